// CUDA kernels: the GPU twins of kernels/cpu/cpu_kernels.h, each tested against
// kernels/reference/. GEMMs live in gemm.h (cuBLASLt), memory helpers in device_buffer.h.
//
// Storage type T is float, Half or BFloat16 (dtype.h); arithmetic and accumulation are fp32 and
// each output is rounded to T once. Shapes use T = tokens (rows), H = hidden size,
// D = head_dim; layouts are row-major and every pointer is device memory unless it says host.
//
// Every call only enqueues work on `stream` and returns at once. The returned status covers
// argument checks and launch errors (INVALID_ARGUMENT for a shape the kernel does not support);
// a fault while the kernel runs surfaces at the next synchronizing call. Thread-safe: kernels
// keep no state, so calls from several threads on several streams are fine.
// Unless stated, outputs may not alias inputs.
#ifndef CARPOOL_KERNELS_CUDA_CUDA_KERNELS_H_
#define CARPOOL_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_kernel_params.h"
#include "kernels/cuda/dtype.h"
#include "kernels/kernel_params.h"

namespace carpool::kernels::cuda {

// out[t] = table[ids[t]], rows of width h. An id outside [0, vocab) yields a zero row.
template <typename T>
absl::Status EmbeddingGather(const T* table, int64_t vocab, const int32_t* ids, T* out, int64_t t,
                             int64_t h, Stream stream);

// The norms' weights are fp32 whatever T is: Gemma's (1 + w), folded at load, keeps its exact
// value (in bf16 it would lose w's low bits), as transformers computes it.
//
// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight. out may alias x.
template <typename T>
absl::Status RmsNorm(const T* x, const float* weight, float eps, T* out, int64_t t, int64_t h,
                     Stream stream);

// In place: residual[t] += x[t] (rounded to T, as Hugging Face adds in the model dtype); then
// out[t] = RmsNorm(residual[t]). out may alias x.
template <typename T>
absl::Status AddRmsNorm(const T* x, T* residual, const float* weight, float eps, T* out, int64_t t,
                        int64_t h, Stream stream);

// Rotate-half RoPE in place on the first rotary_dim features of each head, as
// cpu::RotaryEmbedding: x [T, num_heads, head_dim], positions [T], inv_freq [rotary_dim / 2]
// (device, fp32). The angle float(position) * inv_freq[i] is rounded to fp32; sin and cos are
// fp32 (sincosf, a few ulp).
template <typename T>
absl::Status RotaryEmbedding(T* x, const int32_t* positions, const float* inv_freq, int64_t t,
                             int num_heads, int head_dim, int rotary_dim, Stream stream);

// out = silu(gate) * up, all [T, inter]. out may alias gate or up.
template <typename T>
absl::Status SiluMul(const T* gate, const T* up, T* out, int64_t t, int64_t inter, Stream stream);

// out = gelu_tanh(gate) * up (the tanh approximation of GELU, as cpu::GeluTanhMul), all
// [T, inter]. out may alias gate or up.
template <typename T>
absl::Status GeluTanhMul(const T* gate, const T* up, T* out, int64_t t, int64_t inter,
                         Stream stream);

// In place RMSNorm of every head of x [T, num_heads, head_dim] with weight [head_dim] (the q/k
// norms), as cpu::HeadRmsNorm. One warp per head.
template <typename T>
absl::Status HeadRmsNorm(T* x, const float* weight, float eps, int64_t t, int num_heads,
                         int head_dim, Stream stream);

// In place on x[0, n): x = cap * tanh(x / cap) (tanhf). REQUIRES: cap > 0.
template <typename T>
absl::Status SoftCap(T* x, float cap, int64_t n, Stream stream);

// In place on x[0, n): x *= factor.
template <typename T>
absl::Status Scale(T* x, float factor, int64_t n, Stream stream);

// Writes k and v rows ([T, num_kv_heads, head_dim]) into their cache slots (layout as in
// kernel_params.h). slots[t] < 0, or past the pool, means "do not store".
template <typename T>
absl::Status WriteKvCache(const T* k, const T* v, const int64_t* slots, int64_t t,
                          const KvCacheLayout& layout, T* key_cache, T* value_cache, Stream stream);

// Both attention kernels honor batch.sliding_window (a query's keys start at its window; the
// block-table entries before it are never read) and batch.logit_softcap, as the CPU kernels.
//
// Paged attention for decode: every sequence has exactly one query token. q and out:
// [num_seqs, num_heads, head_dim] (rows by query_start when given). head_dim is 64, 128 or 256.
// Long contexts are split over several thread blocks and merged by a second kernel; that needs
// `workspace` of PagedAttentionDecodeWorkspaceBytes(batch) bytes (none when it returns 0).
// One thread block reads each kv head once for all of its query heads (GQA).
size_t PagedAttentionDecodeWorkspaceBytes(const PagedAttentionBatch& batch);
template <typename T>
absl::Status PagedAttentionDecode(const T* q, const T* key_cache, const T* value_cache,
                                  const PagedAttentionBatch& batch, void* workspace,
                                  size_t workspace_bytes, T* out, Stream stream);

// Paged attention for a mixed batch (chunked prefill and decode): tiled over query rows and
// keys, causal, online softmax in fp32. q and out: [query_start[num_seqs], num_heads, head_dim];
// query_start is required. head_dim is 64, 128 or 256.
template <typename T>
absl::Status PagedAttention(const T* q, const T* key_cache, const T* value_cache,
                            const PagedAttentionBatch& batch, T* out, Stream stream);

// In place log-softmax of each row of x ([rows, n], fp32).
absl::Status LogSoftmax(float* x, int64_t rows, int64_t n, Stream stream);

// out[r] = index of the largest element of row r (the lowest index among equals; NaN counts as
// -inf). x: [rows, n] fp32; out: [rows].
absl::Status Argmax(const float* x, int64_t rows, int64_t n, int32_t* out, Stream stream);

// Samples one token per row of logits ([rows, vocab], fp32) with the CPU sampler's rule
// (worker/sampler/sampler.h, steps 1-7): the same weights bit for bit (its exp, computed
// with the FMAs GCC forms on an FMA host), the same order (weight desc, id asc; the top-k set of
// k <= 1024 by logit desc, id asc), the same top-k, top-p and min-p cuts and the same draw
// u = CounterUniform(seed, position). Masses are summed in double in another order, so a draw
// can differ from the CPU only when u * mass falls within ~1e-15 relative of a boundary.
// rows and out are device arrays of num_rows entries.
// Penalties (step 2): a row with num_penalty_tokens > 0 reads its entries of `penalties` (device,
// PenaltyToken) and samples from a penalized copy of itself written to row
// SamplingRow::penalized_row of `penalized` (device scratch of fp32 rows of `vocab`, one row per
// penalized row of the call), with the CPU's roundings (including the FMA GCC forms for the
// frequency penalty on an FMA host); logprobs stay those of the raw row. Both pointers null:
// no row is penalized. The overload without them is that.
absl::Status Sample(const float* logits, const SamplingRow* rows, int64_t num_rows, int64_t vocab,
                    const PenaltyToken* penalties, float* penalized, SampledToken* out,
                    Stream stream);
absl::Status Sample(const float* logits, const SamplingRow* rows, int64_t num_rows, int64_t vocab,
                    SampledToken* out, Stream stream);

// The asynchronous step's device-side gather of token ids (worker/model/model_device.h,
// PendingTokenId): in place on ids[0, n), an id < 0 becomes previous[-id - 1].token, the token
// the previous step sampled for that row (0 for a row outside [0, num_previous)).
absl::Status GatherPendingTokens(int32_t* ids, int64_t n, const SampledToken* previous,
                                 int64_t num_previous, Stream stream);

// out[i] = worker::CounterUniform(seeds[i], positions[i]) computed on the device (the sampler's
// random numbers; exposed for tests).
absl::Status CounterUniform(const uint64_t* seeds, const uint64_t* positions, double* out,
                            int64_t n, Stream stream);

// out[i] = in[i] converted (rounded to nearest even). From and To are each float, Half or
// BFloat16; e.g. F32 / F16 checkpoint weights to bf16.
template <typename From, typename To>
absl::Status Convert(const From* in, To* out, int64_t n, Stream stream);

}  // namespace carpool::kernels::cuda

#endif  // CARPOOL_KERNELS_CUDA_CUDA_KERNELS_H_
