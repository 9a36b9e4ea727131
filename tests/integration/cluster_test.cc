// The cluster as users run it: carpool-router and carpool-worker processes on ephemeral
// loopback ports, driven through the C++ SDK.
#include <unistd.h>

#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include "client/carpool_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/cluster.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"
#include "text/hf_tokenizer.h"
#include "text/test_tokenizer_json.h"
#include "worker/engine.h"

namespace carpool {
namespace {

using testing::RouterEndpoints;
using testing::Subprocess;

const std::string kBin = CARPOOL_BIN_DIR;

class ClusterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    workers_.clear();
    router_.reset();
  }

  std::string Log(const std::string& name) { return dir_.Log(name); }

  // Starts the router; with backend_port 0 it picks its own ports.
  void StartRouter(int backend_port = 0) {
    RouterEndpoints ep;
    ASSERT_NO_FATAL_FAILURE(testing::StartRouterProcess(
        kBin, testing::LoopbackEndpoint(0), testing::LoopbackEndpoint(backend_port), {},
        Log("router"), &router_, &ep));
    frontend_ = ep.frontend;
    backend_ = ep.backend;
  }

  Subprocess* StartWorker(const std::string& name, const std::string& backend,
                          std::vector<std::string> extra = {}) {
    workers_.push_back(std::make_unique<Subprocess>(
        testing::WorkerArgv(kBin, backend, name, /*max_model_len=*/1024, extra), Log(name)));
    return workers_.back().get();
  }

  std::unique_ptr<Client> Connect() {
    ClientOptions o;
    o.router_endpoint = frontend_;
    o.default_timeout_ms = 30000;
    return testing::ConnectClient(o);
  }

  // Waits up to 10 s until the router lists `n` workers (or more).
  void WaitForWorkers(Client* c, int n) {
    const int64_t ms = testing::WaitForStats(
        c, [n](const StatsOut& s) { return static_cast<int>(s.workers.size()) >= n; },
        /*timeout_ms=*/10000, /*poll_ms=*/50, /*stats_timeout_ms=*/1000);
    if (ms < 0) FAIL() << "workers did not register";
  }

  testing::TestDir dir_{"carpool_cluster_test"};
  std::unique_ptr<Subprocess> router_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::string frontend_, backend_;
};

struct Prompt {
  std::vector<int32_t> ids;
  int max_tokens;
  float temperature;
  uint64_t seed;
};

std::vector<Prompt> MixedPrompts(int n) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> out(1, 24);
  std::vector<Prompt> prompts;
  for (int i = 0; i < n; ++i) {
    Prompt p;
    p.ids = testing::RandomPromptIds(rng, 1, 60);
    p.max_tokens = out(rng);
    p.temperature = i % 2 ? 0.8f : 0.0f;
    p.seed = 500 + i;
    prompts.push_back(std::move(p));
  }
  return prompts;
}

GenerateInput ToInput(const Prompt& p, const std::string& id, bool stream) {
  GenerateInput g;
  g.request_id = id;
  g.token_ids = p.ids;
  g.sampling.max_tokens = p.max_tokens;
  g.sampling.temperature = p.temperature;
  g.sampling.has_seed = true;
  g.sampling.seed = p.seed;
  g.sampling.ignore_eos = true;
  g.stream = stream;
  return g;
}

TEST_F(ClusterTest, ConcurrentStreamsEqualInProcessRunsOnBothWorkers) {
  StartRouter();
  StartWorker("w1", backend_);
  StartWorker("w2", backend_);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  WaitForWorkers(client.get(), 2);

  const std::vector<Prompt> prompts = MixedPrompts(64);
  std::vector<std::future<std::pair<absl::Status, std::vector<int32_t>>>> results;
  for (size_t i = 0; i < prompts.size(); ++i) {
    results.push_back(std::async(std::launch::async, [&, i] {
      std::vector<int32_t> streamed;
      int expected_index = 0;
      bool in_order = true;
      auto r = client->GenerateStream(ToInput(prompts[i], "p" + std::to_string(i), true),
                                      [&](const GenerateChunkOut& chunk) {
                                        in_order &= chunk.index == expected_index;
                                        for (const auto& t : chunk.tokens) {
                                          streamed.push_back(t.token);
                                          ++expected_index;
                                        }
                                      });
      if (!r.ok()) return std::make_pair(r.status(), streamed);
      absl::Status s;
      if (!in_order) s = absl::InternalError("chunks out of order");
      if (r->usage.completion_tokens != static_cast<int>(streamed.size()) ||
          r->usage.prompt_tokens != static_cast<int>(prompts[i].ids.size())) {
        s = absl::InternalError("usage does not match the stream");
      }
      return std::make_pair(s, streamed);
    }));
  }

  auto engine = testing::SyntheticTinyEngine(/*max_model_len=*/1024);
  ASSERT_TRUE(engine.ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto [status, streamed] = results[i].get();
    ASSERT_TRUE(status.ok()) << "prompt " << i << ": " << status;
    worker::EngineRequest r;
    r.prompt_tokens = prompts[i].ids;
    r.sampling.max_tokens = prompts[i].max_tokens;
    r.sampling.temperature = prompts[i].temperature;
    r.sampling.has_seed = true;
    r.sampling.seed = prompts[i].seed;
    r.sampling.ignore_eos = true;
    auto alone = (*engine)->Generate({r});
    ASSERT_TRUE(alone[0].ok());
    EXPECT_EQ(streamed, alone[0]->tokens) << "prompt " << i;
  }
  auto stats = client->Stats(2000);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->workers.size(), 2u);
  for (const auto& w : stats->workers) EXPECT_GT(w.requests_served, 0) << w.worker_id;
}

