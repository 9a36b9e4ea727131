// Embeddings as users get them: carpool-router and carpool-worker processes on ephemeral loopback
// ports, driven through the C++ SDK. Batched answers equal one-by-one answers and an independent
// float64 computation; a generation keeps streaming while embeddings are served; an embed whose
// worker dies is answered by another worker.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include "client/carpool_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"

namespace carpool {
namespace {

using testing::RouterEndpoints;
using testing::Subprocess;
using testing::WaitForRouterEndpoints;
using SteadyClock = std::chrono::steady_clock;

const std::string kBin = CARPOOL_BIN_DIR;

double MillisSince(SteadyClock::time_point t) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t).count();
}


class EmbedClusterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    client_.reset();
    workers_.clear();
    router_.reset();
  }

  std::string Log(const std::string& name) { return dir_.Log(name); }

  void StartRouter(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {kBin + "/carpool-router", "--frontend", "tcp://127.0.0.1:*",
                                     "--backend", "tcp://127.0.0.1:*"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    router_ = std::make_unique<Subprocess>(argv, Log("router"));
    RouterEndpoints ep;
    ASSERT_TRUE(WaitForRouterEndpoints(*router_, &ep)) << router_->Log();
    frontend_ = ep.frontend;
    backend_ = ep.backend;
    ClientOptions o;
    o.router_endpoint = frontend_;
    o.default_timeout_ms = 60000;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  Subprocess* StartWorker(const std::string& name, const std::string& model,
                          std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {kBin + "/carpool-worker", "--router", backend_, "--model",
                                     model, "--worker-id", name};
    argv.insert(argv.end(), extra.begin(), extra.end());
    workers_.push_back(std::make_unique<Subprocess>(argv, Log(name)));
    return workers_.back().get();
  }

  // Waits until the router lists `n` workers.
  void WaitForWorkers(size_t n) {
    for (int i = 0; i < 300; ++i) {
      auto s = client_->Stats(1000);
      if (s.ok() && s->workers.size() >= n) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "workers did not register";
  }

  static EmbedInput Ids(std::vector<std::vector<int32_t>> inputs, Pooling pooling,
                        bool normalize) {
    EmbedInput in;
    for (auto& ids : inputs) in.inputs.push_back({false, "", std::move(ids)});
    in.pooling = pooling;
    in.normalize = normalize;
    return in;
  }

  testing::TestDir dir_{"carpool_embed_test"};
  std::unique_ptr<Subprocess> router_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::string frontend_, backend_;
  std::unique_ptr<Client> client_;
};

// (a) 50 inputs as 50 concurrent calls (batched by the worker) equal the same inputs one by one,
// and both equal a float64 computation from the checkpoint's numbers.
TEST_F(EmbedClusterTest, ConcurrentEqualsOneByOneEqualsFloat64Reference) {
  testing::CheckpointSpec spec;
  spec.config = testing::TinyTestConfig();
  spec.seed = 42;
  const std::string model = (dir_.path() / "model").string();
  auto tensors = testing::WriteCheckpoint(model, spec);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, std::vector<float>> values;
  for (auto& [name, t] : *tensors) values[name] = t.values;
  const testing::ReferenceLlama reference(spec.config, std::move(values));

  ASSERT_NO_FATAL_FAILURE(StartRouter());
  StartWorker("w1", model,
              {"--embed-max-batch-size", "16", "--embed-max-wait-ms", "20", "--max-model-len",
               "256"});
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(1));

  constexpr int kInputs = 50;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(1, 48), tok(3, 299);
  std::vector<std::vector<int32_t>> inputs(kInputs);
  for (auto& ids : inputs) {
    ids.resize(len(rng));
    for (int32_t& t : ids) t = tok(rng);
  }
  const auto pooling = [](int i) { return i % 2 == 0 ? Pooling::kMean : Pooling::kLast; };
  const auto normalize = [](int i) { return i % 5 != 0; };

  std::vector<std::future<absl::StatusOr<EmbedResult>>> concurrent;
  for (int i = 0; i < kInputs; ++i) {
    concurrent.push_back(std::async(std::launch::async, [&, i] {
      return client_->Embed(Ids({inputs[i]}, pooling(i), normalize(i)));
    }));
  }
  std::vector<std::vector<float>> batched(kInputs);
  for (int i = 0; i < kInputs; ++i) {
    absl::StatusOr<EmbedResult> r = concurrent[i].get();
    ASSERT_TRUE(r.ok()) << "input " << i << ": " << r.status();
    ASSERT_EQ(r->embeddings.size(), 1u);
    EXPECT_EQ(r->usage.prompt_tokens, static_cast<int>(inputs[i].size()));
    batched[i] = r->embeddings[0];
  }
  double max_batch_diff = 0, max_reference_diff = 0;
  for (int i = 0; i < kInputs; ++i) {
    absl::StatusOr<EmbedResult> alone = client_->Embed(Ids({inputs[i]}, pooling(i), normalize(i)));
    ASSERT_TRUE(alone.ok()) << alone.status();
    const std::vector<float>& one = alone->embeddings.at(0);
    const std::vector<double> expected = reference.Embedding(inputs[i], pooling(i), normalize(i));
    ASSERT_EQ(one.size(), expected.size());
    ASSERT_EQ(batched[i].size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      max_batch_diff = std::max(max_batch_diff, std::abs(double{batched[i][k]} - one[k]));
      max_reference_diff = std::max(max_reference_diff, std::abs(one[k] - expected[k]));
    }
  }
  EXPECT_LE(max_batch_diff, 1e-5);
  // float32 kernels against float64 on a 2-layer model: ~1e-6 relative; 1e-4 leaves room for
  // accumulation order without hiding a wrong pooling or a missing norm (those are O(0.1)).
  EXPECT_LE(max_reference_diff, 1e-4);

  // A multi-input request answers in input order, with the same numbers.
  std::vector<std::vector<int32_t>> first_three(inputs.begin(), inputs.begin() + 3);
  absl::StatusOr<EmbedResult> many = client_->Embed(Ids(first_three, Pooling::kMean, true));
  ASSERT_TRUE(many.ok()) << many.status();
  ASSERT_EQ(many->embeddings.size(), 3u);
  const std::vector<double> expected = reference.Embedding(inputs[2], Pooling::kMean, true);
  for (size_t k = 0; k < expected.size(); ++k) {
    EXPECT_NEAR(many->embeddings[2][k], expected[k], 1e-4);
  }
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->inflight, 0);
  EXPECT_EQ(stats->queued, 0);
}

