#include "router/handler_pool.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace carpool::router {
namespace {

bool WaitFor(const std::atomic<bool>& flag) {
  for (int i = 0; i < 2000 && !flag.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return flag.load();
}

TEST(HandlerPoolTest, ABurstNeverQueuesAJobBehindARunningOne) {
  HandlerPool pool(8);
  std::atomic<bool> warm{false};
  ASSERT_TRUE(pool.TryRun([&] { warm.store(true); }));
  ASSERT_TRUE(WaitFor(warm));
  for (int i = 0; i < 100 && pool.busy() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // One idle thread; two jobs at once: the first blocks until the second has run.
  std::atomic<bool> second_ran{false}, first_done{false};
  ASSERT_TRUE(pool.TryRun([&] {
    WaitFor(second_ran);
    first_done.store(true);
  }));
  ASSERT_TRUE(pool.TryRun([&] { second_ran.store(true); }));
  EXPECT_TRUE(WaitFor(second_ran));
  EXPECT_TRUE(WaitFor(first_done));
}

TEST(HandlerPoolTest, RefusesBeyondItsBoundAndFreesTheSlotBeforeThen) {
  HandlerPool pool(1);
  std::atomic<bool> release{false}, then_ran{false};
  std::atomic<int64_t> busy_in_then{-1};
  ASSERT_TRUE(pool.TryRun([&] { WaitFor(release); },
                          [&] {
                            busy_in_then.store(pool.busy());
                            then_ran.store(true);
                          }));
  EXPECT_FALSE(pool.TryRun([] {}));
  EXPECT_EQ(pool.busy(), 1);
  release.store(true);
  ASSERT_TRUE(WaitFor(then_ran));
  EXPECT_EQ(busy_in_then.load(), 0);  // `then` may start work that takes the slot
  EXPECT_TRUE(pool.TryRun([] {}));
  pool.Join();
  EXPECT_FALSE(pool.TryRun([] {}));
}

}  // namespace
}  // namespace carpool::router
