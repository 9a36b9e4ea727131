// Sampling on the GPU (CudaDevice::Sample: DeviceSamplingRows, the CUDA sampler with its
// penalties, the logits' conversion and the results' way back) against worker::Sampler on the
// same logits, for every sampling mode, with and without penalties, in fp32 and bf16 storage
// (bf16 logits widen exactly, so both samplers see the same fp32 values): tokens equal, logprobs
// within 1e-5. Then the engine on the GPU with --device-sampling on against off. Every test skips
// itself where no CUDA device is visible.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "tests/testing/cuda_test.h"
#include "worker/engine.h"
#include "worker/model/cuda_device.h"
#include "worker/sampler/sampler.h"

namespace carpool::worker {
namespace {

using testing::RoundToStorage;

struct Mode {
  const char* name;
  float temperature, top_p, min_p;
  int top_k, logprobs;
  float repetition, frequency, presence;
};

const Mode kModes[] = {
    {"greedy", 0.0f, 1.0f, 0.0f, 0, 3, 1.0f, 0.0f, 0.0f},
    {"plain", 1.0f, 1.0f, 0.0f, 0, 0, 1.0f, 0.0f, 0.0f},
    {"hot", 1.7f, 1.0f, 0.0f, 0, 20, 1.0f, 0.0f, 0.0f},
    {"top_k_40", 0.7f, 1.0f, 0.0f, 40, 5, 1.0f, 0.0f, 0.0f},
    {"top_k_2000", 1.0f, 1.0f, 0.0f, 2000, 0, 1.0f, 0.0f, 0.0f},
    {"top_p_0.9", 1.0f, 0.9f, 0.0f, 0, 2, 1.0f, 0.0f, 0.0f},
    {"min_p_0.05", 1.0f, 1.0f, 0.05f, 0, 0, 1.0f, 0.0f, 0.0f},
    {"k_p_min_p", 0.9f, 0.8f, 0.02f, 50, 1, 1.0f, 0.0f, 0.0f},
    {"repetition", 1.0f, 1.0f, 0.0f, 0, 0, 1.3f, 0.0f, 0.0f},
    {"repetition_below_1", 0.8f, 0.95f, 0.0f, 0, 0, 0.7f, 0.0f, 0.0f},
    {"frequency_presence", 1.0f, 1.0f, 0.0f, 0, 4, 1.0f, 0.8f, 0.5f},
    {"greedy_penalized", 0.0f, 1.0f, 0.0f, 0, 2, 1.2f, 1.5f, -0.5f},
    {"all", 1.1f, 0.85f, 0.01f, 100, 3, 1.1f, -0.7f, 1.2f},
    {"temperature_1_penalized", 1.0f, 1.0f, 0.0f, 0, 0, 1.0f, 2.0f, 2.0f},
};

class CudaSamplingTest : public ::testing::TestWithParam<StorageType> {
 protected:
  void SetUp() override {
    CARPOOL_SKIP_WITHOUT_CUDA();
    absl::StatusOr<std::unique_ptr<CudaDevice>> d =
        CreateCudaDevice(testing::SmallCudaDeviceOptions(GetParam()));
    ASSERT_TRUE(d.ok()) << d.status();
    device_ = std::move(*d);
  }

  // Every mode at several positions and seeds, over one batch of rows of `vocab` logits.
  void CheckAgainstCpu(int vocab, int per_mode) {
    const int num_modes = static_cast<int>(std::size(kModes));
    const int rows = num_modes * per_mode;
    std::mt19937 rng(123 + vocab);
    std::uniform_real_distribution<float> logit(-4.0f, 4.0f);
    std::uniform_int_distribution<int> len(0, 64);
    std::uniform_int_distribution<int> hot(0, 200);  // histories and preferred tokens overlap
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& l : logits) l = logit(rng);
    std::vector<SamplingParams> params(rows);
    std::vector<std::vector<int32_t>> prompts(rows), outputs(rows);
    std::vector<SampleRequest> requests(rows);
    for (int r = 0; r < rows; ++r) {
      float* row = &logits[static_cast<size_t>(r) * vocab];
      for (int j = 0; j < 8; ++j) row[hot(rng) % vocab] += 6.0f;
      if (r % 37 == 5) row[1] = std::numeric_limits<float>::quiet_NaN();
      if (r % 37 == 6) row[2] = INFINITY;
      if (r % 37 == 7) std::fill(row, row + vocab, -INFINITY);
      for (int i = 0; i < vocab; ++i) row[i] = RoundToStorage(GetParam(), row[i]);
      const Mode& m = kModes[r / per_mode];
      SamplingParams& q = params[r];
      q.temperature = m.temperature;
      q.top_k = m.top_k;
      q.top_p = m.top_p;
      q.min_p = m.min_p;
      q.logprobs = m.logprobs;
      q.repetition_penalty = m.repetition;
      q.frequency_penalty = m.frequency;
      q.presence_penalty = m.presence;
      q.has_seed = r % 5 != 0;  // some rows use seed 0, as a request without one
      q.seed = 1000 + r % 7;
      for (int j = len(rng); j > 0; --j) prompts[r].push_back(hot(rng) % vocab);
      for (int j = len(rng); j > 0; --j) outputs[r].push_back(hot(rng) % vocab);
      requests[r] = {&q, prompts[r], outputs[r], 17 * r + 3};
    }
    absl::StatusOr<DeviceArray> array = device_->Allocate(static_cast<int64_t>(logits.size()));
    ASSERT_TRUE(array.ok()) << array.status();
    device_->FromHost(logits.data(), 0, static_cast<int64_t>(logits.size()), &*array);
    std::vector<SampleResult> got;
    device_->Sample(*array, vocab, requests, &got);
    ASSERT_TRUE(device_->status().ok()) << device_->status();
    ASSERT_EQ(got.size(), static_cast<size_t>(rows));

