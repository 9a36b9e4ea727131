// The type-erased state machine behind DynamicBatcher: which requests are queued, when a batch
// leaves, how many batches are in flight, how a failed batch is split. It knows requests only
// by ticket; DynamicBatcher<Request, Response> keeps the requests and callbacks and takes its
// orders from here. No threads, no clock reads: every time is passed in.
//
// Thread-compatible: DynamicBatcher calls it under its own mutex.
#ifndef CARPOOL_WORKER_BATCHING_BATCH_QUEUE_H_
#define CARPOOL_WORKER_BATCHING_BATCH_QUEUE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/clock.h"

namespace carpool::worker {

struct DynamicBatcherOptions {
  // Most requests in one batch. Default: 32.
  int max_batch_size = 32;
  // A batch that is not full leaves this long after its first (oldest) request was submitted.
  // 0 sends whatever is queued as soon as a batch slot is free. Default: 1 ms.
  int64_t max_wait_micros = 1'000;
  // Sizes the batch function runs best at (e.g. captured CUDA graphs). Once the queue holds at
  // least one of these, a batch of the largest that fits leaves at once, without waiting for
  // max_wait_micros. Each in [1, max_batch_size]; any order. Default: none.
  std::vector<int> preferred_batch_sizes;
  // Most batches executing at once (in threaded mode, the number of worker threads).
  // Default: 1.
  int max_concurrent_batches = 1;
  // Most requests waiting to be batched; Submit refuses more with RESOURCE_EXHAUSTED.
  // Must be >= max_batch_size. Default: 1024.
  int max_queue_size = 1024;
  // How long a request may wait in the queue, counted from Submit, before it is dropped with
  // DEADLINE_EXCEEDED; 0 = no limit. Submit can override it per request. Default: 0.
  int64_t default_timeout_micros = 0;
  // Not owned; must outlive the batcher. Default: nullptr, meaning Clock::Real().
  Clock* clock = nullptr;

  absl::Status Validate() const;
};

// A point-in-time snapshot of a batcher's counters. Counters only grow; gauges are current.
struct DynamicBatcherStats {
  // Requests.
  int64_t submitted = 0;  // accepted by Submit
  int64_t refused = 0;    // Submit returned RESOURCE_EXHAUSTED (queue full)
  int64_t timed_out = 0;  // dropped with DEADLINE_EXCEEDED before running
  int64_t cancelled = 0;  // got CANCELLED (before or while their batch ran)
  int64_t answered = 0;   // got a response
  int64_t failed = 0;     // got an error from the batch function
  // Batches, including the retries of split batches.
  int64_t batches = 0;
  int64_t batch_splits = 0;                // failed batches split in two for a retry
  std::vector<int64_t> batch_size_counts;  // [s]: batches of s requests; size max_batch_size + 1
  double fill_ratio_sum = 0;               // sum over batches of size / max_batch_size
  // Time from Submit to the request's first batch, over every request that was batched.
  int64_t queue_wait_count = 0;
  int64_t queue_wait_sum_micros = 0;
  int64_t queue_wait_max_micros = 0;
  // Gauges.
  int64_t queued = 0;             // waiting for their first batch
  int64_t batches_in_flight = 0;  // taken and not yet completed

  double MeanFillRatio() const { return batches == 0 ? 0.0 : fill_ratio_sum / batches; }
  double MeanQueueWaitMicros() const {
    return queue_wait_count == 0
               ? 0.0
               : static_cast<double>(queue_wait_sum_micros) / static_cast<double>(queue_wait_count);
  }
};

class BatchQueue {
 public:
  using Ticket = uint64_t;
  static constexpr int64_t kNoDeadline = INT64_MAX;

  // What happens to one request of a completed batch, by its position in the batch.
  enum class Disposition {
    kAnswer,  // deliver its result (or the batch's error) and forget it
    kRetry,   // queued again in a half of the split batch; keep it
    kDrop,    // it was cancelled while running: forget it without a callback
  };
  enum class Outcome {
    kOk,         // one result per request
    kError,      // batch-level error: split and retry, or fail a lone request
    kMalformed,  // unusable results (wrong count): fail every request, no retry
  };
  enum class CancelResult {
    kUnknown,    // no such ticket, or already answered or cancelled
    kRemoved,    // it was waiting: forget it; its callback gets CANCELLED
    kAbandoned,  // its batch is running: callback gets CANCELLED, keep it until Complete
  };

  struct BatchPlan {
    int64_t batch_id = 0;
    std::vector<Ticket> tickets;  // in batch order
  };
  struct TakeResult {
    std::vector<Ticket> expired;  // dropped: each gets DEADLINE_EXCEEDED
    std::optional<BatchPlan> batch;
  };

  // REQUIRES: options.Validate() is OK.
  explicit BatchQueue(const DynamicBatcherOptions& options);

  // Queues a new request; nullopt when the queue is full (counted as refused).
  std::optional<Ticket> Add(int64_t now_micros, int64_t deadline_micros);
  CancelResult Cancel(Ticket ticket);
  // Drops expired requests, then forms the next batch if one is due and a slot is free.
  // Split retries go before new requests.
  TakeResult Take(int64_t now_micros);
  // REQUIRES: batch_id came from Take and was not completed yet.
  std::vector<Disposition> Complete(int64_t batch_id, Outcome outcome);
  // The earliest time at which Take has something to do (a batch or an expiry) if nothing else
  // changes; <= now_micros when it has work now; nullopt when only a Complete or an Add can
  // create work.
  std::optional<int64_t> NextDeadline(int64_t now_micros) const;
  // Forgets everything; returns every ticket whose callback has not run yet.
  std::vector<Ticket> DrainUnanswered();

  DynamicBatcherStats Stats() const;

 private:
  enum class Phase { kQueued, kRetryPending, kRunning, kAbandoned };
  struct TicketState {
    int64_t submit_micros = 0;
    int64_t deadline_micros = kNoDeadline;
    Phase phase = Phase::kQueued;
  };

  // How many queued requests should leave now (0: none yet).
  int DueBatchSize(int64_t now_micros) const;
  bool HasFreeSlot() const;
  BatchPlan StartBatch(std::vector<Ticket> tickets);
  void Dequeue(Ticket ticket);

  const int max_batch_size_;
  const int64_t max_wait_micros_;
  const std::vector<int> preferred_sizes_;  // ascending, unique
  const int max_concurrent_batches_;
  const int max_queue_size_;

  Ticket next_ticket_ = 1;
  int64_t next_batch_id_ = 1;
  absl::flat_hash_map<Ticket, TicketState> tickets_;  // every request not yet forgotten
  std::set<Ticket> queue_;                            // kQueued, oldest first
  std::set<std::pair<int64_t, Ticket>> deadlines_;    // kQueued with a deadline
  std::deque<std::vector<Ticket>> retries_;           // halves of split batches
  absl::flat_hash_map<int64_t, std::vector<Ticket>> in_flight_;
  DynamicBatcherStats stats_;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_BATCHING_BATCH_QUEUE_H_
