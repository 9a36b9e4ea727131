// CpuDevice: every op equals the kernels/cpu function it wraps, bit for bit; the step is copied
// (block tables included); fp32 weights are borrowed, bf16 ones packed or borrowed in place,
// int8 ones quantized, biases kept fp32, and Linear / EmbeddingGather run the kernel of the
// weight's format; a bf16 KV pool runs the bf16 cache kernels; padding sizes; storage type and
// weight format names and sizes; the options' checks.
#include "worker/model/cpu_device.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_test_util.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/linear_int8.h"

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

// ---- weight formats ---------------------------------------------------------------------------

std::unique_ptr<CpuDevice> Device(WeightFormat weights, int int8_group = 0,
                                  StorageType kv = StorageType::kF32) {
  CpuDeviceOptions o;
  o.pool = TestPool();
  o.weights = weights;
  o.int8_group = int8_group;
  o.kv_cache = kv;
  return std::make_unique<CpuDevice>(o);
}

std::vector<float> Floats(const DeviceArray& a) {
  const float* p = static_cast<const float*>(a.data());
  return std::vector<float>(p, p + a.numel());
}

DeviceArray FloatArray(CpuDevice* d, const std::vector<float>& values) {
  absl::StatusOr<DeviceArray> a = d->Allocate(static_cast<int64_t>(values.size()));
  EXPECT_TRUE(a.ok()) << a.status();
  d->FromHost(values.data(), 0, static_cast<int64_t>(values.size()), &*a);
  return std::move(*a);
}

// Hands `d` a step of the given tokens (all that EmbeddingGather reads).
void SetTokens(CpuDevice* d, const std::vector<int32_t>& ids) {
  StepView v;
  v.token_ids = ids;
  v.block_size = 1;
  d->SetStep(v);
}

std::vector<uint16_t> Bf16Bits(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  cpu::FloatToBf16(values.data(), static_cast<int64_t>(values.size()), bits.data());
  return bits;
}

TEST(CpuDeviceFormatTest, OptionsAreCheckedAndNamed) {
  EXPECT_STREQ(WeightFormatName(WeightFormat::kF32), "fp32");
  EXPECT_STREQ(WeightFormatName(WeightFormat::kBF16), "bf16");
  EXPECT_STREQ(WeightFormatName(WeightFormat::kInt8), "int8");
  EXPECT_EQ(Device(WeightFormat::kF32)->weight_type(), "fp32");
  EXPECT_EQ(Device(WeightFormat::kBF16)->weight_type(), "bf16");
  EXPECT_EQ(Device(WeightFormat::kInt8)->weight_type(),
            "int8 (group " + std::to_string(cpu::kInt8Group) + ")");
  EXPECT_EQ(Device(WeightFormat::kInt8, 64)->weight_type(), "int8 (group 64)");
  EXPECT_EQ(Device(WeightFormat::kF32)->kv_storage_type(), StorageType::kF32);
  EXPECT_EQ(Device(WeightFormat::kF32, 0, StorageType::kBF16)->kv_storage_type(),
            StorageType::kBF16);
  // Activations stay fp32 whatever the weights are.
  EXPECT_EQ(Device(WeightFormat::kInt8)->storage_type(), StorageType::kF32);

  CpuDeviceOptions o;
  EXPECT_TRUE(CheckCpuDeviceOptions(o).ok());
  o.weights = WeightFormat::kInt8;
  o.int8_group = 48;
  absl::Status s = CheckCpuDeviceOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("48"), std::string::npos) << s;
  o.int8_group = 64;
  EXPECT_TRUE(CheckCpuDeviceOptions(o).ok());
  o.kv_cache = StorageType::kF16;
  s = CheckCpuDeviceOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("KV cache"), std::string::npos) << s;
}

