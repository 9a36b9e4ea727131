// Each CUDA kernel against kernels/reference/ (and the sampler against the CPU sampler) on
// random inputs. Inputs are rounded to the storage type first, so the tolerances measure only
// the kernel's own rounding: fp32 ~1e-5, fp16 ~2e-3, bf16 ~1.6e-2 (relative, plus the same
// absolute). Tests that need a GPU skip themselves where there is none; the dtype conversion
// tests run everywhere.
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/dtype.h"
#include "kernels/cuda/gemm.h"
#include "kernels/reference/reference_kernels.h"
#include "worker/sampler/philox.h"
#include "worker/sampler/sampler.h"

namespace carpool::kernels::cuda {
namespace {

#define CARPOOL_TEST_CONCAT_INNER(a, b) a##b
#define CARPOOL_TEST_CONCAT(a, b) CARPOOL_TEST_CONCAT_INNER(a, b)

#define ASSERT_OK(expr)                                            \
  do {                                                             \
    const absl::Status carpool_status = (expr);                    \
    ASSERT_TRUE(carpool_status.ok()) << carpool_status.ToString(); \
  } while (0)

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(CARPOOL_TEST_CONCAT(carpool_statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)   \
  auto tmp = (expr);                                \
  ASSERT_TRUE(tmp.ok()) << tmp.status().ToString(); \
  lhs = std::move(tmp).value()

constexpr float kEps = 1e-6f;

// Tolerances of one storage type (relative and absolute, applied together).
template <typename T>
double Tolerance();
template <>
double Tolerance<float>() {
  return 2e-5;
}
template <>
double Tolerance<Half>() {
  return 2e-3;
}
template <>
double Tolerance<BFloat16>() {
  return 1.6e-2;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Values rounded to T and back: what the kernel sees.
template <typename T>
std::vector<float> Quantized(std::vector<float> v) {
  for (float& x : v) x = ToFloat(FromFloat<T>(x));
  return v;
}

::testing::AssertionResult AllNear(const std::vector<float>& actual,
                                   const std::vector<double>& expected, double tolerance) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size() << " != " << expected.size();
  }
  size_t bad = 0;
  size_t first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::abs(static_cast<double>(actual[i]) - expected[i]);
    worst = std::max(worst, err);
    if (!(err <= tolerance * (1.0 + std::abs(expected[i])))) {  // also catches NaN
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  char message[256];
  std::snprintf(message, sizeof(message),
                "%zu of %zu values off; first at %zu: got %.9g, want %.9g; worst error %.3g", bad,
                expected.size(), first, actual[first], expected[first], worst);
  return ::testing::AssertionFailure() << message;
}

// Device buffers holding host values converted to T, and back.
template <typename T>
absl::StatusOr<DeviceBuffer> Upload(const std::vector<float>& values) {
  std::vector<T> converted(values.size());
  for (size_t i = 0; i < values.size(); ++i) converted[i] = FromFloat<T>(values[i]);
  return DeviceBuffer::FromHost(converted);
}

template <typename T>
absl::StatusOr<std::vector<float>> Download(const DeviceBuffer& buffer, size_t n) {
  absl::StatusOr<std::vector<T>> values = buffer.ToHost<T>(n);
  if (!values.ok()) return values.status();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = ToFloat((*values)[i]);
  return out;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// ---------------------------------------------------------------------------------------------
// Conversions (host only: these run without a GPU).

std::vector<uint32_t> InterestingFloatBits() {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u,
                                0x3f800000u, 0xbf800000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                                0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x477fe000u, 0x477ff000u,
                                0x477fefffu, 0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u,
                                0x33000001u, 0x3f808000u, 0x3f818000u, 0x3f807fffu};
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) bits.push_back(rng());
  return bits;
}

TEST(DtypeTest, BFloat16MatchesCudaHostConversion) {
  for (uint32_t b : InterestingFloatBits()) {
    const float x = std::bit_cast<float>(b);
    const __nv_bfloat16 want = __float2bfloat16_rn(x);
    const uint16_t want_bits = std::bit_cast<uint16_t>(want);
    const uint16_t got = ToBFloat16(x).bits;
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(ToFloat(BFloat16{got}))) << std::hex << b;
    } else {
      ASSERT_EQ(got, want_bits) << "float bits 0x" << std::hex << b;
    }
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = __bfloat162float(std::bit_cast<__nv_bfloat16>(static_cast<uint16_t>(h)));
    const float got = ToFloat(BFloat16{static_cast<uint16_t>(h)});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << h;
    }
  }
}

TEST(DtypeTest, HalfMatchesCudaHostConversion) {
  for (uint32_t b : InterestingFloatBits()) {
    const float x = std::bit_cast<float>(b);
    const uint16_t want_bits = std::bit_cast<uint16_t>(__float2half_rn(x));
    const uint16_t got = ToHalf(x).bits;
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(ToFloat(Half{got}))) << std::hex << b;
    } else {
      ASSERT_EQ(got, want_bits) << "float bits 0x" << std::hex << b;
    }
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = __half2float(std::bit_cast<__half>(static_cast<uint16_t>(h)));
    const float got = ToFloat(Half{static_cast<uint16_t>(h)});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << h;
    }
  }
}

TEST(DtypeTest, DeviceCountIsZeroOrMoreWithoutError) { EXPECT_GE(DeviceCount(), 0); }

// ---------------------------------------------------------------------------------------------
// Row-wise and elementwise kernels.

template <typename T>
void CheckEmbeddingGather() {
  const int64_t vocab = 1000;
  const int64_t h = 320;
  const std::vector<int32_t> ids = {0, 999, 17, -1, 17, 1000, 523};
  const int64_t t = static_cast<int64_t>(ids.size());
  const std::vector<float> table = Quantized<T>(RandomFloats(vocab * h, 1));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_table, Upload<T>(table));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ids, DeviceBuffer::FromHost(ids));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(t * h * sizeof(T)));
  ASSERT_OK(
      EmbeddingGather(d_table.as<T>(), vocab, d_ids.as<int32_t>(), d_out.as<T>(), t, h, nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<T>(d_out, t * h));
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < h; ++i) {
      const bool in_range = ids[r] >= 0 && ids[r] < vocab;
      const float want = in_range ? table[ids[r] * h + i] : 0.0f;
      ASSERT_EQ(out[r * h + i], want) << "row " << r << " feature " << i;
    }
  }
}

