// Tensor parallelism in one process, one thread per rank: the leader's step plans handed to the
// followers' threads in the order the leader makes them (what the group's step broadcast does
// across processes). Used by the tensor-parallel model tests.
#ifndef CARPOOL_TESTS_TESTING_STEP_CHANNEL_H_
#define CARPOOL_TESTS_TESTING_STEP_CHANNEL_H_

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "worker/model/step_plan.h"

namespace carpool::testing {

class StepChannel {
 public:
  void Push(worker::StepPlan step) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.push_back(std::move(step));
    cv_.notify_all();
  }
  // The i-th step pushed (waits for it); nullopt after Close once every step was taken.
  std::optional<worker::StepPlan> Get(size_t i) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ || steps_.size() > i; });
    if (steps_.size() > i) return steps_[i];
    return std::nullopt;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<worker::StepPlan> steps_;
  bool closed_ = false;
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_STEP_CHANNEL_H_
