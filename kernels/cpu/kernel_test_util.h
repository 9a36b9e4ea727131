// Helpers shared by the CPU kernel tests (and the CPU device's and model's tests): a thread pool,
// seeded random inputs and comparisons against the float64 reference.
#ifndef CARPOOL_KERNELS_CPU_KERNEL_TEST_UTIL_H_
#define CARPOOL_KERNELS_CPU_KERNEL_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"

namespace carpool::kernels::test_util {

// The pool tests run kernels on: one thread per core, made on first use and kept for the test
// binary's life (tests only; production code gets its pool from its owner).
inline ThreadPool* TestPool() {
  static ThreadPool* const pool = new ThreadPool(ThreadPool::CoreCount());
  return pool;
}

// n floats uniform in [lo, hi), the same for the same seed.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Passes when |actual[i] - expected[i]| <= atol + rtol * |expected[i]| for every i.
inline ::testing::AssertionResult AllNear(const float* actual, const std::vector<double>& expected,
                                          double atol, double rtol) {
  size_t bad = 0;
  size_t first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::abs(double{actual[i]} - expected[i]);
    worst = std::max(worst, err);
    if (!(err <= atol + rtol * std::abs(expected[i]))) {  // also catches NaN
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << absl::StrFormat("%d of %d values off; first at %d: got %.9g, want %.9g; worst %.3g",
                            bad, expected.size(), first, actual[first], expected[first], worst);
}

inline ::testing::AssertionResult AllNear(const std::vector<float>& actual,
                                          const std::vector<double>& expected, double atol,
                                          double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size() << " != " << expected.size();
  }
  return AllNear(actual.data(), expected, atol, rtol);
}

// Bitwise equality of n floats (NaNs with equal bits compare equal).
inline bool BitEqual(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

}  // namespace carpool::kernels::test_util

#endif  // CARPOOL_KERNELS_CPU_KERNEL_TEST_UTIL_H_