TEST_F(CudaTest, EmbeddingGatherF32) { CheckEmbeddingGather<float>(); }
TEST_F(CudaTest, EmbeddingGatherF16) { CheckEmbeddingGather<Half>(); }
TEST_F(CudaTest, EmbeddingGatherBF16) { CheckEmbeddingGather<BFloat16>(); }

const std::pair<int64_t, int64_t> kRowShapes[] = {{1, 64}, {5, 4096}, {3, 1000}, {2, 8192}};

template <typename T>
void CheckRmsNorm() {
  for (const auto& [t, h] : kRowShapes) {
    SCOPED_TRACE(std::to_string(t) + "x" + std::to_string(h));
    const std::vector<float> x = Quantized<T>(RandomFloats(t * h, 1, -3.0f, 3.0f));
    const std::vector<float> weight = RandomFloats(h, 2, 0.5f, 1.5f);  // fp32 on the device
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, Upload<T>(x));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_w, DeviceBuffer::FromHost(weight));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(t * h * sizeof(T)));
    ASSERT_OK(RmsNorm(d_x.as<T>(), d_w.as<float>(), kEps, d_out.as<T>(), t, h, nullptr));
    ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<T>(d_out, t * h));
    const std::vector<double> want = reference::RmsNorm(x.data(), weight.data(), kEps, t, h);
    EXPECT_TRUE(AllNear(out, want, Tolerance<T>()));
    // In place gives the same.
    ASSERT_OK(RmsNorm(d_x.as<T>(), d_w.as<float>(), kEps, d_x.as<T>(), t, h, nullptr));
    ASSERT_OK_AND_ASSIGN(std::vector<float> in_place, Download<T>(d_x, t * h));
    EXPECT_EQ(in_place, out);
  }
}

TEST_F(CudaTest, RmsNormF32) { CheckRmsNorm<float>(); }
TEST_F(CudaTest, RmsNormF16) { CheckRmsNorm<Half>(); }
TEST_F(CudaTest, RmsNormBF16) { CheckRmsNorm<BFloat16>(); }

template <typename T>
void CheckAddRmsNorm() {
  for (const auto& [t, h] : kRowShapes) {
    SCOPED_TRACE(std::to_string(t) + "x" + std::to_string(h));
    const std::vector<float> x = Quantized<T>(RandomFloats(t * h, 5));
    const std::vector<float> residual = Quantized<T>(RandomFloats(t * h, 6, -4.0f, 4.0f));
    const std::vector<float> weight = RandomFloats(h, 7);  // fp32 on the device
    const auto [want_residual, want_out] =
        reference::AddRmsNorm(x.data(), residual.data(), weight.data(), kEps, t, h);
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, Upload<T>(x));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_r, Upload<T>(residual));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_w, DeviceBuffer::FromHost(weight));
    // out aliases x, as the model uses it.
    ASSERT_OK(
        AddRmsNorm(d_x.as<T>(), d_r.as<T>(), d_w.as<float>(), kEps, d_x.as<T>(), t, h, nullptr));
    ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<T>(d_x, t * h));
    ASSERT_OK_AND_ASSIGN(std::vector<float> new_residual, Download<T>(d_r, t * h));
    EXPECT_TRUE(AllNear(new_residual, want_residual, Tolerance<T>()));
    EXPECT_TRUE(AllNear(out, want_out, Tolerance<T>()));
  }
}

TEST_F(CudaTest, AddRmsNormF32) { CheckAddRmsNorm<float>(); }
TEST_F(CudaTest, AddRmsNormF16) { CheckAddRmsNorm<Half>(); }
TEST_F(CudaTest, AddRmsNormBF16) { CheckAddRmsNorm<BFloat16>(); }

template <typename T>
void CheckRotary() {
  const int64_t t = 6;
  const int num_heads = 4;
  for (const int head_dim : {64, 128}) {
    for (const int rotary_dim : {head_dim, head_dim / 2}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " rotary " +
                   std::to_string(rotary_dim));
      const std::vector<float> x = Quantized<T>(RandomFloats(t * num_heads * head_dim, 11));
      const std::vector<int32_t> positions = {0, 1, 7, 100, 4095, 131000};
      std::vector<float> inv_freq(rotary_dim / 2);
      for (int i = 0; i < rotary_dim / 2; ++i) {
        inv_freq[i] = static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / rotary_dim));
      }
      ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, Upload<T>(x));
      ASSERT_OK_AND_ASSIGN(DeviceBuffer d_pos, DeviceBuffer::FromHost(positions));
      ASSERT_OK_AND_ASSIGN(DeviceBuffer d_freq, DeviceBuffer::FromHost(inv_freq));
      ASSERT_OK(RotaryEmbedding(d_x.as<T>(), d_pos.as<int32_t>(), d_freq.as<float>(), t, num_heads,
                                head_dim, rotary_dim, nullptr));
      ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<T>(d_x, x.size()));
      // Large angles lose a little to fp32 sincos: a looser bound for fp32 only.
      const double tolerance = std::max(Tolerance<T>(), 1e-4);
      EXPECT_TRUE(AllNear(out,
                          reference::RotaryEmbedding(x.data(), positions.data(), inv_freq.data(), t,
                                                     num_heads, head_dim, rotary_dim),
                          tolerance));
    }
  }
}

TEST_F(CudaTest, RotaryEmbeddingF32) { CheckRotary<float>(); }
TEST_F(CudaTest, RotaryEmbeddingF16) { CheckRotary<Half>(); }
TEST_F(CudaTest, RotaryEmbeddingBF16) { CheckRotary<BFloat16>(); }

