// Tests of the bf16 conversions (bf16.h) and of LinearBf16 and its packing and gather.
#include "kernels/cpu/linear_bf16.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/kernel_test_util.h"
#include "kernels/reference/reference_kernels.h"

namespace carpool::kernels::cpu {
namespace {

using test_util::AllNear;
using test_util::BitEqual;
using test_util::RandomFloats;
using test_util::TestPool;

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The value of bf16 bits b, for b without an all-ones exponent; b = 0x7f80 (or 0xff80), the
// first pattern past the largest finite bf16, stands for +-2^128, where the next binade would
// start (IEEE rounds as if the exponent were unbounded, then overflows to infinity).
double Bf16Value(uint16_t b) {
  const int sign = (b >> 15) ? -1 : 1;
  const int exponent = (b >> 7) & 0xff;
  const int mantissa = b & 0x7f;
  if (exponent == 0xff) return sign * std::ldexp(1.0, 128);
  if (exponent == 0) return sign * std::ldexp(mantissa, -133);  // subnormal: m * 2^-126 / 128
  return sign * std::ldexp(128 + mantissa, exponent - 134);
}

// f rounded to bf16 by comparing distances in double, independent of bf16.h's bit trick:
// the two candidates are f truncated toward zero and the next bf16 away from zero.
uint16_t ReferenceBf16(float f) {
  const uint32_t bits = BitsOf(f);
  if (std::isnan(f)) return 0;  // callers check NaNs separately
  if (std::isinf(f)) return static_cast<uint16_t>(bits >> 16);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double below = std::abs(double{f} - Bf16Value(down));
  const double above = std::abs(Bf16Value(up) - double{f});
  if (below < above) return down;
  if (above < below) return up;
  return (down & 1) == 0 ? down : up;  // a tie: the even one
}

// Special values and ties around interesting points, then random bit patterns.
std::vector<float> ConversionInputs() {
  std::vector<uint32_t> bits = {
      0x00000000, 0x80000000,              // +-0
      0x00000001, 0x80008000, 0x00018000,  // subnormals, ties among them
      0x3f808000,                          // 1 + half a bf16 ulp: tie, down to even 0x3f80
      0x3f818000,                          // tie, up to even 0x3f82
      0x3f808001, 0x3f807fff,              // just above / below a tie
      0xbf818000,                          // a negative tie
      0x7f7f0000, 0x7f7f7fff,              // the largest finite bf16 and just below its tie
      0x7f7f8000,                          // its tie: rounds to even, which is +inf
      0x7f7fffff, 0xff7fffff,              // FLT_MAX: overflows to +-inf
      0x7f800000, 0xff800000,              // +-inf
  };
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) bits.push_back(static_cast<uint32_t>(rng()));
  // Exact ties at random: lower 16 bits 0x8000.
  for (int i = 0; i < 2000; ++i) bits.push_back((static_cast<uint32_t>(rng()) & ~0xffffu) | 0x8000);
  std::vector<float> values;
  for (uint32_t b : bits) {
    if (std::isnan(FromBits(b))) continue;
    values.push_back(FromBits(b));
  }
  return values;
}

TEST(Bf16ConversionTest, RoundsToNearestEvenLikeADistanceComparison) {
  for (float f : ConversionInputs()) {
    ASSERT_EQ(FloatToBf16(f), ReferenceBf16(f)) << std::hex << "bits 0x" << BitsOf(f);
  }
}

TEST(Bf16ConversionTest, OverflowAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(FloatToBf16(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f8000)), 0x7f80);  // tie at the top: to even, i.e. inf
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(RoundToBf16(-inf), -inf);
}

