// Linear layers on the GPU through cuBLASLt: y[M,N] = x[M,K] · w[N,K]^T (+ bias[N]), the GPU
// twin of cpu::Linear. w is stored [out_features, in_features] as checkpoints store it.
//
// Accumulation is fp32 in every case; fp32 inputs use true fp32 math unless allow_tf32.
// Supported (In, Out): (float, float), (BFloat16, BFloat16), (BFloat16, float), (Half, Half),
// (Half, float). The bias, when given, has type Out (cuBLASLt's rule for the bias epilogue).
// Not batch-invariant: cuBLASLt picks an algorithm per shape, so row m of y may differ in the
// last bits between calls with different M.
//
// Thread safety: a Gemm owns one workspace, so one Gemm serves one stream (or one thread) at a
// time; use one per stream.
#ifndef CARPOOL_KERNELS_CUDA_GEMM_H_
#define CARPOOL_KERNELS_CUDA_GEMM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_kernel_params.h"  // Stream
#include "kernels/cuda/dtype.h"

namespace carpool::kernels::cuda {

struct GemmOptions {
  // cuBLASLt workspace, allocated once in Create. Default: 32 MiB (NVIDIA's advice for Hopper).
  size_t workspace_bytes = size_t{32} << 20;
  // Let fp32 GEMMs use TF32 tensor cores (~1e-3 relative error). Default: false.
  bool allow_tf32 = false;
};

class Gemm {
 public:
  // UNAVAILABLE without a usable device; RESOURCE_EXHAUSTED when the workspace does not fit.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(const GemmOptions& options = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Enqueues y = x·w^T (+ bias) on `stream`. bias may be nullptr. The first call for a shape
  // (M, N, K, types, pointer alignment) asks cuBLASLt's heuristic for an algorithm and keeps it;
  // later calls reuse it. UNIMPLEMENTED when cuBLASLt has no algorithm for the combination.
  // REQUIRES: M, N, K > 0; pointers 2-byte aligned at least (16 is much faster).
  template <typename In, typename Out>
  absl::Status Linear(const In* x, const In* w, const Out* bias, Out* y, int64_t m, int64_t n,
                      int64_t k, Stream stream);

 private:
  struct Impl;
  explicit Gemm(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace carpool::kernels::cuda

#endif  // CARPOOL_KERNELS_CUDA_GEMM_H_
