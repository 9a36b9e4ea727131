// Linear: y = x · w^T (+ bias), batch-invariant by construction.
//
// Why not OpenBLAS: single-threaded OpenBLAS 0.3.21 sgemm (Haswell kernels) gives a row a
// different rounding when it falls in a full 4-row tile than in an edge tile, so the same
// prompt alone and inside a batch got different logits. Here every output element is computed
// the same way whatever M, N, the tile it falls in or the thread split: an 8-lane FMA
// accumulation along K (zero-padded tail), the fixed simd::HSum reduction, then + bias.
// Register tiles of up to 4 rows x 3 columns only share the loads, never the arithmetic.
// Since w is read in its stored [N, K] layout with no packing, M = 1 (decode) is cheap.

#include <algorithm>
#include <cstdint>

#include "common/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/simd.h"

namespace carpool::kernels::cpu {
namespace {

using simd::F8;

constexpr int kTileRows = 4;  // rows of x per register tile
constexpr int kTileCols = 3;  // rows of w (output features) per register tile
// Output features per unit of work handed to the pool; a multiple of kTileCols.
constexpr int64_t kColsPerUnit = 48;
// Bytes of w a thread keeps hot (L2) while it sweeps over all rows of x.
constexpr int64_t kWeightPassBytes = 256 * 1024;
// Below this many multiply-adds the pool's hand-off costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;

// y[i][j] = dot(x row i, w row j) (+ bias[j]) for i < R, j < C.
// x rows and w rows are k floats long and contiguous; y has row stride ldy.
template <int R, int C>
void Tile(const float* x, const float* w, const float* bias, float* y, int64_t k, int64_t ldy) {
  F8 acc[R][C];
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) acc[i][j] = simd::Zero();
  }
  int64_t kk = 0;
  for (; kk + simd::kLanes <= k; kk += simd::kLanes) {
    F8 wv[C];
    for (int j = 0; j < C; ++j) wv[j] = simd::Load(w + j * k + kk);
    for (int i = 0; i < R; ++i) {
      const F8 xv = simd::Load(x + i * k + kk);
      for (int j = 0; j < C; ++j) acc[i][j] = simd::Fma(xv, wv[j], acc[i][j]);
    }
  }
  if (kk < k) {
    const int rest = static_cast<int>(k - kk);
    F8 wv[C];
    for (int j = 0; j < C; ++j) wv[j] = simd::LoadPartial(w + j * k + kk, rest);
    for (int i = 0; i < R; ++i) {
      const F8 xv = simd::LoadPartial(x + i * k + kk, rest);
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

// R rows of x against `cols` consecutive rows of w (output features), kTileCols at a time.
template <int R>
void RowBlock(const float* x, const float* w, const float* bias, float* y, int64_t cols, int64_t k,
              int64_t ldy) {
  int64_t j = 0;
  for (; j + kTileCols <= cols; j += kTileCols) {
    Tile<R, kTileCols>(x, w + j * k, bias ? bias + j : nullptr, y + j, k, ldy);
  }
  static_assert(kTileCols == 3, "the edge cases below assume 3-column tiles");
  if (cols - j == 2) Tile<R, 2>(x, w + j * k, bias ? bias + j : nullptr, y + j, k, ldy);
  if (cols - j == 1) Tile<R, 1>(x, w + j * k, bias ? bias + j : nullptr, y + j, k, ldy);
}

// Output features whose weights fit in kWeightPassBytes; a positive multiple of kTileCols.
int64_t WeightPassCols(int64_t k) {
  const int64_t row_bytes = std::max<int64_t>(k, 1) * sizeof(float);
  return std::max<int64_t>(1, kWeightPassBytes / row_bytes / kTileCols) * kTileCols;
}

// All m rows of y for output features [col_begin, col_end).
void ColumnRange(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
                 int64_t k, int64_t col_begin, int64_t col_end) {
  const int64_t pass_cols = WeightPassCols(k);
  for (int64_t c0 = col_begin; c0 < col_end; c0 += pass_cols) {
    const int64_t cols = std::min(pass_cols, col_end - c0);
    const float* wc = w + c0 * k;
    const float* bc = bias ? bias + c0 : nullptr;
    int64_t i = 0;
    for (; i + kTileRows <= m; i += kTileRows) {
      RowBlock<kTileRows>(x + i * k, wc, bc, y + i * n + c0, cols, k, n);
    }
    static_assert(kTileRows == 4, "the edge cases below assume 4-row tiles");
    switch (m - i) {
      case 3:
        RowBlock<3>(x + i * k, wc, bc, y + i * n + c0, cols, k, n);
        break;
      case 2:
        RowBlock<2>(x + i * k, wc, bc, y + i * n + c0, cols, k, n);
        break;
      case 1:
        RowBlock<1>(x + i * k, wc, bc, y + i * n + c0, cols, k, n);
        break;
      default:
        break;
    }
  }
}

}  // namespace

void Linear(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k) {
  if (m <= 0 || n <= 0) return;
  const int64_t units = (n + kColsPerUnit - 1) / kColsPerUnit;
  auto run = [&](int64_t unit_begin, int64_t unit_end) {
    ColumnRange(x, w, bias, y, m, n, k, unit_begin * kColsPerUnit,
                std::min(n, unit_end * kColsPerUnit));
  };
  if (m * n * k < kMinParallelMacs) {
    run(0, units);
  } else {
    ThreadPool::Default()->ParallelFor(units, run);
  }
}

}  // namespace carpool::kernels::cpu