// Every NaN, signalling or quiet, either sign, any payload, stays a quiet NaN of its sign
// (never an infinity, which rounding the payload's carry into the exponent would give).
TEST(Bf16ConversionTest, NaNStaysQuietNaNWithItsSign) {
  std::vector<uint32_t> nans = {0x7f800001, 0x7fc00000, 0x7fffffff, 0xff800001,
                                0xffffffff, 0x7f80ffff, 0x7fbf8000};
  std::mt19937 rng(8);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t payload = (static_cast<uint32_t>(rng()) & 0x7fffff) | 1;
    nans.push_back(0x7f800000 | payload | (static_cast<uint32_t>(rng()) & 0x80000000u));
  }
  for (uint32_t b : nans) {
    const uint16_t h = FloatToBf16(FromBits(b));
    EXPECT_TRUE(std::isnan(Bf16ToFloat(h))) << std::hex << b;
    EXPECT_NE(h & 0x40, 0) << std::hex << b << ": not quiet";
    EXPECT_EQ(h >> 15, b >> 31) << std::hex << b << ": sign";
  }
}

TEST(Bf16ConversionTest, WideningIsExact) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    ASSERT_EQ(BitsOf(Bf16ToFloat(static_cast<uint16_t>(b))), b << 16);
  }
  EXPECT_EQ(RoundToBf16(1.00390625f), 1.0f);  // 1 + 2^-8: a tie, to even
  EXPECT_EQ(RoundToBf16(3.0f), 3.0f);
}

// The array forms (vectorized where the build has AVX2) give the scalar forms' bits, for
// every length around the vector width and every misalignment.
TEST(Bf16ConversionTest, ArrayFormsEqualScalarForms) {
  std::vector<float> values = ConversionInputs();
  values.push_back(FromBits(0x7f800001));  // NaNs go through the vector path too
  values.push_back(FromBits(0xffc12345));
  std::vector<uint16_t> narrow(values.size());
  FloatToBf16(values.data(), static_cast<int64_t>(values.size()), narrow.data());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(narrow[i], FloatToBf16(values[i])) << std::hex << BitsOf(values[i]);
  }
  for (int64_t offset = 0; offset < 3; ++offset) {
    for (int64_t n = 0; n <= 19; ++n) {
      std::vector<uint16_t> part(n + 1, 0xabcd);
      FloatToBf16(values.data() + offset, n, part.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(part[i], narrow[offset + i]);
      EXPECT_EQ(part[n], 0xabcd) << "wrote past n = " << n;
    }
  }
  std::vector<uint16_t> all(0x10000 + 3);
  for (uint32_t b = 0; b < all.size(); ++b) all[b] = static_cast<uint16_t>(b * 40503u);
  std::vector<float> wide(all.size());
  Bf16ToFloat(all.data() + 1, static_cast<int64_t>(all.size()) - 1, wide.data());
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    ASSERT_EQ(BitsOf(wide[i]), BitsOf(Bf16ToFloat(all[i + 1])));
  }
}

// Whether this CPU takes the avx512_bf16 path, which rounds the activations to bf16 too.
bool RoundsActivations() { return std::string(LinearBf16Path()) == "avx512_bf16"; }

std::vector<float> Rounded(std::vector<float> v) {
  for (float& f : v) f = RoundToBf16(f);
  return v;
}

std::vector<uint16_t> Packed(const std::vector<float>& w, int64_t n, int64_t k) {
  std::vector<uint16_t> packed(PackedBf16Size(n, k));
  PackBf16Weights(w.data(), n, k, packed.data(), TestPool());
  return packed;
}

TEST(LinearBf16Test, PathIsOneOfTheKnownOnes) {
  const std::string path = LinearBf16Path();
  EXPECT_TRUE(path == "avx512_bf16" || path == "avx2" || path == "portable") << path;
#if defined(__x86_64__) && defined(__AVX2__)
  EXPECT_EQ(path, __builtin_cpu_supports("avx512bf16") ? "avx512_bf16" : "avx2");
#endif
}

struct Shape {
  int64_t m, n, k;
};

class LinearBf16ShapeTest : public ::testing::TestWithParam<Shape> {};