// (b) A generation keeps streaming while embeddings are served: the largest gap between its
// tokens stays below the largest step time seen without embeddings plus one embedding batch.
TEST_F(EmbedClusterTest, GenerationKeepsStreamingUnderEmbeddingLoad) {
  ASSERT_NO_FATAL_FAILURE(StartRouter());
  StartWorker("w1", "synthetic:tiny",
              {"--embed-max-batch-size", "16", "--embed-max-wait-ms", "1", "--max-model-len",
               "2048"});
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(1));
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> tok(0, 255);
  const auto batch_input = [&] {
    std::vector<std::vector<int32_t>> inputs(16, std::vector<int32_t>(256));
    for (auto& ids : inputs) {
      for (int32_t& t : ids) t = tok(rng);
    }
    return Ids(std::move(inputs), Pooling::kMean, true);
  };
  // One embedding batch alone (16 inputs of 256 tokens = one full batch), best of 3.
  double batch_ms = 1e9;
  for (int i = 0; i < 3; ++i) {
    const auto t = SteadyClock::now();
    ASSERT_TRUE(client_->Embed(batch_input()).ok());
    batch_ms = std::min(batch_ms, MillisSince(t));
  }
  // The largest gap between tokens of a generation alone.
  const auto stream_gaps = [&](int max_tokens, const std::function<void()>& while_running) {
    GenerateInput g;
    g.token_ids = {256, 1, 2, 3};
    g.sampling.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    g.sampling.ignore_eos = true;
    auto stream = client_->StartStream(g);
    EXPECT_TRUE(stream.ok());
    double max_gap = 0;
    int tokens = 0;
    SteadyClock::time_point last;
    std::thread load;
    for (;;) {
      absl::StatusOr<std::optional<GenerateChunkOut>> c = (*stream)->Next();
      EXPECT_TRUE(c.ok()) << c.status();
      if (!c.ok() || !c->has_value()) break;
      const auto now = SteadyClock::now();
      if (tokens == 1 && while_running) load = std::thread(while_running);
      if (tokens >= 2) {  // from the third token: decode steps only
        max_gap = std::max(max_gap, std::chrono::duration<double, std::milli>(now - last).count());
      }
      last = now;
      ++tokens;
    }
    if (load.joinable()) load.join();
    EXPECT_EQ(tokens, max_tokens);
    return max_gap;
  };
  // Noise on a shared machine only ever lengthens gaps, while a policy that let embedding
  // batches pile up between steps would exceed the bound every time (gaps of several batches):
  // so up to three attempts, each measured afresh, and one within the bound passes.
  double step_ms = 0, mixed_gap_ms = 0, bound_ms = 0;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    step_ms = stream_gaps(300, nullptr);
    int embeds_done = 0;
    mixed_gap_ms = stream_gaps(600, [&] {
      for (int i = 0; i < 6; ++i) {
        absl::StatusOr<EmbedResult> r = client_->Embed(batch_input());
        EXPECT_TRUE(r.ok()) << r.status();
        embeds_done += r.ok();
      }
    });
    EXPECT_EQ(embeds_done, 6);
    // The worker runs at most one embedding batch between two decode steps, so a gap holds at
    // most one step and one batch. The measured batch_ms includes the client round trip (an
    // upper bound on the batch); 2x + 50 ms absorbs the scheduler noise of a shared 2-core
    // machine (a stalled generation would show gaps of several batches: 6 x batch_ms).
    bound_ms = 2 * (step_ms + batch_ms) + 50;
    std::cout << "attempt " << attempt << ": largest gap alone " << step_ms << " ms, one batch "
              << batch_ms << " ms, largest gap under embedding load " << mixed_gap_ms
              << " ms (bound " << bound_ms << " ms)\n";
    if (mixed_gap_ms < bound_ms) break;
  }
  EXPECT_LT(mixed_gap_ms, bound_ms) << "step " << step_ms << " ms, batch " << batch_ms << " ms";
  RecordProperty("step_ms", std::to_string(step_ms));
  RecordProperty("batch_ms", std::to_string(batch_ms));
  RecordProperty("mixed_gap_ms", std::to_string(mixed_gap_ms));
}

