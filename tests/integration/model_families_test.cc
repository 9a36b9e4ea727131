// The newer model families end to end (issue 15): for each family preset (synthetic:qwen3-tiny,
// gemma3-tiny, mistral-tiny) written as a checkpoint, the engine's greedy tokens and logprobs
// equal the float64 reference (tests/testing/reference_llama.h, written from the transformers
// semantics) within kLogprobTolerance: every prompt alone and all of them batched together, with
// prompts and generations longer than the sliding window, prefill chunks that split prompts
// across the window boundary, prefix-cache hits, preemption and recompute, and tensor
// parallelism of two ranks (two threads of this process over an in-process communicator), and
// on a device that hides its host memory (the host transfers a GPU makes), also under TP.
// Embeddings of every family equal the reference's too, also under TP.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster/communicator.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "tests/testing/no_host_memory_device.h"
#include "tests/testing/reference_llama.h"
#include "tests/testing/reference_parity.h"
#include "worker/engine.h"
#include "worker/mpi_worker.h"
#include "worker/weights/model_config.h"
#include "worker/weights/weights.h"

namespace carpool {
namespace {

using worker::Completion;
using worker::Engine;
using worker::EngineOptions;
using worker::EngineRequest;
using worker::ModelConfig;

// fp32 kernels against float64 on 2-4 tiny layers: a few 1e-6 in practice.
constexpr double kLogprobTolerance = 1e-4;
constexpr double kEmbeddingTolerance = 1e-4;

// ---- an in-process tensor-parallel group: one thread per rank ----------------------------------

// The state the ranks of one group share. Every collective is an exchange: each rank posts its
// buffer, waits for all, reads the others' (summing in rank order), and waits again before it
// leaves, so no buffer is reused while a peer still reads it.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), posted_(size) {}
  int size() const { return size_; }

  void Exchange(int rank, const void* mine,
                const std::function<void(const std::vector<const void*>&)>& read) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted_[rank] = mine;
    }
    Barrier();
    read(posted_);
    Barrier();
  }

  void Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<const void*> posted_;
};

class ThreadCommunicator : public cluster::Communicator {
 public:
  ThreadCommunicator(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  absl::Status AllReduceSum(float* data, int64_t count) override {
    std::vector<float> sum(count, 0.0f);
    group_->Exchange(rank_, data, [&](const std::vector<const void*>& all) {
      for (const void* p : all) {
        const float* x = static_cast<const float*>(p);
        for (int64_t i = 0; i < count; ++i) sum[i] += x[i];
      }
    });
    std::copy(sum.begin(), sum.end(), data);
    return absl::OkStatus();
  }
  absl::Status AllGather(const float* send, int64_t count, float* recv) override {
    group_->Exchange(rank_, send, [&](const std::vector<const void*>& all) {
      for (size_t r = 0; r < all.size(); ++r) {
        std::memcpy(recv + r * count, all[r], count * sizeof(float));
      }
    });
    return absl::OkStatus();
  }
  absl::Status Gather(const float* send, int64_t count, float* recv, int root) override {
    group_->Exchange(rank_, send, [&](const std::vector<const void*>& all) {
      if (rank_ != root) return;
      for (size_t r = 0; r < all.size(); ++r) {
        std::memcpy(recv + r * count, all[r], count * sizeof(float));
      }
    });
    return absl::OkStatus();
  }
  // Waits as long as it takes (the tests join every thread).
  absl::Status Broadcast(void* data, int64_t bytes, int root, absl::Duration) override {
    group_->Exchange(rank_, data, [&](const std::vector<const void*>& all) {
      if (rank_ != root) std::memcpy(data, all[root], bytes);
    });
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    group_->Barrier();
    return absl::OkStatus();
  }
  absl::Duration timeout() const override { return absl::Seconds(60); }

 private:
  ThreadGroup* const group_;
  const int rank_;
};

// ---- the families ---------------------------------------------------------------------------

// A family preset written as an F32 checkpoint, and the reference over the same tensors.
class Family {
 public:
  explicit Family(const std::string& preset) : dir_("carpool_model_families_" + preset) {
    testing::CheckpointSpec spec;
    spec.config = worker::SyntheticConfig(preset).value();
    spec.config.max_position_embeddings = 512;
    spec.seed = 11;
    config_ = spec.config;
    absl::StatusOr<testing::CheckpointTensors> tensors =
        testing::WriteCheckpoint(dir_.path().string(), spec);
    EXPECT_TRUE(tensors.ok()) << tensors.status();
    parity_ = std::make_unique<testing::ReferenceParity>(
        testing::ReferenceLlama(config_,
                                testing::RawValues(tensors.value_or(testing::CheckpointTensors{}))),
        Prompts(), window(), kLogprobTolerance);
  }

  const ModelConfig& config() const { return config_; }
  std::string path() const { return dir_.path().string(); }
  // The window prompts are measured against (16 for a family without one).
  int window() const { return config_.sliding_window > 0 ? config_.sliding_window : 16; }

