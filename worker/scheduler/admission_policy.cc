#include "worker/scheduler/admission_policy.h"

#include <algorithm>
#include <limits>

#include "common/status.h"

namespace carpool::worker::internal {

int WaitQueue::Index(const SeqEntry& entry) {
  return std::clamp(static_cast<int>(entry.seq->priority), 0, kNumPriorities - 1);
}

SeqEntry* WaitQueue::Front() const {
  for (const auto& queue : queues_) {
    if (!queue.empty()) return queue.front();
  }
  return nullptr;
}

SeqEntry* WaitQueue::PopFront() {
  for (auto& queue : queues_) {
    if (queue.empty()) continue;
    SeqEntry* entry = queue.front();
    queue.pop_front();
    return entry;
  }
  CARPOOL_CHECK(false);
  return nullptr;
}

int WaitQueue::CountMoreUrgentThan(Priority p) const {
  const int end = std::clamp(static_cast<int>(p), 0, kNumPriorities);
  int n = 0;
  for (int i = 0; i < end; ++i) n += static_cast<int>(queues_[i].size());
  return n;
}

bool WaitQueue::Remove(int64_t seq_id) {
  for (auto& queue : queues_) {
    auto it = std::find_if(queue.begin(), queue.end(),
                           [seq_id](const SeqEntry* e) { return e->seq->seq_id == seq_id; });
    if (it != queue.end()) {
      queue.erase(it);
      return true;
    }
  }
  return false;
}

int WaitQueue::size() const {
  int n = 0;
  for (const auto& queue : queues_) n += static_cast<int>(queue.size());
  return n;
}

int64_t WaitQueue::OldestEnqueueMicros() const {
  CARPOOL_CHECK(!empty());
  int64_t oldest = std::numeric_limits<int64_t>::max();
  for (const auto& queue : queues_) {
    for (const SeqEntry* e : queue) oldest = std::min(oldest, e->enqueue_micros);
  }
  return oldest;
}

namespace {

class ContinuousPolicy final : public AdmissionPolicy {
 public:
  WaitQueue* Select(WaitQueue& waiting, int, int64_t) override { return &waiting; }
  WaitQueue& RequeueTarget(WaitQueue& waiting) override { return waiting; }
  WaitQueue* own_queue() override { return nullptr; }
};

class StaticPolicy final : public AdmissionPolicy {
 public:
  StaticPolicy(int max_batch, int64_t timeout_micros)
      : max_batch_(max_batch), timeout_micros_(timeout_micros) {}

  WaitQueue* Select(WaitQueue& waiting, int num_running, int64_t now_micros) override {
    const bool batch_done = num_running == 0 && batch_.empty();
    if (batch_done && !waiting.empty() &&
        (waiting.size() >= max_batch_ ||
         now_micros - waiting.OldestEnqueueMicros() >= timeout_micros_)) {
      while (batch_.size() < max_batch_ && !waiting.empty()) batch_.PushBack(waiting.PopFront());
    }
    return &batch_;
  }
  // A preempted member stays in the batch.
  WaitQueue& RequeueTarget(WaitQueue&) override { return batch_; }
  WaitQueue* own_queue() override { return &batch_; }

 private:
  const int max_batch_;
  const int64_t timeout_micros_;
  // Members of the current batch not running now (not yet admitted, or preempted).
  WaitQueue batch_;
};

}  // namespace

std::unique_ptr<AdmissionPolicy> MakeContinuousPolicy() {
  return std::make_unique<ContinuousPolicy>();
}

std::unique_ptr<AdmissionPolicy> MakeStaticPolicy(const SchedulerOptions& options) {
  return std::make_unique<StaticPolicy>(options.max_num_seqs, options.static_batch_timeout_micros);
}

}  // namespace carpool::worker::internal
