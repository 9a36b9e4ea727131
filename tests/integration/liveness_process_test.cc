// Liveness flags of a carpool-router process (router/router_main.cc): with no worker, a request
// ends UNAVAILABLE after --no-worker-timeout-ms. The logic itself is tested on a fake clock in
// router/liveness_test.cc; this checks the flag reaches it.
#include "absl/strings/str_cat.h"
#include "client/carpool_client.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"

namespace carpool {
namespace {

using ::testing::HasSubstr;

TEST(LivenessProcessTest, NoWorkerTimeoutFlagEndsAQueuedRequest) {
  testing::TestDir dir("carpool_liveness_process_test");
  testing::Subprocess router({std::string(CARPOOL_BIN_DIR) + "/carpool-router", "--frontend",
                              "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*",
                              "--no-worker-timeout-ms", "300"},
                             dir.Log("router"));
  testing::RouterEndpoints ep;
  ASSERT_TRUE(testing::WaitForRouterEndpoints(router, &ep)) << router.Log();
  ClientOptions c;
  c.router_endpoint = ep.frontend;
  c.default_timeout_ms = 10'000;
  c.max_retries = 0;
  auto client = Client::Connect(c);
  ASSERT_TRUE(client.ok()) << client.status();
  GenerateInput g;
  g.request_id = "lonely";
  g.token_ids = {1, 2, 3};
  g.sampling.max_tokens = 4;
  const int64_t start = Clock::Real()->NowMicros();
  absl::StatusOr<GenerateResult> r = (*client)->Generate(g);
  const int64_t took_ms = (Clock::Real()->NowMicros() - start) / 1000;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("for 300 ms (--no-worker-timeout-ms)"));
  EXPECT_GE(took_ms, 250);
  EXPECT_LT(took_ms, 5000);
}

}  // namespace
}  // namespace carpool
