#include "kernels/cpu/linear_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_test_util.h"

namespace carpool::kernels::cpu {
namespace {

using test_util::BitEqual;
using test_util::RandomFloats;
using test_util::TestPool;

// n values from N(0, 1), the same for the same seed.
std::vector<float> GaussianFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A quantized weight buffer, 64-byte aligned as QuantizeInt8Weights requires.
class Quantized {
 public:
  // Filled with `fill` first: QuantizeInt8Weights must overwrite every byte.
  Quantized(int64_t n, int64_t k, int group, uint8_t fill = 0xAB)
      : bytes_(QuantizedInt8Bytes(n, k, group)) {
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, std::max<int64_t>(bytes_, 64))));
    std::memset(data_.get(), fill, bytes_);
  }
  void* get() { return data_.get(); }
  int64_t bytes() const { return bytes_; }
  bool SameBytes(const Quantized& other) const {
    return bytes_ == other.bytes_ && std::memcmp(data_.get(), other.data_.get(), bytes_) == 0;
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  int64_t bytes_;
  std::unique_ptr<uint8_t, Free> data_;
};

// The quantization of linear_int8.h, written independently: per row, per group of `group`
// values (the last one shorter), scale = max|v| / 127 and q = clamp(round(v / scale)) in fp32.
struct RefQuantized {
  int64_t rows, k, groups;
  int group;
  std::vector<float> scales;  // [rows, groups]
  std::vector<int8_t> q;      // [rows, k]
};

RefQuantized RefQuantize(const float* v, int64_t rows, int64_t k, int group) {
  RefQuantized r{rows, k, (k + group - 1) / group, group, {}, {}};
  r.scales.resize(rows * r.groups);
  r.q.resize(rows * k);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t g = 0; g < r.groups; ++g) {
      const int64_t begin = g * group;
      const int64_t end = std::min(k, begin + group);
      float amax = 0.0f;
      for (int64_t t = begin; t < end; ++t) amax = std::max(amax, std::fabs(v[i * k + t]));
      const float scale = amax / 127.0f;
      r.scales[i * r.groups + g] = scale;
      for (int64_t t = begin; t < end; ++t) {
        const float q = scale == 0.0f ? 0.0f : std::round(v[i * k + t] / scale);
        r.q[i * k + t] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
      }
    }
  }
  return r;
}

// Exact integer sum over group g of row i of a and row j of b.
int64_t GroupSum(const RefQuantized& a, int64_t i, const RefQuantized& b, int64_t j, int64_t g) {
  int64_t s = 0;
  for (int64_t t = g * a.group; t < std::min(a.k, (g + 1) * a.group); ++t) {
    s += int64_t{a.q[i * a.k + t]} * int64_t{b.q[j * b.k + t]};
  }
  return s;
}

// The definition in float64: sum over groups of s * x_scale * w_scale (+ bias). Also returns,
// in *magnitude, the sum of the terms' absolute values (what fp32 rounding is relative to).
std::vector<double> RefLinearInt8(const RefQuantized& x, const RefQuantized& w, const float* bias,
                                  std::vector<double>* magnitude) {
  std::vector<double> y(x.rows * w.rows);
  magnitude->assign(y.size(), 0.0);
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      double sum = 0.0;
      double mag = 0.0;
      for (int64_t g = 0; g < x.groups; ++g) {
        const double term = static_cast<double>(GroupSum(x, i, w, j, g)) *
                            x.scales[i * x.groups + g] * w.scales[j * w.groups + g];
        sum += term;
        mag += std::fabs(term);
      }
      if (bias != nullptr) {
        sum += bias[j];
        mag += std::fabs(bias[j]);
      }
      y[i * w.rows + j] = sum;
      (*magnitude)[i * w.rows + j] = mag;
    }
  }
  return y;
}