  const std::vector<std::vector<int32_t>>& prompts() const { return parity_->prompts(); }
  std::vector<EngineRequest> Requests() const { return parity_->Requests(); }
  // Each completion against the reference: same tokens, logprobs within kLogprobTolerance.
  void ExpectReference(const std::vector<absl::StatusOr<Completion>>& got, const char* what) {
    parity_->ExpectMatches(got, what);
  }

  // Engine options: blocks of 4 tokens and prefill chunks of 6 (windows of 8 and 16 fall inside
  // chunks), as many sequences as prompts.
  EngineOptions Options() const {
    EngineOptions o;
    o.model = path();
    o.block_size = 4;
    o.scheduler.max_model_len = 256;
    o.scheduler.max_num_batched_tokens = 6;
    o.scheduler.max_num_seqs = 8;
    o.num_kv_blocks = 400;
    o.num_threads = 2;
    return o;
  }

  // The engine's embeddings of the prompts (mean and last pooling, normalized or not) against
  // the reference's, within kEmbeddingTolerance.
  void ExpectEmbeddings(Engine* engine, const char* what) {
    const std::vector<std::vector<int32_t>>& prompts = parity_->prompts();
    std::vector<worker::EmbeddingInput> inputs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      worker::EmbeddingInput in;
      in.tokens = prompts[i];
      in.pooling = i % 2 == 0 ? Pooling::kMean : Pooling::kLast;
      in.normalize = i % 3 != 0;
      inputs.push_back(in);
    }
    std::vector<const worker::EmbeddingInput*> batch;
    for (const worker::EmbeddingInput& in : inputs) batch.push_back(&in);
    absl::StatusOr<std::vector<std::vector<float>>> got = engine->Embed(batch);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::vector<double> want =
          parity_->reference().Embedding(inputs[i].tokens, inputs[i].pooling, inputs[i].normalize);
      ASSERT_EQ((*got)[i].size(), want.size()) << what;
      for (size_t k = 0; k < want.size(); ++k) {
        ASSERT_NEAR((*got)[i][k], want[k], kEmbeddingTolerance * (1 + std::abs(want[k])))
            << what << ", input " << i << ", element " << k;
      }
    }
  }

 private:
  // Prompts around and past the window (WindowPrompts), and one sharing the longest one's first
  // 2 windows.
  std::vector<std::vector<int32_t>> Prompts() const {
    const int w = window();
    std::mt19937 rng(17);
    std::vector<std::vector<int32_t>> prompts = testing::WindowPrompts(rng, config_.vocab_size, w);
    std::uniform_int_distribution<int32_t> token(3, config_.vocab_size - 1);
    std::vector<int32_t> shared(prompts.back().begin(), prompts.back().begin() + 2 * w);
    for (int i = 0; i < 5; ++i) shared.push_back(token(rng));
    prompts.push_back(shared);
    return prompts;
  }

  testing::ScratchDir dir_;
  ModelConfig config_;
  std::unique_ptr<testing::ReferenceParity> parity_;
};

using testing::MakeEngine;

class ModelFamiliesTest : public ::testing::TestWithParam<std::string> {
 protected:
  Family& family() {
    if (family_ == nullptr) family_ = std::make_unique<Family>(GetParam());
    return *family_;
  }

 private:
  std::unique_ptr<Family> family_;
};

TEST_P(ModelFamiliesTest, PresetHasTheFamilysFeatures) {
  const ModelConfig& c = family().config();
  if (GetParam() == "mistral-tiny") {
    EXPECT_GT(c.sliding_window, 0);
    EXPECT_TRUE(c.layer_sliding.empty());  // every layer slides
  } else if (GetParam() == "qwen3-tiny") {
    EXPECT_TRUE(c.qk_norm);
    EXPECT_NE(c.head_dim * c.num_heads, c.hidden_size);
  } else {
    EXPECT_TRUE(c.qk_norm && c.sandwich_norms && c.norm_weight_plus_one);
    EXPECT_EQ(c.hidden_activation, worker::Activation::kGeluTanh);
    EXPECT_GT(c.sliding_window, 0);
    EXPECT_GT(c.attn_logit_softcapping, 0.0);
    EXPECT_GT(c.final_logit_softcapping, 0.0);
  }
  // The prompts reach past the window, with a prefix-sharing pair.
  EXPECT_GT(family().prompts()[4].size(), 3u * family().window());
}

TEST_P(ModelFamiliesTest, AloneAndBatchedMatchTheReference) {
  Family& f = family();
  std::unique_ptr<Engine> engine = MakeEngine(f.Options());
  ASSERT_NE(engine, nullptr);
  std::vector<absl::StatusOr<Completion>> alone;
  for (EngineRequest& r : f.Requests()) alone.push_back(std::move(engine->Generate({r})[0]));
  f.ExpectReference(alone, "alone");

  // All together on a fresh engine: decodes beside prefill chunks in every step.
  EngineOptions o = f.Options();
  o.enable_prefix_caching = false;
  std::unique_ptr<Engine> batched = MakeEngine(o);
  ASSERT_NE(batched, nullptr);
  f.ExpectReference(batched->Generate(f.Requests()), "batched");
}

