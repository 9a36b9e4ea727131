// Paged attention over the block-table KV cache (see kernels/kernel_params.h).
//
// One work item is one (query token, kv head): it serves the kv head's whole GQA group of query
// heads, so each key and value row is loaded once per group. Positions are visited in chunks;
// per chunk the scores are computed, the running max and sum rescaled once (online softmax, all
// fp32), and the values accumulated. An item's result depends only on its own sequence, never
// on the rest of the batch or the thread split, and PagedAttentionDecode runs the very same
// item code, so a token's output is bit-identical whichever entry point and batch computed it.
//
// Every score is one fixed-order 8-lane dot product (simd::Dot's), and every output element
// one chain of fused multiply-adds over the positions in order; the loops below only interleave
// independent chains (four dot products at a time, up to eight vectors of an accumulator row
// held in registers across a chunk) so they overlap, which changes no bits.
//
// The item code is a template on the cache element type: fp32, or bf16 bits widened to fp32
// (kernels/cpu/bf16.h). Widening is exact and every operation after it is the same, so the
// bf16 kernels give exactly what the fp32 ones give on the widened values.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
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
  Scratch(int group, int head_dim, bool bf16_cache)
      : max(group),
        sum(group),
        scores(static_cast<size_t>(group) * kChunk),
        acc(static_cast<size_t>(group) * head_dim),
        wide(bf16_cache ? static_cast<size_t>(2) * kChunk * head_dim : 0) {}
  std::vector<float> max;     // [group] running max of the scaled scores
  std::vector<float> sum;     // [group] running sum of exp(score - max)
  std::vector<float> scores;  // [group][kChunk]
  std::vector<float> acc;     // [group][head_dim] running sum of weights * values
  std::vector<float> wide;    // [2][kChunk][head_dim] a bf16 chunk's keys and values, widened
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

// Asks for the n cache elements at p: a chunk's rows lie a cache page apart (the other kv heads'
// rows between them), a stride the hardware prefetcher does not follow.
template <typename T>
void Prefetch(const T* p, int n) {
  const char* bytes = reinterpret_cast<const char*>(p);
  const int64_t size = int64_t{n} * static_cast<int64_t>(sizeof(T));
  for (int64_t at = 0; at < size; at += 64) __builtin_prefetch(bytes + at);
}

// dots[r] = simd::Dot(a[r], b[r], n) for r < N, b read through LoadLanes: each the operations
// of simd::Dot in its order, the N chains interleaved.
template <int N, typename T>
void Dots(const float* const* a, const T* const* b, int n, float* dots) {
  F8 acc[N];
  for (int r = 0; r < N; ++r) acc[r] = simd::Zero();
  int i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes) {
    for (int r = 0; r < N; ++r) {
      acc[r] = simd::Fma(simd::Load(a[r] + i), LoadLanes(b[r] + i), acc[r]);
    }
  }
  if (i < n) {
    const int rest = n - i;
    for (int r = 0; r < N; ++r) {
      acc[r] = simd::Fma(simd::LoadPartial(a[r] + i, rest), LoadLanesPartial(b[r] + i, rest),
                         acc[r]);
    }
  }
  for (int r = 0; r < N; ++r) dots[r] = simd::HSum(acc[r]);
}

