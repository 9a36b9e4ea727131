// Paged attention for decode steps (one query token per sequence).
//
// Grid: (split, kv head x head tile, sequence). A thread block reads the keys and values of one
// kv head over one split of the context once, for up to kDecodeHeadTile query heads of its GQA
// group. Within a block, a "token group" of kLanes threads holds one cache row (16 bytes per
// thread; 32 bytes for fp32 rows of 256); the block walks the split in chunks of kChunk positions:
// scores into shared memory, an online-softmax update per head (one warp per head), then P·V into
// per-thread fp32 accumulators, which are summed over the token groups at the end. With more than
// one split the block writes un-normalized partial results, and DecodeReduceKernel merges them.
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"

namespace carpool::kernels::cuda::internal {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeHeadTile = 4;  // query heads per block
constexpr int kChunk = 256;         // context positions scored per pass through shared memory
constexpr int kRowsInFlight = 2;    // cache rows each thread loads before using them
// Split long contexts until the grid has about this many blocks.
constexpr int kTargetBlocks = 512;
constexpr int kReduceThreads = 128;

template <typename T, int D>
struct DecodeShape {
  // Threads per cache row: one 16-byte vector each, or, for rows wider than a warp's vectors
  // (fp32 with head_dim 256), a warp with several vectors each.
  static constexpr int kLanes = D / kVec16<T> < 32 ? D / kVec16<T> : 32;
  static constexpr int kVec = D / kLanes;                        // elements per thread per row
  static constexpr int kGroupsPerWarp = 32 / kLanes;             // rows per warp at once
  static constexpr int kGroups = kDecodeWarps * kGroupsPerWarp;  // rows per block at once
  static_assert(D % kLanes == 0 && kVec % kVec16<T> == 0 && 32 % kLanes == 0);
};

struct DecodeArgs {
  const int32_t* query_start;
  const int32_t* context_lens;
  const int32_t* block_tables;
  int block_table_stride;
  int block_size;
  int num_heads;
  int num_kv_heads;
  int group;  // query heads per kv head
  int head_tiles;
  float scale;
  int sliding_window;   // 0: none
  float logit_softcap;  // 0: none
  int num_splits;
  int split_tokens;
  float* partial_out;  // [num_seqs][num_heads][num_splits][D], when num_splits > 1
  float* partial_max;  // [num_seqs][num_heads][num_splits]
  float* partial_sum;  // [num_seqs][num_heads][num_splits]
};

// The first context position the sequence's query attends (its window's start).
__device__ __forceinline__ int WindowBegin(int context_len, int sliding_window) {
  return sliding_window > 0 ? max(0, context_len - sliding_window) : 0;
}

// Pool slot of a sequence's context position.
__device__ __forceinline__ int64_t SlotOf(const int32_t* table, int position, int block_size) {
  return static_cast<int64_t>(table[position / block_size]) * block_size + position % block_size;
}

template <typename T, int D>
__global__ void __launch_bounds__(kDecodeThreads)
    DecodeKernel(const T* q, const T* key_cache, const T* value_cache, DecodeArgs a, T* out) {
  using S = DecodeShape<T, D>;
  constexpr int kSmemFloats = kDecodeHeadTile * kChunk > S::kGroups * kDecodeHeadTile * D
                                  ? kDecodeHeadTile * kChunk
                                  : S::kGroups * kDecodeHeadTile * D;
  // scores[head][position in chunk] during the loop; partial sums [group][head][D] after it.
  __shared__ float smem[kSmemFloats];
  __shared__ float head_max[kDecodeHeadTile];
  __shared__ float head_sum[kDecodeHeadTile];
  __shared__ float head_rescale[kDecodeHeadTile];

  const int split = blockIdx.x;
  const int kv_head = blockIdx.y / a.head_tiles;
  const int head0 = kv_head * a.group + (blockIdx.y % a.head_tiles) * kDecodeHeadTile;
  const int heads = min(kDecodeHeadTile, kv_head * a.group + a.group - head0);
  const int seq = blockIdx.z;
  const int context_len = a.context_lens[seq];
  // Splits cover the window (the whole context without one) from its start, so no position
  // before it, nor its block-table entry, is read.
  const int begin = WindowBegin(context_len, a.sliding_window) + split * a.split_tokens;
  const int end = min(context_len, begin + a.split_tokens);
  const int64_t row = a.query_start != nullptr ? a.query_start[seq] : seq;
  if (begin >= end) {
    // A split past this sequence's context: the reduction ignores it. With a single split the
    // context is empty, and the output is defined as zero.
    if (a.num_splits == 1) {
      for (int i = threadIdx.x; i < heads * D; i += blockDim.x) {
        out[(row * a.num_heads + head0) * D + i] = Store<T>(0.0f);
      }
    }
    return;
  }

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int lane_in_row = lane % S::kLanes;
  const int token_group = warp * S::kGroupsPerWarp + lane / S::kLanes;
  const int feature0 = lane_in_row * S::kVec;

  float q_reg[kDecodeHeadTile][S::kVec];
#pragma unroll
  for (int h = 0; h < kDecodeHeadTile; ++h) {
    if (h < heads) {
      LoadVec(q + (row * a.num_heads + head0 + h) * D + feature0, q_reg[h]);
#pragma unroll
      for (int j = 0; j < S::kVec; ++j) q_reg[h][j] *= a.scale;
    } else {
#pragma unroll
      for (int j = 0; j < S::kVec; ++j) q_reg[h][j] = 0.0f;
    }
  }
  float acc[kDecodeHeadTile][S::kVec] = {};
  if (threadIdx.x < kDecodeHeadTile) {
    head_max[threadIdx.x] = -INFINITY;
    head_sum[threadIdx.x] = 0.0f;
  }

  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
  const int64_t row_stride = static_cast<int64_t>(a.num_kv_heads) * D;  // between slots
  const T* k_base = key_cache + static_cast<int64_t>(kv_head) * D + feature0;
  const T* v_base = value_cache + static_cast<int64_t>(kv_head) * D + feature0;
  float* scores = smem;

  for (int chunk = begin; chunk < end; chunk += kChunk) {
    const int n = min(kChunk, end - chunk);
    // 1. Scores of this chunk, kRowsInFlight rows per token group at a time so that several
    // loads are outstanding. The loop bound is uniform across the warp (for the shuffles).
    for (int warp_t = warp * S::kGroupsPerWarp; warp_t < n; warp_t += kRowsInFlight * S::kGroups) {
      float k[kRowsInFlight][S::kVec] = {};
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int t = warp_t + r * S::kGroups + lane / S::kLanes;
        if (t < n) LoadVec(k_base + SlotOf(table, chunk + t, a.block_size) * row_stride, k[r]);
      }
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int t = warp_t + r * S::kGroups + lane / S::kLanes;
#pragma unroll
        for (int h = 0; h < kDecodeHeadTile; ++h) {
          float dot = 0.0f;
#pragma unroll
          for (int j = 0; j < S::kVec; ++j) dot += q_reg[h][j] * k[r][j];
#pragma unroll
          for (int offset = S::kLanes / 2; offset > 0; offset /= 2) {
            dot += __shfl_xor_sync(kFullMask, dot, offset);
          }
          if (a.logit_softcap > 0.0f) dot = a.logit_softcap * tanhf(dot / a.logit_softcap);
          if (lane_in_row == 0 && h < heads && t < n) scores[h * kChunk + t] = dot;
        }
      }
    }
    __syncthreads();
    // 2. Online softmax, one warp per head: scores become weights relative to the new max.
    for (int h = warp; h < heads; h += kDecodeWarps) {
      float chunk_max = -INFINITY;
      for (int t = lane; t < n; t += 32) chunk_max = fmaxf(chunk_max, scores[h * kChunk + t]);
      chunk_max = WarpMax(chunk_max);
      const float old_max = head_max[h];
      const float new_max = fmaxf(old_max, chunk_max);
      float sum = 0.0f;
      for (int t = lane; t < n; t += 32) {
        const float p = __expf(scores[h * kChunk + t] - new_max);
        scores[h * kChunk + t] = p;
        sum += p;
      }
      sum = WarpSum(sum);
      if (lane == 0) {
        const float rescale = old_max == -INFINITY ? 0.0f : __expf(old_max - new_max);
        head_sum[h] = head_sum[h] * rescale + sum;
        head_max[h] = new_max;
        head_rescale[h] = rescale;
      }
    }
    __syncthreads();
    // 3. acc = acc * rescale + P·V over this chunk.
#pragma unroll
    for (int h = 0; h < kDecodeHeadTile; ++h) {
      if (h < heads) {
        const float rescale = head_rescale[h];
#pragma unroll
        for (int j = 0; j < S::kVec; ++j) acc[h][j] *= rescale;
      }
    }
    for (int first = token_group; first < n; first += kRowsInFlight * S::kGroups) {
      float v[kRowsInFlight][S::kVec] = {};
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int t = first + r * S::kGroups;
        if (t < n) LoadVec(v_base + SlotOf(table, chunk + t, a.block_size) * row_stride, v[r]);
      }
#pragma unroll
      for (int r = 0; r < kRowsInFlight; ++r) {
        const int t = first + r * S::kGroups;
        if (t >= n) break;
#pragma unroll
        for (int h = 0; h < kDecodeHeadTile; ++h) {
          if (h < heads) {
            const float p = scores[h * kChunk + t];
#pragma unroll
            for (int j = 0; j < S::kVec; ++j) acc[h][j] += p * v[r][j];
          }
        }
      }
    }
    __syncthreads();  // scores are rewritten by the next chunk; smem is reused below
  }

  // Sum the token groups' accumulators in a fixed order.
  float* partial = smem;  // [group][head][D]
