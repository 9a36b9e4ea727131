// Linear: y = x · w^T (+ bias), batch-invariant by construction.
//
// Why not OpenBLAS: single-threaded OpenBLAS 0.3.21 sgemm (Haswell kernels) gives a row a
// different rounding when it falls in a full 4-row tile than in an edge tile, so the same
// prompt alone and inside a batch got different logits. Here every output element y[i][j] is
// computed by the same operations whatever M, N, the tile it falls in or the thread split:
//   1. L lane-wise accumulators along K: lane l = fma chain over k = l, l + L, l + 2L, ... in
//      increasing order, starting from +0, the tail lanes fed zeros;
//   2. a fixed reduction tree over the L lanes (Reduce16 below, or simd::HSum);
//   3. then + bias[j] when there is a bias.
// L = 16 with AVX-512 and 8 otherwise: the arithmetic differs between ISA paths, never within
// one binary. Everything else only moves data: register tiles (up to 6 rows x 4 columns with
// AVX-512, 4 x 3 otherwise) share loads, not arithmetic; Reduce16 reduces 16 accumulators at
// once, each by exactly the single-accumulator tree; copying operands to aligned, zero-padded
// scratch (packing) changes where the same values are read from, not what is done with them.
// linear_test.cc checks every path against this definition bit for bit.
//
// Loop structure, per thread (a contiguous range of output features, in fixed units):
//   - one row of x (decode): w is streamed once, in place, 16 output features at a time;
//   - small batches (x up to kSmallBatchBytes): x is packed once, then each 4-feature tile of
//     w is read once from memory (prefetched a tile ahead) against every block of rows;
//   - larger batches: w goes in L2-sized passes, packed; each pass against every block of x
//     rows, packed in turn (L1).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "common/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#include <immintrin.h>
#define CARPOOL_LINEAR_AVX512 1
#endif

