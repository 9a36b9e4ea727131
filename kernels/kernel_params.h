// Parameter structs shared by every kernel backend (cpu/, cuda/, reference/).
//
// Kernels take a params struct plus raw pointers; no scheduler or model type reaches here.
// Layouts are row-major. "Tokens" are the rows of one step's flattened batch.
#ifndef CARPOOL_KERNELS_KERNEL_PARAMS_H_
#define CARPOOL_KERNELS_KERNEL_PARAMS_H_

#include <cstdint>

namespace carpool::kernels {

// Paged KV cache of one layer: key and value pools, each laid out as
// [num_blocks][block_size][num_kv_heads][head_dim]. Slot s lives in block s / block_size at
// offset s % block_size.
struct KvCacheLayout {
  int num_blocks = 0;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// One sequence's part of an attention call.
//
// The step's new query tokens of this sequence are rows [query_start, query_start + query_len)
// of q and out. Their keys and values have already been written to the cache, so the sequence
// holds context_len tokens in total and query token j sits at position
// context_len - query_len + j; it attends causally to cache positions 0 .. that position (only
// the last AttentionParams::sliding_window of them with a window).
// block_table[i] is the physical block of logical block i; it has at least
// ceil(context_len / block_size) entries. With a sliding window, entries of blocks wholly
// before the first query's window (positions < first query position - window + 1) may be
// invalid (the KV cache may already have freed them): the kernels never read them.
struct AttentionSeq {
  int query_start = 0;
  int query_len = 0;
  int context_len = 0;
  const int32_t* block_table = nullptr;
};

struct AttentionParams {
  KvCacheLayout cache;
  int num_heads = 0;     // query heads; a multiple of cache.num_kv_heads (GQA)
  float scale = 0.0f;    // usually 1 / sqrt(head_dim)
  // Sliding window: the query at position i attends keys j with i - sliding_window < j <= i.
  // 0: no window (keys 0 .. i).
  int sliding_window = 0;
  // Tanh capping of the scaled scores before the softmax: s = cap * tanh(s / cap). 0: none.
  float logit_softcap = 0.0f;
  int num_seqs = 0;
  const AttentionSeq* seqs = nullptr;
};

}  // namespace carpool::kernels

#endif  // CARPOOL_KERNELS_KERNEL_PARAMS_H_
