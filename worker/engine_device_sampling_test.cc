// Device sampling's host-side glue, on the CPU: the engine with a fake GPU (the CPU device without
// host views, so the model keeps its logits in "device" arrays as on a GPU, padding decode steps
// as a GPU pads them for graphs) whose ModelDevice::Sample copies the rows it is handed to the
// host and runs the CPU sampler on them. Whatever the glue gets wrong (which rows, in which
// order, which parameters, penalties' token histories, positions, padding rows, the mapping of
// results back to sequences) changes tokens or logprobs against the engine that samples on the
// host, which the tests compare bit for bit over every sampling mode in one mixed batch
// (chunked prefill, unsampled chunks, decodes, resumed streams).
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/engine_checks.h"
#include "worker/engine.h"
#include "worker/model/model_device.h"
#include "worker/sampler/sampler.h"

namespace carpool::worker {
namespace {

constexpr int kVocab = 258;  // synthetic:tiny

CpuDeviceOptions PaddedCpu() {
  CpuDeviceOptions o;
  o.pad_decode_batch_sizes = {2, 4, 8, 16};
  return o;
}

// What a FakeSamplingGpu saw; outlives the engine that owns the device.
struct SampleCounts {
  int sample_calls = 0;
  int64_t sampled_rows = 0;
  int padded_steps = 0;  // steps whose padding rows were computed but not sampled
  int64_t penalized_rows = 0;
};

// The CPU device dressed as a GPU that samples: no host views (unless `host_views`, a device
// that samples and whose memory is the host's), and Sample() on the CPU sampler.
class FakeSamplingGpu : public ModelDevice {
 public:
  explicit FakeSamplingGpu(SampleCounts* counts, bool host_views = false)
      : cpu_(CreateCpuDevice(PaddedCpu())),
        sampler_(kVocab),
        counts_(counts),
        host_views_(host_views) {}

