// Internal: the kernel launchers defined in the .cu files. They assume arguments already checked
// by cuda_kernels.cc, enqueue on `stream` and return the launch error (cudaGetLastError).
// Kept apart from cuda_kernels.h so that nvcc never compiles abseil headers.
#ifndef CARPOOL_KERNELS_CUDA_LAUNCH_H_
#define CARPOOL_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_kernel_params.h"
#include "kernels/cuda/dtype.h"
#include "kernels/kernel_params.h"

namespace carpool::kernels::cuda::internal {

template <typename T>
cudaError_t LaunchEmbeddingGather(const T* table, int64_t vocab, const int32_t* ids, T* out,
                                  int64_t t, int64_t h, cudaStream_t stream);
template <typename T>
cudaError_t LaunchAddRmsNorm(const T* x, T* residual, const float* weight, float eps, T* out,
                             int64_t t, int64_t h, cudaStream_t stream);
template <typename T>
cudaError_t LaunchRotaryEmbedding(T* x, const int32_t* positions, const float* inv_freq, int64_t t,
                                  int num_heads, int head_dim, int rotary_dim, cudaStream_t stream);
template <typename T>
cudaError_t LaunchSiluMul(const T* gate, const T* up, T* out, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t LaunchGeluTanhMul(const T* gate, const T* up, T* out, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t LaunchSoftCap(T* x, float cap, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t LaunchScale(T* x, float factor, int64_t n, cudaStream_t stream);
cudaError_t LaunchGatherPendingTokens(int32_t* ids, int64_t n, const SampledToken* previous,
                                      int64_t num_previous, cudaStream_t stream);
template <typename T>
cudaError_t LaunchHeadRmsNorm(T* x, const float* weight, float eps, int64_t rows, int head_dim,
                              cudaStream_t stream);
template <typename T>
cudaError_t LaunchWriteKvCache(const T* k, const T* v, const int64_t* slots, int64_t t,
                               const KvCacheLayout& layout, T* key_cache, T* value_cache,
                               cudaStream_t stream);
template <typename From, typename To>
cudaError_t LaunchConvert(const From* in, To* out, int64_t n, cudaStream_t stream);

// How decode attention splits long contexts; a pure function of the batch's shape and bounds.
struct DecodePlan {
  int head_tiles = 1;    // thread blocks per kv head (each takes up to kDecodeHeadTile heads)
  int num_splits = 1;    // thread blocks per (sequence, head tile) along the context
  int split_tokens = 0;  // context positions per split, a multiple of the chunk size
  size_t workspace_bytes = 0;
};
DecodePlan PlanDecode(const PagedAttentionBatch& batch);

template <typename T>
cudaError_t LaunchPagedAttentionDecode(const T* q, const T* key_cache, const T* value_cache,
                                       const PagedAttentionBatch& batch, const DecodePlan& plan,
                                       void* workspace, T* out, cudaStream_t stream);
template <typename T>
cudaError_t LaunchPagedAttentionPrefill(const T* q, const T* key_cache, const T* value_cache,
                                        const PagedAttentionBatch& batch, T* out,
                                        cudaStream_t stream);

cudaError_t LaunchLogSoftmax(float* x, int64_t rows, int64_t n, cudaStream_t stream);
cudaError_t LaunchArgmax(const float* x, int64_t rows, int64_t n, int32_t* out,
                         cudaStream_t stream);
cudaError_t LaunchSample(const float* logits, const SamplingRow* rows, int64_t num_rows,
                         int64_t vocab, const PenaltyToken* penalties, float* penalized,
                         SampledToken* out, cudaStream_t stream);
cudaError_t LaunchCounterUniform(const uint64_t* seeds, const uint64_t* positions, double* out,
                                 int64_t n, cudaStream_t stream);

}  // namespace carpool::kernels::cuda::internal

#endif  // CARPOOL_KERNELS_CUDA_LAUNCH_H_