TEST_P(ModelFamiliesTest, PrefixCacheHitsMatchTheReference) {
  Family& f = family();
  std::unique_ptr<Engine> engine = MakeEngine(f.Options());
  ASSERT_NE(engine, nullptr);
  f.ExpectReference(engine->Generate(f.Requests()), "first round");
  const std::vector<absl::StatusOr<Completion>> again = engine->Generate(f.Requests());
  f.ExpectReference(again, "second round");
  int cached = 0;
  for (const auto& c : again) cached += c.ok() ? c->cached_prompt_tokens : 0;
  EXPECT_GT(cached, 0);
}

TEST_P(ModelFamiliesTest, PreemptionAndRecomputeMatchTheReference) {
  Family& f = family();
  EngineOptions o = f.Options();
  o.scheduler.max_num_batched_tokens = 32;
  o.num_kv_blocks = 24;  // 96 slots for six requests of up to ~100 tokens
  std::unique_ptr<Engine> engine = MakeEngine(o);
  ASSERT_NE(engine, nullptr);
  f.ExpectReference(engine->Generate(f.Requests()), "preempted");
  EXPECT_GT(engine->scheduler().num_preemptions(), 0);
  EXPECT_EQ(engine->kv_cache().num_used_blocks(), 0);
}

// Two ranks, each on a CPU device (collectives in place) or, `staged`, on one that hides its
// host memory (every collective and the logits go ToHost -> host -> FromHost, a GPU's path).
void ExpectTensorParallelMatches(Family& f, bool staged) {
  const ModelConfig& c = f.config();
  ThreadGroup group(2);
  ThreadCommunicator leader_comm(&group, 0), follower_comm(&group, 1);
  EngineOptions o = f.Options();
  o.num_threads = 1;
  const auto device = [staged]() -> std::unique_ptr<worker::ModelDevice> {
    if (!staged) return nullptr;
    return std::make_unique<testing::NoHostMemoryDevice>();
  };
  std::thread follower([&] {
    EngineOptions fo = o;
    fo.tensor_parallel_group = &follower_comm;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(fo, nullptr, device());
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_TRUE(worker::RunFollower(&(*engine)->model(), &follower_comm).ok());
  });
  o.tensor_parallel_group = &leader_comm;
  absl::StatusOr<std::unique_ptr<Engine>> leader = Engine::Create(o, nullptr, device());
  if (!leader.ok()) {
    ADD_FAILURE() << leader.status();
    follower.detach();  // its engine failed the same way; nothing runs on it
    return;
  }
  EXPECT_EQ((*leader)->model().weights().shard.num_heads, c.num_heads / 2);
  const std::vector<absl::StatusOr<Completion>> got = (*leader)->Generate(f.Requests());
  // Embed passes run on both ranks too (the follower gets them as embed steps).
  f.ExpectEmbeddings(leader->get(),
                     staged ? "tensor parallel embeddings, staged" : "tensor parallel embeddings");
  // Release the follower before checking, so that a failure does not leave it waiting.
  EXPECT_TRUE(worker::StopFollowers(&leader_comm).ok());
  follower.join();
  f.ExpectReference(got, staged ? "tensor parallel, staged" : "tensor parallel");
  EXPECT_GT((*leader)->model().collective_times().all_reduces, 0);
}

TEST_P(ModelFamiliesTest, TensorParallelTwoRanksMatchTheReference) {
  const ModelConfig& c = family().config();
  if (c.num_heads % 2 != 0 || c.num_kv_heads % 2 != 0) GTEST_SKIP() << "heads do not split";
  ExpectTensorParallelMatches(family(), /*staged=*/false);
  ExpectTensorParallelMatches(family(), /*staged=*/true);
}

// One rank on a device without host memory: the logits' softcap and the embedding scale run on
// the device's own arrays.
TEST_P(ModelFamiliesTest, DeviceWithoutHostMemoryMatchesTheReference) {
  Family& f = family();
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(f.Options(), nullptr, std::make_unique<testing::NoHostMemoryDevice>());
  ASSERT_TRUE(engine.ok()) << engine.status();
  f.ExpectReference((*engine)->Generate(f.Requests()), "no host memory");
}

TEST_P(ModelFamiliesTest, EmbeddingsMatchTheReference) {
  Family& f = family();
  std::unique_ptr<Engine> engine = MakeEngine(f.Options());
  ASSERT_NE(engine, nullptr);
  f.ExpectEmbeddings(engine.get(), "embeddings");
}

INSTANTIATE_TEST_SUITE_P(Families, ModelFamiliesTest,
                         ::testing::Values("qwen3-tiny", "gemma3-tiny", "mistral-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace carpool
