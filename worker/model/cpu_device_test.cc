// CpuDevice: every op equals the kernels/cpu function it wraps, bit for bit; the step is copied
// (block tables included); weights are borrowed; padding sizes; storage type names and sizes.
#include "worker/model/cpu_device.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_test_util.h"

namespace carpool::worker {
namespace {

namespace cpu = ::carpool::kernels::cpu;
using ::carpool::kernels::test_util::BitEqual;
using ::carpool::kernels::test_util::RandomFloats;
using ::carpool::kernels::test_util::TestPool;

class CpuDeviceTest : public ::testing::Test {
 protected:
  // A device array holding `values`.
  DeviceArray Array(const std::vector<float>& values) {
    absl::StatusOr<DeviceArray> a = device_.Allocate(static_cast<int64_t>(values.size()));
    EXPECT_TRUE(a.ok()) << a.status();
    device_.FromHost(values.data(), 0, static_cast<int64_t>(values.size()), &*a);
    return std::move(*a);
  }
  DeviceArray Zeros(int64_t n) { return Array(std::vector<float>(n, 0.0f)); }
  std::vector<float> Host(const DeviceArray& a) {
    std::vector<float> v(a.numel());
    device_.ToHost(a, 0, a.numel(), v.data());
    return v;
  }

  static CpuDeviceOptions OnTestPool() {
    CpuDeviceOptions o;
    o.pool = TestPool();
    return o;
  }

  CpuDevice device_{OnTestPool()};
};

TEST(StorageTypeTest, NamesAndBytes) {
  EXPECT_STREQ(StorageTypeName(StorageType::kF32), "fp32");
  EXPECT_STREQ(StorageTypeName(StorageType::kBF16), "bf16");
  EXPECT_STREQ(StorageTypeName(StorageType::kF16), "fp16");
  EXPECT_EQ(StorageTypeBytes(StorageType::kF32), 4);
  EXPECT_EQ(StorageTypeBytes(StorageType::kBF16), 2);
  EXPECT_EQ(StorageTypeBytes(StorageType::kF16), 2);
}

TEST_F(CpuDeviceTest, DescribesItself) {
  EXPECT_EQ(device_.name(), "cpu");
  EXPECT_EQ(device_.storage_type(), StorageType::kF32);
  EXPECT_EQ(device_.FreeBytes(), -1);
  EXPECT_EQ(device_.GraphBatchSize(1), 0);
}

TEST_F(CpuDeviceTest, WeightsAreBorrowedAndArraysAreHostMemory) {
  const std::vector<float> values = RandomFloats(12, 1);
  const Tensor t = Tensor::View(values.data(), {3, 4});
  absl::StatusOr<DeviceArray> w = device_.Weight(t);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->data(), values.data());
  EXPECT_EQ(w->numel(), 12);
  EXPECT_EQ(device_.HostData(*w), values.data());
  absl::StatusOr<DeviceArray> empty = device_.Weight(Tensor());
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());

  DeviceArray a = Array({1, 2, 3, 4});
  EXPECT_EQ(device_.HostData(a), a.data());
  float part[2];
  device_.ToHost(a, 1, 2, part);
  EXPECT_EQ(part[0], 2.0f);
  EXPECT_EQ(part[1], 3.0f);
  const float back[2] = {7, 8};
  device_.FromHost(back, 2, 2, &a);
  EXPECT_EQ(Host(a), (std::vector<float>{1, 2, 7, 8}));
}

TEST_F(CpuDeviceTest, ReserveGrowsOnlyWhenSmaller) {
  DeviceArray a;
  device_.Reserve(&a, 10);
  EXPECT_EQ(a.numel(), 10);
  void* const data = a.data();
  device_.Reserve(&a, 4);
  EXPECT_EQ(a.data(), data);
  EXPECT_EQ(a.numel(), 10);
  device_.Reserve(&a, 11);
  EXPECT_EQ(a.numel(), 11);
}

