// CudaDevice op by op against the CPU kernels (the CpuDevice computes with exactly these), on
// random inputs rounded to the storage type first: fp32 storage within fp32 rounding, bf16 and
// fp16 within their per-dtype tolerance. Then CUDA graphs: a decode step replayed from a graph
// gives what the same step gives without graphs, also at other context lengths. Every test
// skips itself where no CUDA device is visible.
#include "worker/model/cuda_device.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/dtype.h"
#include "tests/testing/cuda_test.h"

namespace carpool::worker {
namespace {

namespace kc = kernels::cuda;

using testing::RoundToStorage;

// Relative + absolute tolerance of one kernel output per storage type.
double Tolerance(StorageType t) {
  switch (t) {
    case StorageType::kF32:
      return 5e-5;
    case StorageType::kBF16:
      return 3e-2;
    case StorageType::kF16:
      return 4e-3;
  }
  return 0;
}

class CudaDeviceTest : public ::testing::TestWithParam<StorageType> {
 protected:
  void SetUp() override {
    CARPOOL_SKIP_WITHOUT_CUDA();
    CudaDeviceOptions o = testing::SmallCudaDeviceOptions(GetParam());
    o.kv_block_size = 16;
    absl::StatusOr<std::unique_ptr<CudaDevice>> d = CreateCudaDevice(o);
    ASSERT_TRUE(d.ok()) << d.status();
    device_ = std::move(*d);
  }

  StorageType storage() const { return GetParam(); }

  // n random values in [-scale, scale], rounded to the storage type.
  std::vector<float> Random(int64_t n, float scale = 1.0f) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> v(n);
    for (float& x : v) x = RoundToStorage(storage(), u(rng_));
    return v;
  }
  DeviceArray Up(const std::vector<float>& v) {
    absl::StatusOr<DeviceArray> a =
        device_->Weight(Tensor::Owned(v, {static_cast<int64_t>(v.size())}));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : DeviceArray();
  }
  DeviceArray NormUp(const std::vector<float>& v) {
    absl::StatusOr<DeviceArray> a =
        device_->NormWeight(Tensor::Owned(v, {static_cast<int64_t>(v.size())}));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : DeviceArray();
  }
  DeviceArray Empty(int64_t n) {
    absl::StatusOr<DeviceArray> a = device_->Allocate(n);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : DeviceArray();
  }
  std::vector<float> Down(const DeviceArray& a, int64_t n) {
    std::vector<float> v(n);
    device_->ToHost(a, 0, n, v.data());
    EXPECT_TRUE(device_->status().ok()) << device_->status();
    return v;
  }
  void ExpectNear(const std::vector<float>& want, const std::vector<float>& got,
                  double tolerance_scale = 1.0) {
    ASSERT_EQ(want.size(), got.size());
    const double tol = Tolerance(storage()) * tolerance_scale;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }

  std::mt19937 rng_{42};
  std::unique_ptr<CudaDevice> device_;
};

TEST_P(CudaDeviceTest, NormsAndActivation) {
  const int64_t t = 5, h = 96;
  // Norm weights stay fp32 (NormWeight): not rounded to the storage type.
  std::vector<float> x = Random(t * h), residual = Random(t * h), w(h);
  for (float& v : w) v = 1.0f + std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng_);
  DeviceArray dx = Up(x), dres = Up(residual), dw = NormUp(w), dout = Empty(t * h);

  std::vector<float> want(t * h);
  kernels::cpu::RmsNorm(x.data(), w.data(), 1e-5f, want.data(), t, h, nullptr);
  device_->RmsNorm(dx, dw, 1e-5f, t, h, &dout);
  ExpectNear(want, Down(dout, t * h));

  std::vector<float> res = residual;
  kernels::cpu::AddRmsNorm(x.data(), res.data(), w.data(), 1e-5f, want.data(), t, h, nullptr);
  device_->AddRmsNorm(dx, &dres, dw, 1e-5f, t, h, &dout);
  ExpectNear(want, Down(dout, t * h));
  ExpectNear(res, Down(dres, t * h));

  std::vector<float> gate = Random(t * h), up = Random(t * h);
  kernels::cpu::SiluMul(gate.data(), up.data(), want.data(), t, h, nullptr);
  DeviceArray dgate = Up(gate), dup = Up(up);
  device_->SiluMul(dgate, dup, t, h, &dout);
  ExpectNear(want, Down(dout, t * h));