// The same definition in the fp32 operations the header names: bit for bit what every path of
// LinearInt8 must give.
std::vector<float> SpecLinearInt8(const RefQuantized& x, const RefQuantized& w, const float* bias) {
  std::vector<float> y(x.rows * w.rows);
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < w.rows; ++j) {
      float acc = 0.0f;
      for (int64_t g = 0; g < x.groups; ++g) {
        const float d = x.scales[i * x.groups + g] * w.scales[j * w.groups + g];
        acc = std::fma(static_cast<float>(GroupSum(x, i, w, j, g)), d, acc);
      }
      y[i * w.rows + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
  return y;
}

struct Shape {
  int64_t m, n, k;
  int group;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "m=" << s.m << " n=" << s.n << " k=" << s.k << " group=" << s.group;
}

std::string ShapeName(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  return absl::StrFormat("m%d_n%d_k%d_g%d", s.m, s.n, s.k, s.group);
}

class LinearInt8Test : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearInt8Test, MatchesTheDefinition) {
  const auto [m, n, k, group] = GetParam();
  const std::vector<float> x = RandomFloats(m * k, 1);
  const std::vector<float> w = RandomFloats(n * k, 2);
  const std::vector<float> bias = RandomFloats(n, 3);
  Quantized wq(n, k, group);
  QuantizeInt8Weights(w.data(), n, k, group, wq.get(), TestPool());
  const RefQuantized rx = RefQuantize(x.data(), m, k, group);
  const RefQuantized rw = RefQuantize(w.data(), n, k, group);
  for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
    SCOPED_TRACE(b ? "with bias" : "without bias");
    std::vector<float> y(m * n, -7.0f);
    LinearInt8(x.data(), wq.get(), b, y.data(), m, n, k, group, TestPool());
    // float64: each of the `groups` fp32 steps (a product, an fma) rounds once, relative to
    // at most the sum of the terms' magnitudes.
    std::vector<double> magnitude;
    const std::vector<double> want = RefLinearInt8(rx, rw, b, &magnitude);
    int64_t bad = 0;
    for (int64_t e = 0; e < m * n; ++e) {
      const double tol = 2.0 * (rx.groups + 2) * 0x1p-24 * magnitude[e] + 1e-30;
      if (!(std::fabs(y[e] - want[e]) <= tol)) {
        if (bad++ == 0) ADD_FAILURE() << "element " << e << ": " << y[e] << " vs " << want[e];
      }
    }
    EXPECT_EQ(bad, 0);
    const std::vector<float> spec = SpecLinearInt8(rx, rw, b);
    EXPECT_TRUE(BitEqual(spec.data(), y.data(), m * n)) << "not the header's fp32 operations";
  }
}

// Against fp32 Linear of the original weights: quantizing v with scale s moves it by at most
// s / 2 (round to nearest; the fp32 division adds < 1e-5 of a step), so per element
//   |x.w - x'.w'| <= sum_t |x_t| sw_t / 2 + |w_t| sx_t / 2 + sx_t sw_t / 4 (+ fp32 rounding).
// This bound is deterministic; the typical error is far below it (see the relative error).
TEST_P(LinearInt8Test, IsCloseToFp32Linear) {
  const auto [m, n, k, group] = GetParam();
  const std::vector<float> x = GaussianFloats(m * k, 4);
  const std::vector<float> w = GaussianFloats(n * k, 5);
  Quantized wq(n, k, group);
  QuantizeInt8Weights(w.data(), n, k, group, wq.get(), TestPool());
  std::vector<float> y(m * n);
  LinearInt8(x.data(), wq.get(), nullptr, y.data(), m, n, k, group, TestPool());
  std::vector<float> y32(m * n);
  Linear(x.data(), w.data(), nullptr, y32.data(), m, n, k, TestPool());
  const RefQuantized rx = RefQuantize(x.data(), m, k, group);
  const RefQuantized rw = RefQuantize(w.data(), n, k, group);
  double err2 = 0.0;
  double ref2 = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double bound = 0.0;
      double mag = 0.0;
      for (int64_t t = 0; t < k; ++t) {
        const double sx = rx.scales[i * rx.groups + t / group] * (0.5 + 1e-5);
        const double sw = rw.scales[j * rw.groups + t / group] * (0.5 + 1e-5);
        const double xt = std::fabs(x[i * k + t]);
        const double wt = std::fabs(w[j * k + t]);
        bound += xt * sw + wt * sx + sx * sw;
        mag += (xt + sx) * (wt + sw);
      }
      bound += 4.0 * (k / 8 + rx.groups + 4) * 0x1p-24 * mag;  // both kernels' fp32 rounding
      const double e = std::fabs(double{y[i * n + j]} - y32[i * n + j]);
      EXPECT_LE(e, bound) << "row " << i << " col " << j;
      err2 += e * e;
      ref2 += double{y32[i * n + j]} * y32[i * n + j];
    }
  }
  // Gaussian x and w: each quantized value is off by a uniform error of about amax / 127 / sqrt(12)
  // with amax ~ 2.5 (group 32) to 2.8 (group 64) standard deviations: about 0.6% and 0.65% of
  // the value, so ~0.9% relative error of y from x and w together (measured: ~0.8% / ~0.9%).
  EXPECT_LT(std::sqrt(err2 / ref2), 0.015);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearInt8Test,
                         ::testing::Values(Shape{1, 1, 1, 32}, Shape{1, 9, 32, 32},
                                           Shape{1, 37, 100, 32}, Shape{1, 37, 100, 64},
                                           Shape{7, 13, 257, 32}, Shape{7, 13, 257, 64},
                                           Shape{64, 33, 64, 64}, Shape{64, 71, 130, 32},
                                           Shape{5, 301, 768, 32}, Shape{513, 17, 257, 32},
                                           Shape{513, 17, 257, 64}),
                         ShapeName);

