// Paged attention for mixed batches (chunked prefill plus decode): a tiled, causal kernel with
// an online softmax in fp32, on CUDA cores.
//
// Grid: (query tile, kv head, sequence). The query rows of one kv head are the pairs
// (token, query head of its group), flattened token-major, so a tile of kTileM rows shares
// every key and value tile it loads across the GQA group. Each thread owns one row and a
// quarter of the key tile's columns for the scores, and the same row and a quarter of the head
// features for the output accumulator; the four threads of a row are adjacent lanes.
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"

namespace carpool::kernels::cuda::internal {
namespace {

constexpr int kTileM = 32;  // query rows per block
constexpr int kTileN = 32;  // keys per iteration
constexpr int kThreadsPerRow = 4;
constexpr int kPrefillThreads = kTileM * kThreadsPerRow;
constexpr int kColsPerThread = kTileN / kThreadsPerRow;

struct PrefillArgs {
  const int32_t* query_start;
  const int32_t* context_lens;
  const int32_t* block_tables;
  int block_table_stride;
  int block_size;
  int num_heads;
  int num_kv_heads;
  int group;
  float scale;
  int sliding_window;   // 0: none
  float logit_softcap;  // 0: none
};

template <int D>
struct PrefillSmem {
  static constexpr int kQStride = D + 1;  // padding keeps column reads free of bank conflicts
  static constexpr int kKStride = D + 1;
  static constexpr int kPStride = kTileN + 1;
  static constexpr size_t kFloats =
      kTileM * kQStride + kTileN * kKStride + kTileN * D + kTileM * kPStride;
  static constexpr size_t kBytes = kFloats * sizeof(float);
};

// Loads kTileN cache rows starting at `first` (zeros past `end`) into dst[row][0, D), fp32.
template <typename T, int D>
__device__ __forceinline__ void LoadKvTile(const T* cache, const int32_t* table, int block_size,
                                           int64_t row_stride, int first, int end, float* dst,
                                           int dst_stride) {
  constexpr int kVec = kVec16<T>;
  constexpr int kVecsPerRow = D / kVec;
  for (int i = threadIdx.x; i < kTileN * kVecsPerRow; i += blockDim.x) {
    const int r = i / kVecsPerRow;
    const int c = (i % kVecsPerRow) * kVec;
    const int position = first + r;
    float v[kVec] = {};
    if (position < end) {
      const int64_t slot =
          static_cast<int64_t>(table[position / block_size]) * block_size + position % block_size;
      LoadVec16(cache + slot * row_stride + c, v);
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) dst[r * dst_stride + c + j] = v[j];
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kPrefillThreads)
    PrefillKernel(const T* q, const T* key_cache, const T* value_cache, PrefillArgs a, T* out) {
  using Smem = PrefillSmem<D>;
  constexpr int kVec = kVec16<T>;
  constexpr int kVecsPerRow = D / kVec;
  constexpr int kFeaturesPerThread = D / kThreadsPerRow;
  extern __shared__ float smem[];
  float* q_tile = smem;                              // [kTileM][kQStride]
  float* k_tile = q_tile + kTileM * Smem::kQStride;  // [kTileN][kKStride]
  float* v_tile = k_tile + kTileN * Smem::kKStride;  // [kTileN][D]
  float* p_tile = v_tile + kTileN * D;               // [kTileM][kPStride]

  const int kv_head = blockIdx.y;
  const int seq = blockIdx.z;
  const int query_start = a.query_start[seq];
  const int query_len = a.query_start[seq + 1] - query_start;
  const int context_len = a.context_lens[seq];
  const int rows = query_len * a.group;
  const int tile_first = blockIdx.x * kTileM;
  if (tile_first >= rows) return;

  // Query tile, pre-scaled; rows past the end are zero.
  for (int i = threadIdx.x; i < kTileM * kVecsPerRow; i += blockDim.x) {
    const int r = i / kVecsPerRow;
    const int c = (i % kVecsPerRow) * kVec;
    float v[kVec] = {};
    const int flat = tile_first + r;
    if (flat < rows) {
      const int64_t token = query_start + flat / a.group;
      const int head = kv_head * a.group + flat % a.group;
      LoadVec16(q + (token * a.num_heads + head) * D + c, v);
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) q_tile[r * Smem::kQStride + c + j] = v[j] * a.scale;
  }

  const int r = threadIdx.x / kThreadsPerRow;
  const int quarter = threadIdx.x % kThreadsPerRow;
  const int flat = tile_first + r;
  const bool valid = flat < rows;
  // This row's token attends to cache positions first_key .. last (0 .. last without a window).
  const int last = valid ? context_len - query_len + flat / a.group : -1;
  const int first_key = a.sliding_window > 0 ? max(0, last - a.sliding_window + 1) : 0;
  const int tile_last_flat = min(rows - 1, tile_first + kTileM - 1);
  const int kv_end = min(context_len, context_len - query_len + tile_last_flat / a.group + 1);
  // The tile's first row has the earliest window: no key before it is loaded, so the block
  // table's entries before it (perhaps freed blocks) are never read.
  const int kv_begin =
      a.sliding_window > 0
          ? max(0, context_len - query_len + tile_first / a.group - a.sliding_window + 1)
          : 0;

  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
  const int64_t row_stride = static_cast<int64_t>(a.num_kv_heads) * D;
  const T* k_base = key_cache + static_cast<int64_t>(kv_head) * D;
  const T* v_base = value_cache + static_cast<int64_t>(kv_head) * D;

  float row_max = -INFINITY;
  float row_sum = 0.0f;
  float acc[kFeaturesPerThread] = {};
  for (int first = kv_begin; first < kv_end; first += kTileN) {
    __syncthreads();  // the previous tiles are consumed (and q_tile is written, first time)
    LoadKvTile<T, D>(k_base, table, a.block_size, row_stride, first, kv_end, k_tile,
                     Smem::kKStride);
    LoadKvTile<T, D>(v_base, table, a.block_size, row_stride, first, kv_end, v_tile, D);
    __syncthreads();

    float s[kColsPerThread];
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) s[j] = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float qd = q_tile[r * Smem::kQStride + d];
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        s[j] += qd * k_tile[(quarter + kThreadsPerRow * j) * Smem::kKStride + d];
      }
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int position = first + quarter + kThreadsPerRow * j;
      if (a.logit_softcap > 0.0f) s[j] = a.logit_softcap * tanhf(s[j] / a.logit_softcap);
      if (position > last || position < first_key) s[j] = -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
#pragma unroll
    for (int offset = 1; offset < kThreadsPerRow; offset *= 2) {
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, offset));
    }
    const float new_max = fmaxf(row_max, tile_max);
    const float rescale = row_max == -INFINITY ? 0.0f : __expf(row_max - new_max);
    float tile_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const float p = s[j] == -INFINITY ? 0.0f : __expf(s[j] - new_max);
      p_tile[r * Smem::kPStride + quarter + kThreadsPerRow * j] = p;
      tile_sum += p;
    }
