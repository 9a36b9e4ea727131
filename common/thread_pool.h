// A fixed pool of worker threads for data-parallel kernels.
//
// There is no process-wide pool: whoever runs kernels owns one and hands it down (the engine
// owns one of EngineOptions::num_threads threads and gives it to its CPU device and its weight
// loading; tests and benchmarks make their own). A step of the engine calls ParallelFor
// hundreds of times, so hand-offs must be cheap: idle workers spin briefly on an atomic
// generation counter before they sleep on a condition variable, and the caller spins for its
// helpers to finish.
#ifndef CARPOOL_COMMON_THREAD_POOL_H_
#define CARPOOL_COMMON_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace carpool {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), at most num_threads() of them,
  // and returns when all have finished. The split depends only on n and num_threads(), never on
  // timing, so results are reproducible. Not reentrant: fn must not call ParallelFor.
  // Thread-safe: concurrent callers are serialized.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  // One per hardware core (at least 1): the size of a pool asked for with 0 threads.
  static int CoreCount();

 private:
  void WorkerLoop(int index);
  // Waits until generation_ differs from `seen` or stop_ is set; returns the new generation.
  uint64_t WaitForWork(uint64_t seen);

  const int num_threads_;
  std::vector<std::thread> threads_;
  std::mutex call_mu_;  // serializes ParallelFor callers

  // The current job; written by the caller before generation_ is bumped (release), read by
  // workers after they see the new generation (acquire).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};

  // Sleeping workers wait here; the caller notifies under mu_ so no wake-up is lost.
  std::mutex mu_;
  std::condition_variable work_cv_;
};

// pool->ParallelFor(n, fn), or fn(0, n) on the calling thread when `pool` is null (code that
// takes an optional pool).
void ParallelFor(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace carpool

#endif  // CARPOOL_COMMON_THREAD_POOL_H_
