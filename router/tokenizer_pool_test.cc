#include "router/tokenizer_pool.h"

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/transport.h"
#include "gtest/gtest.h"

namespace carpool::router {
namespace {

// Runs completions as the loop does (Poll on the wake fd) until `done` or 10 s.
void RunUntil(TokenizerPool& pool, const std::function<bool()>& done) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!done() && absl::Now() < until) {
    const PollItem items[] = {{nullptr, pool.wake_fd()}};
    absl::StatusOr<PollResult> readable = Poll(items, 100);
    ASSERT_TRUE(readable.ok()) << readable.status();
    if ((*readable)[0]) pool.RunCompletions();
  }
}

TEST(TokenizerPoolTest, JobsRunOffTheCallerAndTheirCompletionsOnIt) {
  auto pool = TokenizerPool::Create(2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::thread::id loop = std::this_thread::get_id();
  std::vector<int> results;
  std::atomic<int> off_loop{0};
  for (int i = 0; i < 20; ++i) {
    (*pool)->Submit([i, loop, &off_loop, &results]() -> TokenizerPool::Completion {
      if (std::this_thread::get_id() != loop) off_loop.fetch_add(1);
      return [i, loop, &results] {
        EXPECT_EQ(std::this_thread::get_id(), loop);
        results.push_back(i * i);
      };
    });
  }
  EXPECT_EQ((*pool)->pending(), 20);
  RunUntil(**pool, [&] { return results.size() == 20; });
  EXPECT_EQ(results.size(), 20u);
  EXPECT_EQ(off_loop.load(), 20);
  EXPECT_EQ((*pool)->pending(), 0);
}

TEST(TokenizerPoolTest, ABlockedJobDelaysNoOtherThreadsJobs) {
  auto pool = TokenizerPool::Create(2);
  ASSERT_TRUE(pool.ok());
  absl::Notification release;
  bool slow_done = false, fast_done = false;
  (*pool)->Submit([&]() -> TokenizerPool::Completion {
    release.WaitForNotificationWithTimeout(absl::Seconds(10));
    return [&] { slow_done = true; };
  });
  (*pool)->Submit([&]() -> TokenizerPool::Completion { return [&] { fast_done = true; }; });
  RunUntil(**pool, [&] { return fast_done; });
  EXPECT_TRUE(fast_done);
  EXPECT_FALSE(slow_done);
  release.Notify();
  RunUntil(**pool, [&] { return slow_done; });
  EXPECT_TRUE(slow_done);
}

TEST(TokenizerPoolTest, RefusesNoThreads) {
  EXPECT_TRUE(absl::IsInvalidArgument(TokenizerPool::Create(0).status()));
}

}  // namespace
}  // namespace carpool::router