template <typename T>
void CheckSiluMul() {
  const int64_t t = 7;
  const int64_t inter = 1000;
  const std::vector<float> gate = Quantized<T>(RandomFloats(t * inter, 21, -6.0f, 6.0f));
  const std::vector<float> up = Quantized<T>(RandomFloats(t * inter, 22, -2.0f, 2.0f));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_gate, Upload<T>(gate));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_up, Upload<T>(up));
  ASSERT_OK(SiluMul(d_gate.as<T>(), d_up.as<T>(), d_gate.as<T>(), t, inter, nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<T>(d_gate, t * inter));
  EXPECT_TRUE(AllNear(out, reference::SiluMul(gate.data(), up.data(), t, inter), Tolerance<T>()));
}

TEST_F(CudaTest, SiluMulF32) { CheckSiluMul<float>(); }
TEST_F(CudaTest, SiluMulF16) { CheckSiluMul<Half>(); }
TEST_F(CudaTest, SiluMulBF16) { CheckSiluMul<BFloat16>(); }

template <typename T>
void CheckGeluTanhMul() {
  const int64_t t = 7;
  const int64_t inter = 1000;
  const std::vector<float> gate = Quantized<T>(RandomFloats(t * inter, 23, -8.0f, 8.0f));
  const std::vector<float> up = Quantized<T>(RandomFloats(t * inter, 24, -2.0f, 2.0f));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_gate, Upload<T>(gate));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_up, Upload<T>(up));
  ASSERT_OK(GeluTanhMul(d_gate.as<T>(), d_up.as<T>(), d_gate.as<T>(), t, inter, nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<T>(d_gate, t * inter));
  EXPECT_TRUE(
      AllNear(out, reference::GeluTanhMul(gate.data(), up.data(), t, inter), Tolerance<T>()));
}

TEST_F(CudaTest, GeluTanhMulF32) { CheckGeluTanhMul<float>(); }
TEST_F(CudaTest, GeluTanhMulF16) { CheckGeluTanhMul<Half>(); }
TEST_F(CudaTest, GeluTanhMulBF16) { CheckGeluTanhMul<BFloat16>(); }

template <typename T>
void CheckHeadRmsNorm() {
  for (const auto& [t, heads, d] :
       {std::tuple<int64_t, int, int>{1, 1, 64}, std::tuple<int64_t, int, int>{9, 16, 128},
        std::tuple<int64_t, int, int>{5, 3, 256}, std::tuple<int64_t, int, int>{4, 2, 40}}) {
    SCOPED_TRACE(std::to_string(t) + "x" + std::to_string(heads) + "x" + std::to_string(d));
    const std::vector<float> x = Quantized<T>(RandomFloats(t * heads * d, 25, -3.0f, 3.0f));
    const std::vector<float> weight = RandomFloats(d, 26, 0.5f, 1.5f);  // fp32 on the device
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, Upload<T>(x));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_w, DeviceBuffer::FromHost(weight));
    ASSERT_OK(HeadRmsNorm(d_x.as<T>(), d_w.as<float>(), kEps, t, heads, d, nullptr));
    ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<T>(d_x, x.size()));
    // Each head is one RMSNorm row of d features.
    EXPECT_TRUE(AllNear(out, reference::RmsNorm(x.data(), weight.data(), kEps, t * heads, d),
                        Tolerance<T>()));
  }
}

TEST_F(CudaTest, HeadRmsNormF32) { CheckHeadRmsNorm<float>(); }
TEST_F(CudaTest, HeadRmsNormF16) { CheckHeadRmsNorm<Half>(); }
TEST_F(CudaTest, HeadRmsNormBF16) { CheckHeadRmsNorm<BFloat16>(); }

template <typename T>
void CheckSoftCapAndScale() {
  const int64_t n = 70001;
  const std::vector<float> x = Quantized<T>(RandomFloats(n, 27, -150.0f, 150.0f));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, Upload<T>(x));
  ASSERT_OK(SoftCap(d_x.as<T>(), 30.0f, n, nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<float> capped, Download<T>(d_x, n));
  EXPECT_TRUE(AllNear(capped, reference::SoftCap(x.data(), 30.0, n), Tolerance<T>()));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_y, Upload<T>(x));
  ASSERT_OK(Scale(d_y.as<T>(), 45.25f, n, nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<float> scaled, Download<T>(d_y, n));
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = double{x[i]} * 45.25;
  EXPECT_TRUE(AllNear(scaled, want, Tolerance<T>()));
}

TEST_F(CudaTest, SoftCapAndScaleF32) { CheckSoftCapAndScale<float>(); }
TEST_F(CudaTest, SoftCapAndScaleBF16) { CheckSoftCapAndScale<BFloat16>(); }

template <typename T>
void CheckWriteKvCache() {
  const KvCacheLayout layout{/*num_blocks=*/4, /*block_size=*/16, /*num_kv_heads=*/2,
                             /*head_dim=*/64};
  const int64_t width = layout.num_kv_heads * layout.head_dim;
  const int64_t pool = int64_t{layout.num_blocks} * layout.block_size;
  const std::vector<int64_t> slots = {0, 15, 16, -1, 63, 64, 40};  // -1 and 64: not stored
  const int64_t t = static_cast<int64_t>(slots.size());
  const std::vector<float> k = Quantized<T>(RandomFloats(t * width, 31));
  const std::vector<float> v = Quantized<T>(RandomFloats(t * width, 32));
  const std::vector<float> zeros(pool * width, 0.0f);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_k, Upload<T>(k));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_v, Upload<T>(v));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_slots, DeviceBuffer::FromHost(slots));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_kc, Upload<T>(zeros));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_vc, Upload<T>(zeros));
  ASSERT_OK(WriteKvCache(d_k.as<T>(), d_v.as<T>(), d_slots.as<int64_t>(), t, layout, d_kc.as<T>(),
                         d_vc.as<T>(), nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<float> kc, Download<T>(d_kc, pool * width));
  ASSERT_OK_AND_ASSIGN(std::vector<float> vc, Download<T>(d_vc, pool * width));
  std::vector<float> want_k = zeros;
  std::vector<float> want_v = zeros;
  for (int64_t r = 0; r < t; ++r) {
    if (slots[r] < 0 || slots[r] >= pool) continue;
    std::copy_n(k.begin() + r * width, width, want_k.begin() + slots[r] * width);
    std::copy_n(v.begin() + r * width, width, want_v.begin() + slots[r] * width);
  }
  EXPECT_EQ(kc, want_k);
  EXPECT_EQ(vc, want_v);
}

