// Failover, restarts and placement with real carpool-router / carpool-worker processes on
// loopback ports, driven through the C++ SDK. Must-show items 6-9 of the admission issue.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/carpool_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"
#include "worker/engine.h"

namespace carpool {
namespace {

using testing::NowMs;
using testing::RouterEndpoints;
using testing::Subprocess;

const std::string kBin = CARPOOL_BIN_DIR;

class FailoverTest : public ::testing::Test {
 protected:
  void TearDown() override {
    workers_.clear();
    router_.reset();
  }

  std::string Log(const std::string& name) { return dir_.Log(name); }

  // Starts a router; ports 0 let it pick. Returns after it logged its endpoints.
  void StartRouter(std::vector<std::string> extra = {}, int frontend_port = 0,
                   int backend_port = 0, const std::string& log = "router") {
    RouterEndpoints ep;
    ASSERT_NO_FATAL_FAILURE(testing::StartRouterProcess(
        kBin, testing::LoopbackEndpoint(frontend_port), testing::LoopbackEndpoint(backend_port),
        extra, Log(log), &router_, &ep));
    frontend_ = ep.frontend;
    backend_ = ep.backend;
  }

  Subprocess* StartWorker(const std::string& name, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--threads", "1"});
    workers_.push_back(std::make_unique<Subprocess>(
        testing::WorkerArgv(kBin, backend_, name, /*max_model_len=*/1024, extra), Log(name)));
    return workers_.back().get();
  }

  std::unique_ptr<Client> Connect(int64_t timeout_ms = 60000, int max_retries = 0) {
    ClientOptions o;
    o.router_endpoint = frontend_;
    o.default_timeout_ms = timeout_ms;
    o.max_retries = max_retries;
    return testing::ConnectClient(o);
  }

  // Waits until the router lists exactly `n` workers; the time it took, or -1 after timeout_ms.
  static int64_t WaitForWorkers(Client* c, int n, int64_t timeout_ms = 10000) {
    return testing::WaitForStats(
        c, [n](const StatsOut& s) { return static_cast<int>(s.workers.size()) == n; },
        timeout_ms, /*poll_ms=*/20, /*stats_timeout_ms=*/500);
  }