  kernels::cpu::GeluTanhMul(gate.data(), up.data(), want.data(), t, h, nullptr);
  device_->GeluTanhMul(dgate, dup, t, h, &dout);
  ExpectNear(want, Down(dout, t * h));
}

// The ops the newer families add: per-head q/k norm, logit softcap, embedding scale.
// A host weight kept bf16 (LoadOptions::keep_bf16) goes up as its values: exactly for bf16 and
// fp32 storage, rounded as its fp32 value would be for fp16; also over several upload chunks.
TEST_P(CudaDeviceTest, Bf16HostWeightsUploadAsTheirValues) {
  CudaDeviceOptions o;
  o.storage = storage();
  o.abort_on_error = false;
  o.max_num_batched_tokens = 8;
  o.max_num_seqs = 1;
  o.max_context_len = 64;
  o.kv_block_size = 16;
  o.upload_chunk_elements = 1000;
  absl::StatusOr<std::unique_ptr<CudaDevice>> chunked = CreateCudaDevice(o);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  const int64_t n = 2500;
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  auto bits = std::make_unique<uint16_t[]>(n);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) {
    bits[i] = kc::ToBFloat16(u(rng_)).bits;
    want[i] = RoundToStorage(storage(), kc::ToFloat(kc::BFloat16{bits[i]}));
  }
  const Tensor host = Tensor::OwnedBf16(std::move(bits), {n});
  for (CudaDevice* d : {device_.get(), chunked->get()}) {
    absl::StatusOr<DeviceArray> a = d->Weight(host);
    ASSERT_TRUE(a.ok()) << a.status();
    std::vector<float> got(n);
    d->ToHost(*a, 0, n, got.data());
    ASSERT_TRUE(d->status().ok()) << d->status();
    EXPECT_EQ(got, want);
  }
}

TEST_P(CudaDeviceTest, HeadNormSoftCapAndScale) {
  const int64_t t = 5;
  const int heads = 3, d = 128;
  std::vector<float> x = Random(t * heads * d), w(d);
  for (float& v : w) v = 1.0f + std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng_);
  DeviceArray dx = Up(x), dw = NormUp(w);
  kernels::cpu::HeadRmsNorm(x.data(), w.data(), 1e-6f, t, heads, d, nullptr);
  device_->HeadRmsNorm(dw, 1e-6f, t, heads, d, &dx);
  ExpectNear(x, Down(dx, t * heads * d));

  std::vector<float> logits = Random(1000, 60.0f);
  DeviceArray dl = Up(logits);
  kernels::cpu::SoftCap(logits.data(), 30.0f, 1000, nullptr);
  device_->SoftCap(30.0f, 1000, &dl);
  ExpectNear(logits, Down(dl, 1000));

  std::vector<float> e = Random(300);
  DeviceArray de = Up(e);
  kernels::cpu::Scale(e.data(), 8.0f, 300);
  device_->Scale(8.0f, 300, &de);
  ExpectNear(e, Down(de, 300));
}

TEST_P(CudaDeviceTest, LinearWithAndWithoutBias) {
  const int64_t m = 7, n = 80, k = 128;
  std::vector<float> x = Random(m * k), w = Random(n * k, 0.1f), bias = Random(n);
  DeviceArray dx = Up(x), dw = Up(w), db = Up(bias), dy = Empty(m * n);
  std::vector<float> want(m * n);
  kernels::cpu::Linear(x.data(), w.data(), bias.data(), want.data(), m, n, k, nullptr);
  device_->Linear(dx, dw, db, m, n, k, &dy);
  ExpectNear(want, Down(dy, m * n), 2.0);
  kernels::cpu::Linear(x.data(), w.data(), nullptr, want.data(), m, n, k, nullptr);
  device_->Linear(dx, dw, DeviceArray(), m, n, k, &dy);
  ExpectNear(want, Down(dy, m * n), 2.0);
}