TEST_F(CudaTest, WriteKvCacheF32) { CheckWriteKvCache<float>(); }
TEST_F(CudaTest, WriteKvCacheF16) { CheckWriteKvCache<Half>(); }
TEST_F(CudaTest, WriteKvCacheBF16) { CheckWriteKvCache<BFloat16>(); }

template <typename From, typename To>
void CheckConvert() {
  std::vector<float> values = RandomFloats(10007, 41, -70000.0f, 70000.0f);
  const std::vector<float> small = RandomFloats(1000, 42, -1e-6f, 1e-6f);
  values.insert(values.end(), small.begin(), small.end());
  values = Quantized<From>(values);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_in, Upload<From>(values));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(values.size() * sizeof(To)));
  ASSERT_OK(Convert(d_in.as<From>(), d_out.as<To>(), static_cast<int64_t>(values.size()), nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<To>(d_out, values.size()));
  // Bit-exact against the host conversion (one rounding from the exact value in both).
  EXPECT_EQ(out, Quantized<To>(values));
}

TEST_F(CudaTest, ConvertF32ToBF16) { CheckConvert<float, BFloat16>(); }
TEST_F(CudaTest, ConvertF32ToF16) { CheckConvert<float, Half>(); }
TEST_F(CudaTest, ConvertF16ToBF16) { CheckConvert<Half, BFloat16>(); }
TEST_F(CudaTest, ConvertBF16ToF32) { CheckConvert<BFloat16, float>(); }
TEST_F(CudaTest, ConvertF16ToF32) { CheckConvert<Half, float>(); }

// ---------------------------------------------------------------------------------------------
// Paged attention.

struct AttentionCase {
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int block_size;
  std::vector<std::pair<int, int>> seqs;  // (query_len, context_len)
  int max_context_len = 0;                // 0: the largest context_len; more: slack (graphs)
  int sliding_window = 0;
  float logit_softcap = 0.0f;
};

std::string Describe(const AttentionCase& c) {
  // Appends only: GCC 12 warns falsely (-Wrestrict) about "literal" + std::string temporaries.
  char head[96];
  std::snprintf(head, sizeof(head), "%dq/%dkv d%d bs%d window %d cap %g seqs", c.num_heads,
                c.num_kv_heads, c.head_dim, c.block_size, c.sliding_window, c.logit_softcap);
  std::string s = head;
  for (const auto& [q, ctx] : c.seqs) {
    s += ' ';
    s += std::to_string(q);
    s += '/';
    s += std::to_string(ctx);
  }
  return s;
}

// Runs one case through the CUDA kernel (decode or mixed) and the reference.
template <typename T>
void CheckAttention(const AttentionCase& c, bool decode, bool pass_query_start) {
  SCOPED_TRACE(Describe(c));
  const int num_seqs = static_cast<int>(c.seqs.size());
  int max_context = c.max_context_len;
  int max_query = 1;
  std::vector<int32_t> query_start = {0};
  std::vector<int32_t> context_lens;
  int total_blocks = 2;  // spare blocks nobody owns
  for (const auto& [query_len, context_len] : c.seqs) {
    max_context = std::max(max_context, context_len);
    max_query = std::max(max_query, query_len);
    query_start.push_back(query_start.back() + query_len);
    context_lens.push_back(context_len);
    total_blocks += (context_len + c.block_size - 1) / c.block_size;
  }
  const int rows = query_start.back();
  const int stride = (max_context + c.block_size - 1) / c.block_size;
  // Physical blocks in a shuffled order, so neighbours in a sequence are far apart.
  std::vector<int32_t> physical(total_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), std::mt19937(3));
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * stride, 0);
  int next = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int blocks = (context_lens[s] + c.block_size - 1) / c.block_size;
    for (int b = 0; b < blocks; ++b) tables[s * stride + b] = physical[next++];
    if (c.sliding_window > 0) {
      // Blocks wholly before the first query's window may have been freed: entries far out of
      // the pool, so a kernel that reads one faults.
      const int first_key = std::max(0, context_lens[s] - c.seqs[s].first - c.sliding_window + 1);
      for (int b = 0; b < first_key / c.block_size; ++b) tables[s * stride + b] = -1000000;
    }
  }
  const KvCacheLayout layout{total_blocks, c.block_size, c.num_kv_heads, c.head_dim};
  const size_t cache_size =
      static_cast<size_t>(total_blocks) * c.block_size * c.num_kv_heads * c.head_dim;
  const std::vector<float> q =
      Quantized<T>(RandomFloats(static_cast<size_t>(rows) * c.num_heads * c.head_dim, 51));
  const std::vector<float> key_cache = Quantized<T>(RandomFloats(cache_size, 52));
  const std::vector<float> value_cache = Quantized<T>(RandomFloats(cache_size, 53));
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  std::vector<AttentionSeq> host_seqs(num_seqs);
  for (int s = 0; s < num_seqs; ++s) {
    host_seqs[s] = {query_start[s], c.seqs[s].first, context_lens[s], &tables[s * stride]};
  }
  AttentionParams params;
  params.cache = layout;
  params.num_heads = c.num_heads;
  params.scale = scale;
  params.sliding_window = c.sliding_window;
  params.logit_softcap = c.logit_softcap;
  params.num_seqs = num_seqs;
  params.seqs = host_seqs.data();
  const std::vector<double> want =
      reference::PagedAttention(q.data(), key_cache.data(), value_cache.data(), params);

  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_q, Upload<T>(q));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_kc, Upload<T>(key_cache));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_vc, Upload<T>(value_cache));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_start, DeviceBuffer::FromHost(query_start));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_lens, DeviceBuffer::FromHost(context_lens));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_tables, DeviceBuffer::FromHost(tables));
  const size_t out_size = static_cast<size_t>(rows) * c.num_heads * c.head_dim;
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(out_size * sizeof(T)));
  PagedAttentionBatch batch;
  batch.cache = layout;
  batch.num_heads = c.num_heads;
  batch.scale = scale;
  batch.sliding_window = c.sliding_window;
  batch.logit_softcap = c.logit_softcap;
  batch.num_seqs = num_seqs;
  batch.query_start = pass_query_start ? d_start.as<int32_t>() : nullptr;
  batch.context_lens = d_lens.as<int32_t>();
  batch.block_tables = d_tables.as<int32_t>();
  batch.block_table_stride = stride;
  batch.max_query_len = max_query;
  batch.max_context_len = max_context;
  if (decode) {
    const size_t workspace_bytes = PagedAttentionDecodeWorkspaceBytes(batch);
    ASSERT_OK_AND_ASSIGN(DeviceBuffer workspace, DeviceBuffer::Allocate(workspace_bytes));
    ASSERT_OK(PagedAttentionDecode(d_q.as<T>(), d_kc.as<T>(), d_vc.as<T>(), batch, workspace.data(),
                                   workspace_bytes, d_out.as<T>(), nullptr));
  } else {
    ASSERT_OK(
        PagedAttention(d_q.as<T>(), d_kc.as<T>(), d_vc.as<T>(), batch, d_out.as<T>(), nullptr));
  }
  ASSERT_OK_AND_ASSIGN(std::vector<float> out, Download<T>(d_out, out_size));
  EXPECT_TRUE(AllNear(out, want, std::max(Tolerance<T>(), 1e-4)));
}

