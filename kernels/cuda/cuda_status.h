// The one adapter from CUDA runtime and cuBLAS errors to absl::Status.
//
// Internal to kernels/cuda (it includes CUDA headers). Codes: out of memory ->
// RESOURCE_EXHAUSTED; no device or driver -> UNAVAILABLE; an unsupported cuBLAS configuration
// -> UNIMPLEMENTED; an invalid value -> INVALID_ARGUMENT; anything else -> INTERNAL. A kernel
// fault (illegal address, ...) leaves the CUDA context unusable: every later call fails too.
#ifndef CARPOOL_KERNELS_CUDA_CUDA_STATUS_H_
#define CARPOOL_KERNELS_CUDA_CUDA_STATUS_H_

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace carpool::kernels::cuda {

// OK for cudaSuccess; otherwise a status naming `expr` and the CUDA error.
absl::Status CudaStatus(cudaError_t error, const char* expr);
absl::Status CublasStatus(cublasStatus_t status, const char* expr);

}  // namespace carpool::kernels::cuda

// Returns from the enclosing function when a CUDA runtime call fails.
#define CUDA_RETURN_IF_ERROR(expr)                                             \
  do {                                                                         \
    const cudaError_t carpool_cuda_error_ = (expr);                            \
    if (carpool_cuda_error_ != cudaSuccess) {                                  \
      return ::carpool::kernels::cuda::CudaStatus(carpool_cuda_error_, #expr); \
    }                                                                          \
  } while (0)

// Returns from the enclosing function when a cuBLAS / cuBLASLt call fails.
#define CUBLAS_RETURN_IF_ERROR(expr)                                                \
  do {                                                                              \
    const cublasStatus_t carpool_cublas_status_ = (expr);                           \
    if (carpool_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                          \
      return ::carpool::kernels::cuda::CublasStatus(carpool_cublas_status_, #expr); \
    }                                                                               \
  } while (0)

#endif  // CARPOOL_KERNELS_CUDA_CUDA_STATUS_H_
