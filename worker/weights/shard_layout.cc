#include "worker/weights/shard_layout.h"

#include "absl/strings/str_cat.h"

namespace carpool::worker {
namespace {

absl::Status NotDivisible(const char* field, int64_t value, int size, const char* why = "") {
  return absl::InvalidArgumentError(absl::StrCat("the model cannot be split over --tp ", size,
                                                 ": ", field, " ", value,
                                                 " is not divisible by ", size, why));
}

}  // namespace

absl::StatusOr<ShardLayout> PlanShard(const ModelConfig& c, const TensorParallelRank& tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel rank ", tp.rank, " of ", tp.size, " is not a group rank"));
  }
  const int n = tp.size;
  if (c.num_heads % n != 0) return NotDivisible("num_attention_heads", c.num_heads, n);
  if (c.num_kv_heads >= n && c.num_kv_heads % n != 0) {
    return NotDivisible("num_key_value_heads", c.num_kv_heads, n);
  }
  if (c.num_kv_heads < n && n % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model cannot be split over --tp ", n, ": num_key_value_heads ", c.num_kv_heads,
        " is smaller than ", n, " and does not divide it (each key/value head is replicated on ",
        "--tp / num_key_value_heads ranks)"));
  }
  if (c.intermediate_size % n != 0) return NotDivisible("intermediate_size", c.intermediate_size, n);
  if (c.vocab_size % n != 0) {
    return NotDivisible("vocab_size", c.vocab_size, n, " (embedding and head are vocab-parallel)");
  }
  ShardLayout s;
  s.num_heads = c.num_heads / n;
  s.heads_begin = tp.rank * s.num_heads;
  if (c.num_kv_heads >= n) {
    s.num_kv_heads = c.num_kv_heads / n;
    s.kv_heads_begin = tp.rank * s.num_kv_heads;
  } else {
    // Query head h reads kv head h / (num_heads / num_kv_heads); all of this rank's query heads
    // fall in one such group, because n / num_kv_heads ranks share each kv head.
    s.num_kv_heads = 1;
    s.kv_heads_begin = s.heads_begin / (c.num_heads / c.num_kv_heads);
  }
  s.intermediate = c.intermediate_size / n;
  s.intermediate_begin = tp.rank * s.intermediate;
  s.vocab = c.vocab_size / n;
  s.vocab_begin = tp.rank * s.vocab;
  return s;
}

}  // namespace carpool::worker