TEST(LinearInt8EdgeTest, ZeroInnerDimensionGivesBias) {
  const std::vector<float> bias = {1.5f, -2.0f, 3.25f};
  std::vector<float> y(2 * 3, 9.0f);
  LinearInt8(nullptr, nullptr, bias.data(), y.data(), 2, 3, 0, 32, TestPool());
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 3.25f, 1.5f, -2.0f, 3.25f}));
  LinearInt8(nullptr, nullptr, nullptr, y.data(), 2, 3, 0, 64, TestPool());
  EXPECT_EQ(y, std::vector<float>(6, 0.0f));
}

TEST(LinearInt8EdgeTest, SupportedGroupsAndSizes) {
  EXPECT_TRUE(IsSupportedInt8Group(32));
  EXPECT_TRUE(IsSupportedInt8Group(64));
  EXPECT_FALSE(IsSupportedInt8Group(16));
  EXPECT_FALSE(IsSupportedInt8Group(128));
  EXPECT_TRUE(IsSupportedInt8Group(kInt8Group));
  for (const int group : {32, 64}) {
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {37, 100}, {768, 768}}) {
      const int64_t bytes = QuantizedInt8Bytes(n, k, group);
      EXPECT_EQ(bytes % 64, 0);
      // At least one byte per value and one fp32 scale per group; at most the padding of the
      // tiles of 8 features and of the last group.
      const int64_t groups = (k + group - 1) / group;
      EXPECT_GE(bytes, n * (k + 4 * groups));
      EXPECT_LE(bytes, ((n + 7) / 8 * 8) * groups * (group + 4) + 63);
    }
  }
  const std::string path = LinearInt8Path();
  EXPECT_TRUE(path == "avx512_vnni" || path == "avx_vnni" || path == "avx2" || path == "portable")
      << path;
#if defined(__AVX2__) && defined(__FMA__)
  // The VNNI paths are chosen only where the CPU has the instructions.
  if (!__builtin_cpu_supports("avx512vnni") && !__builtin_cpu_supports("avxvnni")) {
    EXPECT_EQ(path, "avx2");
  }
#endif
}