// Against the float64 reference on the bf16-rounded weights (and activations, on the path that
// rounds them): only fp32 accumulation error remains.
TEST_P(LinearBf16ShapeTest, MatchesReferenceOnRoundedWeights) {
  const auto [m, n, k] = GetParam();
  const std::vector<float> x = RandomFloats(m * k, 1);
  const std::vector<float> w = RandomFloats(n * k, 2);
  const std::vector<float> bias = RandomFloats(n, 3);
  const std::vector<uint16_t> packed = Packed(w, n, k);
  const std::vector<float> w_ref = Rounded(w);
  const std::vector<float> x_ref = RoundsActivations() ? Rounded(x) : x;
  const double atol = 2e-6 * std::sqrt(static_cast<double>(k)) + 1e-6;
  for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
    SCOPED_TRACE(b ? "with bias" : "without bias");
    std::vector<float> y(m * n, -7.0f);
    LinearBf16(x.data(), packed.data(), b, y.data(), m, n, k, TestPool());
    EXPECT_TRUE(AllNear(y, reference::Linear(x_ref.data(), w_ref.data(), b, m, n, k), atol, 1e-5));
  }
}

// K around and off the block sizes (8, 16, 32, 64), N off every tile width (3, 4, 8, 48), and
// M = 1 (decode), 2 and 7 (small batches, w widened in registers or in L1), 64, 513 (weight
// passes).
INSTANTIATE_TEST_SUITE_P(Shapes, LinearBf16ShapeTest,
                         ::testing::Values(Shape{1, 1, 1}, Shape{1, 5, 3}, Shape{1, 100, 64},
                                           Shape{1, 301, 257}, Shape{1, 97, 1000}, Shape{7, 49, 33},
                                           Shape{7, 10, 16}, Shape{7, 50, 65}, Shape{64, 130, 896},
                                           Shape{64, 53, 1100}, Shape{513, 70, 257},
                                           Shape{513, 100, 31}, Shape{2, 3, 4096},
                                           Shape{32, 96, 128}, Shape{7, 50, 2000}));

TEST(LinearBf16Test, ZeroInnerDimensionGivesBiasAndEmptyBatchWritesNothing) {
  const std::vector<float> bias = {1.5f, -2.0f, 3.25f};
  std::vector<float> y(2 * 3, 9.0f);
  LinearBf16(nullptr, nullptr, bias.data(), y.data(), 2, 3, 0, TestPool());
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 3.25f, 1.5f, -2.0f, 3.25f}));
  LinearBf16(nullptr, nullptr, bias.data(), y.data(), 0, 3, 5, TestPool());
  EXPECT_EQ(y[0], 1.5f);
}

// One element exactly as linear_bf16.h defines the avx2 path: blocks of 16 (zero padded),
// lane l takes the pair (2l, 2l + 1) of each block, even element first; then the fixed sum.
float AvxSpecElement(const float* x, const float* w, const float* bias, int64_t k) {
  float acc[8] = {};
  const int64_t padded = (k + 15) / 16 * 16;
  for (int64_t kk = 0; kk < padded; ++kk) {
    const bool in = kk < k;
    const int lane = static_cast<int>(kk % 16) / 2;
    acc[lane] = std::fma(in ? x[kk] : 0.0f, in ? w[kk] : 0.0f, acc[lane]);
  }
  const float sum =
      ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  return bias != nullptr ? sum + *bias : sum;
}