  std::string name() const override { return "fake-sampling-gpu"; }
  StorageType storage_type() const override { return cpu_->storage_type(); }
  absl::StatusOr<DeviceArray> Weight(const Tensor& host) override { return cpu_->Weight(host); }
  absl::StatusOr<DeviceArray> NormWeight(const Tensor& host) override {
    return cpu_->NormWeight(host);
  }
  absl::StatusOr<DeviceArray> Allocate(int64_t numel) override { return cpu_->Allocate(numel); }
  absl::StatusOr<DeviceArray> AllocateKv(int64_t numel) override {
    return cpu_->AllocateKv(numel);
  }
  void Reserve(DeviceArray* a, int64_t numel) override { cpu_->Reserve(a, numel); }
  int64_t FreeBytes() const override { return cpu_->FreeBytes(); }
  void SetRope(absl::Span<const float> inv_freq, absl::Span<const float> local) override {
    cpu_->SetRope(inv_freq, local);
  }
  void SetStep(const StepView& step) override {
    step_sample_rows_ = static_cast<int64_t>(step.sample_rows.size());
    cpu_->SetStep(step);
  }
  void EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) override {
    cpu_->EmbeddingGather(table, h, out);
  }
  void RmsNorm(const DeviceArray& x, const DeviceArray& w, float eps, int64_t rows, int64_t h,
               DeviceArray* out) override {
    cpu_->RmsNorm(x, w, eps, rows, h, out);
  }
  void AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& w, float eps,
                  int64_t rows, int64_t h, DeviceArray* out) override {
    cpu_->AddRmsNorm(x, residual, w, eps, rows, h, out);
  }
  void Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias, int64_t m,
              int64_t n, int64_t k, DeviceArray* y) override {
    cpu_->Linear(x, w, bias, m, n, k, y);
  }
  void Rope(int num_heads, int head_dim, bool local, DeviceArray* x) override {
    cpu_->Rope(num_heads, head_dim, local, x);
  }
  void HeadRmsNorm(const DeviceArray& w, float eps, int64_t rows, int num_heads, int head_dim,
                   DeviceArray* x) override {
    cpu_->HeadRmsNorm(w, eps, rows, num_heads, head_dim, x);
  }
  void SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
               DeviceArray* out) override {
    cpu_->SiluMul(gate, up, rows, inter, out);
  }
  void GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
                   DeviceArray* out) override {
    cpu_->GeluTanhMul(gate, up, rows, inter, out);
  }
  void SoftCap(float cap, int64_t n, DeviceArray* x) override { cpu_->SoftCap(cap, n, x); }
  void Scale(float factor, int64_t n, DeviceArray* x) override { cpu_->Scale(factor, n, x); }
  void WriteKv(const DeviceArray& k, const DeviceArray& v, const kernels::KvCacheLayout& layout,
               DeviceArray* key_cache, DeviceArray* value_cache) override {
    cpu_->WriteKv(k, v, layout, key_cache, value_cache);
  }
  void Attention(const DeviceArray& q, const DeviceArray& key_cache,
                 const DeviceArray& value_cache, const kernels::KvCacheLayout& layout,
                 int num_heads, const AttentionOptions& options, DeviceArray* out) override {
    cpu_->Attention(q, key_cache, value_cache, layout, num_heads, options, out);
  }
  void GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) override {
    cpu_->GatherRows(x, h, out);
  }
  int GraphBatchSize(int num_seqs) const override { return cpu_->GraphBatchSize(num_seqs); }
  void RunStep(const std::function<void()>& body) override { cpu_->RunStep(body); }
  float* HostData(const DeviceArray& x) override {
    return host_views_ ? cpu_->HostData(x) : nullptr;
  }
  void ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) override {
    cpu_->ToHost(x, offset, n, host);
  }
  void FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) override {
    cpu_->FromHost(host, offset, n, x);
  }

  bool SamplesOnDevice() const override { return true; }
  void Sample(const DeviceArray& logits, int64_t vocab, absl::Span<const SampleRequest> requests,
              std::vector<SampleResult>* out) override {
    ++counts_->sample_calls;
    const int64_t n = static_cast<int64_t>(requests.size());
    counts_->sampled_rows += n;
    // Never more rows than the step computed; fewer when the step was padded.
    EXPECT_LE(n, step_sample_rows_);
    if (n < step_sample_rows_) ++counts_->padded_steps;
    EXPECT_EQ(vocab, kVocab);
    EXPECT_GE(logits.numel(), n * vocab);
    host_.resize(n * vocab);
    if (n > 0) cpu_->ToHost(logits, 0, n * vocab, host_.data());
    out->clear();
    for (int64_t i = 0; i < n; ++i) {
      const SampleRequest& r = requests[i];
      EXPECT_EQ(r.position, static_cast<int64_t>(r.prompt_tokens.size() + r.output_tokens.size()));
      if (r.params->repetition_penalty != 1.0f || r.params->frequency_penalty != 0.0f ||
          r.params->presence_penalty != 0.0f) {
        ++counts_->penalized_rows;
      }
      SampleInput in;
      in.logits = host_.data() + i * vocab;
      in.params = r.params;
      in.prompt_tokens = r.prompt_tokens;
      in.output_tokens = r.output_tokens;
      in.position = r.position;
      out->push_back(sampler_.Sample(in));
    }
  }

 private:
  std::unique_ptr<ModelDevice> cpu_;
  Sampler sampler_;
  SampleCounts* const counts_;
  const bool host_views_;
  int64_t step_sample_rows_ = 0;
  std::vector<float> host_;
};

