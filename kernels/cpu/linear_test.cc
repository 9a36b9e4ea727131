#include <cstdint>
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
    Linear(x.data(), w.data(), b, y.data(), m, n, k);
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
  Linear(nullptr, nullptr, bias.data(), y.data(), 2, 3, 0);
  EXPECT_EQ(y, (std::vector<float>{1.5f, -2.0f, 3.25f, 1.5f, -2.0f, 3.25f}));
}

// The serving engine relies on this: a prompt alone and the same prompt inside a batch must
// produce the same bits, so row i of y may depend on row i of x only, whatever M is.
TEST(LinearBatchInvarianceTest, RowsAreBitIdenticalWhateverTheBatchSize) {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{100, 64}, {301, 257}, {1030, 896}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    const std::vector<float> w = RandomFloats(n * k, 10);
    const std::vector<float> bias = RandomFloats(n, 11);
    const std::vector<float> x = RandomFloats(32 * k, 12);
    // Row-by-row results: every M = 1 call.
    std::vector<float> alone(32 * n);
    for (int64_t i = 0; i < 32; ++i) {
      Linear(x.data() + i * k, w.data(), bias.data(), alone.data() + i * n, 1, n, k);
    }
    for (const int64_t m : {2, 4, 5, 7, 8, 13, 32}) {
      std::vector<float> batch(m * n);
      Linear(x.data(), w.data(), bias.data(), batch.data(), m, n, k);
      for (int64_t i = 0; i < m; ++i) {
        EXPECT_TRUE(BitEqual(alone.data() + i * n, batch.data() + i * n, n))
            << "row " << i << " of M=" << m;
      }
    }
  }
}

}  // namespace
}  // namespace carpool::kernels::cpu