TEST(CpuDevicePaddingTest, GraphBatchSizeIsTheNextPadSize) {
  CpuDeviceOptions o;
  o.pad_decode_batch_sizes = {8, 4};
  std::unique_ptr<ModelDevice> d = CreateCpuDevice(o);
  EXPECT_EQ(d->GraphBatchSize(1), 4);
  EXPECT_EQ(d->GraphBatchSize(4), 4);
  EXPECT_EQ(d->GraphBatchSize(5), 8);
  EXPECT_EQ(d->GraphBatchSize(8), 8);
  EXPECT_EQ(d->GraphBatchSize(9), 0);
  int calls = 0;
  d->RunStep([&] { ++calls; });
  EXPECT_EQ(calls, 1);
}

TEST_F(CpuDeviceTest, ElementwiseOpsEqualTheKernels) {
  constexpr int64_t kRows = 5, kH = 48, kInter = 40;
  const std::vector<float> x = RandomFloats(kRows * kH, 2);
  const std::vector<float> w = RandomFloats(kH, 3, 0.5f, 1.5f);
  const std::vector<float> res = RandomFloats(kRows * kH, 4);
  const float eps = 1e-5f;

  DeviceArray dx = Array(x), dw = Array(w), dout = Zeros(kRows * kH);
  device_.RmsNorm(dx, dw, eps, kRows, kH, &dout);
  std::vector<float> want(kRows * kH);
  cpu::RmsNorm(x.data(), w.data(), eps, want.data(), kRows, kH, TestPool());
  EXPECT_TRUE(BitEqual(Host(dout).data(), want.data(), want.size()));

  DeviceArray dres = Array(res);
  device_.AddRmsNorm(dx, &dres, dw, eps, kRows, kH, &dout);
  std::vector<float> want_res = res;
  cpu::AddRmsNorm(x.data(), want_res.data(), w.data(), eps, want.data(), kRows, kH, TestPool());
  EXPECT_TRUE(BitEqual(Host(dres).data(), want_res.data(), want_res.size()));
  EXPECT_TRUE(BitEqual(Host(dout).data(), want.data(), want.size()));

  const std::vector<float> gate = RandomFloats(kRows * kInter, 5, -4.0f, 4.0f);
  const std::vector<float> up = RandomFloats(kRows * kInter, 6);
  DeviceArray dgate = Array(gate), dup = Array(up);
  device_.SiluMul(dgate, dup, kRows, kInter, &dgate);  // out may be gate
  std::vector<float> want_act(kRows * kInter);
  cpu::SiluMul(gate.data(), up.data(), want_act.data(), kRows, kInter, TestPool());
  EXPECT_TRUE(BitEqual(Host(dgate).data(), want_act.data(), want_act.size()));

  dgate = Array(gate);
  device_.GeluTanhMul(dgate, dup, kRows, kInter, &dgate);
  cpu::GeluTanhMul(gate.data(), up.data(), want_act.data(), kRows, kInter, TestPool());
  EXPECT_TRUE(BitEqual(Host(dgate).data(), want_act.data(), want_act.size()));
}

TEST_F(CpuDeviceTest, NewFamilyOpsEqualTheKernels) {
  constexpr int64_t kRows = 3;
  constexpr int kHeads = 4, kD = 16;
  const std::vector<float> x = RandomFloats(kRows * kHeads * kD, 30, -3.0f, 3.0f);
  const std::vector<float> w = RandomFloats(kD, 31, 0.5f, 1.5f);
  DeviceArray dx = Array(x), dw = Array(w);
  device_.HeadRmsNorm(dw, 1e-6f, kRows, kHeads, kD, &dx);
  std::vector<float> want = x;
  cpu::HeadRmsNorm(want.data(), w.data(), 1e-6f, kRows, kHeads, kD, TestPool());
  EXPECT_TRUE(BitEqual(Host(dx).data(), want.data(), want.size()));

  const std::vector<float> logits = RandomFloats(200, 32, -100.0f, 100.0f);
  DeviceArray dl = Array(logits);
  device_.SoftCap(30.0f, 150, &dl);  // the first 150 only
  want = logits;
  cpu::SoftCap(want.data(), 30.0f, 150, TestPool());
  EXPECT_TRUE(BitEqual(Host(dl).data(), want.data(), want.size()));

  DeviceArray ds = Array(logits);
  device_.Scale(8.0f, 200, &ds);
  want = logits;
  cpu::Scale(want.data(), 8.0f, 200);
  EXPECT_TRUE(BitEqual(Host(ds).data(), want.data(), want.size()));
}

