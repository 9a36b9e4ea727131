// LlamaModel through a ModelDevice: an explicit CpuDevice equals the default one, and decode
// steps padded to graph batch sizes (CpuDeviceOptions::pad_decode_batch_sizes, as a GPU pads for
// CUDA graphs) give the same tokens and logprobs, bit for bit, as unpadded ones.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kernel_test_util.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/no_host_memory_device.h"
#include "worker/engine.h"
#include "worker/model/cpu_device.h"
#include "worker/model/llama_model.h"

namespace carpool::worker {
namespace {


// A CpuDevice that counts the steps run whole (RunStep) and the batch sizes they had.
class CountingDevice : public CpuDevice {
 public:
  explicit CountingDevice(const CpuDeviceOptions& o) : CpuDevice(o) {}
  void SetStep(const StepView& step) override {
    last_num_seqs_ = static_cast<int>(step.seqs.size());
    CpuDevice::SetStep(step);
  }
  void RunStep(const std::function<void()>& body) override {
    whole_steps_.push_back(last_num_seqs_);
    body();
  }
  const std::vector<int>& whole_steps() const { return whole_steps_; }

 private:
  int last_num_seqs_ = 0;
  std::vector<int> whole_steps_;
};

class ModelDeviceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((std::filesystem::temp_directory_path() /
                            ("carpool_model_device_test_" + std::to_string(::getpid())))
                               .string());
    testing::CheckpointSpec spec;
    spec.config = testing::TinyTestConfig();
    spec.seed = 9;
    auto tensors = testing::WriteCheckpoint(*dir_, spec);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static EngineOptions Options() {
    EngineOptions o;
    o.model = *dir_;
    o.block_size = 4;
    o.num_kv_blocks = 256;
    o.scheduler.max_num_batched_tokens = 64;
    o.scheduler.max_model_len = 128;
    return o;
  }

  // n greedy requests with different prompts and lengths, so the decode batch shrinks as they
  // finish and passes through padded and unpadded sizes.
  static std::vector<EngineRequest> Requests(int n) {
    std::vector<EngineRequest> rs;
    for (int i = 0; i < n; ++i) {
      EngineRequest r;
      for (int j = 0; j < 3 + 2 * i; ++j) r.prompt_tokens.push_back(3 + (i * 37 + j * 11) % 290);
      r.sampling.max_tokens = 6 + i;
      r.sampling.temperature = 0;
      r.sampling.ignore_eos = true;
      r.sampling.logprobs = 2;
      rs.push_back(std::move(r));
    }
    return rs;
  }

  static void ExpectSame(const std::vector<absl::StatusOr<Completion>>& got,
                         const std::vector<absl::StatusOr<Completion>>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      ASSERT_TRUE(want[i].ok()) << want[i].status();
      EXPECT_EQ(got[i]->tokens, want[i]->tokens) << "request " << i;
      ASSERT_EQ(got[i]->logprobs.size(), want[i]->logprobs.size());
      for (size_t j = 0; j < got[i]->logprobs.size(); ++j) {
        const SampleResult& a = got[i]->logprobs[j];
        const SampleResult& b = want[i]->logprobs[j];
        EXPECT_EQ(a.token, b.token) << "request " << i << " token " << j;
        EXPECT_EQ(a.logprob, b.logprob) << "request " << i << " token " << j;
        ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
        for (size_t k = 0; k < a.top_logprobs.size(); ++k) {
          EXPECT_EQ(a.top_logprobs[k].token, b.top_logprobs[k].token);
          EXPECT_EQ(a.top_logprobs[k].logprob, b.top_logprobs[k].logprob);
        }
      }
    }
  }

  static std::string* dir_;
};

std::string* ModelDeviceTest::dir_ = nullptr;

// The explicit device has no pool (every kernel on the calling thread); the engine's own runs on
// the engine's pool: the same bits either way.
TEST_F(ModelDeviceTest, ExplicitCpuDeviceEqualsTheDefault) {
  auto plain = Engine::Create(Options());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->model().device().name(), "cpu");
  auto explicit_cpu = Engine::Create(Options(), nullptr, CreateCpuDevice());
  ASSERT_TRUE(explicit_cpu.ok()) << explicit_cpu.status();
  ExpectSame((*explicit_cpu)->Generate(Requests(5)), (*plain)->Generate(Requests(5)));

  auto weights = LoadWeights(*dir_, TensorParallelRank{});
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto model =
      LlamaModel::Create(std::move(*weights), KvCacheShape{8, 4}, nullptr, CreateCpuDevice());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->DecodeWeightBytes(), (*plain)->model().DecodeWeightBytes());
}