// Every path (one row, small batches, weight passes; full and edge tiles) runs the specified
// operations, bit for bit. The avx512_bf16 path is defined by vdpbf16ps's own rounding, so it
// is checked by the invariance tests below instead.
TEST(LinearBf16BatchInvarianceTest, EveryElementFollowsTheSpecifiedOperations) {
  if (RoundsActivations()) GTEST_SKIP() << "defined for the avx2 path";
  for (const auto& [m, n, k] :
       {Shape{1, 37, 1}, Shape{1, 301, 257}, Shape{3, 19, 16}, Shape{7, 45, 100}, Shape{13, 70, 33},
        Shape{300, 37, 257}, Shape{2, 11, 40}, Shape{5, 23, 1500}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k);
    const std::vector<float> x = RandomFloats(m * k, 20);
    const std::vector<float> w = RandomFloats(n * k, 21);
    const std::vector<float> bias = RandomFloats(n, 22);
    const std::vector<uint16_t> packed = Packed(w, n, k);
    const std::vector<float> w_wide = Rounded(w);
    for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
      std::vector<float> y(m * n);
      LinearBf16(x.data(), packed.data(), b, y.data(), m, n, k, TestPool());
      std::vector<float> want(m * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          want[i * n + j] = AvxSpecElement(&x[i * k], &w_wide[j * k], b ? &b[j] : nullptr, k);
        }
      }
      EXPECT_TRUE(BitEqual(want.data(), y.data(), m * n)) << (b ? "with bias" : "without bias");
    }
  }
}

// Row i of a batch equals the same row computed alone (M = 1), bit for bit, at every batch
// size up to 513 rows (decode, small batches and weight passes).
TEST(LinearBf16BatchInvarianceTest, RowsAreBitIdenticalWhateverTheBatchSize) {
  for (const auto& [n, k] :
       {std::pair<int64_t, int64_t>{100, 64}, {301, 257}, {130, 1100}, {61, 1500}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    const std::vector<uint16_t> w = Packed(RandomFloats(n * k, 10), n, k);
    const std::vector<float> bias = RandomFloats(n, 11);
    constexpr int64_t kMaxM = 513;
    const std::vector<float> x = RandomFloats(kMaxM * k, 12);
    std::vector<float> alone(kMaxM * n);
    for (int64_t i = 0; i < kMaxM; ++i) {
      LinearBf16(x.data() + i * k, w.data(), bias.data(), alone.data() + i * n, 1, n, k,
                 TestPool());
    }
    for (const int64_t m : std::vector<int64_t>{2, 3, 5, 7, 8, 13, 32, 64, 100, kMaxM}) {
      std::vector<float> batch(m * n);
      LinearBf16(x.data(), w.data(), bias.data(), batch.data(), m, n, k, TestPool());
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_TRUE(BitEqual(alone.data() + i * n, batch.data() + i * n, n))
            << "row " << i << " of M=" << m;
      }
    }
  }
}

// The pool only decides which thread computes which columns: no pool, 2 and 3 threads give
// the same bits; so do a window of the output features alone and misaligned inputs.
TEST(LinearBf16BatchInvarianceTest, BitIdenticalWhateverThePoolWindowAndAlignment) {
  constexpr int64_t kK = 300;
  constexpr int64_t kN = 700;
  const std::vector<uint16_t> w = Packed(RandomFloats(kN * kK, 33), kN, kK);
  const std::vector<float> bias = RandomFloats(kN, 34);
  const std::vector<float> x = RandomFloats(513 * kK, 35);
  ThreadPool two(2);
  ThreadPool three(3);
  for (const int64_t m : {1, 5, 64, 513}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m);
    std::vector<float> one_y(m * kN), two_y(m * kN), three_y(m * kN);
    LinearBf16(x.data(), w.data(), bias.data(), one_y.data(), m, kN, kK, nullptr);
    LinearBf16(x.data(), w.data(), bias.data(), two_y.data(), m, kN, kK, &two);
    LinearBf16(x.data(), w.data(), bias.data(), three_y.data(), m, kN, kK, &three);
    EXPECT_TRUE(BitEqual(one_y.data(), two_y.data(), m * kN));
    EXPECT_TRUE(BitEqual(one_y.data(), three_y.data(), m * kN));

    constexpr int64_t kBegin = 7;
    constexpr int64_t kCount = 250;
    std::vector<float> part(m * kCount);
    LinearBf16(x.data(), w.data() + kBegin * kK, bias.data() + kBegin, part.data(), m, kCount, kK,
               &three);
    for (int64_t i = 0; i < m; ++i) {
      ASSERT_TRUE(BitEqual(one_y.data() + i * kN + kBegin, part.data() + i * kCount, kCount))
          << "row " << i << " of a window of columns";
    }

    std::vector<float> x_shift(m * kK + 1);
    std::vector<uint16_t> w_shift(w.size() + 1);
    std::copy(x.begin(), x.begin() + m * kK, x_shift.begin() + 1);
    std::copy(w.begin(), w.end(), w_shift.begin() + 1);
    std::vector<float> shifted(m * kN);
    LinearBf16(x_shift.data() + 1, w_shift.data() + 1, bias.data(), shifted.data(), m, kN, kK,
               &two);
    EXPECT_TRUE(BitEqual(one_y.data(), shifted.data(), m * kN)) << "misaligned inputs";
  }
}