TEST_F(CpuDeviceTest, LinearEqualsTheKernelWithAndWithoutBias) {
  constexpr int64_t kM = 3, kN = 37, kK = 70;
  const std::vector<float> x = RandomFloats(kM * kK, 7);
  const std::vector<float> w = RandomFloats(kN * kK, 8);
  const std::vector<float> b = RandomFloats(kN, 9);
  const Tensor wt = Tensor::View(w.data(), {kN, kK});
  const Tensor bt = Tensor::View(b.data(), {kN});
  absl::StatusOr<DeviceArray> dw = device_.Weight(wt);
  absl::StatusOr<DeviceArray> db = device_.Weight(bt);
  ASSERT_TRUE(dw.ok() && db.ok());
  DeviceArray dx = Array(x), dy = Zeros(kM * kN);
  std::vector<float> want(kM * kN);

  device_.Linear(dx, *dw, DeviceArray(), kM, kN, kK, &dy);
  cpu::Linear(x.data(), w.data(), nullptr, want.data(), kM, kN, kK, TestPool());
  EXPECT_TRUE(BitEqual(Host(dy).data(), want.data(), want.size()));

  device_.Linear(dx, *dw, *db, kM, kN, kK, &dy);
  cpu::Linear(x.data(), w.data(), b.data(), want.data(), kM, kN, kK, TestPool());
  EXPECT_TRUE(BitEqual(Host(dy).data(), want.data(), want.size()));
}

// A step of two sequences over a pool of 4 blocks of 2 slots: a prefill of 3 tokens and a
// decode at position 4.
class CpuDeviceStepTest : public CpuDeviceTest {
 protected:
  static constexpr int kHeads = 4, kKvHeads = 2, kD = 8, kBlockSize = 2;

  void SetUp() override {
    layout_.num_blocks = 4;
    layout_.block_size = kBlockSize;
    layout_.num_kv_heads = kKvHeads;
    layout_.head_dim = kD;
    tokens_ = {5, 1, 9, 3};
    positions_ = {0, 1, 2, 4};
    slots_ = {6, 7, 2, 0};  // seq 0: blocks 3, 1; seq 1: blocks 2, 1, 0
    tables_ = {{3, 1}, {2, 1, 0}};
    seqs_ = {{0, 3, 3, nullptr}, {3, 1, 5, nullptr}};
    samples_ = {2, 3};
    inv_freq_ = RandomFloats(kD / 2, 10, 0.01f, 1.0f);
    local_inv_freq_ = RandomFloats(kD / 2, 17, 0.01f, 1.0f);
    device_.SetRope(inv_freq_, local_inv_freq_);
  }
  void Set(bool decode_only) {
    for (size_t i = 0; i < seqs_.size(); ++i) seqs_[i].block_table = tables_[i].data();
    StepView v;
    v.token_ids = tokens_;
    v.positions = positions_;
    v.slots = slots_;
    v.seqs = seqs_;
    v.block_size = kBlockSize;
    v.sample_rows = samples_;
    v.decode_only = decode_only;
    device_.SetStep(v);
  }
  kernels::AttentionParams Params() const {
    kernels::AttentionParams p;
    p.cache = layout_;
    p.num_heads = kHeads;
    p.scale = 0.35f;
    p.sliding_window = 2;
    p.logit_softcap = 0.5f;
    p.num_seqs = static_cast<int>(seqs_.size());
    p.seqs = seqs_.data();
    return p;
  }
  int64_t T() const { return static_cast<int64_t>(tokens_.size()); }

  kernels::KvCacheLayout layout_;
  std::vector<int32_t> tokens_, positions_;
  std::vector<int64_t> slots_, samples_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<kernels::AttentionSeq> seqs_;
  std::vector<float> inv_freq_, local_inv_freq_;
};

