// LinearBf16: y = x · w^T (+ bias) with bf16 weights, batch-invariant by construction.
//
// The arithmetic of each element is defined in linear_bf16.h; here is how it is kept the same
// whatever M, N, the tile or the thread. The avx2 path mirrors Linear (linear.cc): every
// element is one chain of 8-lane FMAs along K, then one fixed reduction, then the bias. What
// changes is how weights reach the FMAs. A 256-bit load of 16 bf16 weights holds, in each
// 32-bit lane, the pair k = 2l (low half) and 2l + 1 (high half); shifting the lanes left by
// 16 gives the even elements as fp32, masking off the low halves gives the odd ones, exactly.
// Two cheap integer operations per 16 weights, and no shuffle; the activations are packed once
// into the matching order (per block of 16: the 8 even elements, then the 8 odd ones), and
// each lane's FMAs take the even element then the odd one. vdpbf16ps pairs the elements of a
// lane the same way, so the avx512_bf16 path has the same shape with 16 lanes.
//
// Loop structure, per thread (a contiguous range of output features, in fixed units), as in
// linear.cc:
//   - one row of x (decode): w is streamed once, in place, 8 output features at a time, widened
//     in registers;
//   - two rows, or up to 8 rows when K is large: x is packed once; each 4-feature tile of w is
//     read from memory once and widened in registers for each pair of rows (from L1);
//   - other small batches (x up to kSmallBatchBytes): x is packed once; each 3-feature tile of
//     w is widened to fp32 scratch (L1) once, then used by every block of rows;
//   - larger batches: w is widened in L2-sized passes, each pass used by every block of x
//     rows, packed in turn (L1).
// Widening and packing only move values, so every path runs the same operations on the same
// values; linear_bf16_test.cc checks each element against the definition bit for bit.

#include "kernels/cpu/linear_bf16.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CARPOOL_LINEAR_BF16_AVX512 1
#endif

namespace carpool::kernels::cpu {
namespace {

using simd::F8;

// Elements of K per block: one 256-bit load of bf16 weights (avx2 path).
constexpr int64_t kBlock = 16;
// Bytes of widened w a thread keeps hot (L2) while it sweeps over all rows of x.
constexpr int64_t kWeightPassBytes = 512 * 1024;
// Up to this many bytes of packed x, all of it stays in L2 while w streams past once.
constexpr int64_t kSmallBatchBytes = 256 * 1024;
// Below this many multiply-adds the pool's hand-off costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;
constexpr int kMaxTileRows = 4;   // rows of x per register tile
constexpr int kTileCols = 3;      // output features per register tile (batches)
constexpr int kRowTileCols = 8;   // output features per tile when x has one row
constexpr int kPairTileCols = 4;  // output features per tile of two rows widened in registers
// Batches of up to this many rows widen w in registers, two rows at a time, when a tile of w
// widened to fp32 would take more than kWidenedTileBytes of L1 (and always at two rows): then
// re-widening is cheaper than reading the widened copy back from L2.
constexpr int64_t kMaxRegisterRows = 8;
constexpr int64_t kWidenedTileBytes = 16 * 1024;
// Output features per unit of work handed to the pool, and the granularity of a weight pass:
// a multiple of every tile width of both paths.
constexpr int64_t kColsPerUnit = 48;

// A per-thread, 64-byte-aligned scratch buffer that grows on demand and is never shrunk.
template <typename T>
class Scratch {
 public:
  T* Get(int64_t count) {
    if (count > size_) {
      const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
      data_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
      if (data_ == nullptr) throw std::bad_alloc();  // as std::vector would
      size_ = count;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t size_ = 0;
};

// K rounded up to whole blocks: the stride of packed x rows and widened w rows.
int64_t PaddedK(int64_t k) { return (k + kBlock - 1) / kBlock * kBlock; }

// The 16 bf16 values at p widened to fp32: even = elements 0, 2, .., 14, odd = 1, 3, .., 15.
inline void WidenBlock(const uint16_t* p, F8* even, F8* odd) {
#ifdef CARPOOL_SIMD_AVX2
  const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
  *odd = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(~0xffff)));
#else
  for (int l = 0; l < simd::kLanes; ++l) {
    even->v[l] = Bf16ToFloat(p[2 * l]);
    odd->v[l] = Bf16ToFloat(p[2 * l + 1]);
  }
#endif
}

// The last n (< kBlock) values of a row, as WidenBlock with zeros past them.
inline void WidenTail(const uint16_t* p, int64_t n, F8* even, F8* odd) {
  uint16_t block[kBlock] = {};
  std::memcpy(block, p, n * sizeof(uint16_t));
  WidenBlock(block, even, odd);
}

// x [rows, k] into dst [rows, PaddedK(k)]: per block of 16, the even elements, then the odd
// ones; zeros past k.
void PackRows(const float* x, int64_t rows, int64_t k, float* dst) {
  const int64_t ld = PaddedK(k);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * k;
    float* out = dst + r * ld;
    int64_t kk = 0;
#ifdef CARPOOL_SIMD_AVX2
    for (; kk + kBlock <= k; kk += kBlock) {
      const __m256 a = _mm256_loadu_ps(src + kk);
      const __m256 b = _mm256_loadu_ps(src + kk + 8);
      // Per 128-bit half: [a0 a2 b0 b2 | a4 a6 b4 b6]; then the 64-bit pieces in order 0 2 1 3.
      const __m256 even = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
      const __m256 odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
      constexpr int kOrder = _MM_SHUFFLE(3, 1, 2, 0);
      _mm256_storeu_ps(out + kk,
                       _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), kOrder)));
      _mm256_storeu_ps(out + kk + 8,
                       _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), kOrder)));
    }