// Row i of y depends on row i of x only, bit for bit, whatever M and the pool's size.
TEST(LinearInt8BatchInvarianceTest, RowsAreBitIdenticalWhateverTheBatchAndPool) {
  for (const int group : {32, 64}) {
    // n spans several weight passes and a partial last tile.
    constexpr int64_t kN = 1001;
    constexpr int64_t kK = 257;
    constexpr int64_t kMaxM = 513;
    SCOPED_TRACE(::testing::Message() << "group " << group);
    const std::vector<float> w = RandomFloats(kN * kK, 10);
    const std::vector<float> bias = RandomFloats(kN, 11);
    const std::vector<float> x = RandomFloats(kMaxM * kK, 12);
    Quantized wq(kN, kK, group);
    QuantizeInt8Weights(w.data(), kN, kK, group, wq.get(), TestPool());
    ThreadPool one(1);
    std::vector<float> alone(kMaxM * kN);
    for (int64_t i = 0; i < kMaxM; ++i) {
      LinearInt8(x.data() + i * kK, wq.get(), bias.data(), alone.data() + i * kN, 1, kN, kK, group,
                 &one);
    }
    ThreadPool two(2);
    ThreadPool three(3);
    for (ThreadPool* pool : {&one, &two, &three}) {
      for (const int64_t m : std::vector<int64_t>{2, 3, 5, 7, 64, kMaxM}) {
        std::vector<float> batch(m * kN);
        LinearInt8(x.data(), wq.get(), bias.data(), batch.data(), m, kN, kK, group, pool);
        EXPECT_TRUE(BitEqual(alone.data(), batch.data(), m * kN))
            << "M=" << m << ", " << pool->num_threads() << " threads";
      }
      std::vector<float> single(kN);
      LinearInt8(x.data() + 100 * kK, wq.get(), bias.data(), single.data(), 1, kN, kK, group, pool);
      EXPECT_TRUE(BitEqual(alone.data() + 100 * kN, single.data(), kN));
    }
  }
}

// Also: every byte is written (the buffers start with different contents).
TEST(LinearInt8QuantizeTest, Bf16BitsAndTheirFp32ValuesGiveTheSameBytes) {
  constexpr int64_t kN = 21;
  constexpr int64_t kK = 300;
  std::vector<float> w = GaussianFloats(kN * kK, 20);
  std::vector<uint16_t> bits(w.size());
  for (size_t t = 0; t < w.size(); ++t) {
    bits[t] = FloatToBf16(w[t]);
    w[t] = Bf16ToFloat(bits[t]);
  }
  for (const int group : {32, 64}) {
    Quantized from_fp32(kN, kK, group, 0x00);
    Quantized from_bf16(kN, kK, group, 0xFF);
    QuantizeInt8Weights(w.data(), kN, kK, group, from_fp32.get(), TestPool());
    QuantizeInt8Weights(bits.data(), kN, kK, group, from_bf16.get(), TestPool());
    EXPECT_TRUE(from_fp32.SameBytes(from_bf16)) << "group " << group;
    // And the bytes do not depend on the pool.
    Quantized alone(kN, kK, group, 0x5A);
    QuantizeInt8Weights(w.data(), kN, kK, group, alone.get(), nullptr);
    EXPECT_TRUE(alone.SameBytes(from_fp32)) << "group " << group;
  }
}

