// Plain parameter structs of the CUDA kernels, shared by host code and the .cu files (so no
// abseil and no CUDA header here). Pointers named "device" point to GPU memory.
#ifndef CARPOOL_KERNELS_CUDA_CUDA_KERNEL_PARAMS_H_
#define CARPOOL_KERNELS_CUDA_CUDA_KERNEL_PARAMS_H_

#include <cstdint>

#include "kernels/kernel_params.h"

struct CUstream_st;

namespace carpool::kernels::cuda {

// The same type as cudaStream_t; nullptr is the legacy default stream.
using Stream = ::CUstream_st*;

// One step's attention batch in device memory: the GPU form of AttentionParams. Sequence s owns
// query rows [query_start[s], query_start[s + 1]) of q and out; its query token j sits at
// position context_lens[s] - query_len + j and attends causally to cache positions 0 .. that
// position (its last sliding_window ones with a window), whose keys and values have already
// been written; block-table entries before a sequence's window may be invalid and are not read.
// Query head h reads kv head h / (num_heads / num_kv_heads).
//
// The grid is sized from max_query_len and max_context_len alone (never from device data), so
// a launch can be captured in a CUDA graph and replayed with other lengths up to those bounds.
struct PagedAttentionBatch {
  KvCacheLayout cache;
  int num_heads = 0;           // query heads; a multiple of cache.num_kv_heads
  float scale = 0.0f;          // usually 1 / sqrt(head_dim)
  int sliding_window = 0;      // as AttentionParams::sliding_window; 0: none
  float logit_softcap = 0.0f;  // as AttentionParams::logit_softcap; 0: none
  int num_seqs = 0;
  const int32_t* query_start = nullptr;   // device [num_seqs + 1]; decode: nullptr means row s
  const int32_t* context_lens = nullptr;  // device [num_seqs], each in [query_len, max_context_len]
  const int32_t* block_tables = nullptr;  // device [num_seqs][block_table_stride]
  int block_table_stride = 0;             // >= ceil(max_context_len / block_size)
  int max_query_len = 1;                  // >= every query_len; decode: 1
  int max_context_len = 0;                // >= every context_len
};

// Largest number of top logprobs the device sampler returns (kMaxLogprobs).
inline constexpr int kMaxTopLogprobs = 20;

// One token a row's penalties touch, distinct within the row: `count` > 0 is its number of
// occurrences in the output (the repetition, frequency and presence penalties apply), 0 means it
// is in the prompt only (the repetition penalty applies). The host builds the list from the
// request's prompt and output tokens, as worker::Sampler's ApplyPenalties walks them.
struct PenaltyToken {
  int32_t token = 0;
  int32_t count = 0;
};

// One row's sampling parameters (SamplingParams, resolved). Field meanings and defaults as
// there.
struct SamplingRow {
  uint64_t seed = 0;     // already resolved: a request without a seed uses 0, as on the CPU
  int64_t position = 0;  // sequence position of the token being sampled
  float temperature = 1.0f;
  int32_t top_k = 0;  // <= 0 or >= vocab: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t num_top_logprobs = 0;  // 0 .. kMaxTopLogprobs
  // Penalties: entries [penalty_begin, penalty_begin + num_penalty_tokens) of the penalty list
  // (Sample's `penalties`); 0 entries: the row is sampled as it is. A row with entries is
  // penalized into row `penalized_row` of Sample's `penalized` scratch.
  int32_t num_penalty_tokens = 0;
  int64_t penalty_begin = 0;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t penalized_row = 0;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;                      // log-softmax of the raw logits at `token`
  int32_t top_tokens[kMaxTopLogprobs] = {};  // first num_top_logprobs entries, most likely first
  float top_logprobs[kMaxTopLogprobs] = {};
};

}  // namespace carpool::kernels::cuda

#endif  // CARPOOL_KERNELS_CUDA_CUDA_KERNEL_PARAMS_H_
