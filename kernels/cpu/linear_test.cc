#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_test_util.h"
#include "kernels/reference/reference_kernels.h"

namespace carpool::kernels::cpu {
namespace {

using test_util::AllNear;
using test_util::BitEqual;
using test_util::RandomFloats;
using test_util::TestPool;

struct LinearShape {
  int64_t m, n, k;
};

class LinearTest : public ::testing::TestWithParam<LinearShape> {};

TEST_P(LinearTest, MatchesReferenceWithAndWithoutBias) {
  const auto [m, n, k] = GetParam();
  const std::vector<float> x = RandomFloats(m * k, 1);
  const std::vector<float> w = RandomFloats(n * k, 2);
  const std::vector<float> bias = RandomFloats(n, 3);
  // Sums of k products of magnitude < 1: fp32 rounding grows like sqrt(k) ulps of the sum.
  const double atol = 2e-6 * std::sqrt(static_cast<double>(k)) + 1e-6;
  for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
    SCOPED_TRACE(b ? "with bias" : "without bias");
    std::vector<float> y(m * n, -7.0f);
    Linear(x.data(), w.data(), b, y.data(), m, n, k, TestPool());
    EXPECT_TRUE(AllNear(y, reference::Linear(x.data(), w.data(), b, m, n, k), atol, 1e-5));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Values(LinearShape{1, 1, 1}, LinearShape{1, 5, 3},
                                           LinearShape{1, 100, 64}, LinearShape{3, 7, 9},
                                           LinearShape{7, 49, 33}, LinearShape{32, 96, 128},
                                           LinearShape{5, 1000, 257}, LinearShape{64, 130, 896},
                                           LinearShape{2, 3, 4096}));

TEST(LinearEdgeTest, ZeroInnerDimensionGivesBias) {
  const std::vector<float> bias = {1.5f, -2.0f, 3.25f};
  std::vector<float> y(2 * 3, 9.0f);
  Linear(nullptr, nullptr, bias.data(), y.data(), 2, 3, 0, TestPool());
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 3.25f, 1.5f, -2.0f, 3.25f}));
}

// The serving engine relies on this: a prompt alone and the same prompt inside a batch must
// produce the same bits, so row i of y may depend on row i of x only, whatever M is.
TEST(LinearBatchInvarianceTest, RowsAreBitIdenticalWhateverTheBatchSize) {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{100, 64}, {301, 257}, {1030, 896}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    const std::vector<float> w = RandomFloats(n * k, 10);
    const std::vector<float> bias = RandomFloats(n, 11);
    // Up to 300 rows: large enough batches take the L2-pass path, small ones keep x in L2.
    constexpr int64_t kMaxM = 300;
    const std::vector<float> x = RandomFloats(kMaxM * k, 12);
    // Row-by-row results: every M = 1 call.
    std::vector<float> alone(kMaxM * n);
    for (int64_t i = 0; i < kMaxM; ++i) {
      Linear(x.data() + i * k, w.data(), bias.data(), alone.data() + i * n, 1, n, k, TestPool());
    }
    for (const int64_t m : std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 12, 13, 31, 32, 100, kMaxM}) {
      std::vector<float> batch(m * n);
      Linear(x.data(), w.data(), bias.data(), batch.data(), m, n, k, TestPool());
      for (int64_t i = 0; i < m; ++i) {
        EXPECT_TRUE(BitEqual(alone.data() + i * n, batch.data() + i * n, n))
            << "row " << i << " of M=" << m;
      }
    }
  }
}

// The lanes linear.cc accumulates in: 16 where it is built with AVX-512 (F, DQ and VL), else 8.
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif

// One output element exactly as linear.cc defines it: lane l accumulates fma over
// k = l, l + kLanes, ... from +0 (lanes past the end of the last step get fma(0, 0, acc)),
// then the lanes are summed by halves (l += l + width for width = kLanes/2, ..., 1), then the
// bias is added.
float SpecElement(const float* x, const float* w, const float* bias, int64_t k) {
  float acc[kLanes] = {};
  const int64_t padded = (k + kLanes - 1) / kLanes * kLanes;
  for (int64_t kk = 0; kk < padded; ++kk) {
    const bool in = kk < k;
    acc[kk % kLanes] = std::fma(in ? x[kk] : 0.0f, in ? w[kk] : 0.0f, acc[kk % kLanes]);
  }
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
  }
  return bias != nullptr ? acc[0] + *bias : acc[0];
}