// A worker killed with an embed in flight: the router re-dispatches it to another worker, and
// the client gets the answer the first worker would have given.
TEST_F(EmbedClusterTest, EmbedOfAKilledWorkerIsAnsweredByAnother) {
  ASSERT_NO_FATAL_FAILURE(StartRouter({"--heartbeat-timeout-ms", "500"}));
  Subprocess* a = StartWorker("a", "synthetic:tiny", {"--embed-max-batch-size", "4"});
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(1));
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(0, 255);
  std::vector<std::vector<int32_t>> inputs(64, std::vector<int32_t>(1024));
  for (auto& ids : inputs) {
    for (int32_t& t : ids) t = tok(rng);
  }
  const EmbedInput request = Ids(inputs, Pooling::kMean, true);
  // Freeze "a" as soon as it holds the request (64 inputs of 1024 tokens take it far longer
  // than the few ms until the stop), then start "b" and kill "a".
  auto result = std::async(std::launch::async, [&] { return client_->Embed(request); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  a->Signal(SIGSTOP);
  ASSERT_EQ(result.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "worker a finished before it could be stopped";
  StartWorker("b", "synthetic:tiny", {"--embed-max-batch-size", "4"});
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // a is declared dead
  a->Signal(SIGKILL);
  absl::StatusOr<EmbedResult> r = result.get();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->embeddings.size(), inputs.size());
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->migrations, 1);
  EXPECT_EQ(stats->inflight, 0);
  // The same request again (served by b alone) gives the same numbers.
  absl::StatusOr<EmbedResult> again = client_->Embed(request);
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (size_t k = 0; k < r->embeddings[i].size(); ++k) {
      ASSERT_NEAR(r->embeddings[i][k], again->embeddings[i][k], 1e-5) << i;
    }
  }
}

}  // namespace
}  // namespace carpool
