// carpool-bench-kernels: our batch-invariant Linear against OpenBLAS sgemm in the same run.
//
// For each weight shape (N, K) and batch M, prints GFLOP/s of kernels::cpu::Linear and of
// multi-threaded OpenBLAS (cblas_sgemm RowMajor, NoTrans x Trans, the same y = x · w^T) using
// the same number of threads as our pool (one per core), and their ratio; then GFLOP/s of
// LinearBf16 (the same weights in bf16, path named in the header line) and its speed relative
// to Linear; at M = 1 also the weight bytes Linear and LinearBf16 stream per second. Each figure
// is the best of repeated runs.
// Usage: carpool-bench-kernels [min_seconds_per_figure, default 0.3]
// Not a test: figures quoted in docs name this command.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/linear_bf16.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace carpool::bench {
namespace {

struct Shape {
  int64_t n, k;
};

constexpr Shape kShapes[] = {{2048, 768}, {768, 2048}, {768, 768}, {256, 768}, {32000, 768}};
constexpr int64_t kBatches[] = {1, 8, 32, 128, 512};

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best wall time of `fn` over at least 3 runs and at least `min_seconds` in all.
template <typename Fn>
double BestSeconds(Fn&& fn, double min_seconds) {
  fn();  // warm caches and thread pools
  double best = 1e30;
  double total = 0;
  for (int runs = 0; runs < 3 || total < min_seconds; ++runs) {
    const double t0 = NowSeconds();
    fn();
    const double dt = NowSeconds() - t0;
    best = std::min(best, dt);
    total += dt;
  }
  return best;
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace
}  // namespace carpool::bench

int main(int argc, char** argv) {
  using namespace carpool::bench;
  const double min_seconds = argc > 1 ? std::atof(argv[1]) : 0.3;
  const int threads = carpool::ThreadPool::CoreCount();
  carpool::ThreadPool pool(threads);
  openblas_set_num_threads(threads);
  std::printf(
      "threads=%d  (GFLOP/s = 2*M*N*K / best time; ratio = ours / OpenBLAS; bf16 x = "
      "LinearBf16 / Linear, path %s)\n",
      threads, carpool::kernels::cpu::LinearBf16Path());
  std::printf("%6s %6s %5s %12s %12s %7s %12s %7s %12s %12s\n", "N", "K", "M", "ours GF/s",
              "oblas GF/s", "ratio", "bf16 GF/s", "bf16 x", "ours w GB/s", "bf16 w GB/s");
  for (const Shape& s : kShapes) {
    const std::vector<float> w = RandomFloats(s.n * s.k, 1);
    const std::vector<float> bias = RandomFloats(s.n, 2);
    std::vector<uint16_t> w_bf16(carpool::kernels::cpu::PackedBf16Size(s.n, s.k));
    carpool::kernels::cpu::PackBf16Weights(w.data(), s.n, s.k, w_bf16.data(), &pool);
    for (const int64_t m : kBatches) {
      const std::vector<float> x = RandomFloats(m * s.k, 3);
      std::vector<float> y(m * s.n);
      const double ours = BestSeconds(
          [&] {
            carpool::kernels::cpu::Linear(x.data(), w.data(), bias.data(), y.data(), m, s.n, s.k,
                                          &pool);
          },
          min_seconds);
      const double blas = BestSeconds(
          [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, s.n, s.k, 1.0f, x.data(), s.k,
                        w.data(), s.k, 0.0f, y.data(), s.n);
          },
          min_seconds);
      // OpenBLAS workers spin for a while after a call; let them sleep before we time ours.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const double bf16 = BestSeconds(
          [&] {
            carpool::kernels::cpu::LinearBf16(x.data(), w_bf16.data(), bias.data(), y.data(), m,
                                              s.n, s.k, &pool);
          },
          min_seconds);
      const double flops = 2.0 * m * s.n * s.k;
      std::printf("%6lld %6lld %5lld %12.1f %12.1f %7.2f %12.1f %7.2f", static_cast<long long>(s.n),
                  static_cast<long long>(s.k), static_cast<long long>(m), flops / ours / 1e9,
                  flops / blas / 1e9, blas / ours, flops / bf16 / 1e9, ours / bf16);
      if (m == 1) {
        std::printf(" %12.1f %12.1f", s.n * s.k * sizeof(float) / ours / 1e9,
                    s.n * s.k * sizeof(uint16_t) / bf16 / 1e9);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
