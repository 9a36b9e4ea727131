#include "kernels/cpu/cpu_kernels.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kernel_test_util.h"
#include "kernels/reference/reference_kernels.h"

namespace carpool::kernels::cpu {
namespace {

using test_util::AllNear;
using test_util::BitEqual;
using test_util::RandomFloats;
using test_util::TestPool;

constexpr float kEps = 1e-6f;

class RowShapeTest : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(RowShapeTest, RmsNormMatchesReference) {
  const auto [t, h] = GetParam();
  const std::vector<float> x = RandomFloats(t * h, 1, -3.0f, 3.0f);
  const std::vector<float> weight = RandomFloats(h, 2, 0.5f, 1.5f);
  std::vector<float> out(t * h);
  RmsNorm(x.data(), weight.data(), kEps, out.data(), t, h, TestPool());
  EXPECT_TRUE(AllNear(out, reference::RmsNorm(x.data(), weight.data(), kEps, t, h), 1e-5, 1e-5));
}

TEST_P(RowShapeTest, RmsNormInPlace) {
  const auto [t, h] = GetParam();
  const std::vector<float> x = RandomFloats(t * h, 3);
  const std::vector<float> weight = RandomFloats(h, 4);
  std::vector<float> expected(t * h);
  RmsNorm(x.data(), weight.data(), kEps, expected.data(), t, h, TestPool());
  std::vector<float> in_place = x;
  RmsNorm(in_place.data(), weight.data(), kEps, in_place.data(), t, h, TestPool());
  EXPECT_TRUE(BitEqual(in_place.data(), expected.data(), expected.size()));
}

TEST_P(RowShapeTest, AddRmsNormUpdatesResidualAndNormalizes) {
  const auto [t, h] = GetParam();
  const std::vector<float> x = RandomFloats(t * h, 5);
  const std::vector<float> residual0 = RandomFloats(t * h, 6, -4.0f, 4.0f);
  const std::vector<float> weight = RandomFloats(h, 7);
  const auto [want_residual, want_out] =
      reference::AddRmsNorm(x.data(), residual0.data(), weight.data(), kEps, t, h);
  std::vector<float> residual = residual0;
  std::vector<float> out(t * h);
  AddRmsNorm(x.data(), residual.data(), weight.data(), kEps, out.data(), t, h, TestPool());
  EXPECT_TRUE(AllNear(residual, want_residual, 1e-6, 1e-6));
  EXPECT_TRUE(AllNear(out, want_out, 1e-5, 1e-5));

  // out may alias x.
  std::vector<float> aliased = x;
  residual = residual0;
  AddRmsNorm(aliased.data(), residual.data(), weight.data(), kEps, aliased.data(), t, h,
             TestPool());
  EXPECT_TRUE(BitEqual(aliased.data(), out.data(), out.size()));
}

TEST_P(RowShapeTest, SiluMulMatchesReferenceAndMayAlias) {
  const auto [t, inter] = GetParam();
  const std::vector<float> gate = RandomFloats(t * inter, 8, -12.0f, 12.0f);
  const std::vector<float> up = RandomFloats(t * inter, 9, -2.0f, 2.0f);
  const std::vector<double> want = reference::SiluMul(gate.data(), up.data(), t, inter);
  std::vector<float> out(t * inter);
  SiluMul(gate.data(), up.data(), out.data(), t, inter, TestPool());
  EXPECT_TRUE(AllNear(out, want, 1e-6, 1e-5));
  std::vector<float> into_gate = gate;
  SiluMul(into_gate.data(), up.data(), into_gate.data(), t, inter, TestPool());
  EXPECT_TRUE(BitEqual(into_gate.data(), out.data(), out.size()));
  std::vector<float> into_up = up;
  SiluMul(gate.data(), into_up.data(), into_up.data(), t, inter, TestPool());
  EXPECT_TRUE(BitEqual(into_up.data(), out.data(), out.size()));
}

TEST_P(RowShapeTest, GeluTanhMulMatchesReferenceAndMayAlias) {
  const auto [t, inter] = GetParam();
  const std::vector<float> gate = RandomFloats(t * inter, 20, -12.0f, 12.0f);
  const std::vector<float> up = RandomFloats(t * inter, 21, -2.0f, 2.0f);
  const std::vector<double> want = reference::GeluTanhMul(gate.data(), up.data(), t, inter);
  std::vector<float> out(t * inter);
  GeluTanhMul(gate.data(), up.data(), out.data(), t, inter, TestPool());
  EXPECT_TRUE(AllNear(out, want, 1e-6, 1e-5));
  std::vector<float> into_gate = gate;
  GeluTanhMul(into_gate.data(), up.data(), into_gate.data(), t, inter, TestPool());
  EXPECT_TRUE(BitEqual(into_gate.data(), out.data(), out.size()));
  std::vector<float> into_up = up;
  GeluTanhMul(gate.data(), into_up.data(), into_up.data(), t, inter, TestPool());
  EXPECT_TRUE(BitEqual(into_up.data(), out.data(), out.size()));
}

TEST_P(RowShapeTest, SoftCapMatchesReference) {
  const auto [t, n] = GetParam();
  const std::vector<float> x = RandomFloats(t * n, 22, -200.0f, 200.0f);
  for (const float cap : {30.0f, 50.0f, 0.5f}) {
    SCOPED_TRACE(::testing::Message() << "cap=" << cap);
    std::vector<float> out = x;
    SoftCap(out.data(), cap, t * n, TestPool());
    EXPECT_TRUE(AllNear(out, reference::SoftCap(x.data(), cap, t * n), 4e-7 * cap, 1e-6));
  }
}

TEST_P(RowShapeTest, LogSoftmaxMatchesReference) {
  const auto [rows, n] = GetParam();
  const std::vector<float> x = RandomFloats(rows * n, 10, -30.0f, 30.0f);
  std::vector<float> out = x;
  LogSoftmax(out.data(), rows, n, TestPool());
  EXPECT_TRUE(AllNear(out, reference::LogSoftmax(x.data(), rows, n), 2e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RowShapeTest,
                         ::testing::Values(std::pair<int64_t, int64_t>{1, 1},
                                           std::pair<int64_t, int64_t>{1, 7},
                                           std::pair<int64_t, int64_t>{3, 64},
                                           std::pair<int64_t, int64_t>{5, 897},
                                           std::pair<int64_t, int64_t>{64, 1024},
                                           std::pair<int64_t, int64_t>{2, 151936}));

// Each head of [T, heads, D] is its own RMSNorm row; checked against a float64 loop over heads.
TEST(HeadRmsNormTest, NormalizesEveryHeadOnItsOwn) {
  for (const auto& [t, heads, d] :
       {std::tuple<int64_t, int, int>{1, 1, 8}, std::tuple<int64_t, int, int>{5, 4, 64},
        std::tuple<int64_t, int, int>{3, 6, 128}, std::tuple<int64_t, int, int>{7, 2, 13}}) {
    SCOPED_TRACE(::testing::Message() << "t=" << t << " heads=" << heads << " d=" << d);
    const std::vector<float> x0 = RandomFloats(t * heads * d, 23, -3.0f, 3.0f);
    const std::vector<float> weight = RandomFloats(d, 24, 0.5f, 1.5f);
    std::vector<double> want(x0.size());
    for (int64_t r = 0; r < t; ++r) {
      for (int h = 0; h < heads; ++h) {
        const int64_t base = (r * heads + h) * d;
        double ss = 0.0;
        for (int i = 0; i < d; ++i) ss += double{x0[base + i]} * x0[base + i];
        const double inv = 1.0 / std::sqrt(ss / d + double{kEps});
        for (int i = 0; i < d; ++i) want[base + i] = x0[base + i] * inv * weight[i];
      }
    }
    std::vector<float> x = x0;
    HeadRmsNorm(x.data(), weight.data(), kEps, t, heads, d, TestPool());
    EXPECT_TRUE(AllNear(x, want, 1e-5, 1e-5));
  }
}

TEST(ScaleTest, MultipliesEveryElement) {
  std::vector<float> x = RandomFloats(37, 25);
  const std::vector<float> x0 = x;
  Scale(x.data(), 45.25f, 37);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], x0[i] * 45.25f);
}

TEST(GeluTanhMulTest, KnownValues) {
  // gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.8411920, gelu_tanh(-3) = -0.0036373.
  const std::vector<float> gate = {0.0f, 1.0f, -3.0f, 20.0f, -20.0f};
  const std::vector<float> up = {1.0f, 1.0f, 1.0f, 2.0f, 1.0f};
  std::vector<float> out(5);
  GeluTanhMul(gate.data(), up.data(), out.data(), 1, 5, nullptr);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 0.8411920, 1e-6);
  EXPECT_NEAR(out[2], -0.0036373, 1e-6);
  EXPECT_NEAR(out[3], 40.0f, 1e-5);
  EXPECT_NEAR(out[4], 0.0f, 1e-6);
}

TEST(RmsNormTest, EpsMattersForSmallInputs) {
  const int64_t t = 3, h = 19;
  const std::vector<float> x = RandomFloats(t * h, 16, -1e-3f, 1e-3f);
  const std::vector<float> weight = RandomFloats(h, 17);
  const float eps = 1e-6f;  // about three times mean(x^2)
  std::vector<float> out(t * h);
  RmsNorm(x.data(), weight.data(), eps, out.data(), t, h, TestPool());
  EXPECT_TRUE(AllNear(out, reference::RmsNorm(x.data(), weight.data(), eps, t, h), 1e-6, 1e-5));
}

TEST(LogSoftmaxTest, AllNegativeRowsOfOddWidth) {
  for (const int64_t n : {1, 5, 13, 100}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = RandomFloats(3 * n, 18, -40.0f, -10.0f);
    std::vector<float> out = x;
    LogSoftmax(out.data(), 3, n, TestPool());
    EXPECT_TRUE(AllNear(out, reference::LogSoftmax(x.data(), 3, n), 2e-5, 1e-5));
  }
}

TEST(LogSoftmaxTest, HandlesLargeLogitsAndNegativeInfinity) {
  // exp(1000) overflows fp32: only a max-shifted sum gets this right.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {1000.0f, 1000.0f, -inf, 0.0f};
  LogSoftmax(x.data(), 1, 4, TestPool());
  EXPECT_NEAR(x[0], -std::log(2.0), 1e-4);  // 1000's fp32 ulp is 6e-5
  EXPECT_NEAR(x[1], -std::log(2.0), 1e-4);
  EXPECT_EQ(x[2], -inf);
  EXPECT_NEAR(x[3], -1000.0 - std::log(2.0), 1e-3);
}

struct RopeCase {
  int num_heads, head_dim, rotary_dim;
};

class RotaryTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RotaryTest, MatchesReference) {
  const auto [num_heads, head_dim, rotary_dim] = GetParam();
  const int64_t t = 6;
  const std::vector<int32_t> positions = {0, 1, 17, 255, 4095, 32767};
  std::vector<float> inv_freq(rotary_dim / 2);
  for (int i = 0; i < rotary_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / rotary_dim));
  }
  const std::vector<float> x0 = RandomFloats(t * num_heads * head_dim, 11);
  std::vector<float> x = x0;
  RotaryEmbedding(x.data(), positions.data(), inv_freq.data(), t, num_heads, head_dim, rotary_dim,
                  TestPool());
  EXPECT_TRUE(AllNear(x,
                      reference::RotaryEmbedding(x0.data(), positions.data(), inv_freq.data(), t,
                                                 num_heads, head_dim, rotary_dim),
                      2e-6, 1e-5));
  // Features past rotary_dim pass through untouched.
  for (int64_t r = 0; r < t * num_heads; ++r) {
    for (int i = rotary_dim; i < head_dim; ++i) {
      ASSERT_EQ(x[r * head_dim + i], x0[r * head_dim + i]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RotaryTest,
                         ::testing::Values(RopeCase{1, 8, 8}, RopeCase{4, 64, 64},
                                           RopeCase{3, 64, 32}, RopeCase{2, 80, 20}));

TEST(EmbeddingGatherTest, CopiesRows) {
  const int64_t vocab = 11, h = 13;
  const std::vector<float> table = RandomFloats(vocab * h, 12);
  const std::vector<int32_t> ids = {3, 0, 10, 3};
  std::vector<float> out(ids.size() * h);
  EmbeddingGather(table.data(), ids.data(), out.data(), ids.size(), h);
  EXPECT_TRUE(
      AllNear(out, reference::EmbeddingGather(table.data(), ids.data(), ids.size(), h), 0.0, 0.0));
}

TEST(WriteKvCacheTest, StoresRowsInTheirSlotsAndSkipsPadding) {
  const KvCacheLayout layout{/*num_blocks=*/4, /*block_size=*/3, /*num_kv_heads=*/2,
                             /*head_dim=*/5};
  const int64_t row = layout.num_kv_heads * layout.head_dim;
  const int64_t pool = layout.num_blocks * layout.block_size * row;
  const std::vector<int64_t> slots = {7, -1, 0, 11};
  const int64_t t = slots.size();
  const std::vector<float> k = RandomFloats(t * row, 13);
  const std::vector<float> v = RandomFloats(t * row, 14);
  std::vector<float> key_cache(pool, -100.0f);
  std::vector<float> value_cache(pool, -200.0f);
  WriteKvCache(k.data(), v.data(), slots.data(), t, layout, key_cache.data(), value_cache.data());
  for (int64_t s = 0; s < layout.num_blocks * layout.block_size; ++s) {
    int64_t source = -1;
    for (int64_t r = 0; r < t; ++r) {
      if (slots[r] == s) source = r;
    }
    // Slot s is offset s % block_size of block s / block_size.
    const int64_t at = ((s / layout.block_size) * layout.block_size + s % layout.block_size) * row;
    for (int64_t i = 0; i < row; ++i) {
      ASSERT_EQ(key_cache[at + i], source < 0 ? -100.0f : k[source * row + i]) << "slot " << s;
      ASSERT_EQ(value_cache[at + i], source < 0 ? -200.0f : v[source * row + i]) << "slot " << s;
    }
  }
}

TEST(ArgmaxTest, FindsLargestAndPrefersLowestIndexOnTies) {
  EXPECT_EQ(Argmax(std::vector<float>{-5.0f}.data(), 1), 0);
  EXPECT_EQ(Argmax(std::vector<float>{1.0f, 3.0f, 2.0f}.data(), 3), 1);
  EXPECT_EQ(Argmax(std::vector<float>{-3.0f, -1.0f, -2.0f, -1.0f}.data(), 4), 1);
  std::vector<float> x = RandomFloats(151936, 15, -10.0f, 10.0f);
  x[100000] = 11.0f;
  x[140000] = 11.0f;
  x[151935] = 11.0f;
  EXPECT_EQ(Argmax(x.data(), x.size()), 100000);
  x[151935] = 12.0f;
  EXPECT_EQ(Argmax(x.data(), x.size()), 151935);
  x[3] = 12.0f;
  EXPECT_EQ(Argmax(x.data(), x.size()), 3);
}

}  // namespace
}  // namespace carpool::kernels::cpu