// A mixed step: a prefill chunk of 5 tokens after 11 cached ones, and two decodes.
struct MixedStep {
  std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9, 2};
  std::vector<int32_t> positions = {11, 12, 13, 14, 15, 20, 40};
  std::vector<int64_t> slots;
  std::vector<std::vector<int32_t>> tables = {{2, 5}, {0, 3}, {7, 1, 6}};
  std::vector<kernels::AttentionSeq> seqs;
  std::vector<int64_t> sample_rows = {4, 5, 6};

  MixedStep() {
    auto slot = [this](int s, int pos) { return int64_t{tables[s][pos / 16]} * 16 + pos % 16; };
    for (int p = 11; p <= 15; ++p) slots.push_back(slot(0, p));
    slots.push_back(slot(1, 20));
    slots.push_back(slot(2, 40));
    seqs = {
        {0, 5, 16, tables[0].data()}, {5, 1, 21, tables[1].data()}, {6, 1, 41, tables[2].data()}};
  }
  StepView View() const {
    StepView v;
    v.token_ids = tokens;
    v.positions = positions;
    v.slots = slots;
    v.seqs = seqs;
    v.block_size = 16;
    v.sample_rows = sample_rows;
    v.decode_only = false;
    return v;
  }
};

TEST_P(CudaDeviceTest, GatherRopeKvAndAttention) {
  MixedStep step;
  const int64_t t = 7, vocab = 10, h = 64;
  const int heads = 4, kv_heads = 2, d = 64;
  const kernels::KvCacheLayout layout{8, 16, kv_heads, d};
  const int64_t pool = int64_t{8} * 16 * kv_heads * d;
  device_->SetStep(step.View());

  // Embedding gather and the sampled rows.
  std::vector<float> table = Random(vocab * h), want(t * h);
  DeviceArray dtable = Up(table), demb = Empty(t * h);
  kernels::cpu::EmbeddingGather(table.data(), step.tokens.data(), want.data(), t, h);
  device_->EmbeddingGather(dtable, h, &demb);
  ExpectNear(want, Down(demb, t * h), 0.0);
  DeviceArray drows = Empty(3 * h);
  device_->GatherRows(demb, h, &drows);
  std::vector<float> rows = Down(drows, 3 * h);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < h; ++j) ASSERT_EQ(rows[i * h + j], want[step.sample_rows[i] * h + j]);
  }

  // RoPE (rotary_dim 64, theta 10000).
  std::vector<float> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / d);
  std::vector<float> local_inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) local_inv_freq[i] = std::pow(500000.0f, -2.0f * i / d);
  device_->SetRope(inv_freq, local_inv_freq);
  std::vector<float> q = Random(t * heads * d);
  std::vector<float> q_local = q;
  DeviceArray dq = Up(q), dq_local = Up(q);
  kernels::cpu::RotaryEmbedding(q.data(), step.positions.data(), inv_freq.data(), t, heads, d, d,
                                nullptr);
  device_->Rope(heads, d, /*local=*/false, &dq);
  ExpectNear(q, Down(dq, t * heads * d), 2.0);
  kernels::cpu::RotaryEmbedding(q_local.data(), step.positions.data(), local_inv_freq.data(), t,
                                heads, d, d, nullptr);
  device_->Rope(heads, d, /*local=*/true, &dq_local);
  ExpectNear(q_local, Down(dq_local, t * heads * d), 2.0);
  q = Down(dq, t * heads * d);  // both sides attend with the device's rounded q

  // Fill the whole pool with random history, then write this step's keys and values.
  std::vector<float> kc_host = Random(pool), vc_host = Random(pool);
  DeviceArray dkc = Up(kc_host), dvc = Up(vc_host);
  std::vector<float> k = Random(t * kv_heads * d), v = Random(t * kv_heads * d);
  DeviceArray dk = Up(k), dv = Up(v);
  kernels::cpu::WriteKvCache(k.data(), v.data(), step.slots.data(), t, layout, kc_host.data(),
                             vc_host.data());
  device_->WriteKv(dk, dv, layout, &dkc, &dvc);
  ExpectNear(kc_host, Down(dkc, pool), 0.0);
  ExpectNear(vc_host, Down(dvc, pool), 0.0);

  // Plain, then with a window (8: shorter than every context) and softcapping.
  for (const AttentionOptions& options :
       {AttentionOptions{.scale = 0.125f},
        AttentionOptions{.scale = 0.125f, .sliding_window = 8, .logit_softcap = 0.6f}}) {
    SCOPED_TRACE(options.sliding_window);
    kernels::AttentionParams params;
    params.cache = layout;
    params.num_heads = heads;
    params.scale = options.scale;
    params.sliding_window = options.sliding_window;
    params.logit_softcap = options.logit_softcap;
    params.num_seqs = 3;
    params.seqs = step.seqs.data();
    std::vector<float> out(t * heads * d);
    kernels::cpu::PagedAttention(q.data(), kc_host.data(), vc_host.data(), params, out.data(),
                                 nullptr);
    DeviceArray dout = Empty(t * heads * d);
    device_->Attention(dq, dkc, dvc, layout, heads, options, &dout);
    ExpectNear(out, Down(dout, t * heads * d), 2.0);
  }
}