TEST_F(ModelDeviceTest, PaddedDecodeStepsGiveIdenticalTokensAndLogprobs) {
  auto plain = Engine::Create(Options());
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<absl::StatusOr<Completion>> want = (*plain)->Generate(Requests(10));

  CpuDeviceOptions pad;
  pad.pool = kernels::test_util::TestPool();
  pad.pad_decode_batch_sizes = {4, 8};
  auto device = std::make_unique<CountingDevice>(pad);
  const CountingDevice* counting = device.get();
  auto padded = Engine::Create(Options(), nullptr, std::move(device));
  ASSERT_TRUE(padded.ok()) << padded.status();
  ExpectSame((*padded)->Generate(Requests(10)), want);

  // Decode batches of 10 and 9 ran as they were; 8 down to 1 ran whole (padded to 8 or 4).
  bool saw_small = false, saw_mid = false;
  for (int n : counting->whole_steps()) {
    EXPECT_TRUE(n == 4 || n == 8) << n;
    saw_small |= n == 4;
    saw_mid |= n == 8;
  }
  EXPECT_TRUE(saw_small);
  EXPECT_TRUE(saw_mid);
}

TEST_F(ModelDeviceTest, PaddingLeavesEmbeddingsAlone) {
  auto plain = Engine::Create(Options());
  ASSERT_TRUE(plain.ok()) << plain.status();
  CpuDeviceOptions pad;
  pad.pool = kernels::test_util::TestPool();
  pad.pad_decode_batch_sizes = {4, 8};
  auto padded = Engine::Create(Options(), nullptr, CreateCpuDevice(pad));
  ASSERT_TRUE(padded.ok()) << padded.status();
  EmbeddingInput a, b;
  a.tokens = {5, 6, 7};
  b.tokens = {9};
  b.pooling = Pooling::kLast;
  const EmbeddingInput* inputs[] = {&a, &b};
  auto want = (*plain)->Embed(inputs);
  auto got = (*padded)->Embed(inputs);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(*got, *want);
}

TEST_F(ModelDeviceTest, TransfersWithoutHostMemoryGiveTheSameResults) {
  auto plain = Engine::Create(Options());
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto copying =
      Engine::Create(Options(), nullptr, std::make_unique<testing::NoHostMemoryDevice>());
  ASSERT_TRUE(copying.ok()) << copying.status();
  ExpectSame((*copying)->Generate(Requests(6)), (*plain)->Generate(Requests(6)));

  EmbeddingInput a, b;
  a.tokens = {5, 6, 7, 8};
  b.tokens = {9, 10};
  b.pooling = Pooling::kLast;
  const EmbeddingInput* inputs[] = {&a, &b};
  auto want = (*plain)->Embed(inputs);
  auto got = (*copying)->Embed(inputs);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(*got, *want);
}

// Weights that lack a tensor their config's family needs (or carry one it does not) are refused
// at Create with the layer and the tensor named, never read past.
TEST(FamilyTensorsTest, MissingOrExtraNormsAreRefusedByName) {
  const ModelConfig gemma = SyntheticConfig("gemma3-tiny").value();
  const auto create = [](std::unique_ptr<LlamaWeights> w) {
    return LlamaModel::Create(std::move(w), KvCacheShape{4, 16}).status();
  };
  EXPECT_TRUE(create(SyntheticWeights(gemma, 1)).ok());

  std::unique_ptr<LlamaWeights> w = SyntheticWeights(gemma, 1);
  w->layers[1].q_norm = Tensor();
  absl::Status s = create(std::move(w));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer 1: self_attn.q_norm"), std::string::npos) << s;

  w = SyntheticWeights(gemma, 1);
  w->layers[0].post_feedforward_norm = Tensor();
  s = create(std::move(w));
  EXPECT_NE(s.message().find("layer 0: post_feedforward_layernorm"), std::string::npos) << s;

  // A config without q/k norms over weights that have them.
  w = SyntheticWeights(gemma, 1);
  w->config.qk_norm = false;
  s = create(std::move(w));
  EXPECT_NE(s.message().find("layer 0: self_attn.q_norm has 32 values, the config needs 0"),
            std::string::npos)
      << s;

  w = SyntheticWeights(gemma, 1);
  w->config.layer_sliding.pop_back();
  s = create(std::move(w));
  EXPECT_NE(s.message().find("layer_sliding"), std::string::npos) << s;
}

TEST(KvBytesPerBlockTest, ScalesWithTheStorageType) {
  const ModelConfig c = testing::TinyTestConfig();
  const int64_t fp32 = LlamaModel::KvBytesPerBlock(c, 16);
  EXPECT_EQ(fp32, 2LL * c.num_layers * 16 * c.num_kv_heads * c.head_dim * 4);
  EXPECT_EQ(LlamaModel::KvBytesPerBlock(c, 16, StorageType::kF32), fp32);
  EXPECT_EQ(LlamaModel::KvBytesPerBlock(c, 16, StorageType::kBF16), fp32 / 2);
  EXPECT_EQ(LlamaModel::KvBytesPerBlock(c, 16, StorageType::kF16), fp32 / 2);
}

}  // namespace
}  // namespace carpool::worker