std::vector<AttentionCase> DecodeCases() {
  // Many sequences: one split each, several chunks per split (the online rescaling).
  AttentionCase wide{32, 8, 128, 16, {}};
  for (int s = 0; s < 64; ++s) wide.seqs.push_back({1, 1 + (s * 97) % 1100});
  // A few long sequences: several splits of several chunks each.
  AttentionCase long_split{32, 8, 128, 16, {}};
  for (int s = 0; s < 8; ++s) long_split.seqs.push_back({1, 4000 + 131 * s});
  return {
      wide,
      long_split,
      {8, 8, 64, 16, {{1, 1}, {1, 17}, {1, 100}}},                      // MHA
      {32, 8, 128, 16, {{1, 255}, {1, 256}, {1, 257}, {1, 1000}}},      // GQA 4, chunk edges
      {32, 8, 128, 16, {{1, 5000}}},                                    // one long context: splits
      {14, 2, 64, 16, {{1, 33}, {1, 513}, {1, 2}}},                     // GQA 7: head tiles 4 + 3
      {16, 1, 128, 32, {{1, 300}, {1, 1}}},                             // GQA 16: four tiles
      {32, 8, 128, 16, {{1, 40}, {1, 900}}, /*max_context_len=*/8192},  // slack bounds: empty
                                                                        // splits
      {8, 4, 256, 16, {{1, 1}, {1, 300}, {1, 2100}}},                   // Gemma 3's head_dim
  };
}

template <typename T>
void CheckDecodeCases() {
  for (const AttentionCase& c : DecodeCases()) {
    CheckAttention<T>(c, /*decode=*/true, /*pass_query_start=*/false);
    CheckAttention<T>(c, /*decode=*/true, /*pass_query_start=*/true);
  }
}

TEST_F(CudaTest, PagedAttentionDecodeF32) { CheckDecodeCases<float>(); }
TEST_F(CudaTest, PagedAttentionDecodeF16) { CheckDecodeCases<Half>(); }
TEST_F(CudaTest, PagedAttentionDecodeBF16) { CheckDecodeCases<BFloat16>(); }

std::vector<AttentionCase> MixedCases() {
  return {
      // Prefill from scratch, chunked prefill onto a cached prefix, and decode rows together.
      {32, 8, 128, 16, {{1, 1}, {5, 5}, {37, 37}, {16, 100}, {1, 300}, {130, 200}}},
      {8, 8, 64, 16, {{33, 33}, {64, 64}, {1, 65}}},                    // MHA, tile edges
      {14, 2, 64, 32, {{20, 20}, {7, 300}}},                            // GQA 7
      {32, 8, 128, 16, {{3, 50}, {9, 900}}, /*max_context_len=*/2048},  // slack bounds
      {8, 4, 256, 16, {{40, 40}, {5, 300}, {1, 70}}},                   // Gemma 3's head_dim
  };
}

template <typename T>
void CheckMixedCases() {
  for (const AttentionCase& c : MixedCases()) {
    CheckAttention<T>(c, /*decode=*/false, /*pass_query_start=*/true);
  }
}

TEST_F(CudaTest, PagedAttentionMixedF32) { CheckMixedCases<float>(); }
TEST_F(CudaTest, PagedAttentionMixedF16) { CheckMixedCases<Half>(); }
TEST_F(CudaTest, PagedAttentionMixedBF16) { CheckMixedCases<BFloat16>(); }

