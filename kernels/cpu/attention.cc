// Paged attention over the block-table KV cache (see kernels/kernel_params.h).
//
// One work item is one (query token, kv head): it serves the kv head's whole GQA group of query
// heads, so each key and value row is loaded once per group. Positions are visited in chunks;
// per chunk the scores are computed, the running max and sum rescaled once (online softmax, all
// fp32), and the values accumulated. An item's result depends only on its own sequence, never
// on the rest of the batch or the thread split, and PagedAttentionDecode runs the very same
// item code, so a token's output is bit-identical whichever entry point and batch computed it.
//
// The item code is a template on the cache element type: fp32, or bf16 bits widened to fp32 as
// they are loaded (kernels/cpu/bf16.h). Widening is exact and every operation after the load is
// the same, so the bf16 kernels give exactly what the fp32 ones give on the widened values.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd.h"

namespace carpool::kernels::cpu {
namespace {

using simd::F8;

// Cache positions scored per online-softmax step.
constexpr int kChunk = 32;

// One query token of one sequence.
struct QueryRow {
  int64_t row = 0;   // row of q and out
  int position = 0;  // its position in the sequence; it attends to 0 .. position (or its window)
  const AttentionSeq* seq = nullptr;
};

// Per-thread scratch for one item: the group's running state.
struct Scratch {
  explicit Scratch(int group, int head_dim)
      : max(group),
        sum(group),
        scores(static_cast<size_t>(group) * kChunk),
        acc(static_cast<size_t>(group) * head_dim) {}
  std::vector<float> max;     // [group] running max of the scaled scores
  std::vector<float> sum;     // [group] running sum of exp(score - max)
  std::vector<float> scores;  // [group][kChunk]
  std::vector<float> acc;     // [group][head_dim] running sum of weights * values
};

// Offset of (position, kv_head) in a cache pool, through the sequence's block table.
int64_t CacheOffset(const KvCacheLayout& c, const int32_t* block_table, int position, int kv_head) {
  const int64_t block = block_table[position / c.block_size];
  const int64_t slot = block * c.block_size + position % c.block_size;
  return (slot * c.num_kv_heads + kv_head) * c.head_dim;
}

// Eight cache elements at p as fp32 lanes, and the first n of them with zero lanes after
// (never touching p[n..7]), as simd::Load and simd::LoadPartial give for fp32.
F8 LoadLanes(const float* p) { return simd::Load(p); }
F8 LoadLanesPartial(const float* p, int n) { return simd::LoadPartial(p, n); }

F8 LoadLanes(const uint16_t* p) {
#ifdef CARPOOL_SIMD_AVX2
  return LoadBf16x8(p);
#else
  float wide[simd::kLanes];
  Bf16ToFloat(p, simd::kLanes, wide);
  return simd::Load(wide);
#endif
}
F8 LoadLanesPartial(const uint16_t* p, int n) {
  float wide[simd::kLanes];
  Bf16ToFloat(p, n, wide);
  return simd::LoadPartial(wide, n);
}

// simd::Dot(a, b, n) with b read through LoadLanes: the same operations in the same order.
template <typename T>
float DotCache(const float* a, const T* b, int n) {
  F8 acc = simd::Zero();
  int i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes) {
    acc = simd::Fma(simd::Load(a + i), LoadLanes(b + i), acc);
  }
  if (i < n) {
    const int rest = n - i;
    acc = simd::Fma(simd::LoadPartial(a + i, rest), LoadLanesPartial(b + i, rest), acc);
  }
  return simd::HSum(acc);
}

// acc[0..n) *= s.
void Scale(float* acc, float s, int n) {
  int i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes) {
    simd::Store(acc + i, simd::Mul(simd::Load(acc + i), simd::Set1(s)));
  }
  if (i < n) {
    simd::StorePartial(acc + i, simd::Mul(simd::LoadPartial(acc + i, n - i), simd::Set1(s)), n - i);
  }
}

// acc[0..n) += p * v[0..n).
template <typename T>
void AddScaled(float* acc, float p, const T* v, int n) {
  const F8 pv = simd::Set1(p);
  int i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes) {
    simd::Store(acc + i, simd::Fma(pv, LoadLanes(v + i), simd::Load(acc + i)));
  }
  if (i < n) {
    const int rest = n - i;
    simd::StorePartial(
        acc + i, simd::Fma(pv, LoadLanesPartial(v + i, rest), simd::LoadPartial(acc + i, rest)),
        rest);
  }
}

// s[0..n) = cap * tanh(s / cap).
void CapScores(float* s, float cap, int n) {
  const F8 c = simd::Set1(cap);
  const F8 inv = simd::Set1(1.0f / cap);
  for (int i = 0; i < n; i += simd::kLanes) {
    const int lanes = std::min(simd::kLanes, n - i);
    simd::StorePartial(
        s + i, simd::Mul(c, simd::Tanh(simd::Mul(simd::LoadPartial(s + i, lanes), inv))), lanes);
  }
}

// s[0..n) = exp(s - m); returns their sum, added in index order.
float ExpShifted(float* s, float m, int n) {
  for (int i = 0; i < n; i += simd::kLanes) {
    const int lanes = std::min(simd::kLanes, n - i);
    const F8 e = simd::Exp(simd::Sub(simd::LoadPartial(s + i, lanes), simd::Set1(m)));
    simd::StorePartial(s + i, e, lanes);
  }
  float total = 0.0f;
  for (int i = 0; i < n; ++i) total += s[i];
  return total;
}