TEST_F(CpuDeviceStepTest, GatherOpsReadTheStep) {
  Set(false);
  constexpr int64_t kH = 6;
  const std::vector<float> table = RandomFloats(10 * kH, 11);
  DeviceArray dtable = Array(table), dout = Zeros(T() * kH);
  device_.EmbeddingGather(dtable, kH, &dout);
  std::vector<float> want(T() * kH);
  cpu::EmbeddingGather(table.data(), tokens_.data(), want.data(), T(), kH);
  EXPECT_TRUE(BitEqual(Host(dout).data(), want.data(), want.size()));

  DeviceArray rows = Zeros(2 * kH);
  device_.GatherRows(dout, kH, &rows);
  const std::vector<float> got = Host(rows);
  EXPECT_TRUE(BitEqual(got.data(), want.data() + 2 * kH, kH));
  EXPECT_TRUE(BitEqual(got.data() + kH, want.data() + 3 * kH, kH));
}

TEST_F(CpuDeviceStepTest, RopeEqualsTheKernelWithEitherTable) {
  Set(false);
  const std::vector<float> x = RandomFloats(T() * kHeads * kD, 12);
  for (const bool local : {false, true}) {
    SCOPED_TRACE(local ? "local" : "global");
    DeviceArray dx = Array(x);
    device_.Rope(kHeads, kD, local, &dx);
    std::vector<float> want = x;
    cpu::RotaryEmbedding(want.data(), positions_.data(),
                         local ? local_inv_freq_.data() : inv_freq_.data(), T(), kHeads, kD, kD,
                         TestPool());
    EXPECT_TRUE(BitEqual(Host(dx).data(), want.data(), want.size()));
  }
}

// WriteKv then Attention, for the mixed kernel and for the decode kernel, against the kernels
// on their own copy of the pool. The caller's block tables are scribbled over after SetStep:
// the device must have copied them.
TEST_F(CpuDeviceStepTest, WriteKvAndAttentionEqualTheKernels) {
  for (bool decode_only : {false, true}) {
    SCOPED_TRACE(decode_only ? "decode" : "mixed");
    if (decode_only) {  // four decodes at positions 0, 1, 2, 4 of the same block tables
      seqs_ = {{0, 1, 1, nullptr}, {1, 1, 2, nullptr}, {2, 1, 3, nullptr}, {3, 1, 5, nullptr}};
      tables_ = {{3}, {3}, {3, 1}, {2, 1, 0}};
      slots_ = {6, 7, 2, 0};
    }
    const int64_t pool = int64_t{layout_.num_blocks} * kBlockSize * kKvHeads * kD;
    const std::vector<float> k = RandomFloats(T() * kKvHeads * kD, 13);
    const std::vector<float> v = RandomFloats(T() * kKvHeads * kD, 14);
    const std::vector<float> q = RandomFloats(T() * kHeads * kD, 15);
    const std::vector<float> init = RandomFloats(pool, 16);  // what earlier steps left
    std::vector<float> want_keys = init, want_values = init, want_out(T() * kHeads * kD);
    const kernels::AttentionParams params = [&] {
      for (size_t i = 0; i < seqs_.size(); ++i) seqs_[i].block_table = tables_[i].data();
      return Params();
    }();
    cpu::WriteKvCache(k.data(), v.data(), slots_.data(), T(), layout_, want_keys.data(),
                      want_values.data());
    if (decode_only) {
      cpu::PagedAttentionDecode(q.data(), want_keys.data(), want_values.data(), params,
                                want_out.data(), TestPool());
    } else {
      cpu::PagedAttention(q.data(), want_keys.data(), want_values.data(), params, want_out.data(),
                          TestPool());
    }

    Set(decode_only);
    for (auto& table : tables_) std::fill(table.begin(), table.end(), 99);
    DeviceArray dk = Array(k), dv = Array(v), dq = Array(q), keys = Array(init),
                values = Array(init), dout = Zeros(T() * kHeads * kD);
    device_.WriteKv(dk, dv, layout_, &keys, &values);
    EXPECT_TRUE(BitEqual(Host(keys).data(), want_keys.data(), pool));
    EXPECT_TRUE(BitEqual(Host(values).data(), want_values.data(), pool));
    device_.Attention(dq, keys, values, layout_, kHeads,
                      AttentionOptions{.scale = 0.35f, .sliding_window = 2, .logit_softcap = 0.5f},
                      &dout);
    EXPECT_TRUE(BitEqual(Host(dout).data(), want_out.data(), want_out.size()));
  }
}

}  // namespace
}  // namespace carpool::worker