// Every element of every path (one row, small batches, L2 passes; full and edge tiles) is
// the specified sequence of operations, bit for bit.
TEST(LinearBatchInvarianceTest, EveryElementFollowsTheSpecifiedOperations) {
  struct Case {
    int64_t m, n, k;
  };
  for (const auto& [m, n, k] : {Case{1, 37, 1}, Case{1, 301, 257}, Case{3, 19, 16},
                                Case{7, 45, 100}, Case{13, 70, 33}, Case{256, 37, 257}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k);
    const std::vector<float> x = RandomFloats(m * k, 20);
    const std::vector<float> w = RandomFloats(n * k, 21);
    const std::vector<float> bias = RandomFloats(n, 22);
    for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
      std::vector<float> y(m * n);
      Linear(x.data(), w.data(), b, y.data(), m, n, k, TestPool());
      std::vector<float> want(m * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          want[i * n + j] = SpecElement(&x[i * k], &w[j * k], b ? &b[j] : nullptr, k);
        }
      }
      EXPECT_TRUE(BitEqual(want.data(), y.data(), m * n)) << (b ? "with bias" : "without bias");
    }
  }
}

// A column of y depends only on its own row of w: computing any window of output features
// alone (which moves it to another tile, weight pass and thread) gives the same bits.
// Inputs at odd addresses give the same bits too.
TEST(LinearBatchInvarianceTest, ColumnsAreBitIdenticalWhateverTheWindow) {
  constexpr int64_t kK = 300;
  constexpr int64_t kN = 1000;
  const std::vector<float> w = RandomFloats(kN * kK + 1, 30);
  const std::vector<float> bias = RandomFloats(kN, 31);
  const std::vector<float> x = RandomFloats(300 * kK + 1, 32);
  for (const int64_t m : {1, 2, 5, 6, 9, 40, 300}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m);
    std::vector<float> full(m * kN);
    Linear(x.data(), w.data(), bias.data(), full.data(), m, kN, kK, TestPool());
    for (const auto& [begin, count] :
         {std::pair<int64_t, int64_t>{0, 1}, {1, 3}, {5, 17}, {333, 250}, {999, 1}, {7, 993}}) {
      std::vector<float> part(m * count);
      Linear(x.data(), w.data() + begin * kK, bias.data() + begin, part.data(), m, count, kK,
             TestPool());
      for (int64_t i = 0; i < m; ++i) {
        EXPECT_TRUE(BitEqual(full.data() + i * kN + begin, part.data() + i * count, count))
            << "row " << i << ", columns [" << begin << ", " << begin + count << ")";
      }
    }
    // The same values one float further on: every load is now misaligned.
    std::vector<float> x_shift(x.size() + 1), w_shift(w.size() + 1);
    std::copy(x.begin(), x.end(), x_shift.begin() + 1);
    std::copy(w.begin(), w.end(), w_shift.begin() + 1);
    std::vector<float> shifted(m * kN);
    Linear(x_shift.data() + 1, w_shift.data() + 1, bias.data(), shifted.data(), m, kN, kK,
           TestPool());
    EXPECT_TRUE(BitEqual(full.data(), shifted.data(), m * kN)) << "misaligned inputs";
  }
}

// The pool only decides which thread computes which columns: no pool (the calling thread), one
// of 3 threads and the test pool give the same bits, at every batch size.
TEST(LinearBatchInvarianceTest, BitIdenticalWhateverThePool) {
  constexpr int64_t kK = 300;
  constexpr int64_t kN = 700;
  const std::vector<float> w = RandomFloats(kN * kK, 33);
  const std::vector<float> bias = RandomFloats(kN, 34);
  const std::vector<float> x = RandomFloats(64 * kK, 35);
  ThreadPool three(3);
  for (const int64_t m : {1, 5, 64}) {
    std::vector<float> inline_y(m * kN), three_y(m * kN), test_y(m * kN);
    Linear(x.data(), w.data(), bias.data(), inline_y.data(), m, kN, kK, nullptr);
    Linear(x.data(), w.data(), bias.data(), three_y.data(), m, kN, kK, &three);
    Linear(x.data(), w.data(), bias.data(), test_y.data(), m, kN, kK, TestPool());
    EXPECT_TRUE(BitEqual(inline_y.data(), three_y.data(), m * kN)) << "m=" << m;
    EXPECT_TRUE(BitEqual(inline_y.data(), test_y.data(), m * kN)) << "m=" << m;
  }
}

}  // namespace
}  // namespace carpool::kernels::cpu