TEST(CpuDeviceFormatTest, Fp32WeightsWidenBf16Tensors) {
  std::unique_ptr<CpuDevice> d = Device(WeightFormat::kF32);
  const std::vector<float> w = RandomFloats(6 * 10, 40);
  const std::vector<uint16_t> bits = Bf16Bits(w);
  absl::StatusOr<DeviceArray> a = d->Weight(Tensor::ViewBf16(bits.data(), {6, 10}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->format().kind, ArrayFormat::Kind::kStorage);
  EXPECT_TRUE(a->owns_memory());
  std::vector<float> want(bits.size());
  cpu::Bf16ToFloat(bits.data(), static_cast<int64_t>(bits.size()), want.data());
  EXPECT_EQ(Floats(*a), want);
}

// Packed from fp32, packed or borrowed from bf16; Linear and EmbeddingGather equal the bf16
// kernels; the bias is an fp32 copy.
TEST(CpuDeviceFormatTest, Bf16WeightsAndTheirKernels) {
  constexpr int64_t kM = 5, kN = 37, kK = 70;
  std::unique_ptr<CpuDevice> d = Device(WeightFormat::kBF16);
  const std::vector<float> x = RandomFloats(kM * kK, 41);
  const std::vector<float> w = RandomFloats(kN * kK, 42);
  const std::vector<float> b = RandomFloats(kN, 43);
  const std::vector<uint16_t> bits = Bf16Bits(w);
  std::vector<uint16_t> packed(cpu::PackedBf16Size(kN, kK));
  cpu::PackBf16Weights(w.data(), kN, kK, packed.data(), nullptr);

  absl::StatusOr<DeviceArray> from_f32 = d->Weight(Tensor::View(w.data(), {kN, kK}));
  absl::StatusOr<DeviceArray> from_bf16 = d->Weight(Tensor::ViewBf16(bits.data(), {kN, kK}));
  absl::StatusOr<DeviceArray> bias = d->Weight(Tensor::View(b.data(), {kN}));
  ASSERT_TRUE(from_f32.ok() && from_bf16.ok() && bias.ok());
  for (const DeviceArray* a : {&*from_f32, &*from_bf16}) {
    EXPECT_EQ(a->format().kind, ArrayFormat::Kind::kBF16);
    EXPECT_EQ(a->numel(), kN * kK);
    EXPECT_EQ(a->bytes(), cpu::PackedBf16Size(kN, kK) * 2);
    EXPECT_TRUE(a->owns_memory());  // so the host's tensor may be released
    EXPECT_EQ(std::memcmp(a->data(), packed.data(), packed.size() * 2), 0);
  }
  EXPECT_NE(from_f32->data(), static_cast<const void*>(w.data()));
  if (cpu::Bf16PackingIsRowMajor()) {
    EXPECT_EQ(from_bf16->data(), static_cast<const void*>(bits.data()));  // in place
  }
  EXPECT_EQ(bias->format().kind, ArrayFormat::Kind::kStorage);
  EXPECT_TRUE(bias->owns_memory());
  EXPECT_EQ(Floats(*bias), b);

  DeviceArray dx = FloatArray(d.get(), x), dy = FloatArray(d.get(), std::vector<float>(kM * kN));
  std::vector<float> want(kM * kN);
  d->Linear(dx, *from_bf16, *bias, kM, kN, kK, &dy);
  cpu::LinearBf16(x.data(), packed.data(), b.data(), want.data(), kM, kN, kK, TestPool());
  EXPECT_TRUE(BitEqual(Floats(dy).data(), want.data(), want.size()));
  d->Linear(dx, *from_f32, DeviceArray(), kM, kN, kK, &dy);
  cpu::LinearBf16(x.data(), packed.data(), nullptr, want.data(), kM, kN, kK, TestPool());
  EXPECT_TRUE(BitEqual(Floats(dy).data(), want.data(), want.size()));

  // The table [kN rows, kK wide].
  const std::vector<int32_t> ids = {3, 0, 36, 3};
  SetTokens(d.get(), ids);
  DeviceArray rows = FloatArray(d.get(), std::vector<float>(ids.size() * kK));
  d->EmbeddingGather(*from_f32, kK, &rows);
  std::vector<float> want_rows(ids.size() * kK);
  cpu::EmbeddingGatherBf16(packed.data(), kN, kK, ids.data(), 4, want_rows.data());
  EXPECT_TRUE(BitEqual(Floats(rows).data(), want_rows.data(), want_rows.size()));
}

// Quantized from fp32 or bf16 (the same bytes for the same values); Linear and EmbeddingGather
// equal the int8 kernels, with the device's group.
TEST(CpuDeviceFormatTest, Int8WeightsAndTheirKernels) {
  constexpr int64_t kM = 4, kN = 21, kK = 100;  // K not a multiple of either group
  for (const int group : {32, 64}) {
    SCOPED_TRACE(group);
    std::unique_ptr<CpuDevice> d = Device(WeightFormat::kInt8, group);
    const std::vector<float> x = RandomFloats(kM * kK, 44);
    // Values a bf16 tensor holds exactly, so both sources quantize the same numbers.
    std::vector<float> w = RandomFloats(kN * kK, 45);
    for (float& v : w) v = cpu::RoundToBf16(v);
    const std::vector<uint16_t> bits = Bf16Bits(w);
    const int64_t bytes = cpu::QuantizedInt8Bytes(kN, kK, group);
    std::vector<uint8_t> want_q(bytes);
    cpu::QuantizeInt8Weights(w.data(), kN, kK, group, want_q.data(), nullptr);

    absl::StatusOr<DeviceArray> from_f32 = d->Weight(Tensor::View(w.data(), {kN, kK}));
    absl::StatusOr<DeviceArray> from_bf16 = d->Weight(Tensor::ViewBf16(bits.data(), {kN, kK}));
    ASSERT_TRUE(from_f32.ok() && from_bf16.ok());
    for (const DeviceArray* a : {&*from_f32, &*from_bf16}) {
      EXPECT_EQ(a->format().kind, ArrayFormat::Kind::kInt8);
      EXPECT_EQ(a->format().group, group);
      EXPECT_EQ(a->bytes(), bytes);
      EXPECT_TRUE(a->owns_memory());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 64, 0u);
      EXPECT_EQ(std::memcmp(a->data(), want_q.data(), bytes), 0);
    }

    DeviceArray dx = FloatArray(d.get(), x);
    DeviceArray dy = FloatArray(d.get(), std::vector<float>(kM * kN));
    std::vector<float> want(kM * kN);
    d->Linear(dx, *from_bf16, DeviceArray(), kM, kN, kK, &dy);
    cpu::LinearInt8(x.data(), want_q.data(), nullptr, want.data(), kM, kN, kK, group, TestPool());
    EXPECT_TRUE(BitEqual(Floats(dy).data(), want.data(), want.size()));

    const std::vector<int32_t> ids = {20, 1, 1};
    SetTokens(d.get(), ids);
    DeviceArray rows = FloatArray(d.get(), std::vector<float>(ids.size() * kK));
    d->EmbeddingGather(*from_f32, kK, &rows);
    std::vector<float> want_rows(ids.size() * kK);
    cpu::EmbeddingGatherInt8(want_q.data(), kN, kK, group, ids.data(), 3, want_rows.data());
    EXPECT_TRUE(BitEqual(Floats(rows).data(), want_rows.data(), want_rows.size()));
  }
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

// The same on a bf16 pool (AllocateKv of a device whose KV cache is bf16): the bf16 cache
// kernels, bit for bit.
TEST_F(CpuDeviceStepTest, WriteKvAndAttentionOnABf16PoolEqualTheBf16Kernels) {
  std::unique_ptr<CpuDevice> d = Device(WeightFormat::kF32, 0, StorageType::kBF16);
  d->SetRope(inv_freq_, local_inv_freq_);
  for (bool decode_only : {false, true}) {
    SCOPED_TRACE(decode_only ? "decode" : "mixed");
    if (decode_only) {
      seqs_ = {{0, 1, 1, nullptr}, {1, 1, 2, nullptr}, {2, 1, 3, nullptr}, {3, 1, 5, nullptr}};
      tables_ = {{3}, {3}, {3, 1}, {2, 1, 0}};
    }
    const int64_t pool = int64_t{layout_.num_blocks} * kBlockSize * kKvHeads * kD;
    const std::vector<float> k = RandomFloats(T() * kKvHeads * kD, 23);
    const std::vector<float> v = RandomFloats(T() * kKvHeads * kD, 24);
    const std::vector<float> q = RandomFloats(T() * kHeads * kD, 25);
    const std::vector<uint16_t> init = Bf16Bits(RandomFloats(pool, 26));
    std::vector<uint16_t> want_keys = init, want_values = init;
    std::vector<float> want_out(T() * kHeads * kD);
    for (size_t i = 0; i < seqs_.size(); ++i) seqs_[i].block_table = tables_[i].data();
    const kernels::AttentionParams params = Params();
    cpu::WriteKvCacheBf16(k.data(), v.data(), slots_.data(), T(), layout_, want_keys.data(),
                          want_values.data());
    if (decode_only) {
      cpu::PagedAttentionDecodeBf16(q.data(), want_keys.data(), want_values.data(), params,
                                    want_out.data(), TestPool());
    } else {
      cpu::PagedAttentionBf16(q.data(), want_keys.data(), want_values.data(), params,
                              want_out.data(), TestPool());
    }

    StepView view;
    view.token_ids = tokens_;
    view.positions = positions_;
    view.slots = slots_;
    view.seqs = seqs_;
    view.block_size = kBlockSize;
    view.sample_rows = samples_;
    view.decode_only = decode_only;
    d->SetStep(view);
    absl::StatusOr<DeviceArray> keys = d->AllocateKv(pool);
    absl::StatusOr<DeviceArray> values = d->AllocateKv(pool);
    ASSERT_TRUE(keys.ok() && values.ok());
    EXPECT_EQ(keys->format().kind, ArrayFormat::Kind::kBF16);
    EXPECT_EQ(keys->numel(), pool);
    EXPECT_EQ(keys->bytes(), pool * 2);
    std::memcpy(keys->data(), init.data(), pool * 2);
    std::memcpy(values->data(), init.data(), pool * 2);
    DeviceArray dk = FloatArray(d.get(), k), dv = FloatArray(d.get(), v),
                dq = FloatArray(d.get(), q),
                dout = FloatArray(d.get(), std::vector<float>(T() * kHeads * kD));
    d->WriteKv(dk, dv, layout_, &*keys, &*values);
    EXPECT_EQ(std::memcmp(keys->data(), want_keys.data(), pool * 2), 0);
    EXPECT_EQ(std::memcmp(values->data(), want_values.data(), pool * 2), 0);
    d->Attention(dq, *keys, *values, layout_, kHeads,
                 AttentionOptions{.scale = 0.35f, .sliding_window = 2, .logit_softcap = 0.5f},
                 &dout);
    EXPECT_TRUE(BitEqual(Floats(dout).data(), want_out.data(), want_out.size()));
  }
  // An fp32 device's pool is fp32.
  absl::StatusOr<DeviceArray> fp32 = device_.AllocateKv(8);
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ(fp32->format().kind, ArrayFormat::Kind::kStorage);
}

}  // namespace
}  // namespace carpool::worker
