// fp32 CPU kernels. Each has a float64 twin in kernels/reference/ that its test compares
// against. Those that take a `pool` (last, as a CUDA kernel takes its stream) split their work
// over it where that pays; the caller owns the pool (the engine's, via its CpuDevice), and a
// null pool runs everything on the calling thread. No result depends on the pool's size.
//
// Shapes use T = number of tokens (rows), H = hidden size, D = head_dim.
// Unless stated, outputs may not alias inputs.
// REQUIRES: not called from inside a task of `pool` (ParallelFor is not reentrant).
// Thread-safe otherwise: concurrent calls on one pool are serialized by it.
#ifndef CARPOOL_KERNELS_CPU_CPU_KERNELS_H_
#define CARPOOL_KERNELS_CPU_CPU_KERNELS_H_

#include <cstdint>

#include "common/thread_pool.h"
#include "kernels/kernel_params.h"

namespace carpool::kernels::cpu {

// y[M,N] = x[M,K] · w[N,K]^T (+ bias[N] when bias != nullptr).
// w is stored as [out_features, in_features], as checkpoints store linear layers.
// The N dimension is split over the thread pool. Batch-invariant: row m of y depends only on
// row m of x, bit for bit, whatever M and the thread count (every element is one fixed-order
// 16-lane dot product with AVX-512, 8-lane otherwise; OpenBLAS sgemm is not invariant, see
// linear.cc). x and w need no particular alignment.
void Linear(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k, ThreadPool* pool);

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, for t in [0, T), rows of width h.
// out may alias x.
void RmsNorm(const float* x, const float* weight, float eps, float* out, int64_t t, int64_t h,
             ThreadPool* pool);

// In place: residual[t] += x[t]; then out[t] = RmsNorm(residual[t]). out may alias x.
void AddRmsNorm(const float* x, float* residual, const float* weight, float eps, float* out,
                int64_t t, int64_t h, ThreadPool* pool);

// Rotate-half rotary embedding, in place, on the first `rotary_dim` features of every head.
// x: [T, num_heads, head_dim]; positions: [T]; inv_freq: [rotary_dim / 2].
// For pair i < half = rotary_dim/2: angle = float(position) * inv_freq[i], rounded to fp32 as
// HF does (cos and sin of that fp32 angle may be taken in double);
//   x'[i] = x[i] cos - x[i + half] sin;  x'[i + half] = x[i + half] cos + x[i] sin.
void RotaryEmbedding(float* x, const int32_t* positions, const float* inv_freq, int64_t t,
                     int num_heads, int head_dim, int rotary_dim, ThreadPool* pool);

// RMSNorm of every head, in place: x [T, num_heads, head_dim], each head's head_dim features
// normalized on their own and multiplied by weight [head_dim] (Qwen3's and Gemma 3's q/k norms).
void HeadRmsNorm(float* x, const float* weight, float eps, int64_t t, int num_heads, int head_dim,
                 ThreadPool* pool);

// out[t, i] = silu(gate[t, i]) * up[t, i]; all [T, inter]. out may alias gate or up.
void SiluMul(const float* gate, const float* up, float* out, int64_t t, int64_t inter,
             ThreadPool* pool);

// out[t, i] = gelu_tanh(gate[t, i]) * up[t, i], with the tanh approximation of GELU
// 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), computed as g / (1 + e^(-2 u)) for the
// tanh's argument u (the same value, without tanh's loss of digits). out may alias gate or up.
void GeluTanhMul(const float* gate, const float* up, float* out, int64_t t, int64_t inter,
                 ThreadPool* pool);

// In place: x[i] = cap * tanh(x[i] / cap) for i in [0, n) (Gemma's logit capping). REQUIRES:
// cap > 0. Within ~2e-7 * cap absolute of the exact value (simd::Tanh).
void SoftCap(float* x, float cap, int64_t n, ThreadPool* pool);

// In place: x[i] *= factor for i in [0, n).
void Scale(float* x, float factor, int64_t n);

// out[t] = table[ids[t]], rows of width h. REQUIRES: 0 <= ids[t] < table rows.
void EmbeddingGather(const float* table, const int32_t* ids, float* out, int64_t t, int64_t h);

// Writes k and v rows ([T, num_kv_heads, head_dim]) into their cache slots.
// slots[t] < 0 means "do not store" (padding).
void WriteKvCache(const float* k, const float* v, const int64_t* slots, int64_t t,
                  const KvCacheLayout& layout, float* key_cache, float* value_cache);

// WriteKvCache for a bf16 cache (same layout, elements bf16 bits): each value rounded to the
// nearest bf16, ties to even (kernels/cpu/bf16.h). slots[t] < 0 are skipped.
void WriteKvCacheBf16(const float* k, const float* v, const int64_t* slots, int64_t t,
                      const KvCacheLayout& layout, uint16_t* key_cache, uint16_t* value_cache);

// Paged attention for a mixed batch of prefill chunks and decodes (see AttentionSeq).
// q, out: [total query tokens, num_heads, head_dim]. Query head h reads kv head
// h / (num_heads / num_kv_heads). Softmax in fp32 with a running max (online). With
// params.sliding_window, a query's key loop starts at its window (positions before it, and
// their block-table entries, are never read); params.logit_softcap caps each scaled score.
void PagedAttention(const float* q, const float* key_cache, const float* value_cache,
                    const AttentionParams& params, float* out, ThreadPool* pool);

// Decode-only fast path: every seq has query_len == 1. Same contract as PagedAttention.
void PagedAttentionDecode(const float* q, const float* key_cache, const float* value_cache,
                          const AttentionParams& params, float* out, ThreadPool* pool);

// PagedAttention and PagedAttentionDecode over a bf16 cache (written by WriteKvCacheBf16): the
// same operations on the widened values, so the output is bit-identical to the fp32 kernel's on
// a cache holding those values, and half the cache bytes are read.
void PagedAttentionBf16(const float* q, const uint16_t* key_cache, const uint16_t* value_cache,
                        const AttentionParams& params, float* out, ThreadPool* pool);
void PagedAttentionDecodeBf16(const float* q, const uint16_t* key_cache,
                              const uint16_t* value_cache, const AttentionParams& params,
                              float* out, ThreadPool* pool);

// In place log-softmax of each row of x ([rows, n]).
void LogSoftmax(float* x, int64_t rows, int64_t n, ThreadPool* pool);

// Index of the largest element (the lowest index among equals).
int64_t Argmax(const float* x, int64_t n);

}  // namespace carpool::kernels::cpu

#endif  // CARPOOL_KERNELS_CPU_CPU_KERNELS_H_
