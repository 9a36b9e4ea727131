// Internal to worker/scheduler: the queue of waiting sequences and the policies that decide
// which of them may join the running batch (continuous: any, every step; static: one fixed batch
// at a time). Everything else (decode-first ordering, chunked prefill, preemption, stops) is
// shared in SchedulerImpl.
#ifndef CARPOOL_WORKER_SCHEDULER_ADMISSION_POLICY_H_
#define CARPOOL_WORKER_SCHEDULER_ADMISSION_POLICY_H_

#include <array>
#include <cstdint>
#include <deque>
#include <memory>

#include "worker/scheduler/scheduler.h"
#include "worker/scheduler/sequence.h"

namespace carpool::worker::internal {

// A sequence as the scheduler holds it, from Add() until it finishes or is aborted.
struct SeqEntry {
  std::unique_ptr<Sequence> seq;
  int64_t arrival_index = 0;   // order of Add(): lower arrived earlier
  int64_t enqueue_micros = 0;  // scheduler clock at Add()
};

// Sequences that are not running: one FIFO per priority. Front() is the most urgent priority's
// oldest entry. Does not own the entries.
class WaitQueue {
 public:
  void PushBack(SeqEntry* entry) { queues_[Index(*entry)].push_back(entry); }
  // For preempted sequences: ahead of everything of the same priority.
  void PushFront(SeqEntry* entry) { queues_[Index(*entry)].push_front(entry); }
  // Null when empty.
  SeqEntry* Front() const;
  // REQUIRES: !empty().
  SeqEntry* PopFront();
  bool Remove(int64_t seq_id);
  int size() const;
  bool empty() const { return size() == 0; }
  // Entries more urgent than `p` (of a lower Priority value).
  int CountMoreUrgentThan(Priority p) const;
  // Earliest enqueue_micros of any entry. REQUIRES: !empty().
  int64_t OldestEnqueueMicros() const;

 private:
  static constexpr int kNumPriorities = 3;
  static int Index(const SeqEntry& entry);

  std::array<std::deque<SeqEntry*>, kNumPriorities> queues_;
};

class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;

  // Called once per step, after the running sequences got their share: the queue to admit
  // from, in its order, or null to admit nothing. May move entries out of `waiting` into a
  // queue of the policy's own.
  virtual WaitQueue* Select(WaitQueue& waiting, int num_running, int64_t now_micros) = 0;
  // Where a preempted sequence goes back to (the scheduler pushes it to the front).
  virtual WaitQueue& RequeueTarget(WaitQueue& waiting) = 0;
  // Entries the policy holds outside `waiting`, or null.
  virtual WaitQueue* own_queue() = 0;
};

// Admits from everything waiting, every step.
std::unique_ptr<AdmissionPolicy> MakeContinuousPolicy();
// When nothing runs and no batch is pending, forms a batch of up to max_num_seqs waiting
// sequences once max_num_seqs are waiting or the oldest has waited static_batch_timeout_micros;
// admits only from that batch until all of it has finished.
std::unique_ptr<AdmissionPolicy> MakeStaticPolicy(const SchedulerOptions& options);

}  // namespace carpool::worker::internal

#endif  // CARPOOL_WORKER_SCHEDULER_ADMISSION_POLICY_H_