// Sliding windows (shorter than, across and longer than the contexts; across split, chunk and
// tile edges) and softcapping, decode and mixed; the entries before each window are invalid.
std::vector<AttentionCase> WindowCases(bool decode) {
  std::vector<AttentionCase> cases;
  for (const int window : {1, 31, 256, 700, 5000}) {
    for (const float cap : {0.0f, 0.7f}) {
      if (decode) {
        AttentionCase c{32, 8, 128, 16, {{1, 1}, {1, 40}, {1, 257}, {1, 1000}, {1, 4500}}};
        c.sliding_window = window;
        c.logit_softcap = cap;
        cases.push_back(c);
        AttentionCase slack{14, 2, 64, 16, {{1, 300}, {1, 2}}, /*max_context_len=*/8192};
        slack.sliding_window = window;
        slack.logit_softcap = cap;
        cases.push_back(slack);
        AttentionCase wide{8, 4, 256, 16, {{1, 5}, {1, 700}}};
        wide.sliding_window = window;
        wide.logit_softcap = cap;
        cases.push_back(wide);
      } else {
        AttentionCase c{32, 8, 128, 16, {{1, 1}, {40, 40}, {37, 300}, {130, 1000}, {1, 2000}}};
        c.sliding_window = window;
        c.logit_softcap = cap;
        cases.push_back(c);
        AttentionCase gqa7{14, 2, 64, 32, {{20, 20}, {70, 300}}};
        gqa7.sliding_window = window;
        gqa7.logit_softcap = cap;
        cases.push_back(gqa7);
        AttentionCase wide{8, 4, 256, 16, {{33, 33}, {9, 600}}};
        wide.sliding_window = window;
        wide.logit_softcap = cap;
        cases.push_back(wide);
      }
    }
  }
  return cases;
}

template <typename T>
void CheckWindowCases() {
  for (const AttentionCase& c : WindowCases(/*decode=*/true)) {
    CheckAttention<T>(c, /*decode=*/true, /*pass_query_start=*/false);
  }
  for (const AttentionCase& c : WindowCases(/*decode=*/false)) {
    CheckAttention<T>(c, /*decode=*/false, /*pass_query_start=*/true);
  }
}

TEST_F(CudaTest, PagedAttentionWindowSoftcapF32) { CheckWindowCases<float>(); }
TEST_F(CudaTest, PagedAttentionWindowSoftcapBF16) { CheckWindowCases<BFloat16>(); }

TEST_F(CudaTest, PagedAttentionRejectsUnsupportedHeadDim) {
  PagedAttentionBatch batch;
  batch.cache = {4, 16, 2, 96};
  batch.num_heads = 4;
  batch.num_seqs = 1;
  batch.max_context_len = 1;
  batch.block_table_stride = 1;
  EXPECT_EQ(PagedAttention<BFloat16>(nullptr, nullptr, nullptr, batch, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// GEMM.

template <typename In, typename Out>
void CheckGemm() {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Gemm> gemm, Gemm::Create());
  const int64_t shapes[][3] = {{1, 257, 4096}, {7, 1000, 512}, {64, 512, 1024}, {3, 8, 8}};
  for (const auto& shape : shapes) {
    const int64_t m = shape[0];
    const int64_t n = shape[1];
    const int64_t k = shape[2];
    for (const bool with_bias : {false, true}) {
      SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                   (with_bias ? " bias" : ""));
      const std::vector<float> x = Quantized<In>(RandomFloats(m * k, 61));
      const std::vector<float> w = Quantized<In>(RandomFloats(n * k, 62));
      const std::vector<float> bias = Quantized<Out>(RandomFloats(n, 63));
      ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, Upload<In>(x));
      ASSERT_OK_AND_ASSIGN(DeviceBuffer d_w, Upload<In>(w));
      ASSERT_OK_AND_ASSIGN(DeviceBuffer d_bias, Upload<Out>(bias));
      ASSERT_OK_AND_ASSIGN(DeviceBuffer d_y, DeviceBuffer::Allocate(m * n * sizeof(Out)));
      ASSERT_OK(gemm->Linear(d_x.as<In>(), d_w.as<In>(), with_bias ? d_bias.as<Out>() : nullptr,
                             d_y.as<Out>(), m, n, k, nullptr));
      ASSERT_OK_AND_ASSIGN(std::vector<float> y, Download<Out>(d_y, m * n));
      std::vector<double> want =
          reference::Linear(x.data(), w.data(), with_bias ? bias.data() : nullptr, m, n, k);
      // Dot products of K terms of size ~1/3 grow like sqrt(K): scale the bound by that.
      const double magnitude = std::sqrt(static_cast<double>(k)) / 3.0;
      for (double& v : want) v /= magnitude;
      for (float& v : y) v = static_cast<float>(v / magnitude);
      EXPECT_TRUE(AllNear(y, want, std::max(Tolerance<Out>(), 1e-4)));
    }
  }
}

TEST_F(CudaTest, GemmF32) { CheckGemm<float, float>(); }
TEST_F(CudaTest, GemmBF16) { CheckGemm<BFloat16, BFloat16>(); }
TEST_F(CudaTest, GemmBF16ToF32) { CheckGemm<BFloat16, float>(); }
TEST_F(CudaTest, GemmF16) { CheckGemm<Half, Half>(); }
TEST_F(CudaTest, GemmF16ToF32) { CheckGemm<Half, float>(); }

// ---------------------------------------------------------------------------------------------
// Log-softmax, argmax and sampling.

TEST_F(CudaTest, LogSoftmaxMatchesReference) {
  for (const auto& [rows, n] : std::vector<std::pair<int64_t, int64_t>>{{3, 1000}, {1, 128256}}) {
    const std::vector<float> x = RandomFloats(rows * n, 71, -20.0f, 20.0f);
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, DeviceBuffer::FromHost(x));
    ASSERT_OK(LogSoftmax(d_x.as<float>(), rows, n, nullptr));
    ASSERT_OK_AND_ASSIGN(std::vector<float> out, d_x.ToHost<float>(x.size()));
    EXPECT_TRUE(AllNear(out, reference::LogSoftmax(x.data(), rows, n), 1e-5));
  }
}