SamplingParams Mode(int i) {
  SamplingParams p;
  p.has_seed = true;
  p.seed = 7000 + i;
  p.max_tokens = 12;
  p.ignore_eos = true;
  switch (i % 14) {
    case 0:  // greedy
      p.temperature = 0.0f;
      p.logprobs = 3;
      break;
    case 1:  // temperature
      p.temperature = 0.8f;
      break;
    case 2:
      p.temperature = 1.6f;
      p.logprobs = 20;
      break;
    case 3:  // top-k
      p.top_k = 5;
      break;
    case 4:  // top-p
      p.temperature = 0.9f;
      p.top_p = 0.7f;
      break;
    case 5:  // min-p
      p.min_p = 0.1f;
      p.logprobs = 1;
      break;
    case 6:  // all truncations
      p.temperature = 1.2f;
      p.top_k = 40;
      p.top_p = 0.8f;
      p.min_p = 0.02f;
      p.logprobs = 5;
      break;
    case 7:  // repetition penalty
      p.repetition_penalty = 1.5f;
      break;
    case 8:  // frequency and presence
      p.frequency_penalty = 0.7f;
      p.presence_penalty = 0.4f;
      p.logprobs = 2;
      break;
    case 9:  // every penalty, greedy
      p.temperature = 0.0f;
      p.repetition_penalty = 1.3f;
      p.frequency_penalty = 1.5f;
      p.presence_penalty = -0.5f;
      break;
    case 10:  // every penalty, truncated
      p.temperature = 0.7f;
      p.top_k = 20;
      p.top_p = 0.9f;
      p.repetition_penalty = 0.8f;
      p.frequency_penalty = -0.3f;
      p.presence_penalty = 1.0f;
      break;
    case 11:  // plain, no logprobs
      break;
    case 12:  // top-k of one
      p.top_k = 1;
      p.logprobs = 4;
      break;
    default:  // greedy with a repetition penalty below 1
      p.temperature = 0.0f;
      p.repetition_penalty = 0.7f;
      break;
  }
  return p;
}

// Every mode, twice, with prompts of 1 to 90 tokens, a few of them resumed streams (output tokens
// given, which the penalties count), so steps mix prefill chunks, unsampled chunks and decodes.
std::vector<EngineRequest> MixedRequests() {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> len(1, 90);
  std::uniform_int_distribution<int> token(0, kVocab - 1);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 28; ++i) {
    EngineRequest r;
    const int n = i == 0 ? 1 : len(rng);
    for (int j = 0; j < n; ++j) r.prompt_tokens.push_back(token(rng) % 16);  // repeats
    if (i % 4 == 3) {
      for (int j = 0; j < 5; ++j) r.output_tokens.push_back(token(rng) % 16);
    }
    r.sampling = Mode(i);
    requests.push_back(std::move(r));
  }
  return requests;
}

EngineOptions Options(DeviceSampling sampling) {
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.scheduler.max_model_len = 256;
  o.scheduler.max_num_batched_tokens = 64;  // chunked prefill mixed with decodes
  o.scheduler.max_num_seqs = 12;
  o.num_threads = 2;
  o.device_sampling = sampling;
  return o;
}

std::vector<absl::StatusOr<Completion>> Generate(std::unique_ptr<ModelDevice> device,
                                                 DeviceSampling sampling, bool expect_on_device) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(Options(sampling), nullptr, std::move(device));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  EXPECT_EQ((*engine)->samples_on_device(), expect_on_device);
  return (*engine)->Generate(MixedRequests());
}

// Request by request, bit for bit (tests/testing/engine_checks.h).
void ExpectSame(const std::vector<absl::StatusOr<Completion>>& want,
                const std::vector<absl::StatusOr<Completion>>& got) {
  testing::ExpectSameCompletions(want, got, {.top_logprob_values = true});
}

TEST(EngineDeviceSamplingTest, DeviceSamplingEqualsHostSamplingForEveryModeInAMixedBatch) {
  // The reference: the CPU device (host memory), which cannot sample, so auto samples on the host.
  const auto host = Generate(CreateCpuDevice(PaddedCpu()), DeviceSampling::kAuto, false);

  SampleCounts counts;
  auto gpu = std::make_unique<FakeSamplingGpu>(&counts);
  const auto device = Generate(std::move(gpu), DeviceSampling::kAuto, true);
  ExpectSame(host, device);
  // Every token came from the device: 28 requests of 12 tokens, of which the resumed ones
  // already hold 5.
  EXPECT_EQ(counts.sampled_rows, 28 * 12 - 7 * 5);
  EXPECT_GT(counts.sample_calls, 0);
  EXPECT_GT(counts.padded_steps, 0);  // some decode steps were padded: their rows not sampled
  EXPECT_GT(counts.penalized_rows, 0);
}

// The same with a sampling device whose memory is the host's (the head writes into the model's
// host scratch, which the device samples from).
TEST(EngineDeviceSamplingTest, DeviceSamplingFromHostMemoryEqualsHostSampling) {
  const auto host = Generate(CreateCpuDevice(PaddedCpu()), DeviceSampling::kAuto, false);
  SampleCounts counts;
  const auto device = Generate(std::make_unique<FakeSamplingGpu>(&counts, /*host_views=*/true),
                               DeviceSampling::kOn, true);
  ExpectSame(host, device);
  EXPECT_EQ(counts.sampled_rows, 28 * 12 - 7 * 5);
}