  testing::TestDir dir_{"carpool_failover_test"};
  std::unique_ptr<Subprocess> router_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::string frontend_, backend_;
};

struct Prompt {
  std::vector<int32_t> ids;
  int max_tokens;
};

std::vector<Prompt> GreedyPrompts(int n, int min_tokens, int max_tokens) {
  std::mt19937 rng(29);
  std::uniform_int_distribution<int> out(min_tokens, max_tokens);
  std::vector<Prompt> prompts;
  for (int i = 0; i < n; ++i) {
    Prompt p;
    p.ids = testing::RandomPromptIds(rng, 4, 40);
    p.max_tokens = out(rng);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

GenerateInput ToInput(const Prompt& p, const std::string& id) {
  GenerateInput g;
  g.request_id = id;
  g.token_ids = p.ids;
  g.sampling.max_tokens = p.max_tokens;
  g.sampling.temperature = 0;
  g.sampling.ignore_eos = true;
  g.stream = true;
  return g;
}

// The no-fault run: every prompt through an in-process engine.
std::vector<std::vector<int32_t>> Expected(const std::vector<Prompt>& prompts) {
  std::vector<worker::EngineRequest> requests;
  for (const Prompt& p : prompts) {
    worker::EngineRequest r;
    r.prompt_tokens = p.ids;
    r.sampling.max_tokens = p.max_tokens;
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  return testing::InProcessTokens(std::move(requests), /*max_model_len=*/1024);
}

// What a client saw of one stream.
struct Seen {
  absl::Status status;
  std::vector<int32_t> tokens;
  bool in_order = true;  // every chunk's index was the next position: no gap, no duplicate
};

// Streams every prompt at once; `tokens_seen` counts chunks' tokens as they arrive.
std::vector<std::future<Seen>> StreamAll(Client* client, const std::vector<Prompt>& prompts,
                                         std::atomic<int64_t>* tokens_seen) {
  std::vector<std::future<Seen>> results;
  for (size_t i = 0; i < prompts.size(); ++i) {
    results.push_back(std::async(std::launch::async, [=, &prompts] {
      Seen seen;
      auto r = client->GenerateStream(
          ToInput(prompts[i], absl::StrCat("p", i)), [&](const GenerateChunkOut& chunk) {
            seen.in_order &= chunk.index == static_cast<int>(seen.tokens.size());
            for (const auto& t : chunk.tokens) seen.tokens.push_back(t.token);
            tokens_seen->fetch_add(static_cast<int64_t>(chunk.tokens.size()));
          });
      seen.status = r.status();
      if (r.ok() && r->usage.completion_tokens != static_cast<int>(seen.tokens.size())) {
        seen.status = absl::InternalError("usage does not match the stream");
      }
      return seen;
    }));
  }
  return results;
}

void ExpectStreamsMatch(std::vector<std::future<Seen>>& results,
                        const std::vector<std::vector<int32_t>>& expected) {
  for (size_t i = 0; i < results.size(); ++i) {
    Seen seen = results[i].get();
    ASSERT_TRUE(seen.status.ok()) << "prompt " << i << ": " << seen.status;
    EXPECT_TRUE(seen.in_order) << "prompt " << i << ": a gap or a duplicate in the stream";
    EXPECT_EQ(seen.tokens, expected[i]) << "prompt " << i;
  }
}

void WaitForTokens(const std::atomic<int64_t>& seen, int64_t n) {
  for (int i = 0; i < 3000 && seen.load() < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// 6. kill -9 one of two workers midway through 100 streaming greedy requests: every request
// completes, its stream equals the no-fault run, the router stays up, detection takes <= 2 s.
TEST_F(FailoverTest, KillNineMidwayEveryStreamEqualsTheNoFaultRun) {
  StartRouter();
  Subprocess* victim = StartWorker("w1", {"--max-num-seqs", "16"});
  StartWorker("w2", {"--max-num-seqs", "16"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_GE(WaitForWorkers(client.get(), 2), 0);
  const std::vector<Prompt> prompts = GreedyPrompts(100, 60, 160);
  const std::vector<std::vector<int32_t>> expected = Expected(prompts);
  int64_t total = 0;
  for (const auto& e : expected) total += static_cast<int64_t>(e.size());

  std::atomic<int64_t> seen{0};
  auto results = StreamAll(client.get(), prompts, &seen);
  WaitForTokens(seen, total / 3);
  const int64_t at_kill = seen.load();
  ASSERT_LT(at_kill, total) << "the run ended before the kill";
  victim->Signal(SIGKILL);
  const int64_t detect_ms = WaitForWorkers(client.get(), 1, 5000);
  ExpectStreamsMatch(results, expected);
  std::cout << "kill -9 after " << at_kill * 100 / total << "% of the tokens: detected in "
            << detect_ms << " ms\n";
  EXPECT_GE(detect_ms, 0);
  EXPECT_LE(detect_ms, 2000);
  EXPECT_TRUE(router_->running());
  auto stats = client->Stats(2000);
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->migrations, 0);
  EXPECT_EQ(stats->inflight, 0);
  EXPECT_EQ(stats->inflight_tokens, 0);
}

// 7. SIGSTOP a worker until the router declares it dead, then SIGCONT: what it sends from its
// old registration is dropped, so no client sees a stale or duplicate token, and it registers
// again.
TEST_F(FailoverTest, StoppedAndContinuedWorkerDeliversNoStaleOrDuplicateTokens) {
  StartRouter();
  Subprocess* victim = StartWorker("w1", {"--max-num-seqs", "16"});
  StartWorker("w2", {"--max-num-seqs", "16"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_GE(WaitForWorkers(client.get(), 2), 0);
  const std::vector<Prompt> prompts = GreedyPrompts(48, 100, 200);
  const std::vector<std::vector<int32_t>> expected = Expected(prompts);
  int64_t total = 0;
  for (const auto& e : expected) total += static_cast<int64_t>(e.size());

  std::atomic<int64_t> seen{0};
  auto results = StreamAll(client.get(), prompts, &seen);
  WaitForTokens(seen, total / 4);
  victim->Signal(SIGSTOP);
  const int64_t detect_ms = WaitForWorkers(client.get(), 1, 5000);
  victim->Signal(SIGCONT);
  ExpectStreamsMatch(results, expected);
  EXPECT_GE(detect_ms, 0);
  auto stats = client->Stats(2000);
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->migrations, 0) << "the stopped worker held streams";
  EXPECT_GE(WaitForWorkers(client.get(), 2, 5000), 0) << "the continued worker re-registers";
  EXPECT_TRUE(victim->WaitForLog("registering again", 5000)) << victim->Log();
}

// 8. kill -9 the router and start another on the same ports: the workers register with it
// within 5 s, no client call hangs past its timeout, and new calls are served.
TEST_F(FailoverTest, RouterRestartWorkersReRegisterAndNoCallHangs) {
  const int frontend_port = testing::FreePort();
  const int backend_port = testing::FreePort();
  StartRouter({}, frontend_port, backend_port, "router1");
  StartWorker("w1");
  StartWorker("w2");
  auto client = Connect(/*timeout_ms=*/3000, /*max_retries=*/5);
  ASSERT_NE(client, nullptr);
  ASSERT_GE(WaitForWorkers(client.get(), 2), 0);
  const std::vector<Prompt> prompts = GreedyPrompts(16, 600, 900);
  std::atomic<int64_t> seen{0};
  std::vector<std::future<std::pair<absl::Status, int64_t>>> calls;
  for (size_t i = 0; i < prompts.size(); ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      const int64_t start = NowMs();
      auto r = client->GenerateStream(ToInput(prompts[i], absl::StrCat("long", i)),
                                      [&](const GenerateChunkOut&) { seen.fetch_add(1); });
      return std::make_pair(r.status(), NowMs() - start);
    }));
  }
  WaitForTokens(seen, 50);
  router_->Signal(SIGKILL);
  EXPECT_NE(router_->Wait(5000), -1000);
  StartRouter({}, frontend_port, backend_port, "router2");
  const int64_t start = NowMs();
  const int64_t reregistered_ms = WaitForWorkers(client.get(), 2, 10000);
  std::cout << "workers registered with the new router after " << reregistered_ms
            << " ms (counted from its start: " << NowMs() - start << " ms)\n";
  EXPECT_GE(reregistered_ms, 0);
  EXPECT_LE(reregistered_ms, 5000);
  for (auto& c : calls) {
    auto [status, took_ms] = c.get();
    // The old router's requests died with it: a clear error, within the 3 s timeout.
    EXPECT_LE(took_ms, 3000 + 500) << status;
    if (!status.ok()) {
      EXPECT_TRUE(absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status)) << status;
    }
  }
  GenerateInput g = ToInput(prompts[0], "after");
  g.sampling.max_tokens = 8;
  auto r = client->Generate(g);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens.size(), 8u);
}

// SIGTERM on the router: new requests are refused `draining`, the one in flight finishes, the
// router drains its worker and both exit 0.
TEST_F(FailoverTest, SigtermOnTheRouterFinishesInFlightWorkThenExits) {
  // A grace far beyond the request's time even on a loaded machine (alone it takes ~10 s).
  StartRouter({"--drain-grace-ms", "60000"});
  // synthetic:small decodes slowly enough that the request is surely still running.
  Subprocess* worker = StartWorker("w1", {"--model", "synthetic:small"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_GE(WaitForWorkers(client.get(), 1), 0);
  Prompt p{{256, 1, 2, 3}, 300};
  std::atomic<int64_t> seen{0};
  auto pending = std::async(std::launch::async, [&] {
    return client->GenerateStream(ToInput(p, "inflight"),
                                  [&](const GenerateChunkOut&) { seen.fetch_add(1); });
  });
  WaitForTokens(seen, 5);
  router_->Signal(SIGTERM);
  ASSERT_TRUE(router_->WaitForLog("draining", 5000));
  const int64_t before = seen.load();
  CallOptions short_call;
  short_call.timeout_ms = 5000;
  auto refused = client->Generate(ToInput(Prompt{{256, 9}, 4}, "late"), short_call);
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_EQ(ErrorReason(refused.status()), reason::kDraining);
  auto r = pending.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens.size(), 300u);
  EXPECT_LT(before, 300) << "the request finished before the drain began";
  EXPECT_EQ(router_->Wait(10000), 0) << router_->Log();
  EXPECT_EQ(worker->Wait(20000), 0) << worker->Log();
}

// 9. Groups of requests sharing long prefixes: prefix_affinity gets a strictly higher
// prefix-cache hit ratio than round_robin (printed with the mean TTFT of both).
TEST_F(FailoverTest, PrefixAffinityHitsTheCacheMoreThanRoundRobin) {
  struct Result {
    double hit_ratio = 0;
    double mean_ttft_ms = 0;
  };
  const auto run = [&](const std::string& placement) {
    Result result;
    StartRouter({"--placement", placement}, 0, 0, "router_" + placement);
    workers_.clear();
    StartWorker(placement + "_w1");
    StartWorker(placement + "_w2");
    auto client = Connect();
    EXPECT_GE(WaitForWorkers(client.get(), 2), 0);
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> tok(0, 255);
    int64_t prompt_tokens = 0, cached_tokens = 0;
    double ttft = 0;
    int n = 0;
    const auto account = [&](const absl::StatusOr<GenerateResult>& r) {
      ASSERT_TRUE(r.ok()) << r.status();
      prompt_tokens += r->usage.prompt_tokens;
      cached_tokens += r->usage.cached_prompt_tokens;
      ttft += r->timings.ttft_ms;
      ++n;
    };
    for (int group = 0; group < 6; ++group) {
      std::vector<int32_t> prefix = {256};
      for (int i = 0; i < 255; ++i) prefix.push_back(tok(rng));
      const auto request = [&](int i) {
        GenerateInput g;
        g.request_id = absl::StrCat("g", group, "_", i);
        g.token_ids = prefix;
        for (int j = 0; j < 8; ++j) g.token_ids.push_back(tok(rng));
        g.sampling.max_tokens = 2;
        g.sampling.temperature = 0;
        g.sampling.ignore_eos = true;
        return g;
      };
      account(client->Generate(request(0)));  // leaves the prefix in one worker's cache
      std::vector<GenerateInput> rest;
      for (int i = 1; i < 6; ++i) rest.push_back(request(i));
      std::vector<std::future<absl::StatusOr<GenerateResult>>> calls;
      for (auto& g : rest) {
        calls.push_back(std::async(std::launch::async, [&, g] { return client->Generate(g); }));
      }
      for (auto& c : calls) account(c.get());
    }
    result.hit_ratio = static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens);
    result.mean_ttft_ms = ttft / n;
    std::cout << placement << ": prefix-cache hit ratio " << result.hit_ratio << ", mean TTFT "
              << result.mean_ttft_ms << " ms\n";
    return result;
  };
  const Result rr = run("round_robin");
  const Result affinity = run("prefix_affinity");
  EXPECT_GT(affinity.hit_ratio, rr.hit_ratio);
}

}  // namespace
}  // namespace carpool
