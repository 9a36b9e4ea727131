#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace carpool {
namespace {

std::atomic<int> g_default_threads{0};

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
    stop_ = true;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    pending_ = parts - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  int64_t begin, end;
  SliceRange(n, parts, 0, &begin, &end);
  fn(begin, end);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
    }
    const int parts = static_cast<int>(std::min<int64_t>(num_threads_, n));
    if (index < parts) {
      int64_t begin, end;
      SliceRange(n, parts, index, &begin, &end);
      (*fn)(begin, end);
      bool last;
      {
        std::lock_guard<std::mutex> lock(mu_);
        last = --pending_ == 0;
      }
      if (last) done_cv_.notify_one();
    }
  }
}

ThreadPool* ThreadPool::Default() {
  static ThreadPool* pool = [] {
    int n = g_default_threads.load();
    if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return new ThreadPool(n);
  }();
  return pool;
}

void ThreadPool::SetDefaultThreads(int num_threads) { g_default_threads.store(num_threads); }

}  // namespace carpool
