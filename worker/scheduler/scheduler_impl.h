// Internal to worker/scheduler: the state machine both batching policies share. Use
// CreateScheduler (scheduler.h) instead.
//
// Each Schedule() builds a step in this order, within max_num_batched_tokens and max_num_seqs:
//   0. (continuous policy) slots change hands: while sequences more urgent than the batch class
//      wait beyond the free slots, the newest running batch-class sequence is suspended (it
//      keeps its KV blocks and its progress); while a slot is free and nothing more urgent than
//      the batch class waits, the oldest suspended sequence runs again, ahead of admissions;
//   1. running sequences in decode (1 token each), in admission order;
//   2. running sequences still prefilling (a chunk each, as the remaining budget allows);
//   3. if nothing was preempted this step, admissions from the policy's queue, in its order
//      (priority, then arrival), stopping at the first that does not fit.
// A running sequence that cannot get a block preempts (by recompute) a suspended sequence
// first, then the least urgent, then newest, running sequence, until it fits or is itself the
// victim; a waiting sequence that cannot get its blocks preempts suspended ones less urgent
// than itself. Suspending instead of preempting is what lets the router hand a worker full of
// batch jobs an interactive request without recomputing the batch job's prompt and tokens.
//
// Invariants: every running sequence holds KV blocks for at least num_computed_tokens tokens
// (with a sliding window, less those the KV cache has released behind the window of position
// num_computed_tokens);
// waiting sequences hold none and have num_computed_tokens == 0; suspended ones hold blocks as
// running ones do and are in neither running_ nor a wait queue;
// running_.size() <= max_num_seqs.
#ifndef CARPOOL_WORKER_SCHEDULER_SCHEDULER_IMPL_H_
#define CARPOOL_WORKER_SCHEDULER_SCHEDULER_IMPL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/scheduler/admission_policy.h"
#include "worker/scheduler/scheduler.h"

namespace carpool::worker::internal {

class SchedulerImpl final : public Scheduler {
 public:
  // REQUIRES: options.Validate() is OK; kv_cache and policy non-null.
  SchedulerImpl(const SchedulerOptions& options, KvCacheManager* kv_cache,
                std::unique_ptr<AdmissionPolicy> policy);

  void Add(std::unique_ptr<Sequence> seq) override;
  bool Abort(int64_t seq_id) override;
  BatchPlan Schedule() override;
  std::vector<SeqUpdate> Update(const BatchPlan& plan, const StepOutput& output) override;

  int num_waiting() const override;
  int num_running() const override { return static_cast<int>(running_.size()); }
  int64_t num_preemptions() const override { return num_preemptions_; }
  int64_t num_suspensions() const override { return num_suspensions_; }

 private:
  // One sequence's share of the step being built.
  struct Item {
    SeqEntry* entry = nullptr;
    int start = 0;
    int num_tokens = 0;
  };
  struct Step {
    std::vector<Item> items;
    int token_budget = 0;
    std::vector<int64_t> preempted;
  };

  // Step 0 above.
  void SuspendForUrgent();
  void ResumeSuspended();
  void ScheduleRunning(bool decodes, Step& step);
  void ScheduleOne(SeqEntry* entry, Step& step);
  void Admit(WaitQueue& queue, Step& step);
  // Tokens of `seq` to compute now, from `start`, within the step's budget; 0 if none fit.
  int ChunkSize(const Sequence& seq, int start, const Step& step) const;
  SeqEntry* PickVictim() const;
  // The suspended sequence to preempt for a waiting one of priority `p`: the least urgent,
  // newest one less urgent than `p`; null when none is.
  SeqEntry* SuspendedVictimFor(Priority p) const;
  void Preempt(SeqEntry* victim, Step& step);
  BatchPlan MakePlan(Step& step) const;
  FinishReason StopReason(const Sequence& seq) const;
  void RemoveRunning(SeqEntry* entry);

  const SchedulerOptions options_;
  Clock* const clock_;
  KvCacheManager* const kv_;
  const std::unique_ptr<AdmissionPolicy> policy_;

  absl::flat_hash_map<int64_t, std::unique_ptr<SeqEntry>> seqs_;  // every unfinished sequence
  WaitQueue waiting_;
  std::vector<SeqEntry*> running_;    // in admission order
  std::vector<SeqEntry*> suspended_;  // in suspension order
  int64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t num_suspensions_ = 0;
};

}  // namespace carpool::worker::internal

#endif  // CARPOOL_WORKER_SCHEDULER_SCHEDULER_IMPL_H_