// scores[g * kChunk + i] = (q[g] . keys[i]) * scale for the group's query heads g (rows of d
// floats at q) and the chunk's keys i < len, four dot products at a time.
template <typename T>
void ScoreChunk(const float* q, const T* const* keys, int len, int group, int d, float scale,
                float* scores) {
  // Jobs (key i, head g) in order of i, then g.
  const int jobs = len * group;
  int i = 0;
  int g = 0;
  int job = 0;
  for (; job + 4 <= jobs; job += 4) {
    const float* a[4];
    const T* b[4];
    int at[4];
    for (int r = 0; r < 4; ++r) {
      a[r] = q + g * d;
      b[r] = keys[i];
      at[r] = g * kChunk + i;
      if (++g == group) {
        g = 0;
        ++i;
      }
    }
    float dots[4];
    Dots<4>(a, b, d, dots);
    for (int r = 0; r < 4; ++r) scores[at[r]] = dots[r] * scale;
  }
  for (; job < jobs; ++job) {
    const float* a = q + g * d;
    const T* b = keys[i];
    float dot;
    Dots<1>(&a, &b, d, &dot);
    scores[g * kChunk + i] = dot * scale;
    if (++g == group) {
      g = 0;
      ++i;
    }
  }
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

// acc[j, j + 8 N) += weights[i] * values[i][j, j + 8 N) for i = 0 .. len - 1 in turn, the N
// vectors of acc held in registers meanwhile.
template <int N, typename T>
void AccumulateVectors(float* acc, const float* weights, const T* const* values, int len, int j) {
  F8 sum[N];
  for (int r = 0; r < N; ++r) sum[r] = simd::Load(acc + j + r * simd::kLanes);
  for (int i = 0; i < len; ++i) {
    const F8 w = simd::Set1(weights[i]);
    for (int r = 0; r < N; ++r) {
      sum[r] = simd::Fma(w, LoadLanes(values[i] + j + r * simd::kLanes), sum[r]);
    }
  }
  for (int r = 0; r < N; ++r) simd::Store(acc + j + r * simd::kLanes, sum[r]);
}

// acc[0..n) += weights[i] * values[i][0..n) for i = 0 .. len - 1 in turn: one fused
// multiply-add per element and position, in order of position, whatever the tiling.
template <typename T>
void AccumulateChunk(float* acc, const float* weights, const T* const* values, int len, int n) {
  constexpr int kLanes = simd::kLanes;
  int j = 0;
  for (; j + 8 * kLanes <= n; j += 8 * kLanes) AccumulateVectors<8>(acc, weights, values, len, j);
  if (j + 4 * kLanes <= n) {
    AccumulateVectors<4>(acc, weights, values, len, j);
    j += 4 * kLanes;
  }
  if (j + 2 * kLanes <= n) {
    AccumulateVectors<2>(acc, weights, values, len, j);
    j += 2 * kLanes;
  }
  if (j + kLanes <= n) {
    AccumulateVectors<1>(acc, weights, values, len, j);
    j += kLanes;
  }
  if (j < n) {
    const int rest = n - j;
    F8 sum = simd::LoadPartial(acc + j, rest);
    for (int i = 0; i < len; ++i) {
      sum = simd::Fma(simd::Set1(weights[i]), LoadLanesPartial(values[i] + j, rest), sum);
    }
    simd::StorePartial(acc + j, sum, rest);
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

// One online-softmax step of an item: the chunk's len keys and values (rows of head_dim).
template <typename T>
void AttendChunk(const float* q_group, const T* const* keys, const T* const* values, int len,
                 const AttentionParams& p, Scratch* scratch) {
  const int d = p.cache.head_dim;
  const int group = p.num_heads / p.cache.num_kv_heads;
  ScoreChunk(q_group, keys, len, group, d, p.scale, scratch->scores.data());
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
  for (int g = 0; g < group; ++g) {
    AccumulateChunk(&scratch->acc[g * d], &scratch->scores[g * kChunk], values, len, d);
  }
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
    const T* keys[kChunk];
    const T* values[kChunk];
    for (int i = 0; i < len; ++i) {
      const int64_t offset = CacheOffset(c, table, start + i, kv_head);
      keys[i] = key_cache + offset;
      values[i] = value_cache + offset;
    }
    const int next_len = std::min(kChunk, num_positions - start - kChunk);
    for (int i = 0; i < next_len; ++i) {
      const int64_t offset = CacheOffset(c, table, start + kChunk + i, kv_head);
      Prefetch(key_cache + offset, d);
      Prefetch(value_cache + offset, d);
    }
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (group > 1) {
        // Every row serves the whole group: widen it once rather than once per query head.
        const float* wide_keys[kChunk];
        const float* wide_values[kChunk];
        for (int i = 0; i < len; ++i) {
          float* wide = &scratch->wide[static_cast<size_t>(2 * i) * d];
          Bf16ToFloat(keys[i], d, wide);
          Bf16ToFloat(values[i], d, wide + d);
          wide_keys[i] = wide;
          wide_values[i] = wide + d;
        }
        AttendChunk(q_group, wide_keys, wide_values, len, p, scratch);
        continue;
      }
    }
    AttendChunk(q_group, keys, values, len, p, scratch);
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
    Scratch scratch(p.num_heads / kv_heads, p.cache.head_dim, std::is_same_v<T, uint16_t>);
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