#endif
    for (; kk < ld; ++kk) {
      const int64_t block = kk / kBlock * kBlock;
      const int64_t pos = kk - block;  // 0..7: even element pos; 8..15: odd element pos - 8
      const int64_t from = block + (pos < 8 ? 2 * pos : 2 * (pos - 8) + 1);
      out[kk] = from < k ? src[from] : 0.0f;
    }
  }
}

// w [rows, k] (bf16) widened into dst [rows, PaddedK(k)] in the packed order of PackRows.
void WidenRows(const uint16_t* w, int64_t rows, int64_t k, float* dst) {
  const int64_t ld = PaddedK(k);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* src = w + r * k;
    float* out = dst + r * ld;
    F8 even, odd;
    int64_t kk = 0;
    for (; kk + kBlock <= k; kk += kBlock) {
      WidenBlock(src + kk, &even, &odd);
      simd::Store(out + kk, even);
      simd::Store(out + kk + 8, odd);
    }
    if (kk < k) {
      WidenTail(src + kk, k - kk, &even, &odd);
      simd::Store(out + kk, even);
      simd::Store(out + kk + 8, odd);
    }
  }
}

// Loads go to registers once each when `uses` > 1 FMAs read them: the empty asm stops GCC from
// folding the load into every FMA that uses it, which made a 4 x 3 tile bound by loads (16 per
// 12 FMAs instead of 7).
inline void KeepInRegister(int uses, F8* v) {
#ifdef CARPOOL_SIMD_AVX2
  if (uses > 1) asm("" : "+x"(*v));
#else
  (void)uses;
  (void)v;
#endif
}

// y[i * ldy + j] = dot(x row i, w row j) (+ bias[j]) for i < R, j < C, over packed x and
// widened w rows, both of stride ld (a multiple of kBlock).
template <int R, int C>
void Tile(const float* x, const float* w, int64_t ld, const float* bias, float* y, int64_t ldy) {
  F8 acc[R][C];
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) acc[i][j] = simd::Zero();
  }
  for (int64_t kk = 0; kk < ld; kk += simd::kLanes) {
    F8 wv[C];
    for (int j = 0; j < C; ++j) {
      wv[j] = simd::Load(w + j * ld + kk);
      KeepInRegister(R, &wv[j]);
    }
    for (int i = 0; i < R; ++i) {
      F8 xv = simd::Load(x + i * ld + kk);
      KeepInRegister(C, &xv);
      for (int j = 0; j < C; ++j) acc[i][j] = simd::Fma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) {
      const float dot = simd::HSum(acc[i][j]);
      y[i * ldy + j] = bias != nullptr ? dot + bias[j] : dot;
    }
  }
}

