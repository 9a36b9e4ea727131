// The worker's batching state machine. No device code: a model runner executes the plans.
//
//   BatchPlan plan = scheduler->Schedule();
//   StepOutput out = runner(plan);          // forward + sampler
//   auto updates = scheduler->Update(plan, out);
//
// Thread-compatible: owned and driven by the engine loop alone.
//
// Priorities are strict: a stream of more urgent requests that keeps the batch full starves less
// urgent ones (aging is the router's job). Within a priority, admission is first come, first
// served, where arrival is the order of Add() calls.
#ifndef CARPOOL_WORKER_SCHEDULER_SCHEDULER_H_
#define CARPOOL_WORKER_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "worker/scheduler/sequence.h"

namespace carpool::worker {

class KvCacheManager;

enum class SchedulerPolicy { kContinuous, kStatic };

struct SchedulerOptions {
  SchedulerPolicy policy = SchedulerPolicy::kContinuous;
  // Most tokens (decode + prefill) in one step. Default: 2048.
  int max_num_batched_tokens = 2048;
  // Most sequences in one step. Default: 64.
  int max_num_seqs = 64;
  // Longest sequence (prompt + output). Default: 2048.
  int max_model_len = 2048;
  // Split long prompts over several steps. When false, a prompt is prefilled in one step and
  // max_num_batched_tokens must be >= max_model_len. Default: true.
  bool enable_chunked_prefill = true;
  // Static policy only: start a batch when max_num_seqs are waiting, or this long after the
  // oldest waiting request arrived. Default: 50 ms.
  int64_t static_batch_timeout_micros = 50'000;
  // Not owned; defaults to Clock::Real().
  Clock* clock = nullptr;

  absl::Status Validate() const;
};

// One sequence's share of a step: tokens at positions
// [start_position, start_position + num_tokens) are computed this step.
struct ScheduledSeq {
  Sequence* seq = nullptr;             // owned by the scheduler; valid until Update returns
  int start_position = 0;
  int num_tokens = 0;
  // True when this step computes the sequence's last known token, so the runner samples the
  // next one from its final row.
  bool sample = false;
  absl::Span<const int32_t> block_table;  // valid until the next Schedule/Update/Abort
};

struct BatchPlan {
  std::vector<ScheduledSeq> seqs;       // decodes first, then prefill chunks
  int num_batched_tokens = 0;           // sum of num_tokens
  std::vector<int64_t> preempted;       // seq_ids preempted while building this plan
  bool empty() const { return seqs.empty(); }
};

// What the runner produced for a plan: samples[i] belongs to plan.seqs[i] and is read only
// when plan.seqs[i].sample is true.
struct StepOutput {
  std::vector<SampleResult> samples;
};

// What happened to one sequence in Update.
struct SeqUpdate {
  int64_t seq_id = 0;
  bool has_token = false;
  SampleResult sample;                  // the new token, when has_token
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // Queues a sequence. The caller has validated it (prompt non-empty, prompt + max_tokens
  // <= max_model_len, tokens within the vocabulary, sampling params valid), and the KV cache can
  // hold the most blocks the sequence needs at once (KvCacheManager::PeakBlocks of prompt +
  // max_tokens tokens: all of them, or with a sliding window those of its window and a chunk). REQUIRES: seq_id is not held already. The static policy's
  // timeout counts from this call, on options.clock.
  virtual void Add(std::unique_ptr<Sequence> seq) = 0;

  // Removes a waiting or running sequence and frees its blocks. False if unknown.
  // REQUIRES: not between Schedule() and the matching Update().
  virtual bool Abort(int64_t seq_id) = 0;

  // Picks this step's work. An empty plan means nothing can run now (nothing queued, or the
  // static policy is still collecting a batch).
  virtual BatchPlan Schedule() = 0;

  // Applies the step's sampled tokens: appends them, detects stops, frees finished sequences.
  // Returns one SeqUpdate per sequence that got a token or finished.
  virtual std::vector<SeqUpdate> Update(const BatchPlan& plan, const StepOutput& output) = 0;

  // Waiting sequences count the suspended ones.
  virtual int num_waiting() const = 0;
  virtual int num_running() const = 0;
  bool has_unfinished() const { return num_waiting() + num_running() > 0; }

  // Cumulative counters: sequences preempted by recompute (their blocks freed), and batch-class
  // sequences suspended for a more urgent one (their blocks kept).
  virtual int64_t num_preemptions() const = 0;
  virtual int64_t num_suspensions() const = 0;
};

// `kv_cache` is not owned and must outlive the scheduler.
absl::StatusOr<std::unique_ptr<Scheduler>> CreateScheduler(const SchedulerOptions& options,
                                                           KvCacheManager* kv_cache);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_SCHEDULER_SCHEDULER_H_