// Packing from fp32 rounds each value (as FloatToBf16 does); packing a checkpoint's bf16 bits
// gives the same packed data; the layout is row-major, as Bf16PackingIsRowMajor says.
TEST(PackBf16WeightsTest, BothOverloadsGiveTheSameRowMajorData) {
  ASSERT_TRUE(Bf16PackingIsRowMajor());
  ThreadPool three(3);
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {700, 300}}) {
    ASSERT_EQ(PackedBf16Size(n, k), n * k);
    std::vector<float> w = RandomFloats(n * k, 40, -3.0f, 3.0f);
    w[0] = FromBits(0x3f818000);  // a tie
    std::vector<uint16_t> bits(n * k);
    for (int64_t i = 0; i < n * k; ++i) bits[i] = FloatToBf16(w[i]);
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &three}) {
      std::vector<uint16_t> from_float(PackedBf16Size(n, k), 1);
      std::vector<uint16_t> from_bf16(PackedBf16Size(n, k), 2);
      PackBf16Weights(w.data(), n, k, from_float.data(), pool);
      PackBf16Weights(bits.data(), n, k, from_bf16.data(), pool);
      EXPECT_EQ(from_float, bits) << "n=" << n << " k=" << k;
      EXPECT_EQ(from_bf16, bits) << "n=" << n << " k=" << k;
    }
  }
}

TEST(EmbeddingGatherBf16Test, RowsAreTheWidenedTableRows) {
  constexpr int64_t kVocab = 50;
  constexpr int64_t kH = 37;
  const std::vector<uint16_t> table = Packed(RandomFloats(kVocab * kH, 50), kVocab, kH);
  const std::vector<int32_t> ids = {0, 49, 7, 7, 23};
  std::vector<float> out(ids.size() * kH);
  EmbeddingGatherBf16(table.data(), kVocab, kH, ids.data(), static_cast<int64_t>(ids.size()),
                      out.data());
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t c = 0; c < kH; ++c) {
      ASSERT_EQ(BitsOf(out[t * kH + c]), static_cast<uint32_t>(table[ids[t] * kH + c]) << 16)
          << "token " << t << " column " << c;
    }
  }
}

TEST(EmbeddingGatherBf16DeathTest, AnIdOutsideTheVocabularyIsAProgrammingError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the test pool's threads may be running
  const std::vector<uint16_t> table(4 * 2, 0x3f80);
  std::vector<float> out(2);
  const int32_t too_big = 4;
  const int32_t negative = -1;
  EXPECT_DEATH(EmbeddingGatherBf16(table.data(), 4, 2, &too_big, 1, out.data()), "CHECK failed");
  EXPECT_DEATH(EmbeddingGatherBf16(table.data(), 4, 2, &negative, 1, out.data()), "CHECK failed");
}

}  // namespace
}  // namespace carpool::kernels::cpu
