// Tensor parallelism in one process, one thread per rank: a follower rank on its own thread,
// handed the leader's step plans in the order the leader makes them (what the group's step
// broadcast does across processes). Used by the tensor-parallel model tests.
#ifndef CARPOOL_TESTS_TESTING_FOLLOWER_THREAD_H_
#define CARPOOL_TESTS_TESTING_FOLLOWER_THREAD_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "worker/model/step_plan.h"

namespace carpool::testing {

// Runs `follow` on its own thread for every step pushed, in order, until Finish (also at
// destruction, so an early return of a test does not leave the thread running).
class FollowerThread {
 public:
  explicit FollowerThread(std::function<void(const worker::StepPlan&)> follow)
      : thread_([this, follow = std::move(follow)] {
          for (;;) {
            worker::StepPlan step;
            {
              std::unique_lock<std::mutex> lock(mu_);
              cv_.wait(lock, [&] { return closed_ || !steps_.empty(); });
              if (steps_.empty()) return;
              step = std::move(steps_.front());
              steps_.pop_front();
            }
            follow(step);
          }
        }) {}
  FollowerThread(const FollowerThread&) = delete;
  FollowerThread& operator=(const FollowerThread&) = delete;
  ~FollowerThread() { Finish(); }

  void Push(worker::StepPlan step) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.push_back(std::move(step));
    cv_.notify_all();
  }
  // Lets the thread follow every step pushed so far, then joins it.
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<worker::StepPlan> steps_;
  bool closed_ = false;
  std::thread thread_;  // last: starts once the members it reads exist
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_FOLLOWER_THREAD_H_