// A decode step of `contexts.size()` sequences (padded by the caller as the model pads):
// embedding, a projection, KV write, attention, a projection back; returns the output rows.
class DecodeStep {
 public:
  // `window`: the attention's sliding window (0: none).
  DecodeStep(CudaDevice* device, std::mt19937* rng, int window = 0)
      : device_(device), window_(window) {
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    auto random = [&](int64_t n) {
      std::vector<float> v(n);
      for (float& x : v) x = u(*rng);
      return *device_->Weight(Tensor::Owned(v, {n}));
    };
    table_ = random(kVocab * kH);
    wq_ = random(kH * kH);
    wk_ = random(kH * kH);
    wv_ = random(kH * kH);
    wo_ = random(kH * kH);
    key_cache_ = random(int64_t{kBlocks} * 16 * kH);
    value_cache_ = random(int64_t{kBlocks} * 16 * kH);
    std::vector<float> inv_freq(kH / 2);
    for (int i = 0; i < kH / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / kH);
    device_->SetRope(inv_freq, inv_freq);
  }

  // Sequence i has context contexts[i] over blocks i*8 .. i*8+7; contexts[i] == 0 marks a
  // padding row (context 1 over block 0, slot -1).
  std::vector<float> Run(const std::vector<int>& contexts) {
    const int n = static_cast<int>(contexts.size());
    std::vector<int32_t> tokens(n), positions(n);
    std::vector<int64_t> slots(n), sample_rows(n);
    std::vector<std::vector<int32_t>> tables(n);
    std::vector<kernels::AttentionSeq> seqs(n);
    for (int i = 0; i < n; ++i) {
      const bool pad = contexts[i] == 0;
      const int context = pad ? 1 : contexts[i];
      tokens[i] = pad ? 0 : (7 * i + contexts[i]) % kVocab;
      positions[i] = pad ? 0 : context - 1;
      for (int b = 0; b < 8; ++b) tables[i].push_back(pad ? 0 : i * 8 + b);
      slots[i] = pad ? -1 : int64_t{tables[i][(context - 1) / 16]} * 16 + (context - 1) % 16;
      seqs[i] = {i, 1, context, tables[i].data()};
      sample_rows[i] = i;
    }
    StepView view;
    view.token_ids = tokens;
    view.positions = positions;
    view.slots = slots;
    view.seqs = seqs;
    view.block_size = 16;
    view.sample_rows = sample_rows;
    view.decode_only = true;
    device_->SetStep(view);
    device_->Reserve(&x_, int64_t{n} * kH);
    device_->Reserve(&q_, int64_t{n} * kH);
    device_->Reserve(&k_, int64_t{n} * kH);
    device_->Reserve(&v_, int64_t{n} * kH);
    device_->Reserve(&attn_, int64_t{n} * kH);
    device_->Reserve(&out_, int64_t{n} * kH);
    const kernels::KvCacheLayout layout{kBlocks, 16, kHeads, kH / kHeads};
    device_->RunStep([&] {
      device_->EmbeddingGather(table_, kH, &x_);
      device_->Linear(x_, wq_, DeviceArray(), n, kH, kH, &q_);
      device_->Linear(x_, wk_, DeviceArray(), n, kH, kH, &k_);
      device_->Linear(x_, wv_, DeviceArray(), n, kH, kH, &v_);
      device_->Rope(kHeads, kH / kHeads, /*local=*/false, &q_);
      device_->Rope(kHeads, kH / kHeads, /*local=*/false, &k_);
      device_->WriteKv(k_, v_, layout, &key_cache_, &value_cache_);
      device_->Attention(q_, key_cache_, value_cache_, layout, kHeads,
                         AttentionOptions{.scale = 0.125f, .sliding_window = window_}, &attn_);
      device_->Linear(attn_, wo_, DeviceArray(), n, kH, kH, &out_);
    });
    std::vector<float> result(int64_t{n} * kH);
    device_->ToHost(out_, 0, result.size(), result.data());
    return result;
  }