    Sampler sampler(vocab);
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE(std::string(kModes[r / per_mode].name) + " row " + std::to_string(r));
      SampleInput in;
      in.logits = &logits[static_cast<size_t>(r) * vocab];
      in.params = &params[r];
      in.prompt_tokens = prompts[r];
      in.output_tokens = outputs[r];
      in.position = requests[r].position;
      const SampleResult want = sampler.Sample(in);
      EXPECT_EQ(got[r].token, want.token);
      EXPECT_NEAR(got[r].logprob, want.logprob, 1e-5);
      ASSERT_EQ(got[r].top_logprobs.size(), want.top_logprobs.size());
      for (size_t i = 0; i < want.top_logprobs.size(); ++i) {
        EXPECT_EQ(got[r].top_logprobs[i].token, want.top_logprobs[i].token) << "top " << i;
        EXPECT_NEAR(got[r].top_logprobs[i].logprob, want.top_logprobs[i].logprob, 1e-5)
            << "top " << i;
      }
    }
  }

  std::unique_ptr<CudaDevice> device_;
};

TEST_P(CudaSamplingTest, MatchesCpuSamplerSmallVocab) { CheckAgainstCpu(1000, 12); }
TEST_P(CudaSamplingTest, MatchesCpuSamplerLlamaVocab) { CheckAgainstCpu(128256, 4); }

TEST_P(CudaSamplingTest, NoRowsIsNothing) {
  absl::StatusOr<DeviceArray> array = device_->Allocate(10);
  ASSERT_TRUE(array.ok());
  std::vector<SampleResult> got(3);
  device_->Sample(*array, 10, {}, &got);
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(device_->status().ok()) << device_->status();
}

INSTANTIATE_TEST_SUITE_P(Storage, CudaSamplingTest,
                         ::testing::Values(StorageType::kF32, StorageType::kBF16),
                         [](const auto& info) {
                           return std::string(info.param == StorageType::kF32 ? "F32" : "BF16");
                         });

// The engine on the GPU in fp32: the same requests sampled on the device and on the host. A
// small checkpoint written here (not synthetic:tiny, whose head_dim 16 the CUDA attention
// kernels do not take).
TEST(CudaEngineSamplingTest, DeviceSamplingEqualsHostSampling) {
  CARPOOL_SKIP_WITHOUT_CUDA();
  testing::ScratchDir dir("carpool_cuda_sampling_test");
  testing::CheckpointSpec spec;
  spec.config.architecture = "LlamaForCausalLM";
  spec.config.vocab_size = 512;
  spec.config.hidden_size = 256;
  spec.config.intermediate_size = 320;
  spec.config.num_layers = 2;
  spec.config.num_heads = 4;
  spec.config.num_kv_heads = 2;
  spec.config.head_dim = 64;
  spec.config.rms_norm_eps = 1e-5;
  spec.config.rope_theta = 10000.0;
  spec.config.max_position_embeddings = 512;
  spec.config.bos_token_id = 1;
  spec.config.eos_token_ids = {2};
  spec.seed = 23;
  absl::StatusOr<testing::CheckpointTensors> written =
      testing::WriteCheckpoint(dir.path().string(), spec);
  ASSERT_TRUE(written.ok()) << written.status();

  std::vector<EngineRequest> requests;
  std::mt19937 rng(8);
  for (int i = 0; i < 24; ++i) {
    EngineRequest r;
    for (int j = 1 + static_cast<int>(rng() % 60); j > 0; --j) {
      r.prompt_tokens.push_back(static_cast<int32_t>(3 + rng() % 500));
    }
    const Mode& m = kModes[i % std::size(kModes)];
    r.sampling.temperature = m.temperature;
    r.sampling.top_k = m.top_k;
    r.sampling.top_p = m.top_p;
    r.sampling.min_p = m.min_p;
    r.sampling.logprobs = m.logprobs;
    r.sampling.repetition_penalty = m.repetition;
    r.sampling.frequency_penalty = m.frequency;
    r.sampling.presence_penalty = m.presence;
    r.sampling.has_seed = true;
    r.sampling.seed = 40 + i;
    r.sampling.max_tokens = 16;
    r.sampling.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  std::vector<std::vector<absl::StatusOr<Completion>>> results;
  for (DeviceSampling s : {DeviceSampling::kOn, DeviceSampling::kOff}) {
    EngineOptions o;
    o.model = dir.path().string();
    o.scheduler.max_model_len = 256;
    o.scheduler.max_num_batched_tokens = 64;
    o.scheduler.max_num_seqs = 8;
    o.num_kv_blocks = 256;
    o.device = {.kind = DeviceKind::kCuda, .dtype = StorageType::kF32};
    o.device_sampling = s;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->samples_on_device(), s == DeviceSampling::kOn);
    results.push_back((*engine)->Generate(requests));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_TRUE(results[0][i].ok()) << results[0][i].status();
    ASSERT_TRUE(results[1][i].ok()) << results[1][i].status();
    EXPECT_EQ(results[0][i]->tokens, results[1][i]->tokens);
    ASSERT_EQ(results[0][i]->logprobs.size(), results[1][i]->logprobs.size());
    for (size_t j = 0; j < results[0][i]->logprobs.size(); ++j) {
      EXPECT_NEAR(results[0][i]->logprobs[j].logprob, results[1][i]->logprobs[j].logprob, 1e-5);
    }
  }
}

}  // namespace
}  // namespace carpool::worker