// Dequantized values are scale * q of the definition, bit for bit; an all-zero group has scale
// 0 and dequantizes to zeros, and a row of x with an all-zero group still follows the definition.
TEST(LinearInt8QuantizeTest, DequantizeIsScaleTimesQ) {
  constexpr int64_t kN = 19;
  constexpr int64_t kK = 150;
  for (const int group : {32, 64}) {
    SCOPED_TRACE(::testing::Message() << "group " << group);
    std::vector<float> w = RandomFloats(kN * kK, 30, -3.0f, 3.0f);
    for (int64_t t = group; t < 2 * group; ++t) w[4 * kK + t] = 0.0f;  // row 4, group 1
    // Ties: values that are exactly (q + 0.5) steps, which round away from zero.
    for (int64_t t = 0; t < group; ++t) w[5 * kK + t] = static_cast<float>(t % 7) - 2.5f;
    w[5 * kK + group - 1] = 127.0f;  // scale 1
    Quantized wq(kN, kK, group);
    QuantizeInt8Weights(w.data(), kN, kK, group, wq.get(), TestPool());
    std::vector<float> dequant(kN * kK);
    DequantizeInt8Weights(wq.get(), kN, kK, group, dequant.data());
    const RefQuantized rw = RefQuantize(w.data(), kN, kK, group);
    std::vector<float> want(kN * kK);
    for (int64_t j = 0; j < kN; ++j) {
      for (int64_t t = 0; t < kK; ++t) {
        want[j * kK + t] =
            rw.scales[j * rw.groups + t / group] * static_cast<float>(rw.q[j * kK + t]);
      }
    }
    EXPECT_TRUE(BitEqual(want.data(), dequant.data(), kN * kK));
    for (int64_t t = group; t < 2 * group; ++t) EXPECT_EQ(dequant[4 * kK + t], 0.0f);
    EXPECT_EQ(dequant[5 * kK + 0], -3.0f);  // -2.5 rounds to -3
    EXPECT_EQ(dequant[5 * kK + 5], 3.0f);   // 2.5 rounds to 3
    // Each dequantized value is within half a step of the original.
    for (int64_t j = 0; j < kN; ++j) {
      for (int64_t t = 0; t < kK; ++t) {
        const float step = rw.scales[j * rw.groups + t / group];
        EXPECT_LE(std::fabs(dequant[j * kK + t] - w[j * kK + t]), step * 0.50001f);
      }
    }
    // x with an all-zero group in row 1 and an all-zero row 2.
    constexpr int64_t kM = 3;
    std::vector<float> x = RandomFloats(kM * kK, 31);
    for (int64_t t = 0; t < group; ++t) x[1 * kK + t] = 0.0f;
    for (int64_t t = 0; t < kK; ++t) x[2 * kK + t] = 0.0f;
    std::vector<float> y(kM * kN);
    LinearInt8(x.data(), wq.get(), nullptr, y.data(), kM, kN, kK, group, TestPool());
    const std::vector<float> spec =
        SpecLinearInt8(RefQuantize(x.data(), kM, kK, group), rw, nullptr);
    EXPECT_TRUE(BitEqual(spec.data(), y.data(), kM * kN));
    for (int64_t j = 0; j < kN; ++j) EXPECT_EQ(y[2 * kN + j], 0.0f);
  }
}

TEST(LinearInt8QuantizeTest, NonFiniteInputsGiveNonFiniteOutputs) {
  constexpr int64_t kN = 10;
  constexpr int64_t kK = 70;
  const std::vector<float> w = RandomFloats(kN * kK, 40);
  Quantized wq(kN, kK, 32);
  QuantizeInt8Weights(w.data(), kN, kK, 32, wq.get(), TestPool());
  std::vector<float> x = RandomFloats(3 * kK, 41);
  x[1 * kK + 40] = std::numeric_limits<float>::quiet_NaN();
  x[2 * kK + 3] = std::numeric_limits<float>::infinity();
  std::vector<float> y(3 * kN);
  LinearInt8(x.data(), wq.get(), nullptr, y.data(), 3, kN, kK, 32, TestPool());
  for (int64_t j = 0; j < kN; ++j) {
    EXPECT_TRUE(std::isfinite(y[j]));
    EXPECT_FALSE(std::isfinite(y[kN + j]));
    EXPECT_FALSE(std::isfinite(y[2 * kN + j]));
  }
}

TEST(LinearInt8EmbeddingTest, GatherGivesDequantizedRows) {
  constexpr int64_t kVocab = 45;
  constexpr int64_t kH = 100;
  const std::vector<float> table = GaussianFloats(kVocab * kH, 50);
  for (const int group : {32, 64}) {
    Quantized tq(kVocab, kH, group);
    QuantizeInt8Weights(table.data(), kVocab, kH, group, tq.get(), TestPool());
    std::vector<float> dequant(kVocab * kH);
    DequantizeInt8Weights(tq.get(), kVocab, kH, group, dequant.data());
    const std::vector<int32_t> ids = {0, 44, 7, 7, 8, 31};
    std::vector<float> out(ids.size() * kH, -1.0f);
    EmbeddingGatherInt8(tq.get(), kVocab, kH, group, ids.data(), ids.size(), out.data());
    for (size_t r = 0; r < ids.size(); ++r) {
      EXPECT_TRUE(BitEqual(dequant.data() + ids[r] * kH, out.data() + r * kH, kH))
          << "id " << ids[r] << ", group " << group;
    }
  }
}

}  // namespace
}  // namespace carpool::kernels::cpu