// R rows of packed x against `cols` widened weight rows, kTileCols at a time.
template <int R>
void RowBlock(const float* x, const float* w, int64_t ld, const float* bias, float* y, int64_t ldy,
              int64_t cols) {
  int64_t j = 0;
  for (; j + kTileCols <= cols; j += kTileCols) {
    Tile<R, kTileCols>(x, w + j * ld, ld, bias ? bias + j : nullptr, y + j, ldy);
  }
  static_assert(kTileCols == 3, "the edge cases below assume 3-column tiles");
  if (cols - j == 2) Tile<R, 2>(x, w + j * ld, ld, bias ? bias + j : nullptr, y + j, ldy);
  if (cols - j == 1) Tile<R, 1>(x, w + j * ld, ld, bias ? bias + j : nullptr, y + j, ldy);
}

void RowBlock(int rows, const float* x, const float* w, int64_t ld, const float* bias, float* y,
              int64_t ldy, int64_t cols) {
  static_assert(kMaxTileRows == 4, "the cases below assume up to 4-row tiles");
  switch (rows) {
    case 4:
      return RowBlock<4>(x, w, ld, bias, y, ldy, cols);
    case 3:
      return RowBlock<3>(x, w, ld, bias, y, ldy, cols);
    case 2:
      return RowBlock<2>(x, w, ld, bias, y, ldy, cols);
    default:
      return RowBlock<1>(x, w, ld, bias, y, ldy, cols);
  }
}

// acc[i][j] += the products of block kk of packed x row i (stride ld) and of w row j (in place,
// stride k), widened in registers: the even elements, then the odd ones, as Tile does.
template <int R, int C, bool kTail>
inline void RegStep(const float* x, int64_t ld, const uint16_t* w, int64_t k, int64_t kk,
                    F8 (&acc)[R][C]) {
  F8 x_even[R], x_odd[R];
  for (int i = 0; i < R; ++i) {
    x_even[i] = simd::Load(x + i * ld + kk);
    x_odd[i] = simd::Load(x + i * ld + kk + 8);
  }
  for (int j = 0; j < C; ++j) {
    F8 even, odd;
    if constexpr (kTail) {
      WidenTail(w + j * k + kk, k - kk, &even, &odd);
    } else {
      WidenBlock(w + j * k + kk, &even, &odd);
    }
    for (int i = 0; i < R; ++i) {
      acc[i][j] = simd::Fma(x_even[i], even, acc[i][j]);
      acc[i][j] = simd::Fma(x_odd[i], odd, acc[i][j]);
    }
  }
}

// R packed rows of x against C consecutive rows of w in place, widened in registers: the same
// operations as Tile<R, C> on widened rows.
template <int R, int C>
void RegTile(const float* x, int64_t ld, const uint16_t* w, int64_t k, const float* bias, float* y,
             int64_t ldy) {
  F8 acc[R][C];
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) acc[i][j] = simd::Zero();
  }
  int64_t kk = 0;
  for (; kk + kBlock <= k; kk += kBlock) RegStep<R, C, false>(x, ld, w, k, kk, acc);
  if (kk < k) RegStep<R, C, true>(x, ld, w, k, kk, acc);
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) {
      const float dot = simd::HSum(acc[i][j]);
      y[i * ldy + j] = bias != nullptr ? dot + bias[j] : dot;
    }
  }
}

// R packed rows of x against `cols` rows of w in place, CMax at a time.
template <int R, int CMax>
void RegRowBlock(const float* x, int64_t ld, const uint16_t* w, int64_t k, const float* bias,
                 float* y, int64_t ldy, int64_t cols) {
  int64_t j = 0;
  for (; j + CMax <= cols; j += CMax) {
    RegTile<R, CMax>(x, ld, w + j * k, k, bias ? bias + j : nullptr, y + j, ldy);
  }
  const uint16_t* wj = w + j * k;
  const float* bj = bias ? bias + j : nullptr;
  static_assert(CMax <= 8, "the edge cases below assume at most 8-column tiles");
  switch (cols - j) {
    case 7:
      if constexpr (CMax > 7) return RegTile<R, 7>(x, ld, wj, k, bj, y + j, ldy);
      return;
    case 6:
      if constexpr (CMax > 6) return RegTile<R, 6>(x, ld, wj, k, bj, y + j, ldy);
      return;
    case 5:
      if constexpr (CMax > 5) return RegTile<R, 5>(x, ld, wj, k, bj, y + j, ldy);
      return;
    case 4:
      if constexpr (CMax > 4) return RegTile<R, 4>(x, ld, wj, k, bj, y + j, ldy);
      return;
    case 3:
      return RegTile<R, 3>(x, ld, wj, k, bj, y + j, ldy);
    case 2:
      return RegTile<R, 2>(x, ld, wj, k, bj, y + j, ldy);
    case 1:
      return RegTile<R, 1>(x, ld, wj, k, bj, y + j, ldy);
    default:
      return;
  }
}

