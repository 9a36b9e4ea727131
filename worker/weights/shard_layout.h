// The Megatron split of a Llama model over a tensor-parallel group, and which part one rank
// holds: query heads, key/value heads, intermediate features and vocabulary rows.
//
//   q/k/v_proj, gate/up_proj  split by output rows (whole heads; key/value heads are split when
//                             num_kv_heads >= size and replicated otherwise, each rank keeping
//                             the one its query heads read)
//   o_proj, down_proj         split by input columns (each rank's product is a partial sum, the
//                             group all-reduces it)
//   embed_tokens, lm_head     split by vocabulary rows (vocab-parallel)
//   norms                     replicated (q/k head norms too; Gemma folds 1 + w on each rank)
#ifndef CARPOOL_WORKER_WEIGHTS_SHARD_LAYOUT_H_
#define CARPOOL_WORKER_WEIGHTS_SHARD_LAYOUT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/weights/model_config.h"

namespace carpool::worker {

// One process's place in a tensor-parallel group. Default: the whole model (rank 0 of 1).
struct TensorParallelRank {
  int rank = 0;
  int size = 1;
};

// What one rank holds; for size 1, everything.
struct ShardLayout {
  int heads_begin = 0;       // query heads [heads_begin, heads_begin + num_heads)
  int num_heads = 0;
  int kv_heads_begin = 0;    // key/value heads [kv_heads_begin, kv_heads_begin + num_kv_heads)
  int num_kv_heads = 0;
  int64_t intermediate_begin = 0;
  int64_t intermediate = 0;
  int64_t vocab_begin = 0;   // vocabulary rows [vocab_begin, vocab_begin + vocab)
  int64_t vocab = 0;
};

// INVALID_ARGUMENT when `tp` is not a rank of a group (size < 1, rank outside [0, size)) or the
// model does not divide by tp.size; the message names the config field, its value and the
// group size, e.g. "num_attention_heads 12 is not divisible by --tp 8".
absl::StatusOr<ShardLayout> PlanShard(const ModelConfig& config, const TensorParallelRank& tp);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_WEIGHTS_SHARD_LAYOUT_H_