namespace carpool::kernels::cpu {
namespace {

// Bytes of w a thread keeps hot (L2) while it sweeps over all rows of x.
constexpr int64_t kWeightPassBytes = 512 * 1024;
// Up to this many bytes of x, all of it stays packed in L2 while w streams past once
// (SmallBatchRange); larger batches take w in L2-sized passes instead.
constexpr int64_t kSmallBatchBytes = 256 * 1024;
// Below this many multiply-adds the pool's hand-off costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;
// Packed operands are laid out in steps of this many floats along K.
constexpr int64_t kStep = 16;

// Where a tile reads its operands. Element kk of x row i (i < the block's rows) is at
//   x + i * x_row + (kk / kStep) * x_step + kk % kStep,
// and element kk of output feature j0 + c, for a tile starting at column j0, is at
//   w + j0 * w_col + c * w_row + (kk / kStep) * w_step + kk % kStep.
// In place (row-major [rows, k]) that is x_row = w_col = w_row = k, x_step = w_step = kStep.
struct Operands {
  const float* x;
  int64_t x_row, x_step;
  const float* w;
  int64_t w_col, w_row, w_step;
  const float* bias;  // at the first column, or nullptr
  float* y;           // at the block's first row and the first column
  int64_t ldy;
  int64_t k;
  // Whether a tile prefetches the next tile's weights as it goes (worth it when they come
  // from memory rather than from a packed copy in L2).
  bool prefetch;
};

// A per-thread, 64-byte-aligned scratch buffer that grows on demand and is never shrunk.
class Scratch {
 public:
  float* Get(int64_t floats) {
    if (floats > size_) {
      const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
      data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      if (data_ == nullptr) throw std::bad_alloc();  // as std::vector would
      size_ = floats;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  int64_t size_ = 0;
};

// K rounded up to whole steps: the stride of packed rows.
int64_t PaddedK(int64_t k) { return (k + kStep - 1) / kStep * kStep; }

// Copies `rows` rows of k floats (contiguous at src) to dst in groups of `group` rows: group g
// starts at dst + g * group * ld (ld = PaddedK(k)), and holds step s of its row r at
// s * kStep * group + r * kStep. Padding (the K tail, the rows missing from the last group) is
// zero. group == 1 is plain row-major with stride ld.
void Pack(const float* src, int64_t rows, int64_t k, int group, float* dst) {
  const int64_t ld = PaddedK(k);
  const int64_t padded_rows = (rows + group - 1) / group * group;
  for (int64_t r = 0; r < padded_rows; ++r) {
    float* out = dst + (r / group) * group * ld + (r % group) * kStep;
    const int64_t have = r < rows ? k : 0;  // floats of this row to copy
    int64_t kk = 0;
    for (; kk + kStep <= have; kk += kStep) {
      std::memcpy(out + kk * group, src + r * k + kk, kStep * sizeof(float));
    }
    for (; kk < ld; kk += kStep) {
      const int64_t n = std::max<int64_t>(0, have - kk);
      if (n > 0) std::memcpy(out + kk * group, src + r * k + kk, n * sizeof(float));
      std::memset(out + kk * group + n, 0, (kStep - n) * sizeof(float));
    }
  }
}

#ifdef CARPOOL_LINEAR_AVX512

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which -Wuninitialized flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

constexpr int kMaxTileRows = 6;          // rows of x per register tile
constexpr int kTileCols = 4;             // output features per register tile
constexpr int kRowTileCols = 16;         // output features per tile when x has one row
constexpr int kWeightGroup = kTileCols;  // packed w interleaves one tile's rows
// Output features per unit of work handed to the pool, and the granularity of a weight pass.
constexpr int64_t kColsPerUnit = 16;
// Packed x interleaves the rows of a block.
int RowGroup(int rows) { return rows; }

inline __mmask16 PrefixMask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// Lane t of the result is the sum of the 16 lanes of a[t], always by the same tree:
//   s1[l] = v[l] + v[l+8] (l < 8); s2[l] = s1[l] + s1[l+4] (l < 4);
//   s3[l] = s2[l] + s2[l+2] (l < 2); sum = s3[0] + s3[1].
// Each level adds pairs of lanes of one input only, so lane t never depends on the others.
inline __m512 Reduce16(const __m512 (&a)[16]) {
  auto halves = [](__m512 p, __m512 q) {  // [p0..7 + p8..15, q0..7 + q8..15]
    return _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x44), _mm512_shuffle_f32x4(p, q, 0xEE));
  };
  auto quarters = [](__m512 p, __m512 q) {  // 128-bit blocks [p0+p1, p2+p3, q0+q1, q2+q3]
    return _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x88), _mm512_shuffle_f32x4(p, q, 0xDD));
  };
  auto pairs = [](__m512 p, __m512 q) {  // in each 128-bit block: [p0+p2, p1+p3, q0+q2, q1+q3]
    return _mm512_add_ps(_mm512_shuffle_ps(p, q, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(p, q, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  auto neighbours = [](__m512 p, __m512 q) {  // in each 128-bit block: [p0+p1, p2+p3, q0+q1, q2+q3]
    return _mm512_add_ps(_mm512_shuffle_ps(p, q, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(p, q, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  __m512 c[4];
  for (int r = 0; r < 4; ++r) {
    c[r] = quarters(halves(a[r], a[r + 4]), halves(a[r + 8], a[r + 12]));
  }
  return neighbours(pairs(c[0], c[1]), pairs(c[2], c[3]));
}

// One step along K: acc[i][j] = fma(x row i, w row j, acc[i][j]) lane-wise.
// Masked loads read only the first lanes and give zeros elsewhere.
// Also prefetches one line of each of the C rows at `ahead`, w_row apart, unless it is 0.
template <int R, int C, bool kMasked>
inline void Step(const float* x, int64_t x_row, const float* w, int64_t w_row, uintptr_t ahead,
                 __mmask16 mask, __m512 (&acc)[R][C]) {
  if (ahead != 0) {
    for (int j = 0; j < C; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + j * w_row * sizeof(float)), _MM_HINT_T0);
    }
  }
  // Loads go to registers once each (the empty asm stops GCC from folding a load into every
  // FMA that uses it, which would repeat it up to kMaxTileRows times).
  __m512 wv[C];
  for (int j = 0; j < C; ++j) {
    wv[j] = kMasked ? _mm512_maskz_loadu_ps(mask, w + j * w_row) : _mm512_loadu_ps(w + j * w_row);
    if (R > 1) asm("" : "+v"(wv[j]));
  }
  for (int i = 0; i < R; ++i) {
    __m512 xv =
        kMasked ? _mm512_maskz_loadu_ps(mask, x + i * x_row) : _mm512_loadu_ps(x + i * x_row);
    if (C > 1) asm("" : "+v"(xv));
    for (int j = 0; j < C; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
  }
}

// acc[i][j] = lane-wise dot products of x row i and w row j; w points at the tile's first
// output feature. With op.prefetch, the C rows `ahead` floats further on (the next tile's)
// are prefetched on the way.
template <int R, int C>
inline void Accumulate(const Operands& op, const float* w, int64_t ahead, __m512 (&acc)[R][C]) {
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const float* x = op.x;
  // Integer arithmetic: the prefetched rows may lie past the end of w.
  uintptr_t pf = op.prefetch ? reinterpret_cast<uintptr_t>(w) + ahead * sizeof(float) : 0;
  const uintptr_t pf_step = op.prefetch ? op.w_step * sizeof(float) : 0;
  int64_t kk = 0;
  for (; kk + kStep <= op.k; kk += kStep, x += op.x_step, w += op.w_step, pf += pf_step) {
    Step<R, C, false>(x, op.x_row, w, op.w_row, pf, 0, acc);
  }
  if (kk < op.k) Step<R, C, true>(x, op.x_row, w, op.w_row, pf, PrefixMask(op.k - kk), acc);
}

// Block r (0..3) of v as 128 bits; r is a constant once the callers' loops are unrolled.
inline __m128 Block(__m512 v, int r) {
  switch (r) {
    case 0:
      return _mm512_castps512_ps128(v);
    case 1:
      return _mm512_extractf32x4_ps(v, 1);
    case 2:
      return _mm512_extractf32x4_ps(v, 2);
    default:
      return _mm512_extractf32x4_ps(v, 3);
  }
}

// y[i][j0 + j] = dot(x row i, w row j0 + j) (+ bias) for i < R, j < C <= 4.
// Four rows at a time share one Reduce16: lane 4i + j holds element (i, j).
template <int R, int C>
void Tile(const Operands& op, int64_t j0) {
  static_assert(C <= kTileCols);
  __m512 acc[R][C];
  Accumulate<R, C>(op, op.w + j0 * op.w_col, kTileCols * op.w_col, acc);
  const __mmask8 cols = static_cast<__mmask8>((1u << C) - 1u);
  const __m512 b = op.bias != nullptr
                       ? _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(cols, op.bias + j0))
                       : _mm512_setzero_ps();
  for (int g = 0; g < R; g += 4) {
    __m512 in[16];
    for (__m512& v : in) v = _mm512_setzero_ps();
    for (int i = g; i < R && i < g + 4; ++i) {
      for (int j = 0; j < C; ++j) in[4 * (i - g) + j] = acc[i][j];
    }
    __m512 sums = Reduce16(in);
    if (op.bias != nullptr) sums = _mm512_add_ps(sums, b);
    for (int i = g; i < R && i < g + 4; ++i) {
      float* y = op.y + i * op.ldy + j0;
      if (C == kTileCols) {
        _mm_storeu_ps(y, Block(sums, i - g));
      } else {
        _mm_mask_storeu_ps(y, cols, Block(sums, i - g));
      }
    }
  }
}

// One row of x against output features j0 .. j0 + 15, over all of K, one Reduce16. Eight
// features at a time: fewer concurrent weight streams than sixteen, still enough FMA chains.
// REQUIRES: w in place (row-major).
void RowTile(const Operands& op, int64_t j0) {
  constexpr int kHalf = kRowTileCols / 2;
  __m512 in[16];
  for (int h = 0; h < 2; ++h) {
    __m512 acc[1][kHalf];
    Accumulate<1, kHalf>(op, op.w + (j0 + h * kHalf) * op.w_col, kHalf * op.w_col, acc);
    for (int j = 0; j < kHalf; ++j) in[h * kHalf + j] = acc[0][j];
  }
  __m512 sums = Reduce16(in);
  if (op.bias != nullptr) sums = _mm512_add_ps(sums, _mm512_loadu_ps(op.bias + j0));
  _mm512_storeu_ps(op.y + j0, sums);
}

// R rows of x against `cols` consecutive output features. A single row (w in place) goes 16
// features at a time, then like the others kTileCols at a time.
template <int R>
void RowBlock(const Operands& op, int64_t cols) {
  int64_t j = 0;
  if (R == 1) {
    for (; j + kRowTileCols <= cols; j += kRowTileCols) RowTile(op, j);
  }
  for (; j + kTileCols <= cols; j += kTileCols) Tile<R, kTileCols>(op, j);
  static_assert(kTileCols == 4, "the edge cases below assume 4-column tiles");
  switch (cols - j) {
    case 3:
      return Tile<R, 3>(op, j);
    case 2:
      return Tile<R, 2>(op, j);
    case 1:
      return Tile<R, 1>(op, j);
    default:
      return;
  }
}

// rows (1..kMaxTileRows) rows of x against `cols` output features.
void RowBlock(int rows, const Operands& op, int64_t cols) {
  static_assert(kMaxTileRows == 6, "the cases below assume up to 6-row tiles");
  switch (rows) {
    case 6:
      return RowBlock<6>(op, cols);
    case 5:
      return RowBlock<5>(op, cols);
    case 4:
      return RowBlock<4>(op, cols);
    case 3:
      return RowBlock<3>(op, cols);
    case 2:
      return RowBlock<2>(op, cols);
    default:
      return RowBlock<1>(op, cols);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#else  // 8 lanes (AVX2 or the portable simd.h fallback); packed operands stay row-major

using simd::F8;

constexpr int kMaxTileRows = 4;  // rows of x per register tile
constexpr int kTileCols = 3;     // output features per register tile
constexpr int kWeightGroup = 1;
constexpr int64_t kColsPerUnit = 48;  // a multiple of kTileCols
int RowGroup(int /*rows*/) { return 1; }

// y[i][j0 + j] = dot(x row i, w row j0 + j) (+ bias) for i < R, j < C.
// REQUIRES: x_step == w_step == kStep (rows are contiguous).
template <int R, int C>
void Tile(const Operands& op, int64_t j0) {
  const float* x = op.x;
  const float* w = op.w + j0 * op.w_col;
  const int64_t k = op.k;
  F8 acc[R][C];
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) acc[i][j] = simd::Zero();
  }
  int64_t kk = 0;
  for (; kk + simd::kLanes <= k; kk += simd::kLanes) {
    F8 wv[C];
    for (int j = 0; j < C; ++j) wv[j] = simd::Load(w + j * op.w_row + kk);
    for (int i = 0; i < R; ++i) {
      const F8 xv = simd::Load(x + i * op.x_row + kk);
      for (int j = 0; j < C; ++j) acc[i][j] = simd::Fma(xv, wv[j], acc[i][j]);
    }
  }
  if (kk < k) {
    const int rest = static_cast<int>(k - kk);
    F8 wv[C];
    for (int j = 0; j < C; ++j) wv[j] = simd::LoadPartial(w + j * op.w_row + kk, rest);
    for (int i = 0; i < R; ++i) {
      const F8 xv = simd::LoadPartial(x + i * op.x_row + kk, rest);
      for (int j = 0; j < C; ++j) acc[i][j] = simd::Fma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) {
      const float dot = simd::HSum(acc[i][j]);
      op.y[i * op.ldy + j0 + j] = op.bias != nullptr ? dot + op.bias[j0 + j] : dot;
    }
  }
}

// R rows of x against `cols` consecutive output features, kTileCols at a time.
template <int R>
void RowBlock(const Operands& op, int64_t cols) {
  int64_t j = 0;
  for (; j + kTileCols <= cols; j += kTileCols) Tile<R, kTileCols>(op, j);
  static_assert(kTileCols == 3, "the edge cases below assume 3-column tiles");
  if (cols - j == 2) Tile<R, 2>(op, j);
  if (cols - j == 1) Tile<R, 1>(op, j);
}

// rows (1..kMaxTileRows) rows of x against `cols` output features.
void RowBlock(int rows, const Operands& op, int64_t cols) {
  static_assert(kMaxTileRows == 4, "the cases below assume up to 4-row tiles");
  switch (rows) {
    case 4:
      return RowBlock<4>(op, cols);
    case 3:
      return RowBlock<3>(op, cols);
    case 2:
      return RowBlock<2>(op, cols);
    default:
      return RowBlock<1>(op, cols);
  }
}

#endif  // CARPOOL_LINEAR_AVX512

// Output features whose weights fit in kWeightPassBytes; a positive multiple of kColsPerUnit.
int64_t WeightPassCols(int64_t k) {
  const int64_t row_bytes = std::max<int64_t>(PaddedK(k), 1) * sizeof(float);
  return std::max<int64_t>(1, kWeightPassBytes / row_bytes / kColsPerUnit) * kColsPerUnit;
}

// Calls fn(i, rows) for blocks of consecutive rows covering [0, m) in order, each of at most
// kMaxTileRows rows and as even as possible (block sizes change speed, never results).
template <typename Fn>
void ForEachBlock(int64_t m, Fn&& fn) {
  const int64_t blocks = (m + kMaxTileRows - 1) / kMaxTileRows;
  int64_t i = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int rows = static_cast<int>(m / blocks + (b < m % blocks ? 1 : 0));
    fn(i, rows);
    i += rows;
  }
}

// Operands with x and w in place, for output features from j0 on; y at row 0.
Operands InPlace(const float* x, const float* w, const float* bias, float* y, int64_t n, int64_t k,
                 int64_t j0) {
  return Operands{.x = x,
                  .x_row = k,
                  .x_step = kStep,
                  .w = w + j0 * k,
                  .w_col = k,
                  .w_row = k,
                  .w_step = kStep,
                  .bias = bias != nullptr ? bias + j0 : nullptr,
                  .y = y + j0,
                  .ldy = n,
                  .k = k,
                  .prefetch = false};
}

// Points op at a block of `rows` rows packed by Pack(..., RowGroup(rows), xbuf).
void UsePackedRows(const float* xbuf, int rows, Operands* op) {
  const int group = RowGroup(rows);
  op->x = xbuf;
  op->x_row = group == 1 ? PaddedK(op->k) : kStep;
  op->x_step = kStep * group;
}

// Points op at weights packed by Pack(..., kWeightGroup, wbuf).
void UsePackedWeights(const float* wbuf, Operands* op) {
  op->w = wbuf;
  op->w_col = PaddedK(op->k);
  op->w_row = kWeightGroup == 1 ? PaddedK(op->k) : kStep;
  op->w_step = kStep * kWeightGroup;
}

// Small batches: all of x packed once, then each tile of output features against every block
// of rows in turn, so each weight row is read from memory once (prefetched a tile ahead) and
// reused from L1.
void SmallBatchRange(const float* x, const float* w, const float* bias, float* y, int64_t m,
                     int64_t n, int64_t k, int64_t col_begin, int64_t col_end, float* xbuf) {
  const int64_t ld = PaddedK(k);
  ForEachBlock(
      m, [&](int64_t i, int rows) { Pack(x + i * k, rows, k, RowGroup(rows), xbuf + i * ld); });
  for (int64_t j = col_begin; j < col_end; j += kTileCols) {
    const int64_t cols = std::min<int64_t>(kTileCols, col_end - j);
    ForEachBlock(m, [&](int64_t i, int rows) {
      Operands op = InPlace(x, w, bias, y + i * n, n, k, j);
      UsePackedRows(xbuf + i * ld, rows, &op);
      op.prefetch = true;
      RowBlock(rows, op, cols);
    });
  }
}

// Larger batches: w in passes of L2-sized packed copies, each against every block of x rows,
// each block packed in turn (it stays in L1 while the pass's tiles sweep over it).
void LargeBatchRange(const float* x, const float* w, const float* bias, float* y, int64_t m,
                     int64_t n, int64_t k, int64_t col_begin, int64_t col_end, float* wbuf,
                     float* xbuf) {
  const int64_t pass_cols = WeightPassCols(k);
  for (int64_t c0 = col_begin; c0 < col_end; c0 += pass_cols) {
    const int64_t cols = std::min(pass_cols, col_end - c0);
    Pack(w + c0 * k, cols, k, kWeightGroup, wbuf);
    ForEachBlock(m, [&](int64_t i, int rows) {
      Pack(x + i * k, rows, k, RowGroup(rows), xbuf);
      Operands op = InPlace(x, w, bias, y + i * n, n, k, c0);
      UsePackedRows(xbuf, rows, &op);
      UsePackedWeights(wbuf, &op);
      RowBlock(rows, op, cols);
    });
  }
}

// All m rows of y for output features [col_begin, col_end). A single row (decode) reads x and w
// in place; more rows are packed into per-thread scratch first.
void ColumnRange(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
                 int64_t k, int64_t col_begin, int64_t col_end) {
  if (m == 1) {
    return RowBlock(1, InPlace(x, w, bias, y, n, k, col_begin), col_end - col_begin);
  }
  thread_local Scratch weight_scratch;
  thread_local Scratch row_scratch;
  const int64_t ld = PaddedK(k);
  if (m * ld * static_cast<int64_t>(sizeof(float)) <= kSmallBatchBytes) {
    return SmallBatchRange(x, w, bias, y, m, n, k, col_begin, col_end, row_scratch.Get(m * ld));
  }
  const int64_t pass_groups = (WeightPassCols(k) + kWeightGroup - 1) / kWeightGroup;
  LargeBatchRange(x, w, bias, y, m, n, k, col_begin, col_end,
                  weight_scratch.Get(pass_groups * kWeightGroup * ld),
                  row_scratch.Get(kMaxTileRows * ld));
}

}  // namespace

void Linear(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k, ThreadPool* pool) {
  if (m <= 0 || n <= 0) return;
  const int64_t units = (n + kColsPerUnit - 1) / kColsPerUnit;
  auto run = [&](int64_t unit_begin, int64_t unit_end) {
    ColumnRange(x, w, bias, y, m, n, k, unit_begin * kColsPerUnit,
                std::min(n, unit_end * kColsPerUnit));
  };
  if (m * n * k < kMinParallelMacs) {
    run(0, units);
  } else {
    ParallelFor(pool, units, run);
  }
}

}  // namespace carpool::kernels::cpu