#pragma unroll
    for (int offset = 1; offset < kThreadsPerRow; offset *= 2) {
      tile_sum += __shfl_xor_sync(kFullMask, tile_sum, offset);
    }
    row_sum = row_sum * rescale + tile_sum;
    row_max = new_max;
    __syncwarp();  // a row's probabilities are written and read by its own four lanes
#pragma unroll
    for (int f = 0; f < kFeaturesPerThread; ++f) acc[f] *= rescale;
    for (int c = 0; c < kTileN; ++c) {
      const float p = p_tile[r * Smem::kPStride + c];
#pragma unroll
      for (int f = 0; f < kFeaturesPerThread; ++f) {
        acc[f] += p * v_tile[c * D + quarter + kThreadsPerRow * f];
      }
    }
  }
  if (!valid) return;
  const int64_t token = query_start + flat / a.group;
  const int head = kv_head * a.group + flat % a.group;
  T* dst = out + (token * a.num_heads + head) * D;
  const float inv_sum = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
#pragma unroll
  for (int f = 0; f < kFeaturesPerThread; ++f) {
    dst[quarter + kThreadsPerRow * f] = Store<T>(acc[f] * inv_sum);
  }
}

template <typename T, int D>
cudaError_t LaunchPrefill(const T* q, const T* key_cache, const T* value_cache,
                          const PagedAttentionBatch& batch, T* out, cudaStream_t stream) {
  using DT = DeviceType<T>;
  PrefillArgs a;
  a.query_start = batch.query_start;
  a.context_lens = batch.context_lens;
  a.block_tables = batch.block_tables;
  a.block_table_stride = batch.block_table_stride;
  a.block_size = batch.cache.block_size;
  a.num_heads = batch.num_heads;
  a.num_kv_heads = batch.cache.num_kv_heads;
  a.group = batch.num_heads / batch.cache.num_kv_heads;
  a.scale = batch.scale;
  a.sliding_window = batch.sliding_window;
  a.logit_softcap = batch.logit_softcap;
  constexpr size_t kSmemBytes = PrefillSmem<D>::kBytes;
  const cudaError_t attribute = cudaFuncSetAttribute(
      PrefillKernel<DT, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (attribute != cudaSuccess) return attribute;
  const dim3 grid(CeilDiv(static_cast<int64_t>(batch.max_query_len) * a.group, kTileM),
                  batch.cache.num_kv_heads, batch.num_seqs);
  PrefillKernel<DT, D><<<grid, kPrefillThreads, kSmemBytes, stream>>>(
      ToDevice(q), ToDevice(key_cache), ToDevice(value_cache), a, ToDevice(out));
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t LaunchPagedAttentionPrefill(const T* q, const T* key_cache, const T* value_cache,
                                        const PagedAttentionBatch& batch, T* out,
                                        cudaStream_t stream) {
  switch (batch.cache.head_dim) {
    case 64:
      return LaunchPrefill<T, 64>(q, key_cache, value_cache, batch, out, stream);
    case 128:
      return LaunchPrefill<T, 128>(q, key_cache, value_cache, batch, out, stream);
    case 256:
      return LaunchPrefill<T, 256>(q, key_cache, value_cache, batch, out, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template cudaError_t LaunchPagedAttentionPrefill<float>(const float*, const float*, const float*,
                                                        const PagedAttentionBatch&, float*,
                                                        cudaStream_t);
template cudaError_t LaunchPagedAttentionPrefill<Half>(const Half*, const Half*, const Half*,
                                                       const PagedAttentionBatch&, Half*,
                                                       cudaStream_t);
template cudaError_t LaunchPagedAttentionPrefill<BFloat16>(const BFloat16*, const BFloat16*,
                                                           const BFloat16*,
                                                           const PagedAttentionBatch&, BFloat16*,
                                                           cudaStream_t);

}  // namespace carpool::kernels::cuda::internal