TEST_F(CudaTest, ArgmaxTakesLowestIndexAmongEqualsAndSkipsNaN) {
  const int64_t n = 5000;
  std::vector<float> x = RandomFloats(3 * n, 72);
  x[123] = 5.0f;  // row 0: a tie, the lower index wins
  x[4000] = 5.0f;
  x[n + 7] = std::numeric_limits<float>::quiet_NaN();  // row 1: NaN is not a maximum
  x[n + 4999] = 3.0f;
  std::fill(x.begin() + 2 * n, x.end(), -std::numeric_limits<float>::infinity());  // row 2
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, DeviceBuffer::FromHost(x));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(3 * sizeof(int32_t)));
  ASSERT_OK(Argmax(d_x.as<float>(), 3, n, d_out.as<int32_t>(), nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> out, d_out.ToHost<int32_t>(3));
  EXPECT_EQ(out, (std::vector<int32_t>{123, 4999, 0}));
}

TEST_F(CudaTest, CounterUniformMatchesPhilox) {
  std::mt19937_64 rng(81);
  std::vector<uint64_t> seeds(4096);
  std::vector<uint64_t> positions(4096);
  for (size_t i = 0; i < seeds.size(); ++i) {
    seeds[i] = i < 16 ? i : rng();
    positions[i] = i % 2 == 0 ? i : rng();
  }
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_seeds, DeviceBuffer::FromHost(seeds));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_positions, DeviceBuffer::FromHost(positions));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(seeds.size() * sizeof(double)));
  ASSERT_OK(CounterUniform(d_seeds.as<uint64_t>(), d_positions.as<uint64_t>(), d_out.as<double>(),
                           static_cast<int64_t>(seeds.size()), nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<double> out, d_out.ToHost<double>(seeds.size()));
  for (size_t i = 0; i < seeds.size(); ++i) {
    ASSERT_EQ(out[i], worker::CounterUniform(seeds[i], positions[i])) << i;
  }
}

struct SamplerCase {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  int logprobs;
};

const SamplerCase kSamplerCases[] = {
    {"greedy", 0.0f, 0, 1.0f, 0.0f, 3},        {"plain", 1.0f, 0, 1.0f, 0.0f, 0},
    {"hot", 1.7f, 0, 1.0f, 0.0f, 0},           {"top_k_40", 0.7f, 40, 1.0f, 0.0f, 5},
    {"top_k_2000", 1.0f, 2000, 1.0f, 0.0f, 0}, {"top_p_0.9", 1.0f, 0, 0.9f, 0.0f, 2},
    {"top_p_0.5", 0.8f, 0, 0.5f, 0.0f, 0},     {"min_p_0.05", 1.0f, 0, 1.0f, 0.05f, 0},
    {"k_p_min_p", 0.9f, 50, 0.8f, 0.02f, 20},  {"top_k_1", 1.0f, 1, 1.0f, 0.0f, 1},
    {"k_min_p", 1.3f, 100, 1.0f, 0.3f, 0},     {"big_k_p", 1.0f, 3000, 0.7f, 0.0f, 0},
};

// The device sampler against worker::Sampler for every case at many positions and seeds.
// `tie_heavy` rounds the logits to bf16, so that many tokens share a weight.
void CheckSamplerEquality(int vocab, bool tie_heavy) {
  const int positions_per_case = 24;
  const int num_cases = static_cast<int>(std::size(kSamplerCases));
  const int rows = num_cases * positions_per_case;
  std::vector<float> logits = RandomFloats(static_cast<size_t>(rows) * vocab, 91, -4.0f, 4.0f);
  std::mt19937 rng(92);
  for (int r = 0; r < rows; ++r) {
    // A few clearly preferred tokens per row, as real logits have.
    for (int j = 0; j < 8; ++j) logits[static_cast<size_t>(r) * vocab + rng() % vocab] += 6.0f;
  }
  if (tie_heavy) logits = Quantized<BFloat16>(logits);
  std::vector<SamplingRow> params(rows);
  std::vector<SamplingParams> cpu_params(rows);
  for (int r = 0; r < rows; ++r) {
    const SamplerCase& c = kSamplerCases[r / positions_per_case];
    SamplingRow& p = params[r];
    p.seed = 1000 + r % 7;
    p.position = 17 * r + 3;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.num_top_logprobs = c.logprobs;
    SamplingParams& q = cpu_params[r];
    q.temperature = c.temperature;
    q.top_k = c.top_k;
    q.top_p = c.top_p;
    q.min_p = c.min_p;
    q.has_seed = true;
    q.seed = p.seed;
    q.logprobs = c.logprobs;
  }
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_logits, DeviceBuffer::FromHost(logits));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_params, DeviceBuffer::FromHost(params));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(rows * sizeof(SampledToken)));
  ASSERT_OK(Sample(d_logits.as<float>(), d_params.as<SamplingRow>(), rows, vocab,
                   d_out.as<SampledToken>(), nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<SampledToken> out, d_out.ToHost<SampledToken>(rows));

  worker::Sampler sampler(vocab);
  for (int r = 0; r < rows; ++r) {
    SCOPED_TRACE(std::string(kSamplerCases[r / positions_per_case].name) + " row " +
                 std::to_string(r));
    worker::SampleInput input;
    input.logits = &logits[static_cast<size_t>(r) * vocab];
    input.params = &cpu_params[r];
    input.position = params[r].position;
    const SampleResult want = sampler.Sample(input);
    EXPECT_EQ(out[r].token, want.token);
    EXPECT_NEAR(out[r].logprob, want.logprob, 1e-5);
    ASSERT_EQ(static_cast<int>(want.top_logprobs.size()), params[r].num_top_logprobs);
    for (int i = 0; i < params[r].num_top_logprobs; ++i) {
      EXPECT_EQ(out[r].top_tokens[i], want.top_logprobs[i].token) << "top " << i;
      EXPECT_NEAR(out[r].top_logprobs[i], want.top_logprobs[i].logprob, 1e-5) << "top " << i;
    }
  }
}

TEST_F(CudaTest, SamplerMatchesCpuSmallVocab) { CheckSamplerEquality(1000, false); }
TEST_F(CudaTest, SamplerMatchesCpuLlamaVocab) { CheckSamplerEquality(128256, false); }
TEST_F(CudaTest, SamplerMatchesCpuWithTiedWeights) { CheckSamplerEquality(32000, true); }