#pragma unroll
  for (int h = 0; h < kDecodeHeadTile; ++h) {
    if (h < heads) {
#pragma unroll
      for (int j = 0; j < S::kVec; ++j) {
        partial[(token_group * kDecodeHeadTile + h) * D + feature0 + j] = acc[h][j];
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < heads * D; i += blockDim.x) {
    const int h = i / D;
    const int d = i % D;
    float total = 0.0f;
    for (int g = 0; g < S::kGroups; ++g) total += partial[(g * kDecodeHeadTile + h) * D + d];
    const int head = head0 + h;
    if (a.num_splits == 1) {
      out[(row * a.num_heads + head) * D + d] = Store<T>(total / head_sum[h]);
    } else {
      const int64_t at = (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_splits + split;
      a.partial_out[at * D + d] = total;
      if (d == 0) {
        a.partial_max[at] = head_max[h];
        a.partial_sum[at] = head_sum[h];
      }
    }
  }
}

// Merges the splits of one (sequence, head): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
template <typename T, int D>
__global__ void __launch_bounds__(kReduceThreads) DecodeReduceKernel(DecodeArgs a, T* out) {
  extern __shared__ float split_weight[];  // [num_splits]
  __shared__ float scratch[32];
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int64_t row = a.query_start != nullptr ? a.query_start[seq] : seq;
  const int context_len = a.context_lens[seq];
  const int span = context_len - WindowBegin(context_len, a.sliding_window);
  const int used = (span + a.split_tokens - 1) / a.split_tokens;
  const int64_t base = (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_splits;
  T* dst = out + (row * a.num_heads + head) * D;
  if (used <= 0) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = Store<T>(0.0f);
    return;
  }
  float global_max = -INFINITY;
  for (int s = threadIdx.x; s < used; s += blockDim.x) {
    global_max = fmaxf(global_max, a.partial_max[base + s]);
  }
  global_max = BlockMax(global_max, scratch);
  float total = 0.0f;
  for (int s = threadIdx.x; s < used; s += blockDim.x) {
    const float w = __expf(a.partial_max[base + s] - global_max);
    split_weight[s] = w;
    total += w * a.partial_sum[base + s];
  }
  total = BlockSum(total, scratch);  // its barriers also publish split_weight
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float value = 0.0f;
    for (int s = 0; s < used; ++s) value += split_weight[s] * a.partial_out[(base + s) * D + d];
    dst[d] = Store<T>(value / total);
  }
}

template <typename T, int D>
cudaError_t LaunchDecode(const T* q, const T* key_cache, const T* value_cache,
                         const PagedAttentionBatch& batch, const DecodePlan& plan, void* workspace,
                         T* out, cudaStream_t stream) {
  DecodeArgs a;
  a.query_start = batch.query_start;
  a.context_lens = batch.context_lens;
  a.block_tables = batch.block_tables;
  a.block_table_stride = batch.block_table_stride;
  a.block_size = batch.cache.block_size;
  a.num_heads = batch.num_heads;
  a.num_kv_heads = batch.cache.num_kv_heads;
  a.group = batch.num_heads / batch.cache.num_kv_heads;
  a.head_tiles = plan.head_tiles;
  a.scale = batch.scale;
  a.sliding_window = batch.sliding_window;
  a.logit_softcap = batch.logit_softcap;
  a.num_splits = plan.num_splits;
  a.split_tokens = plan.split_tokens;
  const int64_t partials = static_cast<int64_t>(batch.num_seqs) * batch.num_heads * plan.num_splits;
  a.partial_out = static_cast<float*>(workspace);
  a.partial_max = a.partial_out != nullptr ? a.partial_out + partials * D : nullptr;
  a.partial_sum = a.partial_max != nullptr ? a.partial_max + partials : nullptr;

  const dim3 grid(plan.num_splits, batch.cache.num_kv_heads * plan.head_tiles, batch.num_seqs);
  using DT = DeviceType<T>;
  DecodeKernel<DT, D><<<grid, kDecodeThreads, 0, stream>>>(ToDevice(q), ToDevice(key_cache),
                                                           ToDevice(value_cache), a, ToDevice(out));
  if (plan.num_splits > 1) {
    const dim3 reduce_grid(batch.num_heads, batch.num_seqs);
    DecodeReduceKernel<DT, D>
        <<<reduce_grid, kReduceThreads, plan.num_splits * sizeof(float), stream>>>(a,
                                                                                   ToDevice(out));
  }
  return cudaGetLastError();
}

}  // namespace