// Attention of one query token for the query heads of one kv head. Writes
// out[row, h, :] for every h in the group.
template <typename T>
void AttendItem(const float* q, const T* key_cache, const T* value_cache,
                const AttentionParams& p, const QueryRow& query, int kv_head, Scratch* scratch,
                float* out) {
  const KvCacheLayout& c = p.cache;
  const int d = c.head_dim;
  const int group = p.num_heads / c.num_kv_heads;
  const int first_head = kv_head * group;
  const float* q_group = q + (query.row * p.num_heads + first_head) * d;
  std::fill(scratch->max.begin(), scratch->max.end(), -std::numeric_limits<float>::infinity());
  std::fill(scratch->sum.begin(), scratch->sum.end(), 0.0f);
  std::fill(scratch->acc.begin(), scratch->acc.end(), 0.0f);
  const int32_t* table = query.seq->block_table;
  const int num_positions = query.position + 1;
  // With a window the loop starts at the window's first key: the block-table entries before it
  // may be invalid (freed blocks).
  const int first = p.sliding_window > 0 ? std::max(0, query.position - p.sliding_window + 1) : 0;
  for (int start = first; start < num_positions; start += kChunk) {
    const int len = std::min(kChunk, num_positions - start);
    for (int i = 0; i < len; ++i) {
      const T* k = key_cache + CacheOffset(c, table, start + i, kv_head);
      for (int g = 0; g < group; ++g) {
        scratch->scores[g * kChunk + i] = DotCache(q_group + g * d, k, d) * p.scale;
      }
    }
    for (int g = 0; g < group; ++g) {
      float* s = &scratch->scores[g * kChunk];
      if (p.logit_softcap > 0.0f) CapScores(s, p.logit_softcap, len);
      const float old_max = scratch->max[g];
      const float new_max = std::max(old_max, *std::max_element(s, s + len));
      if (new_max > old_max && scratch->sum[g] > 0.0f) {
        const float rescale = std::exp(old_max - new_max);
        scratch->sum[g] *= rescale;
        Scale(&scratch->acc[g * d], rescale, d);
      }
      scratch->max[g] = new_max;
      scratch->sum[g] += ExpShifted(s, new_max, len);
    }
    for (int i = 0; i < len; ++i) {
      const T* v = value_cache + CacheOffset(c, table, start + i, kv_head);
      for (int g = 0; g < group; ++g) {
        AddScaled(&scratch->acc[g * d], scratch->scores[g * kChunk + i], v, d);
      }
    }
  }
  for (int g = 0; g < group; ++g) {
    float* o = out + (query.row * p.num_heads + first_head + g) * d;
    const float inv_sum = 1.0f / scratch->sum[g];
    for (int i = 0; i < d; ++i) o[i] = scratch->acc[g * d + i] * inv_sum;
  }
}

// Every query token of the batch, in row order of the sequences.
std::vector<QueryRow> ListQueryRows(const AttentionParams& p) {
  std::vector<QueryRow> rows;
  for (int s = 0; s < p.num_seqs; ++s) {
    const AttentionSeq& seq = p.seqs[s];
    for (int j = 0; j < seq.query_len; ++j) {
      rows.push_back(QueryRow{seq.query_start + j, seq.context_len - seq.query_len + j, &seq});
    }
  }
  return rows;
}

template <typename T>
void RunItems(const float* q, const T* key_cache, const T* value_cache,
              const AttentionParams& p, const std::vector<QueryRow>& rows, float* out,
              ThreadPool* pool) {
  const int kv_heads = p.cache.num_kv_heads;
  const int64_t items = static_cast<int64_t>(rows.size()) * kv_heads;
  ParallelFor(pool, items, [&](int64_t begin, int64_t end) {
    Scratch scratch(p.num_heads / kv_heads, p.cache.head_dim);
    for (int64_t item = begin; item < end; ++item) {
      AttendItem(q, key_cache, value_cache, p, rows[item / kv_heads],
                 static_cast<int>(item % kv_heads), &scratch, out);
    }
  });
}

// The decode fast path's rows: one per sequence, its last position.
std::vector<QueryRow> ListDecodeRows(const AttentionParams& p) {
  std::vector<QueryRow> rows(p.num_seqs);
  for (int s = 0; s < p.num_seqs; ++s) {
    const AttentionSeq& seq = p.seqs[s];
    rows[s] = QueryRow{seq.query_start, seq.context_len - 1, &seq};
  }
  return rows;
}

}  // namespace

void PagedAttention(const float* q, const float* key_cache, const float* value_cache,
                    const AttentionParams& params, float* out, ThreadPool* pool) {
  RunItems(q, key_cache, value_cache, params, ListQueryRows(params), out, pool);
}

void PagedAttentionDecode(const float* q, const float* key_cache, const float* value_cache,
                          const AttentionParams& params, float* out, ThreadPool* pool) {
  RunItems(q, key_cache, value_cache, params, ListDecodeRows(params), out, pool);
}

void PagedAttentionBf16(const float* q, const uint16_t* key_cache, const uint16_t* value_cache,
                        const AttentionParams& params, float* out, ThreadPool* pool) {
  RunItems(q, key_cache, value_cache, params, ListQueryRows(params), out, pool);
}

void PagedAttentionDecodeBf16(const float* q, const uint16_t* key_cache,
                              const uint16_t* value_cache, const AttentionParams& params,
                              float* out, ThreadPool* pool) {
  RunItems(q, key_cache, value_cache, params, ListDecodeRows(params), out, pool);
}

}  // namespace carpool::kernels::cpu