// Output features whose widened weights fit in kWeightPassBytes; a positive multiple of
// kColsPerUnit.
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

// All m rows of y for output features [col_begin, col_end), avx2 path.
void ColumnRange(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m,
                 int64_t n, int64_t k, int64_t col_begin, int64_t col_end) {
  thread_local Scratch<float> weight_scratch;
  thread_local Scratch<float> row_scratch;
  const int64_t ld = PaddedK(k);
  const float* b = bias != nullptr ? bias + col_begin : nullptr;
  if (m == 1) {
    float* xbuf = row_scratch.Get(ld);
    PackRows(x, 1, k, xbuf);
    return RegRowBlock<1, kRowTileCols>(xbuf, ld, w + col_begin * k, k, b, y + col_begin, n,
                                        col_end - col_begin);
  }
  if (m == 2 || (m <= kMaxRegisterRows &&
                 kTileCols * ld * static_cast<int64_t>(sizeof(float)) > kWidenedTileBytes)) {
    float* xbuf = row_scratch.Get(m * ld);
    PackRows(x, m, k, xbuf);
    for (int64_t j = col_begin; j < col_end; j += kPairTileCols) {
      const int64_t cols = std::min<int64_t>(kPairTileCols, col_end - j);
      const float* bj = bias != nullptr ? bias + j : nullptr;
      for (int64_t i = 0; i < m; i += 2) {
        if (i + 1 < m) {
          RegRowBlock<2, kPairTileCols>(xbuf + i * ld, ld, w + j * k, k, bj, y + i * n + j, n,
                                        cols);
        } else {
          RegRowBlock<1, kPairTileCols>(xbuf + i * ld, ld, w + j * k, k, bj, y + i * n + j, n,
                                        cols);
        }
      }
    }
    return;
  }
  if (m * ld * static_cast<int64_t>(sizeof(float)) <= kSmallBatchBytes) {
    float* xbuf = row_scratch.Get(m * ld);
    float* wbuf = weight_scratch.Get(kTileCols * ld);
    PackRows(x, m, k, xbuf);
    for (int64_t j = col_begin; j < col_end; j += kTileCols) {
      const int64_t cols = std::min<int64_t>(kTileCols, col_end - j);
      WidenRows(w + j * k, cols, k, wbuf);
      ForEachBlock(m, [&](int64_t i, int rows) {
        RowBlock(rows, xbuf + i * ld, wbuf, ld, bias ? bias + j : nullptr, y + i * n + j, n, cols);
      });
    }
    return;
  }
  const int64_t pass_cols = WeightPassCols(k);
  float* wbuf = weight_scratch.Get(pass_cols * ld);
  float* xbuf = row_scratch.Get(kMaxTileRows * ld);
  for (int64_t c0 = col_begin; c0 < col_end; c0 += pass_cols) {
    const int64_t cols = std::min(pass_cols, col_end - c0);
    WidenRows(w + c0 * k, cols, k, wbuf);
    ForEachBlock(m, [&](int64_t i, int rows) {
      PackRows(x + i * k, rows, k, xbuf);
      RowBlock(rows, xbuf, wbuf, ld, bias ? bias + c0 : nullptr, y + i * n + c0, n, cols);
    });
  }
}

#ifdef CARPOOL_LINEAR_BF16_AVX512

// The avx512_bf16 path: compiled for CPUs with AVX512-BF16 whatever -march says, chosen at run
// time (first run and measured on an Intel Xeon with AVX512-BF16 on 2026-12-02; the tests then
// check it batch-invariant bit for bit and within the reference's bounds). w is read in place
// and x rounded to bf16 once per call; one row of x streams w once, 8 features at a time;
// more rows go in 4 x 4 tiles over L2-sized passes of w.
#define CARPOOL_AVX512_BF16 __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")))