DecodePlan PlanDecode(const PagedAttentionBatch& batch) {
  DecodePlan plan;
  const int group = batch.num_heads / batch.cache.num_kv_heads;
  plan.head_tiles = (group + kDecodeHeadTile - 1) / kDecodeHeadTile;
  const int64_t base_blocks =
      static_cast<int64_t>(batch.num_seqs) * batch.cache.num_kv_heads * plan.head_tiles;
  // A query reads at most its window: the splits cover that span.
  int max_context = batch.max_context_len > 0 ? batch.max_context_len : 1;
  if (batch.sliding_window > 0 && batch.sliding_window < max_context) {
    max_context = batch.sliding_window;
  }
  const int max_chunks = (max_context + kChunk - 1) / kChunk;
  int64_t splits = (kTargetBlocks + base_blocks - 1) / (base_blocks > 0 ? base_blocks : 1);
  splits = splits < 1 ? 1 : (splits > max_chunks ? max_chunks : splits);
  const int chunks_per_split = static_cast<int>((max_chunks + splits - 1) / splits);
  plan.split_tokens = chunks_per_split * kChunk;
  plan.num_splits = (max_context + plan.split_tokens - 1) / plan.split_tokens;
  if (plan.num_splits > 1) {
    const size_t partials = static_cast<size_t>(batch.num_seqs) * batch.num_heads * plan.num_splits;
    plan.workspace_bytes = partials * (batch.cache.head_dim + 2) * sizeof(float);
  }
  return plan;
}