TEST_F(ClusterTest, CancelMidStreamFreesTheWorkersBlocks) {
  StartRouter();
  // synthetic:small decodes slowly enough on this machine that the stream is surely mid-way.
  StartWorker("w1", backend_, {"--model", "synthetic:small", "--threads", "1"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  WaitForWorkers(client.get(), 1);
  Prompt p{{256, 1, 2, 3}, 1000, 0, 1};
  auto stream = client->StartStream(ToInput(p, "long", true));
  ASSERT_TRUE(stream.ok()) << stream.status();
  int tokens = 0;
  while (tokens < 5) {
    auto next = (*stream)->Next(10000);
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_TRUE(next->has_value());
    tokens += static_cast<int>((*next)->tokens.size());
  }
  bool busy = false;
  for (int i = 0; i < 50 && !busy; ++i) {
    auto s = client->Stats(1000);
    busy = s.ok() && !s->workers.empty() && s->workers[0].kv_used_blocks > 0;
  }
  EXPECT_TRUE(busy) << "the worker never reported blocks in use";
  (*stream)->Cancel();
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    auto s = client->Stats(1000);
    freed = s.ok() && s->workers.size() == 1 && s->workers[0].kv_used_blocks == 0 &&
            s->workers[0].running == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(freed);
}

// A stop string on a text prompt (tokenized by the router): the stream ends right at it, with
// the text before it, and the worker drops the sequence at once, so its blocks free long before
// the 1000 tokens it was asked for.
TEST_F(ClusterTest, AStopStringEndsTheStreamAtItAndFreesTheWorkersBlocks) {
  StartRouter();
  StartWorker("w1", backend_, {"--model", "synthetic:small", "--threads", "1"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  WaitForWorkers(client.get(), 1);
  GenerateInput g;
  g.request_id = "probe";
  g.has_text = true;
  g.text = "Hello there";
  g.sampling.max_tokens = 40;
  g.sampling.temperature = 0;
  g.sampling.ignore_eos = true;
  auto probe = client->Generate(g);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->usage.prompt_tokens, 12);  // BOS + 11 bytes, counted by the router
  // The stop string: how the byte tokenizer writes the 4th token (this model's ids are past the
  // byte range: "<|id|>"); the stream must end where that id first appears (greedy: the same
  // again).
  ASSERT_EQ(probe->tokens.size(), 40u);
  const int32_t id = probe->tokens[3].token;
  ASSERT_GT(id, ByteTokenizer::kEos) << "a token in the byte range";
  const std::string stop = "<|" + std::to_string(id) + "|>";
  size_t k = 0;
  while (probe->tokens[k].token != id) ++k;
  const std::string expected = probe->text.substr(0, probe->text.find(stop));
  g.request_id = "stopped";
  g.sampling.max_tokens = 1000;
  g.stop = {stop};
  std::string streamed;
  auto r = client->GenerateStream(g, [&](const GenerateChunkOut& c) { streamed += c.text; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->finish_reason, "stop");
  EXPECT_EQ(r->stop_string, stop);
  EXPECT_EQ(r->usage.completion_tokens, static_cast<int>(k) + 1);
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(r->text, expected);
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    auto s = client->Stats(1000);
    freed = s.ok() && s->workers.size() == 1 && s->workers[0].kv_used_blocks == 0 &&
            s->workers[0].running == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(freed);
}

// A Hugging Face folder (a tiny checkpoint and a byte-level BPE tokenizer.json) served by a
// router that has no copy of it: the worker hands its tokenizer over, and the router's ids for a
// text prompt, its streamed text and its stop strings are those of the same tokenizer here.
TEST_F(ClusterTest, AFoldersHandedOverTokenizerServesTextStreamsAndStops) {
  const std::string dir = (dir_.path() / "hf").string();
  testing::CheckpointSpec spec;
  spec.config = testing::TinyTestConfig();
  ASSERT_TRUE(testing::WriteCheckpoint(dir, spec).ok());
  const std::string json = text::TestTokenizerJson().dump();
  ASSERT_TRUE(testing::WriteFile(dir + "/tokenizer.json", json).ok());
  ASSERT_TRUE(testing::WriteFile(dir + "/tokenizer_config.json", "{}").ok());
  auto tokenizer = text::HfTokenizer::FromJson(json, "{}");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  StartRouter();
  StartWorker("w1", backend_, {"--model", dir, "--threads", "1", "--max-model-len", "256"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  WaitForWorkers(client.get(), 1);
  GenerateInput g;
  g.request_id = "whole";
  g.has_text = true;
  g.text = " hi there, hi";
  g.sampling.max_tokens = 24;
  g.sampling.temperature = 0;
  g.sampling.ignore_eos = true;
  auto whole = client->Generate(g);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto ids = (*tokenizer)->Encode(g.text, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(whole->usage.prompt_tokens, static_cast<int>(ids->size()));
  ASSERT_EQ(whole->tokens.size(), 24u);
  EXPECT_EQ(whole->text, (*tokenizer)->Decode(whole->TokenIds(), true));
  g.request_id = "streamed";
  g.stream = true;
  std::string streamed;
  auto r = client->GenerateStream(g, [&](const GenerateChunkOut& c) { streamed += c.text; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->TokenIds(), whole->TokenIds());
  EXPECT_EQ(streamed, whole->text);
  // A stop string from the middle of that text ends the stream right before it.
  // (One whole character: stop strings are UTF-8.)
  size_t at = whole->text.size() / 2;
  while (at > 0 && (static_cast<unsigned char>(whole->text[at]) & 0xC0) == 0x80) --at;
  size_t end = at + 1;
  while (end < whole->text.size() &&
         (static_cast<unsigned char>(whole->text[end]) & 0xC0) == 0x80) {
    ++end;
  }
  const std::string stop = whole->text.substr(at, end - at);
  const std::string expected = whole->text.substr(0, whole->text.find(stop));
  g.request_id = "stopped";
  g.stop = {stop};
  streamed.clear();
  r = client->GenerateStream(g, [&](const GenerateChunkOut& c) { streamed += c.text; });
  ASSERT_TRUE(r.ok()) << r.status() << " (stop: " << stop << ")";
  EXPECT_EQ(r->finish_reason, "stop");
  EXPECT_EQ(r->stop_string, stop);
  EXPECT_EQ(streamed, expected);
  EXPECT_LT(r->usage.completion_tokens, 24);
}

TEST_F(ClusterTest, WorkersStartedBeforeAndAfterTheRouterBothServe) {
  const int port = testing::FreePort();
  const std::string backend = "tcp://127.0.0.1:" + std::to_string(port);
  StartWorker("early", backend);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  StartRouter(port);
  StartWorker("late", backend_);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  WaitForWorkers(client.get(), 2);
  std::vector<std::future<absl::StatusOr<GenerateResult>>> calls;
  for (int i = 0; i < 16; ++i) {
    Prompt p{{256, i}, 8, 0, 1};
    calls.push_back(std::async(std::launch::async, [&, p, i] {
      return client->Generate(ToInput(p, "r" + std::to_string(i), false));
    }));
  }
  for (auto& c : calls) {
    auto r = c.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens.size(), 8u);
  }
  auto stats = client->Stats(2000);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->workers.size(), 2u);
  for (const auto& w : stats->workers) EXPECT_GT(w.requests_served, 0) << w.worker_id;
}

TEST_F(ClusterTest, SigtermDrainsAWorkerAndEveryProcessExitsCleanly) {
  StartRouter();
  Subprocess* w = StartWorker("w1", backend_);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  WaitForWorkers(client.get(), 1);
  Prompt p{{256, 7}, 200, 0, 1};
  auto pending = std::async(std::launch::async,
                            [&] { return client->Generate(ToInput(p, "drain", false)); });
  ASSERT_TRUE(w->WaitForLog("", 100));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(w->Terminate(10000), 0) << w->Log();
  auto r = pending.get();
  ASSERT_TRUE(r.ok()) << r.status();  // the running request finished before the worker left
  EXPECT_EQ(r->tokens.size(), 200u);
  EXPECT_EQ(router_->Terminate(5000), 0) << router_->Log();
}

}  // namespace
}  // namespace carpool
