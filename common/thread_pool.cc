#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CARPOOL_CPU_RELAX() _mm_pause()
#else
#define CARPOOL_CPU_RELAX() std::this_thread::yield()
#endif

namespace carpool {
namespace {

// How long an idle worker spins before it sleeps: long enough to bridge the gap between two
// kernels of one engine step, short enough not to burn a core between steps.
constexpr auto kSpinFor = std::chrono::microseconds(200);

// Range of slice `i` of `parts` over [0, n).
void SliceRange(int64_t n, int parts, int i, int64_t* begin, int64_t* end) {
  const int64_t base = n / parts;
  const int64_t rem = n % parts;
  *begin = i * base + std::min<int64_t>(i, rem);
  *end = *begin + base + (i < rem ? 1 : 0);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) {
    threads_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int parts = static_cast<int>(std::min<int64_t>(num_threads_, n));
  if (parts == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  fn_ = &fn;
  n_ = n;
  // Every worker checks in, even one with no slice, so none can lag into the next job.
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  int64_t begin, end;
  SliceRange(n, parts, 0, &begin, &end);
  fn(begin, end);
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 1024) {
      CARPOOL_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

uint64_t ThreadPool::WaitForWork(uint64_t seen) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinFor;
  int spins = 0;
  for (;;) {
    const uint64_t g = generation_.load(std::memory_order_acquire);
    if (g != seen || stop_.load(std::memory_order_relaxed)) return g;
    // Pause while the wait is short; then yield, so that an oversubscribed machine still runs
    // the threads that have work.
    if (++spins < 1024) {
      CARPOOL_CPU_RELAX();
    } else {
      std::this_thread::yield();
      if (std::chrono::steady_clock::now() > deadline) break;
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  work_cv_.wait(lock, [&] {
    return stop_.load(std::memory_order_relaxed) ||
           generation_.load(std::memory_order_acquire) != seen;
  });
  return generation_.load(std::memory_order_acquire);
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    seen = WaitForWork(seen);
    if (stop_.load(std::memory_order_relaxed)) return;
    const int64_t n = n_;
    const int parts = static_cast<int>(std::min<int64_t>(num_threads_, n));
    if (index < parts) {
      int64_t begin, end;
      SliceRange(n, parts, index, &begin, &end);
      (*fn_)(begin, end);
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

int ThreadPool::CoreCount() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void ParallelFor(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn);
  } else if (n > 0) {
    fn(0, n);
  }
}

}  // namespace carpool
