// DynamicBatcher<Request, Response>: groups one-shot requests (embeddings, classifiers) into
// batches for a batch function, with a bounded queue, per-request timeouts, cancellation and
// error isolation. docs/dynamic_batching.md describes the semantics for users.
//
// Two ways to execute batches:
//  - Threaded: Create(options, fn) starts max_concurrent_batches worker threads that call fn.
//  - Pull: Create(options) starts no thread; an external loop (the engine loop) calls
//    TryTakeBatch, runs the batch however it likes, then calls Complete. NextDeadline says when
//    to call TryTakeBatch next.
//
// Thread safety: Submit, Cancel, Stats and NextDeadline may be called from any thread;
// TryTakeBatch and Complete too, but only on a pull-mode batcher. The mutex is held only for
// bookkeeping: callbacks and the batch function never run under it.
//
// Callbacks: every request accepted by Submit gets exactly one call of its callback, with a
// response or with CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE (batcher destroyed) or the batch
// function's error. It runs on whichever thread settled the request (Complete, TryTakeBatch,
// Cancel, the destructor) and may call Submit or Cancel.
#ifndef CARPOOL_WORKER_BATCHING_DYNAMIC_BATCHER_H_
#define CARPOOL_WORKER_BATCHING_DYNAMIC_BATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "worker/batching/batch_queue.h"

namespace carpool::worker {

template <typename Request, typename Response>
class DynamicBatcher {
 public:
  using Ticket = BatchQueue::Ticket;
  using Callback = absl::AnyInvocable<void(absl::StatusOr<Response>) &&>;
  // Returns one response per request, in order, or a batch-level error. On an error the batch
  // is split in halves and each half retried until the failing requests are alone; only they
  // get the error. Returning the wrong number of responses fails the whole batch with INTERNAL.
  using BatchFunction = std::function<absl::StatusOr<std::vector<Response>>(
      absl::Span<const Request* const> requests)>;

  // A batch taken by TryTakeBatch. The requests stay valid until it is passed to Complete.
  class Batch {
   public:
    Batch(Batch&&) = default;
    Batch& operator=(Batch&&) = default;
    absl::Span<const Request* const> requests() const { return requests_; }
    size_t size() const { return requests_.size(); }

   private:
    friend class DynamicBatcher;
    Batch() = default;
    int64_t id_ = 0;
    std::vector<Ticket> tickets_;
    std::vector<const Request*> requests_;
  };

  // Pull mode: no threads; drive it with TryTakeBatch/Complete.
  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const DynamicBatcherOptions& options);
  // Threaded mode: max_concurrent_batches threads call `fn`. The clock must run in real time.
  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const DynamicBatcherOptions& options, BatchFunction fn);

  // Threaded mode: waits for the running batches. Every request not answered yet, including
  // those of pull-mode batches not yet completed (which must then never be completed), gets
  // UNAVAILABLE.
  ~DynamicBatcher();
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Queues a request and returns its ticket, or RESOURCE_EXHAUSTED at once when the queue is
  // full (then `done` is destroyed uncalled). `timeout_micros` (> 0) bounds its wait in the
  // queue; 0 means no limit; the overload without it uses options.default_timeout_micros.
  absl::StatusOr<Ticket> Submit(Request request, Callback done);
  absl::StatusOr<Ticket> Submit(Request request, Callback done, int64_t timeout_micros);

  // True when this call settled the request: its callback got CANCELLED (now, on this thread)
  // and it will never reach the batch function again; a running batch's result for it is
  // discarded. False when it was already answered, cancelled or never existed.
  bool Cancel(Ticket ticket);

  // Pull mode. Drops expired requests (their callbacks run here), then returns the next batch
  // if one is due and fewer than max_concurrent_batches are in flight. `now_micros` comes from
  // options.clock.
  std::optional<Batch> TryTakeBatch(int64_t now_micros);
  // Pull mode. Settles a batch from TryTakeBatch with the batch function's result.
  void Complete(Batch batch, absl::StatusOr<std::vector<Response>> results);
  // When TryTakeBatch will next have work if nothing else happens (<= now: it has work now);
  // nullopt when only a Submit or a Complete can create work.
  std::optional<int64_t> NextDeadline() const;

  DynamicBatcherStats Stats() const;

 private:
  struct Entry {
    Request request;
    Callback done;
  };

  DynamicBatcher(const DynamicBatcherOptions& options, BatchFunction fn);
  void WorkerLoop();
  // Blocks until TryTakeBatch may have work; false when the batcher is stopping.
  bool WaitForWork();
  Callback TakeCallback(Ticket ticket, bool forget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const int64_t default_timeout_micros_;
  const BatchFunction batch_fn_;  // empty in pull mode

  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;  // signalled (outside mu_) when a batch may have become due
  BatchQueue queue_ ABSL_GUARDED_BY(mu_);
  // Node-based so that Batch may point at requests while others are added.
  absl::node_hash_map<Ticket, Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace carpool::worker

#include "worker/batching/dynamic_batcher_inl.h"  // IWYU pragma: export

#endif  // CARPOOL_WORKER_BATCHING_DYNAMIC_BATCHER_H_