 private:
  static constexpr int kVocab = 50, kH = 128, kHeads = 2, kBlocks = 64;
  CudaDevice* device_;
  const int window_;
  DeviceArray table_, wq_, wk_, wv_, wo_, key_cache_, value_cache_;
  DeviceArray x_, q_, k_, v_, attn_, out_;
};

// With `window`, the contexts below run past it, so the replayed graph's window bounds move.
void CheckReplayEqualsEager(int window) {
  std::vector<std::vector<float>> results[2];
  int captured = 0;
  int64_t replays = 0;
  for (bool graphs : {false, true}) {
    CudaDeviceOptions o;
    o.storage = StorageType::kF32;
    o.abort_on_error = false;
    o.cuda_graphs = graphs;
    o.max_num_seqs = 8;
    o.max_context_len = 128;
    std::unique_ptr<CudaDevice> device = *CreateCudaDevice(o);
    EXPECT_EQ(device->GraphBatchSize(3), graphs ? 4 : 0);
    std::mt19937 rng(7);
    DecodeStep step(device.get(), &rng, window);
    // Batch 4 (3 sequences and a padding row) at growing contexts, and batch 1.
    for (const std::vector<int>& contexts : std::vector<std::vector<int>>{
             {5, 17, 33, 0}, {6, 18, 34, 0}, {7, 60, 100, 0}, {9}, {10}, {8, 61, 101, 0}}) {
      results[graphs].push_back(step.Run(contexts));
      ASSERT_TRUE(device->status().ok()) << device->status();
    }
    captured = device->graphs_captured();
    replays = device->graph_replays();
  }
  // Batch 4 and batch 1 are captured at least once (again when a workspace grows and moves);
  // every step of a captured size is either its capture's eager run or a replay.
  EXPECT_GE(captured, 2);
  EXPECT_GE(replays, 3);
  EXPECT_EQ(captured + replays, 6);
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t s = 0; s < results[0].size(); ++s) {
    const std::vector<float>& eager = results[0][s];
    const std::vector<float>& graph = results[1][s];
    ASSERT_EQ(eager.size(), graph.size());
    // Padding rows are dropped by the model; compare the real rows. The graph attends with the
    // captured bound (max_context_len) rather than the step's, so the split plan may differ:
    // equal within fp32 rounding, not bit for bit.
    for (size_t i = 0; i < eager.size(); ++i) {
      ASSERT_NEAR(graph[i], eager[i], 1e-4 * (1 + std::fabs(eager[i]))) << "step " << s;
    }
  }
}

TEST(CudaDeviceGraphs, ReplayEqualsEagerAtOtherContexts) {
  CARPOOL_SKIP_WITHOUT_CUDA();
  CheckReplayEqualsEager(/*window=*/0);
}

TEST(CudaDeviceGraphs, ReplayEqualsEagerWithASlidingWindow) {
  CARPOOL_SKIP_WITHOUT_CUDA();
  CheckReplayEqualsEager(/*window=*/16);
}

TEST(CudaDeviceOptionsTest, Validate) {
  CudaDeviceOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.max_num_seqs = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = CudaDeviceOptions();
  o.graph_batch_sizes = {1, 0};
  EXPECT_FALSE(o.Validate().ok());
}

INSTANTIATE_TEST_SUITE_P(Storage, CudaDeviceTest,
                         ::testing::Values(StorageType::kF32, StorageType::kBF16,
                                           StorageType::kF16),
                         [](const ::testing::TestParamInfo<StorageType>& info) {
                           switch (info.param) {
                             case StorageType::kF32:
                               return std::string("F32");
                             case StorageType::kBF16:
                               return std::string("BF16");
                             case StorageType::kF16:
                               return std::string("F16");
                           }
                           return std::string("X");
                         });

}  // namespace
}  // namespace carpool::worker