TEST(EngineDeviceSamplingTest, OffSamplesOnTheHostFromTheDevicesLogits) {
  const auto host = Generate(CreateCpuDevice(PaddedCpu()), DeviceSampling::kAuto, false);
  SampleCounts counts;
  auto gpu = std::make_unique<FakeSamplingGpu>(&counts);
  const auto off = Generate(std::move(gpu), DeviceSampling::kOff, false);
  ExpectSame(host, off);
  EXPECT_EQ(counts.sample_calls, 0);
}

TEST(EngineDeviceSamplingTest, OnNeedsADeviceThatSamples) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(Options(DeviceSampling::kOn), nullptr, CreateCpuDevice());
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(engine.status().message().find("--device-sampling"), std::string::npos);

  SampleCounts counts;
  auto gpu = std::make_unique<FakeSamplingGpu>(&counts);
  engine = Engine::Create(Options(DeviceSampling::kOn), nullptr, std::move(gpu));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE((*engine)->samples_on_device());
  EngineRequest r;
  r.prompt_tokens = {1, 2, 3};
  r.sampling.max_tokens = 3;
  r.sampling.ignore_eos = true;
  auto results = (*engine)->Generate({r});
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_EQ(results[0]->tokens.size(), 3u);
  EXPECT_EQ(counts.sampled_rows, 3);
}

TEST(EngineDeviceSamplingTest, FlagTakesAutoOnOff) {
  EngineOptions o;
  EXPECT_EQ(o.device_sampling, DeviceSampling::kAuto);
  ASSERT_TRUE(testing::ParseEngineFlags({"--device-sampling", "off"}, &o).ok());
  EXPECT_EQ(o.device_sampling, DeviceSampling::kOff);
  ASSERT_TRUE(testing::ParseEngineFlags({"--device-sampling=on"}, &o).ok());
  EXPECT_EQ(o.device_sampling, DeviceSampling::kOn);
  ASSERT_TRUE(testing::ParseEngineFlags({"--device-sampling", "auto"}, &o).ok());
  EXPECT_EQ(o.device_sampling, DeviceSampling::kAuto);
  const absl::Status bad = testing::ParseEngineFlags({"--device-sampling", "gpu"}, &o);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--device-sampling"), std::string::npos) << bad;
  EXPECT_STREQ(DeviceSamplingName(DeviceSampling::kOff), "off");
}

// The rows of a plan: only sequences that sample, in plan order, at their next position.
TEST(EngineDeviceSamplingTest, SampleRequestsFromBatchTakesTheSampledSequencesInOrder) {
  Sequence a, b, c;
  a.prompt_tokens = {1, 2, 3};
  a.output_tokens = {4};
  a.sampling.temperature = 0.5f;
  b.prompt_tokens = {5, 6, 7, 8, 9};  // a prefill chunk that does not sample yet
  c.prompt_tokens = {10, 11};
  c.sampling.top_k = 3;
  BatchPlan plan;
  plan.seqs = {{&a, 3, 1, true, {}}, {&b, 0, 2, false, {}}, {&c, 0, 2, true, {}}};
  std::vector<SampleRequest> requests = {SampleRequest{}};  // reused, not appended to
  std::vector<int> index = {42};
  SampleRequestsFromBatch(plan, &requests, &index);
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(index, (std::vector<int>{0, 2}));
  EXPECT_EQ(requests[0].params, &a.sampling);
  EXPECT_EQ(requests[0].position, 4);
  EXPECT_EQ(requests[0].prompt_tokens.data(), a.prompt_tokens.data());
  EXPECT_EQ(requests[0].output_tokens.size(), 1u);
  EXPECT_EQ(requests[1].params, &c.sampling);
  EXPECT_EQ(requests[1].position, 2);
  EXPECT_EQ(requests[1].prompt_tokens.size(), 2u);
  EXPECT_TRUE(requests[1].output_tokens.empty());
}

}  // namespace
}  // namespace carpool::worker
