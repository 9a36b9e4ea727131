#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace carpool {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPoolTest, SplitDependsOnlyOnSizeAndThreads) {
  ThreadPool pool(3);
  auto ranges = [&](int64_t n) {
    std::vector<std::pair<int64_t, int64_t>> r(3, {-1, -1});
    std::atomic<int> slot{0};
    pool.ParallelFor(n, [&](int64_t b, int64_t e) { r[slot.fetch_add(1)] = {b, e}; });
    std::sort(r.begin(), r.end());
    return r;
  };
  EXPECT_EQ(ranges(10), ranges(10));
  EXPECT_EQ(ranges(10)[2], std::make_pair(int64_t{7}, int64_t{10}));
}

TEST(ThreadPoolTest, ManyBackToBackJobsWithSmallSizes) {
  ThreadPool pool(4);
  int64_t total = 0;
  for (int job = 0; job < 3000; ++job) {
    const int64_t n = 1 + job % 6;  // often fewer items than threads
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum.fetch_add(i + 1);
    });
    total += sum.load();
    ASSERT_EQ(sum.load(), n * (n + 1) / 2);
  }
  EXPECT_GT(total, 0);
}

TEST(ThreadPoolTest, NullPoolRunsEverythingOnTheCallingThread) {
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::pair<int64_t, int64_t>> calls;
  ParallelFor(nullptr, 10, [&](int64_t b, int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    calls.push_back({b, e});
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(int64_t{0}, int64_t{10}));
  ParallelFor(nullptr, 0, [&](int64_t, int64_t) { ADD_FAILURE() << "nothing to run"; });

  ThreadPool pool(3);
  std::atomic<int64_t> covered{0};
  ParallelFor(&pool, 10, [&](int64_t b, int64_t e) { covered.fetch_add(e - b); });
  EXPECT_EQ(covered.load(), 10);
  EXPECT_GE(ThreadPool::CoreCount(), 1);
}

}  // namespace
}  // namespace carpool
