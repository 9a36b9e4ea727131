// A router that dies (kill -9) or freezes (SIGSTOP) under open streams: with real carpool-router,
// carpool-worker and `carpool generate` processes on loopback ports, every open call of the C++
// SDK and the CLI ends with UNAVAILABLE router_lost within 3 s.
#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/carpool_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"

namespace carpool {
namespace {

using ::testing::HasSubstr;
using testing::RouterEndpoints;
using testing::Subprocess;

const std::string kBin = CARPOOL_BIN_DIR;
constexpr int kStreams = 16;
constexpr int kMaxTokens = 2000;  // far more than can be generated before the worker is frozen

class RouterLostTest : public ::testing::Test {
 protected:
  void TearDown() override {
    // Stopped processes take no SIGTERM: let them run again so they stop quickly.
    if (worker_ != nullptr) worker_->Signal(SIGCONT);
    if (router_ != nullptr) router_->Signal(SIGCONT);
    cli_.reset();
    worker_.reset();
    router_.reset();
  }

  std::unique_ptr<Client> Connect() {
    ClientOptions o;
    o.router_endpoint = frontend_;
    o.default_timeout_ms = 60000;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // A router and one synthetic:tiny worker, registered.
  void StartCluster() {
    router_ = std::make_unique<Subprocess>(
        std::vector<std::string>{kBin + "/carpool-router", "--frontend", "tcp://127.0.0.1:*",
                                 "--backend", "tcp://127.0.0.1:*"},
        dir_.Log("router"));
    RouterEndpoints ep;
    ASSERT_TRUE(WaitForRouterEndpoints(*router_, &ep)) << router_->Log();
    frontend_ = ep.frontend;
    worker_ = std::make_unique<Subprocess>(
        std::vector<std::string>{kBin + "/carpool-worker", "--router", ep.backend, "--model",
                                 "synthetic:tiny", "--worker-id", "w1", "--max-model-len", "2048",
                                 "--threads", "1"},
        dir_.Log("worker"));
    stats_client_ = Connect();
    ASSERT_NE(stats_client_, nullptr);
    ASSERT_TRUE(WaitForInflight(-1)) << "no worker registered\n" << worker_->Log();
  }

  // Waits until the router has a worker and at least `n` requests in flight.
  bool WaitForInflight(int n) {
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (absl::Now() < until && worker_->running()) {
      absl::StatusOr<StatsOut> s = stats_client_->Stats(1000);
      if (s.ok() && !s->workers.empty() && s->inflight >= n) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // kStreams SDK streams (each with a first chunk read) and one `carpool generate --stream`, all
  // in flight at the router; then the worker is frozen, so none of them can finish.
  void OpenStreams() {
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
    for (int i = 0; i < kStreams; ++i) {
      GenerateInput g;
      g.request_id = absl::StrCat("s", i);
      g.token_ids = {1, 2, 3, i};
      g.sampling.max_tokens = kMaxTokens;
      g.sampling.ignore_eos = true;
      absl::StatusOr<std::unique_ptr<Stream>> s = client_->StartStream(g);
      ASSERT_TRUE(s.ok()) << s.status();
      streams_.push_back(std::move(*s));
    }
    for (auto& s : streams_) {
      absl::StatusOr<std::optional<GenerateChunkOut>> first = s->Next(20000);
      ASSERT_TRUE(first.ok() && first->has_value()) << first.status();
    }
    cli_ = std::make_unique<Subprocess>(
        std::vector<std::string>{kBin + "/carpool", "generate", "--router", frontend_,
                                 "--prompt-ids", "5,6,7", "--max-tokens", absl::StrCat(kMaxTokens),
                                 "--ignore-eos", "--stream", "--timeout-ms", "60000"},
        dir_.Log("cli"));
    ASSERT_TRUE(WaitForInflight(kStreams + 1)) << cli_->Log();
    worker_->Signal(SIGSTOP);
  }

  // Reads every stream to its end and checks each ended with router_lost; the time it took.
  absl::Duration ExpectAllLost(absl::Time since) {
    for (auto& s : streams_) {
      absl::Status end;
      for (;;) {
        absl::StatusOr<std::optional<GenerateChunkOut>> next = s->Next();
        if (!next.ok()) {
          end = next.status();
          break;
        }
        if (!next->has_value()) break;  // finished: must not happen, checked below
      }
      EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << s->request_id() << ": " << end;
      EXPECT_EQ(ErrorReason(end), "router_lost") << s->request_id() << ": " << end;
    }
    const absl::Duration took = absl::Now() - since;
    RecordProperty("all_lost_after_ms", absl::StrCat(absl::ToInt64Milliseconds(took)));
    return took;
  }

  testing::TestDir dir_{"carpool_router_lost_test"};
  std::unique_ptr<Subprocess> router_, worker_, cli_;
  std::string frontend_;
  std::unique_ptr<Client> stats_client_, client_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

TEST_F(RouterLostTest, KilledRouterEndsEveryStreamAndTheCli) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(OpenStreams());
  const absl::Time kill = absl::Now();
  router_->Signal(SIGKILL);
  EXPECT_LT(ExpectAllLost(kill), absl::Seconds(3));
  const int cli_exit = cli_->Wait(3000 - absl::ToInt64Milliseconds(absl::Now() - kill));
  EXPECT_EQ(cli_exit, 1) << cli_->Log();
  EXPECT_THAT(cli_->Log(), HasSubstr("router_lost"));
}

TEST_F(RouterLostTest, StoppedRouterIsLostThroughHeartbeatsAndFoundAgain) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ASSERT_NO_FATAL_FAILURE(OpenStreams());
  const absl::Time stop = absl::Now();
  router_->Signal(SIGSTOP);  // keeps its sockets open and answers nothing, not even PINGs
  // 1 s heartbeats: the last traffic was before the stop, so at most 3 s.
  EXPECT_LT(ExpectAllLost(stop), absl::Seconds(3));
  EXPECT_EQ(cli_->Wait(3000), 1) << cli_->Log();
  EXPECT_THAT(cli_->Log(), HasSubstr("router_lost"));
  // The router resumes: the same client redials it by itself.
  router_->Signal(SIGCONT);
  absl::StatusOr<StatsOut> stats = client_->Stats(10000);
  EXPECT_TRUE(stats.ok()) << stats.status();
}

}  // namespace
}  // namespace carpool