template <typename T>
cudaError_t LaunchPagedAttentionDecode(const T* q, const T* key_cache, const T* value_cache,
                                       const PagedAttentionBatch& batch, const DecodePlan& plan,
                                       void* workspace, T* out, cudaStream_t stream) {
  switch (batch.cache.head_dim) {
    case 64:
      return LaunchDecode<T, 64>(q, key_cache, value_cache, batch, plan, workspace, out, stream);
    case 128:
      return LaunchDecode<T, 128>(q, key_cache, value_cache, batch, plan, workspace, out, stream);
    case 256:
      return LaunchDecode<T, 256>(q, key_cache, value_cache, batch, plan, workspace, out, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template cudaError_t LaunchPagedAttentionDecode<float>(const float*, const float*, const float*,
                                                       const PagedAttentionBatch&,
                                                       const DecodePlan&, void*, float*,
                                                       cudaStream_t);
template cudaError_t LaunchPagedAttentionDecode<Half>(const Half*, const Half*, const Half*,
                                                      const PagedAttentionBatch&, const DecodePlan&,
                                                      void*, Half*, cudaStream_t);
template cudaError_t LaunchPagedAttentionDecode<BFloat16>(const BFloat16*, const BFloat16*,
                                                          const BFloat16*,
                                                          const PagedAttentionBatch&,
                                                          const DecodePlan&, void*, BFloat16*,
                                                          cudaStream_t);

}  // namespace carpool::kernels::cuda::internal
