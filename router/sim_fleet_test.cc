// The simulated fleet (router/testing/sim_fleet.h) against a real router in-process: dozens of
// workers register, serve requests with the expected tokens, feed the prefix index, honour
// cancels and drains, and leave by deregistering or by going silent.
#include "router/testing/sim_fleet.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/transport.h"
#include "router/router.h"
#include "router/testing/sim_worker.h"

namespace carpool::router {
namespace {

using testing::Drive;
using testing::Outcome;
using testing::QueryStats;
using testing::Scripted;
using testing::SimDispatch;
using testing::SimFleet;
using testing::SimFleetOptions;
using testing::SimTokens;

int64_t NowMillis() { return Clock::Real()->NowMicros() / 1000; }

// A prompt of `length` tokens that differs from every other `tag`'s.
std::vector<int32_t> Prompt(int tag, int length) {
  std::vector<int32_t> p = {tag / 256, tag % 256};
  for (int i = 2; i < length; ++i) p.push_back(1 + (tag + i) % 200);
  return p;
}

GenerateInput Request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  GenerateInput g;
  g.request_id = id;
  g.token_ids = std::move(prompt);
  g.sampling.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  return g;
}

std::vector<int32_t> TokensOf(const GenerateFinalOut& f) {
  std::vector<int32_t> out;
  for (const SampleResult& t : f.tokens) out.push_back(t.token);
  return out;
}

class SimFleetTest : public ::testing::Test {
 protected:
  void StartRouter(RouterOptions o) {
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    auto router = Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
  }
  std::unique_ptr<SimFleet> StartFleet(SimFleetOptions o) {
    o.router = router_->backend_endpoint();
    auto fleet = SimFleet::Start(o);
    EXPECT_TRUE(fleet.ok()) << fleet.status();
    if (!fleet.ok()) return nullptr;
    EXPECT_TRUE((*fleet)->WaitRegistered(5000));
    return std::move(*fleet);
  }
  // Polls the router's stats until `done` holds them (true) or timeout_ms passes (false).
  template <typename Pred>
  bool WaitForStats(Pred done, int timeout_ms, StatsOut* last = nullptr) {
    const int64_t give_up = NowMillis() + timeout_ms;
    StatsOut s;
    do {
      s = QueryStats(frontend());
      if (done(s)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } while (NowMillis() < give_up);
    if (last != nullptr) *last = s;
    return done(s);
  }
  const std::string& frontend() const { return router_->frontend_endpoint(); }
  void TearDown() override {
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  std::unique_ptr<Router> router_;
  std::thread thread_;
};

TEST_F(SimFleetTest, SixtyFourWorkersServePlaceByPrefixCancelAndDeregister) {
  RouterOptions ro;
  ro.placement = PlacementPolicy::kPrefixAffinity;
  ro.heartbeat_timeout_ms = 3000;  // so a departure within 1 s is a deregistration
  StartRouter(ro);
  SimFleetOptions fo;
  fo.workers = 64;
  fo.max_num_seqs = 8;
  fo.step_ms = 2;
  fo.cached_blocks = 50;
  fo.num_kv_blocks = 1024;
  fo.record_dispatches = true;
  std::unique_ptr<SimFleet> fleet = StartFleet(fo);
  ASSERT_NE(fleet, nullptr);

  // Every worker registered, and its initial cache reached the router's prefix index.
  StatsOut stats;
  ASSERT_TRUE(WaitForStats(
      [](const StatsOut& s) {
        return s.workers.size() == 64 &&
               std::all_of(s.workers.begin(), s.workers.end(), [](const WorkerStatsOut& w) {
                 return w.healthy && w.cached_prefix_blocks == 50;
               });
      },
      3000, &stats))
      << stats.workers.size() << " workers";

  // 320 requests at once: every one ends with its own token pattern, spread over the fleet.
  std::vector<Scripted> script;
  for (int i = 0; i < 320; ++i) {
    script.push_back({0, Request(absl::StrCat("r", i), Prompt(i, 20), 6)});
  }
  const std::map<std::string, Outcome> out = Drive(frontend(), script, 8000);
  ASSERT_EQ(out.size(), 320u);
  for (int i = 0; i < 320; ++i) {
    const Outcome& o = out.at(absl::StrCat("r", i));
    ASSERT_TRUE(o.ok) << "r" << i << ": " << o.error.message;
    EXPECT_EQ(TokensOf(o.final), SimTokens(Prompt(i, 20), 6)) << "r" << i;
    EXPECT_EQ(o.final.finish_reason, "length");
  }
  const std::vector<int64_t> per_worker = fleet->counters().dispatches_per_worker;
  const auto used = std::count_if(per_worker.begin(), per_worker.end(),
                                  [](int64_t n) { return n > 0; });
  EXPECT_GE(used, 32) << "320 requests went to only " << used << " of 64 workers";
  EXPECT_EQ(fleet->counters().finished, 320);

  // A prompt of 4 full blocks: once its worker has reported them, the same prompt goes there.
  const std::vector<int32_t> shared = Prompt(5000, 80);
  std::map<std::string, int> blocks_before;
  for (const WorkerStatsOut& w : QueryStats(frontend()).workers) {
    blocks_before[w.worker_id] = w.cached_prefix_blocks;
  }
  const auto first = Drive(frontend(), {{0, Request("p1", shared, 3)}}, 3000);
  ASSERT_TRUE(first.at("p1").ok);
  int owner = -1;
  for (const SimDispatch& d : fleet->dispatches()) {
    if (d.prompt == shared) owner = d.worker;
  }
  ASSERT_GE(owner, 0);
  const std::string owner_id = fleet->WorkerId(owner);
  ASSERT_TRUE(WaitForStats(
      [&](const StatsOut& s) {
        return std::any_of(s.workers.begin(), s.workers.end(), [&](const WorkerStatsOut& w) {
          return w.worker_id == owner_id &&
                 w.cached_prefix_blocks == blocks_before[owner_id] + 4;
        });
      },
      2000))
      << owner_id << " never reported the prompt's 4 blocks";
  const auto again = Drive(frontend(), {{0, Request("p2", shared, 3)}}, 3000);
  ASSERT_TRUE(again.at("p2").ok);
  EXPECT_EQ(again.at("p2").final.usage.cached_prompt_tokens, 64);
  EXPECT_EQ(TokensOf(again.at("p2").final), SimTokens(shared, 3));
  int second = -1;
  int seen = 0;
  for (const SimDispatch& d : fleet->dispatches()) {
    if (d.prompt == shared && ++seen == 2) second = d.worker;
  }
  EXPECT_EQ(second, owner) << "the repeated prompt went to " << fleet->WorkerId(second);

  // A cancelled stream: the client gets CANCELLED and the worker drops the request.
  {
    zmq::context_t context;
    auto client = Socket::Create(&context, zmq::socket_type::dealer, SocketOptions());
    ASSERT_TRUE(client.ok());
    ASSERT_TRUE((*client)->Connect(frontend()).ok());
    GenerateInput g = Request("long", Prompt(7000, 20), 2000);
    g.stream = true;
    ASSERT_TRUE((*client)->Send({Encode(ClientMessage(g))}).ok());
    auto next = [&]() -> std::optional<ServerMessage> {
      auto frames = (*client)->Recv(3000);
      if (!frames.ok() || !frames->has_value()) return std::nullopt;
      auto m = DecodeServerMessage((*frames)->back());
      if (!m.ok()) return std::nullopt;
      return *m;
    };
    std::optional<ServerMessage> chunk = next();
    ASSERT_TRUE(chunk.has_value() && std::holds_alternative<GenerateChunkOut>(*chunk));
    EXPECT_EQ(std::get<GenerateChunkOut>(*chunk).tokens.at(0).token,
              SimTokens(Prompt(7000, 20), 1)[0]);
    ASSERT_TRUE((*client)->Send({Encode(ClientMessage(CancelInput{"long"}))}).ok());
    bool cancelled = false;
    for (int i = 0; i < 5000 && !cancelled; ++i) {
      std::optional<ServerMessage> m = next();
      ASSERT_TRUE(m.has_value()) << "no answer to the cancel";
      if (const auto* e = std::get_if<ErrorInfo>(&*m)) {
        EXPECT_EQ(e->code, absl::StatusCode::kCancelled);
        cancelled = true;
      }
    }
    EXPECT_TRUE(cancelled);
    const int64_t give_up = NowMillis() + 2000;
    while (fleet->counters().cancels < 1 && NowMillis() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(fleet->counters().cancels, 1);
  }

  // Stopping deregisters every worker: gone well before the 3 s heartbeat timeout.
  const int64_t stopped = NowMillis();
  fleet->Stop(/*deregister=*/true);
  EXPECT_TRUE(WaitForStats([](const StatsOut& s) { return s.workers.empty(); }, 5000, &stats))
      << stats.workers.size() << " workers left";
  EXPECT_LT(NowMillis() - stopped, 2000);
}

TEST_F(SimFleetTest, SilentFleetIsDeclaredDeadAfterTheHeartbeatTimeout) {
  RouterOptions ro;
  ro.heartbeat_timeout_ms = 1000;
  StartRouter(ro);
  SimFleetOptions fo;
  fo.workers = 16;
  fo.heartbeat_ms = 100;
  std::unique_ptr<SimFleet> fleet = StartFleet(fo);
  ASSERT_NE(fleet, nullptr);
  // Heartbeats keep all of them alive across several timeouts' worth of time.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(QueryStats(frontend()).workers.size(), 16u);
  const int64_t stopped = NowMillis();
  fleet->Stop(/*deregister=*/false);
  // No deregistration: still there at first, then dead once the timeout passes.
  EXPECT_EQ(QueryStats(frontend()).workers.size(), 16u);
  EXPECT_TRUE(WaitForStats([](const StatsOut& s) { return s.workers.empty(); }, 4000));
  EXPECT_GE(NowMillis() - stopped, 900);
}

TEST_F(SimFleetTest, RouterDrainDrainsEveryWorker) {
  StartRouter(RouterOptions());
  SimFleetOptions fo;
  fo.workers = 16;
  std::unique_ptr<SimFleet> fleet = StartFleet(fo);
  ASSERT_NE(fleet, nullptr);
  const auto out = Drive(frontend(), {{0, Request("a", Prompt(1, 8), 4)}}, 3000);
  ASSERT_TRUE(out.at("a").ok);
  router_->Drain();
  thread_.join();  // Run returns once every worker deregistered
  EXPECT_EQ(fleet->counters().deregistered, 16);
  EXPECT_EQ(fleet->counters().registered, 0);
}

TEST(SimFleetOptionsTest, BadOptionsAreRefusedByName) {
  SimFleetOptions o;
  EXPECT_NE(SimFleet::Start(o).status().message().find("router"), std::string::npos);
  o.router = "tcp://127.0.0.1:1";
  o.workers = 0;
  EXPECT_NE(SimFleet::Start(o).status().message().find("workers"), std::string::npos);
  o.workers = 2;
  o.cached_blocks = o.num_kv_blocks + 1;
  EXPECT_NE(SimFleet::Start(o).status().message().find("cached_blocks"), std::string::npos);
}

}  // namespace
}  // namespace carpool::router