// GCC 12's AVX-512 intrinsics start from _mm*_undefined_*(), which -Wuninitialized flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Elements of K per vdpbf16ps: 16 lanes of pairs.
constexpr int64_t kBlock512 = 32;
constexpr int kTileCols512 = 4;

int64_t PaddedK512(int64_t k) { return (k + kBlock512 - 1) / kBlock512 * kBlock512; }

// The avx2 path's eight-lane sum, ((0+4)+(2+6)) + ((1+5)+(3+7)), of lanes l + (l + 8).
CARPOOL_AVX512_BF16 inline float Sum16(__m512 v) {
  __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

bool HasAvx512Bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

// x [m, k] rounded to bf16 (nearest even) into dst [m, PaddedK512(k)], zeros past k.
CARPOOL_AVX512_BF16 void PackRowsBf16(const float* x, int64_t m, int64_t k, uint16_t* dst) {
  const int64_t ld = PaddedK512(k);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t kk = 0; kk < ld; kk += kBlock512) {
      const int64_t have = std::clamp<int64_t>(k - kk, 0, kBlock512);
      const __mmask16 lo_mask = static_cast<__mmask16>((1u << std::min<int64_t>(have, 16)) - 1);
      const __mmask16 hi_mask = static_cast<__mmask16>((1u << std::max<int64_t>(have - 16, 0)) - 1);
      const __m512 lo = _mm512_maskz_loadu_ps(lo_mask, x + r * k + kk);
      const __m512 hi = _mm512_maskz_loadu_ps(hi_mask, x + r * k + kk + 16);
      _mm512_storeu_si512(dst + r * ld + kk, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

// y[i * ldy + j] = Sum16(acc[i][j]) (+ bias[j]) for a 4 x 4 tile, the sixteen sums computed
// together: each level of Sum16's tree (lanes l + (l + 8), then l + (l + 4), l + (l + 2),
// l + (l + 1)) is one add of two vectors that hold that level's operands for several
// accumulators side by side, so the same additions of the same values give the same sums, in
// 15 adds and 30 shuffles instead of 16 times 8 dependent operations. The last vector holds,
// in its 128-bit quarter i, row i's four sums in column order.
CARPOOL_AVX512_BF16 inline void Store4x4(const __m512 (&acc)[4][4], const float* bias, float* y,
                                         int64_t ldy) {
  // a[4 * j + i] = acc[i][j]; level 1: s[p] holds a[2p]'s lanes l + (l + 8) in its low half and
  // a[2p + 1]'s in its high half.
  __m512 s[8];
  for (int p = 0; p < 8; ++p) {
    const __m512 a = acc[(2 * p) % 4][(2 * p) / 4];
    const __m512 b = acc[(2 * p + 1) % 4][(2 * p + 1) / 4];
    s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  }
  // Level 2: u[q] holds, in quarter r, a[4q + r]'s lanes l + (l + 4).
  __m512 u[4];
  for (int q = 0; q < 4; ++q) {
    const __m512 a = s[2 * q];
    const __m512 b = s[2 * q + 1];
    u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
  }
  // Level 3: w[h] holds, in quarter r, a[8h + r]'s lanes l + (l + 2) and then a[8h + 4 + r]'s.
  __m512 w[2];
  for (int h = 0; h < 2; ++h) {
    const __m512 a = u[2 * h];
    const __m512 b = u[2 * h + 1];
    w[h] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Level 4: lane 4r + c holds a[4c + r] = acc[r][c].
  __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  if (bias != nullptr) sums = _mm512_add_ps(sums, _mm512_broadcast_f32x4(_mm_loadu_ps(bias)));
  _mm_storeu_ps(y, _mm512_castps512_ps128(sums));
  _mm_storeu_ps(y + ldy, _mm512_extractf32x4_ps(sums, 1));
  _mm_storeu_ps(y + 2 * ldy, _mm512_extractf32x4_ps(sums, 2));
  _mm_storeu_ps(y + 3 * ldy, _mm512_extractf32x4_ps(sums, 3));
}

// acc[i][j] = vdpbf16ps(acc[i][j], block kk of x row i, block kk of w row j), the w block
// loaded with `mask` (zeros past K) when kMasked.
template <int R, int C, bool kMasked>
CARPOOL_AVX512_BF16 inline void Step512(const uint16_t* x, int64_t ldx, const uint16_t* w,
                                        int64_t k, int64_t kk, __mmask32 mask,
                                        __m512 (&acc)[R][C]) {
  __m512bh wv[C];
  for (int j = 0; j < C; ++j) {
    if constexpr (kMasked) {
      wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + j * k + kk);
    } else {
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * k + kk);
    }
  }
  for (int i = 0; i < R; ++i) {
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i * ldx + kk);
    for (int j = 0; j < C; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
  }
}

// y[i * ldy + j] = dot(x row i, w row j) (+ bias[j]) for i < R, j < C; x rounded to bf16 pairs
// (stride ldx), w in place (row-major, stride k). The whole blocks of K, then the last one
// masked: the same operations on the same values as one masked loop, but without a mask on
// the hot loop GCC keeps the accumulators in registers (with it, it stored all of them to the
// stack on every block, which made the tile bound by stores).
template <int R, int C>
CARPOOL_AVX512_BF16 void Tile512(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k,
                                 const float* bias, float* y, int64_t ldy) {
  __m512 acc[R][C];
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  int64_t kk = 0;
  // The tile's C rows of w are one contiguous run of C * k weights, and so are the next
  // tiles'; each block prefetches (into L2) C lines of the run two tiles ahead, so those lines
  // are in flight while this tile's dot products run. On an AMD EPYC (Zen 4) the hardware
  // prefetcher alone, facing C short row streams, read 23 GB/s on two cores for one row of x
  // where fp32 (rows twice as long) read 33; with this, 36 GB/s (issue 17; into L1 instead, or
  // one or three tiles ahead, was slower). Where the run is in L2 already (the later blocks of
  // rows of a weight pass), the prefetches cost a load slot each and find it there.
  const char* ahead = reinterpret_cast<const char*>(w + 2 * C * k);
  for (; kk + kBlock512 <= k; kk += kBlock512) {
    for (int j = 0; j < C; ++j) _mm_prefetch(ahead + (kk / kBlock512 * C + j) * 64, _MM_HINT_T1);
    Step512<R, C, false>(x, ldx, w, k, kk, 0, acc);
  }
  if (kk < k) {
    const auto mask = static_cast<__mmask32>((uint64_t{1} << (k - kk)) - 1);
    Step512<R, C, true>(x, ldx, w, k, kk, mask, acc);
  }
  if constexpr (R == 4 && C == 4) {
    return Store4x4(acc, bias, y, ldy);
  } else {
    for (int i = 0; i < R; ++i) {
      for (int j = 0; j < C; ++j) {
        const float dot = Sum16(acc[i][j]);
        y[i * ldy + j] = bias != nullptr ? dot + bias[j] : dot;
      }
    }
  }
}

// R rows of x against `cols` rows of w, C at a time, then the rest one at a time.
template <int R, int C>
CARPOOL_AVX512_BF16 void RowBlock512(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k,
                                     const float* bias, float* y, int64_t ldy, int64_t cols) {
  int64_t j = 0;
  for (; j + C <= cols; j += C) {
    Tile512<R, C>(x, ldx, w + j * k, k, bias ? bias + j : nullptr, y + j, ldy);
  }
  for (; j < cols; ++j) Tile512<R, 1>(x, ldx, w + j * k, k, bias ? bias + j : nullptr, y + j, ldy);
}

// All m rows of y for output features [col_begin, col_end): w in L2-sized passes in place,
// each against every block of rows.
CARPOOL_AVX512_BF16 void ColumnRange512(const uint16_t* xb, const uint16_t* w, const float* bias,
                                        float* y, int64_t m, int64_t n, int64_t k,
                                        int64_t col_begin, int64_t col_end) {
  const int64_t ldx = PaddedK512(k);
  if (m == 1) {
    // Decode: w streamed once, in place, kRowTileCols features at a time.
    return RowBlock512<1, kRowTileCols>(xb, ldx, w + col_begin * k, k,
                                        bias != nullptr ? bias + col_begin : nullptr,
                                        y + col_begin, n, col_end - col_begin);
  }
  const int64_t row_bytes = std::max<int64_t>(k, 1) * sizeof(uint16_t);
  const int64_t pass_cols =
      std::max<int64_t>(1, kWeightPassBytes / row_bytes / kColsPerUnit) * kColsPerUnit;
  for (int64_t c0 = col_begin; c0 < col_end; c0 += pass_cols) {
    const int64_t cols = std::min(pass_cols, col_end - c0);
    const float* b = bias != nullptr ? bias + c0 : nullptr;
    ForEachBlock(m, [&](int64_t i, int rows) {
      const uint16_t* xi = xb + i * ldx;
      const uint16_t* wc = w + c0 * k;
      float* yi = y + i * n + c0;
      static_assert(kMaxTileRows == 4, "the cases below assume up to 4-row tiles");
      switch (rows) {
        case 4:
          return RowBlock512<4, kTileCols512>(xi, ldx, wc, k, b, yi, n, cols);
        case 3:
          return RowBlock512<3, kTileCols512>(xi, ldx, wc, k, b, yi, n, cols);
        case 2:
          return RowBlock512<2, kTileCols512>(xi, ldx, wc, k, b, yi, n, cols);
        default:
          return RowBlock512<1, kTileCols512>(xi, ldx, wc, k, b, yi, n, cols);
      }
    });
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

void LinearAvx512Bf16(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m,
                      int64_t n, int64_t k, ThreadPool* pool) {
  // x is rounded once, by the calling thread, and shared read-only by the pool's threads.
  thread_local Scratch<uint16_t> x_scratch;
  uint16_t* xb = x_scratch.Get(m * PaddedK512(k));
  PackRowsBf16(x, m, k, xb);
  const int64_t units = (n + kColsPerUnit - 1) / kColsPerUnit;
  auto run = [&](int64_t unit_begin, int64_t unit_end) {
    ColumnRange512(xb, w, bias, y, m, n, k, unit_begin * kColsPerUnit,
                   std::min(n, unit_end * kColsPerUnit));
  };
  if (m * n * k < kMinParallelMacs) {
    run(0, units);
  } else {
    ParallelFor(pool, units, run);
  }
}

#endif  // CARPOOL_LINEAR_BF16_AVX512

// Runs fn(row_begin, row_end) over [0, n) rows of k elements, on the pool when it is worth it.
template <typename Fn>
void ForRows(int64_t n, int64_t k, ThreadPool* pool, Fn&& fn) {
  if (n * k < kMinParallelMacs) {
    fn(0, n);
  } else {
    ParallelFor(pool, n, fn);
  }
}

}  // namespace

int64_t PackedBf16Size(int64_t n, int64_t k) { return n * k; }

void PackBf16Weights(const float* w, int64_t n, int64_t k, uint16_t* dst, ThreadPool* pool) {
  ForRows(n, k, pool, [&](int64_t begin, int64_t end) {
    FloatToBf16(w + begin * k, (end - begin) * k, dst + begin * k);
  });
}

void PackBf16Weights(const uint16_t* w, int64_t n, int64_t k, uint16_t* dst, ThreadPool* pool) {
  ForRows(n, k, pool, [&](int64_t begin, int64_t end) {
    std::memcpy(dst + begin * k, w + begin * k, (end - begin) * k * sizeof(uint16_t));
  });
}

bool Bf16PackingIsRowMajor() { return true; }

void LinearBf16(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m,
                int64_t n, int64_t k, ThreadPool* pool) {
  if (m <= 0 || n <= 0) return;
#ifdef CARPOOL_LINEAR_BF16_AVX512
  if (HasAvx512Bf16()) return LinearAvx512Bf16(x, w, bias, y, m, n, k, pool);
#endif
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

void EmbeddingGatherBf16(const uint16_t* table, int64_t vocab, int64_t h, const int32_t* ids,
                         int64_t t, float* out) {
  for (int64_t r = 0; r < t; ++r) {
    CARPOOL_CHECK(ids[r] >= 0 && ids[r] < vocab);
    Bf16ToFloat(table + static_cast<int64_t>(ids[r]) * h, h, out + r * h);
  }
}

const char* LinearBf16Path() {
#ifdef CARPOOL_LINEAR_BF16_AVX512
  if (HasAvx512Bf16()) return "avx512_bf16";
#endif
#ifdef CARPOOL_SIMD_AVX2
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace carpool::kernels::cpu