// Penalties on the device: each row's distinct output tokens with their counts and, with a
// repetition penalty, its prompt-only tokens (count 0), as worker::Sampler walks them; rows
// without penalties mixed in (no entries, no scratch row).
TEST_F(CudaTest, SamplerAppliesPenaltiesAsTheCpu) {
  const int vocab = 4096;
  const int rows = 96;
  std::vector<float> logits = RandomFloats(static_cast<size_t>(rows) * vocab, 71, -3.0f, 3.0f);
  std::mt19937 rng(72);
  std::vector<SamplingRow> params(rows);
  std::vector<SamplingParams> cpu(rows);
  std::vector<std::vector<int32_t>> prompts(rows), outputs(rows);
  std::vector<PenaltyToken> entries;
  int penalized = 0;
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < 30; ++j) {
      const int32_t t = static_cast<int32_t>(rng() % 64);  // repeats; likely tokens below
      if (j % 2 == 0) prompts[r].push_back(t);
      if (j % 3 == 0) outputs[r].push_back(t);
      logits[static_cast<size_t>(r) * vocab + t] += 3.0f;
    }
    SamplingParams& q = cpu[r];
    q.has_seed = true;
    q.seed = 300 + r;
    q.temperature = r % 4 == 0 ? 0.0f : 0.9f;
    q.top_k = r % 3 == 0 ? 30 : 0;
    q.top_p = r % 5 == 0 ? 0.8f : 1.0f;
    q.logprobs = r % 7;
    q.repetition_penalty = r % 6 == 1 ? 1.0f : 0.6f + 0.1f * (r % 9);
    q.frequency_penalty = r % 6 == 2 ? 0.0f : -1.5f + 0.37f * (r % 8);
    q.presence_penalty = r % 6 == 3 ? 0.0f : 1.9f - 0.41f * (r % 10);
    if (r % 11 == 0) {  // no penalty at all
      q.repetition_penalty = 1.0f;
      q.frequency_penalty = 0.0f;
      q.presence_penalty = 0.0f;
    }
    SamplingRow& p = params[r];
    p.seed = q.seed;
    p.position = 5 * r + 1;
    p.temperature = q.temperature;
    p.top_k = q.top_k;
    p.top_p = q.top_p;
    p.num_top_logprobs = q.logprobs;
    p.repetition_penalty = q.repetition_penalty;
    p.frequency_penalty = q.frequency_penalty;
    p.presence_penalty = q.presence_penalty;
    // The entries, built here independently of worker/model/device_sampling.cc.
    const size_t begin = entries.size();
    std::vector<int32_t> counts(vocab, 0);
    for (int32_t t : outputs[r]) ++counts[t];
    const bool any_output = q.frequency_penalty != 0.0f || q.presence_penalty != 0.0f ||
                            q.repetition_penalty != 1.0f;
    for (int32_t t : outputs[r]) {
      if (!any_output || counts[t] <= 0) continue;
      entries.push_back({t, counts[t]});
      counts[t] = -1;
    }
    for (int32_t t : prompts[r]) {
      if (q.repetition_penalty == 1.0f || counts[t] != 0) continue;
      entries.push_back({t, 0});
      counts[t] = -1;
    }
    if (entries.size() > begin) {
      p.penalty_begin = static_cast<int64_t>(begin);
      p.num_penalty_tokens = static_cast<int32_t>(entries.size() - begin);
      p.penalized_row = penalized++;
    }
  }
  ASSERT_GT(penalized, rows / 2);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_logits, DeviceBuffer::FromHost(logits));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_params, DeviceBuffer::FromHost(params));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_entries, DeviceBuffer::FromHost(entries));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_penalized,
                       DeviceBuffer::Allocate(static_cast<size_t>(penalized) * vocab * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(rows * sizeof(SampledToken)));
  ASSERT_OK(Sample(d_logits.as<float>(), d_params.as<SamplingRow>(), rows, vocab,
                   d_entries.as<PenaltyToken>(), d_penalized.as<float>(),
                   d_out.as<SampledToken>(), nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<SampledToken> out, d_out.ToHost<SampledToken>(rows));
  worker::Sampler sampler(vocab);
  for (int r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    worker::SampleInput input;
    input.logits = &logits[static_cast<size_t>(r) * vocab];
    input.params = &cpu[r];
    input.prompt_tokens = prompts[r];
    input.output_tokens = outputs[r];
    input.position = params[r].position;
    const SampleResult want = sampler.Sample(input);
    EXPECT_EQ(out[r].token, want.token);
    EXPECT_NEAR(out[r].logprob, want.logprob, 1e-5);  // of the raw row
    for (int i = 0; i < params[r].num_top_logprobs; ++i) {
      EXPECT_EQ(out[r].top_tokens[i], want.top_logprobs[i].token) << "top " << i;
    }
  }
}

TEST_F(CudaTest, SamplerTreatsAllMaskedRowAsUniform) {
  const int vocab = 300;
  std::vector<float> logits(vocab, -std::numeric_limits<float>::infinity());
  logits[5] = std::numeric_limits<float>::quiet_NaN();
  SamplingRow p;
  p.seed = 3;
  p.position = 11;
  SamplingParams q;
  q.has_seed = true;
  q.seed = 3;
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_logits, DeviceBuffer::FromHost(logits));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_params, DeviceBuffer::FromHost(std::vector<SamplingRow>{p}));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_out, DeviceBuffer::Allocate(sizeof(SampledToken)));
  ASSERT_OK(Sample(d_logits.as<float>(), d_params.as<SamplingRow>(), 1, vocab,
                   d_out.as<SampledToken>(), nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<SampledToken> out, d_out.ToHost<SampledToken>(1));
  worker::Sampler sampler(vocab);
  worker::SampleInput input;
  input.logits = logits.data();
  input.params = &q;
  input.position = 11;
  EXPECT_EQ(out[0].token, sampler.Sample(input).token);
}

}  // namespace
}  // namespace carpool::kernels::cuda
