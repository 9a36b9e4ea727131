// LinearInt8: the arithmetic is defined in linear_int8.h; this file is about doing it fast.
//
// Layout of a quantized weight: output features in tiles of kTileCols = 8 (the last tile
// zero-padded), each tile's groups one after another, and each (tile, group) block holding the
// 8 features' G int8 values one feature after the other, then their 8 fp32 scales:
//   block(t, g) = [q of feature 8t .. 8t+7 over group g: 8 x G bytes][w_scale x 8: 32 bytes]
// so a tile is one contiguous stream (decode reads w exactly once, front to back) and every
// 32-byte load is aligned when the buffer is. The K tail of the last group holds zeros, and
// the padded features zeros with scale 0.
//
// Per tile, per group, per row of x: for each of the 8 features, the products of 32 int8
// pairs go to eight int32 lanes (AVX2: pmaddubsw of |qx| and qw carrying qx's sign, then
// pmaddwd with ones, which cannot saturate: a pair of products is at most 2 * 127 * 127 =
// 32258 < 32767; VNNI: one vpdpbusd); a fixed tree of integer additions reduces the 8 features'
// lanes to one vector of the 8 group sums s[g], exact whatever the order; then one fp32 fma per
// (row, feature, group), as the header defines. Activations are quantized once per call into
// scratch, before the output features are split over the pool.
//
// Speed on AVX2 (AMD EPYC, Zen 2, one core): pmaddubsw and pmaddwd both issue on one pipe, so
// the integer part peaks at 16 multiply-adds a cycle (measured ~34 G/s, compute-bound at
// batch 4 and up; fp32 Linear ~21-25 G/s), and batch 1 from memory runs at fp32's bandwidth
// on a quarter of the bytes.
//
// kInt8Group = 64, measured (one thread, CPU time): at batch 1 from memory it is ~5% faster
// than 32 (1.06 bytes a weight against 1.125: the fp32 scales), in cache 3-7% faster (fewer
// reductions), at batch 32 within 2%; its error on Gaussian weights and activations is about
// 1.1x group 32's (relative RMS error of y against fp32 Linear: 0.79-0.90% for 64, 0.73-0.81%
// for 32, shapes 768x768 to 32000x768).

#include "kernels/cpu/linear_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "common/status.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/simd.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CARPOOL_INT8_AVX2 1
#endif

namespace carpool::kernels::cpu {
namespace {

constexpr int kTileCols = 8;     // output features per tile (and per register of group sums)
constexpr int kMaxTileRows = 4;  // rows of x per call of a tile kernel
// Bytes of w a thread keeps hot (L2) while it sweeps over all rows of x.
constexpr int64_t kWeightPassBytes = 256 * 1024;
// How far ahead of its reads a tile kernel prefetches w: a single stream per thread, which the
// hardware prefetcher alone kept ~15% below the memory bandwidth at batch 1.
constexpr int64_t kPrefetchBytes = 2048;
// Below this many multiply-adds the pool's hand-off costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;
// Below this many values of x, quantizing them on the calling thread is cheaper than a hand-off.
constexpr int64_t kMinParallelQuantize = 1 << 15;

// Where everything lies in a quantized [n, k] weight; see the file comment.
struct Layout {
  int group = 0;
  int64_t groups = 0;       // per row of K
  int64_t block_bytes = 0;  // one tile's one group: kTileCols * group int8 + kTileCols scales
  int64_t tile_bytes = 0;   // one tile, all groups
  int64_t tiles = 0;
};

Layout MakeLayout(int64_t n, int64_t k, int group) {
  CARPOOL_CHECK(IsSupportedInt8Group(group));
  CARPOOL_CHECK(n >= 0 && k >= 0);
  Layout l;
  l.group = group;
  l.groups = (k + group - 1) / group;
  l.block_bytes = kTileCols * (group + static_cast<int64_t>(sizeof(float)));
  l.tile_bytes = l.groups * l.block_bytes;
  l.tiles = (n + kTileCols - 1) / kTileCols;
  return l;
}

// Values of group g of a row of k.
int GroupCount(int64_t k, int group, int64_t g) {
  return static_cast<int>(std::min<int64_t>(group, k - g * group));
}

// A per-thread, 64-byte-aligned scratch buffer that grows on demand and is never shrunk.
class Scratch {
 public:
  void* Get(int64_t bytes) {
    if (bytes > size_) {
      const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
      data_.reset(std::aligned_alloc(64, rounded));
      if (data_ == nullptr) throw std::bad_alloc();  // as std::vector would
      size_ = bytes;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
  int64_t size_ = 0;
};

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

#ifdef CARPOOL_INT8_AVX2

// round(v) (ties away from zero), clamped to [-127, 127], NaN to -127. v - trunc(v) is exact,
// so the tie test is too.
inline __m256 RoundClamp(__m256 v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
  const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));  // +-1
  const __m256 half = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 r = _mm256_add_ps(t, _mm256_and_ps(half, step));
  // max returns its second operand when either is NaN.
  return _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
}

// Quantizes the first `count` values at v (the rest of the group taken as 0) to `group` int8 at
// q, as linear_int8.h defines; returns the scale. Reads only v[0, count).
float QuantizeGroup(const float* v, int count, int group, int8_t* q) {
  const int vecs = group / simd::kLanes;
  __m256 x[64 / simd::kLanes];
  __m256i amax = _mm256_setzero_si256();
  const __m256i abs_bits = _mm256_set1_epi32(0x7fffffff);
  for (int t = 0; t < vecs; ++t) {
    const int have = std::clamp(count - t * simd::kLanes, 0, simd::kLanes);
    x[t] = have == simd::kLanes ? _mm256_loadu_ps(v + t * simd::kLanes)
           : have > 0           ? simd::LoadPartial(v + t * simd::kLanes, have)
                                : _mm256_setzero_ps();
    amax = _mm256_max_epu32(amax, _mm256_and_si256(_mm256_castps_si256(x[t]), abs_bits));
  }
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(amax), _mm256_extracti128_si256(amax, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  const float scale = BitsToFloat(static_cast<uint32_t>(_mm_cvtsi128_si32(m))) / 127.0f;
  if (scale == 0.0f) {
    std::memset(q, 0, group);
    return scale;
  }
  const __m256 s = _mm256_set1_ps(scale);
  // packs interleave the 128-bit halves; this puts the 4-byte runs back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int t = 0; t < vecs; t += 4) {
    __m256i i32[4];
    for (int u = 0; u < 4; ++u) {
      i32[u] = _mm256_cvttps_epi32(RoundClamp(_mm256_div_ps(x[t + u], s)));
    }
    const __m256i i8 =
        _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + t * simd::kLanes),
                        _mm256_permutevar8x32_epi32(i8, order));
  }
  return scale;
}

#else  // portable

// max |v[t]| for t < count as the bits of a non-negative float: for those, the integer order of
// the bits is the order of the values, with NaN above infinity, so a NaN wins.
uint32_t AbsMaxBitsScalar(const float* v, int count) {
  uint32_t amax = 0;
  for (int t = 0; t < count; ++t) {
    uint32_t bits;
    std::memcpy(&bits, &v[t], sizeof(bits));
    amax = std::max(amax, bits & 0x7fffffffu);
  }
  return amax;
}

int8_t RoundClamp(float v) {
  const float r = std::round(v);
  if (!(r >= -127.0f)) return -127;  // also NaN
  return static_cast<int8_t>(std::min(r, 127.0f));
}

float QuantizeGroup(const float* v, int count, int group, int8_t* q) {
  const float scale = BitsToFloat(AbsMaxBitsScalar(v, count)) / 127.0f;
  std::memset(q, 0, group);
  if (scale == 0.0f) return scale;
  for (int t = 0; t < count; ++t) q[t] = RoundClamp(v[t] / scale);
  return scale;
}

#endif  // CARPOOL_INT8_AVX2

// Quantizes a row of k values into l.groups groups: q (l.groups * l.group bytes), scales.
void QuantizeRow(const Layout& l, const float* v, int64_t k, int8_t* q, float* scales) {
  for (int64_t g = 0; g < l.groups; ++g) {
    scales[g] = QuantizeGroup(v + g * l.group, GroupCount(k, l.group, g), l.group, q + g * l.group);
  }
}

// Writes every byte of dst for the weight [n, k] whose row j row(j, buffer) returns (fp32;
// `buffer` is per-thread room for k floats if the row must be converted).
template <typename RowFn>
void QuantizeWeights(int64_t n, int64_t k, int group, void* dst, ThreadPool* pool, RowFn row) {
  const Layout l = MakeLayout(n, k, group);
  auto* base = static_cast<uint8_t*>(dst);
  const int64_t used = l.tiles * l.tile_bytes;
  const int64_t padding = QuantizedInt8Bytes(n, k, group) - used;
  if (padding > 0) std::memset(base + used, 0, padding);
  ParallelFor(pool, l.tiles, [&](int64_t t_begin, int64_t t_end) {
    thread_local Scratch buffer;
    auto* floats = static_cast<float*>(buffer.Get(k * static_cast<int64_t>(sizeof(float))));
    thread_local Scratch row_scratch;  // one row's q, then its scales
    auto* q = static_cast<int8_t*>(
        row_scratch.Get(l.groups * (l.group + static_cast<int64_t>(sizeof(float)))));
    auto* scales = reinterpret_cast<float*>(q + l.groups * l.group);
    for (int64_t t = t_begin; t < t_end; ++t) {
      uint8_t* tile = base + t * l.tile_bytes;
      for (int c = 0; c < kTileCols; ++c) {
        const int64_t j = t * kTileCols + c;
        if (j < n) {
          QuantizeRow(l, row(j, floats), k, q, scales);
        } else {
          std::memset(q, 0, l.groups * l.group);
          std::fill(scales, scales + l.groups, 0.0f);
        }
        for (int64_t g = 0; g < l.groups; ++g) {
          uint8_t* block = tile + g * l.block_bytes;
          std::memcpy(block + c * l.group, q + g * l.group, l.group);
          std::memcpy(block + kTileCols * l.group + c * sizeof(float), &scales[g], sizeof(float));
        }
      }
    }
  });
}

// Row j of the quantized weight as fp32 values scale * q, k of them.
void DequantizeRow(const Layout& l, const void* w, int64_t j, int64_t k, float* dst) {
  const auto* tile = static_cast<const uint8_t*>(w) + (j / kTileCols) * l.tile_bytes;
  const int c = static_cast<int>(j % kTileCols);
  for (int64_t g = 0; g < l.groups; ++g) {
    const uint8_t* block = tile + g * l.block_bytes;
    const auto* q = reinterpret_cast<const int8_t*>(block + c * l.group);
    float scale;
    std::memcpy(&scale, block + kTileCols * l.group + c * sizeof(float), sizeof(float));
    const int count = GroupCount(k, l.group, g);
    for (int t = 0; t < count; ++t) dst[g * l.group + t] = scale * static_cast<float>(q[t]);
  }
}

// One call of a tile kernel: `rows` rows of quantized x against one tile of w, all groups.
struct TileArgs {
  const int8_t* xq;  // row 0 of the block; rows x_row bytes apart, groups `group` bytes apart
  int64_t x_row;
  const float* xs;   // x_scale of row 0, group 0; rows `groups` floats apart
  const uint8_t* w;  // the tile's first block
  int64_t groups;
  int64_t block_bytes;
};

// out[i * kTileCols + c] = acc of row i and feature c of the tile (before the bias).
using TileFn = void (*)(const TileArgs&, float* out);

#ifdef CARPOOL_INT8_AVX2

// Integer dot products of 32 bytes: lane l of the result adds sum_{b < 4} a[4l + b] * s[4l + b]
// (a unsigned, s signed) to acc. Exact (no saturation, no wrap) for |a|, |s| <= 127.
struct Avx2Dot {
  static __m256i First(__m256i a, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, s), _mm256_set1_epi16(1));
  }
  static __m256i Next(__m256i acc, __m256i a, __m256i s) {
    return _mm256_add_epi32(acc, First(a, s));
  }
};

// The same with vpdpbusd. Written as asm, not intrinsics: GCC will not inline a function for
// another target into the shared TileKernel below, and the instruction is only reached when
// the CPU has it (ChosenPath). EVEX form: AVX512_VNNI with AVX512VL (256-bit registers).
struct Avx512VnniDot {
  static __m256i First(__m256i a, __m256i s) { return Next(_mm256_setzero_si256(), a, s); }
  static __m256i Next(__m256i acc, __m256i a, __m256i s) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(s));
    return acc;
  }
};

// VEX form: AVX-VNNI.
struct AvxVnniDot {
  static __m256i First(__m256i a, __m256i s) { return Next(_mm256_setzero_si256(), a, s); }
  static __m256i Next(__m256i acc, __m256i a, __m256i s) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(s));
    return acc;
  }
};

// Lane c of the result = the sum of the 8 lanes of p[c] (integer, so exact in any order).
inline __m256i SumLanes(const __m256i (&p)[kTileCols]) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
  // a = [p0..p3 over lanes 0-3 | p0..p3 over lanes 4-7], b likewise for p4..p7.
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                          _mm256_permute2x128_si256(a, b, 0x31));
}

// R rows x one tile, groups of 32 * kChunks. kPrefetch: w comes from memory, not L2.
template <int R, int kChunks, bool kPrefetch, typename Dot>
void TileKernel(const TileArgs& args, float* out) {
  constexpr int kGroup = 32 * kChunks;
  __m256 acc[R];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  const uint8_t* w = args.w;
  for (int64_t g = 0; g < args.groups; ++g, w += args.block_bytes) {
    if (kPrefetch) {
      // Integer arithmetic: the prefetched lines may lie past the end of w.
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(w) + kPrefetchBytes;
      for (int64_t b = 0; b < args.block_bytes; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + b), _MM_HINT_T0);
      }
    }
    const __m256 ws = _mm256_loadu_ps(reinterpret_cast<const float*>(w + kTileCols * kGroup));
    for (int i = 0; i < R; ++i) {
      const int8_t* xg = args.xq + i * args.x_row + g * kGroup;
      __m256i xv[kChunks];
      __m256i ax[kChunks];
      for (int c = 0; c < kChunks; ++c) {
        xv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 32 * c));
        ax[c] = _mm256_sign_epi8(xv[c], xv[c]);  // |qx| <= 127, read as unsigned
      }
      __m256i p[kTileCols];
      for (int j = 0; j < kTileCols; ++j) {
        const auto* wj = reinterpret_cast<const __m256i*>(w + j * kGroup);
        p[j] = Dot::First(ax[0], _mm256_sign_epi8(_mm256_loadu_si256(wj), xv[0]));
        for (int c = 1; c < kChunks; ++c) {
          p[j] = Dot::Next(p[j], ax[c], _mm256_sign_epi8(_mm256_loadu_si256(wj + c), xv[c]));
        }
      }
      const __m256 d = _mm256_mul_ps(_mm256_set1_ps(args.xs[i * args.groups + g]), ws);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SumLanes(p)), d, acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) _mm256_storeu_ps(out + i * kTileCols, acc[i]);
}

#else  // portable

struct ScalarDot {};

template <int R, int kChunks, bool kPrefetch, typename Dot>
void TileKernel(const TileArgs& args, float* out) {
  constexpr int kGroup = 32 * kChunks;
  float acc[R][kTileCols] = {};
  const uint8_t* w = args.w;
  for (int64_t g = 0; g < args.groups; ++g, w += args.block_bytes) {
    for (int i = 0; i < R; ++i) {
      const int8_t* xg = args.xq + i * args.x_row + g * kGroup;
      for (int j = 0; j < kTileCols; ++j) {
        const auto* wj = reinterpret_cast<const int8_t*>(w + j * kGroup);
        int32_t s = 0;
        for (int t = 0; t < kGroup; ++t) s += int32_t{xg[t]} * int32_t{wj[t]};
        float ws;
        std::memcpy(&ws, w + kTileCols * kGroup + j * sizeof(float), sizeof(float));
        acc[i][j] = std::fma(static_cast<float>(s), args.xs[i * args.groups + g] * ws, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i) std::memcpy(out + i * kTileCols, acc[i], sizeof(acc[i]));
}

#endif  // CARPOOL_INT8_AVX2

// The tile kernels of one instruction set: tiles[kChunks - 1][kPrefetch][rows - 1].
struct Path {
  const char* name;
  TileFn tiles[2][2][kMaxTileRows];
};

template <int kChunks, bool kPrefetch, typename Dot>
void FillRows(TileFn (&tiles)[kMaxTileRows]) {
  static_assert(kMaxTileRows == 4, "the table below assumes up to 4-row tiles");
  tiles[0] = TileKernel<1, kChunks, kPrefetch, Dot>;
  tiles[1] = TileKernel<2, kChunks, kPrefetch, Dot>;
  tiles[2] = TileKernel<3, kChunks, kPrefetch, Dot>;
  tiles[3] = TileKernel<4, kChunks, kPrefetch, Dot>;
}

template <typename Dot>
Path MakePath(const char* name) {
  Path path{.name = name, .tiles = {}};
  FillRows<1, false, Dot>(path.tiles[0][0]);
  FillRows<1, true, Dot>(path.tiles[0][1]);
  FillRows<2, false, Dot>(path.tiles[1][0]);
  FillRows<2, true, Dot>(path.tiles[1][1]);
  return path;
}

const Path& ChosenPath() {
  static const Path path = [] {
#ifdef CARPOOL_INT8_AVX2
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")) {
      return MakePath<Avx512VnniDot>("avx512_vnni");
    }
    if (__builtin_cpu_supports("avxvnni")) return MakePath<AvxVnniDot>("avx_vnni");
    return MakePath<Avx2Dot>("avx2");
#else
    return MakePath<ScalarDot>("portable");
#endif
  }();
  return path;
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

// Quantized activations: m rows of x_row bytes, and their scales, [m, groups].
struct QuantizedRows {
  const int8_t* q;
  int64_t x_row;
  const float* scales;
};

// All m rows of y for the output features of tiles [t_begin, t_end): w in passes of about
// kWeightPassBytes, each against every block of rows (the pass stays in L2, the block in L1).
void TileRange(const Layout& l, const QuantizedRows& x, const void* w, const float* bias, float* y,
               int64_t m, int64_t n, int64_t t_begin, int64_t t_end) {
  const Path& path = ChosenPath();
  const int chunks = l.group / 32;
  const int64_t pass_tiles =
      std::max<int64_t>(1, kWeightPassBytes / std::max<int64_t>(l.tile_bytes, 1));
  alignas(32) float out[kMaxTileRows * kTileCols];
  for (int64_t p0 = t_begin; p0 < t_end; p0 += pass_tiles) {
    const int64_t p1 = std::min(t_end, p0 + pass_tiles);
    ForEachBlock(m, [&](int64_t i0, int rows) {
      // The first block of rows reads the pass from memory; the others find it in L2.
      const TileFn tile = path.tiles[chunks - 1][i0 == 0][rows - 1];
      for (int64_t t = p0; t < p1; ++t) {
        const TileArgs args{.xq = x.q + i0 * x.x_row,
                            .x_row = x.x_row,
                            .xs = x.scales + i0 * l.groups,
                            .w = static_cast<const uint8_t*>(w) + t * l.tile_bytes,
                            .groups = l.groups,
                            .block_bytes = l.block_bytes};
        tile(args, out);
        const int64_t j0 = t * kTileCols;
        const int cols = static_cast<int>(std::min<int64_t>(kTileCols, n - j0));
        for (int i = 0; i < rows; ++i) {
          float* yi = y + (i0 + i) * n + j0;
          for (int c = 0; c < cols; ++c) {
            const float v = out[i * kTileCols + c];
            yi[c] = bias != nullptr ? v + bias[j0 + c] : v;
          }
        }
      }
    });
  }
}

}  // namespace

bool IsSupportedInt8Group(int group) { return group == 32 || group == 64; }

int64_t QuantizedInt8Bytes(int64_t n, int64_t k, int group) {
  const Layout l = MakeLayout(n, k, group);
  return (l.tiles * l.tile_bytes + 63) / 64 * 64;
}

void QuantizeInt8Weights(const float* w, int64_t n, int64_t k, int group, void* dst,
                         ThreadPool* pool) {
  QuantizeWeights(n, k, group, dst, pool, [&](int64_t j, float*) { return w + j * k; });
}

void QuantizeInt8Weights(const uint16_t* w_bf16, int64_t n, int64_t k, int group, void* dst,
                         ThreadPool* pool) {
  QuantizeWeights(n, k, group, dst, pool, [&](int64_t j, float* buffer) {
    Bf16ToFloat(w_bf16 + j * k, k, buffer);
    return static_cast<const float*>(buffer);
  });
}

void DequantizeInt8Weights(const void* w, int64_t n, int64_t k, int group, float* dst) {
  const Layout l = MakeLayout(n, k, group);
  for (int64_t j = 0; j < n; ++j) DequantizeRow(l, w, j, k, dst + j * k);
}

void LinearInt8(const float* x, const void* w, const float* bias, float* y, int64_t m, int64_t n,
                int64_t k, int group, ThreadPool* pool) {
  const Layout l = MakeLayout(n, k, group);
  if (m <= 0 || n <= 0) return;
  if (l.groups == 0) {  // k == 0: empty sums
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) y[i * n + j] = bias != nullptr ? bias[j] : 0.0f;
    }
    return;
  }
  // The caller's thread quantizes (or hands out) all rows once; workers read them.
  thread_local Scratch scratch;
  const int64_t x_row = l.groups * l.group;
  auto* q = static_cast<int8_t*>(
      scratch.Get(m * x_row + m * l.groups * static_cast<int64_t>(sizeof(float))));
  auto* scales = reinterpret_cast<float*>(q + m * x_row);  // x_row is a multiple of 32
  auto quantize = [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      QuantizeRow(l, x + r * k, k, q + r * x_row, scales + r * l.groups);
    }
  };
  if (m * k < kMinParallelQuantize) {
    quantize(0, m);
  } else {
    ParallelFor(pool, m, quantize);
  }
  const QuantizedRows rows{.q = q, .x_row = x_row, .scales = scales};
  auto run = [&](int64_t t_begin, int64_t t_end) {
    TileRange(l, rows, w, bias, y, m, n, t_begin, t_end);
  };
  if (m * n * k < kMinParallelMacs) {
    run(0, l.tiles);
  } else {
    ParallelFor(pool, l.tiles, run);
  }
}

void EmbeddingGatherInt8(const void* table, int64_t vocab, int64_t h, int group, const int32_t* ids,
                         int64_t t, float* out) {
  const Layout l = MakeLayout(vocab, h, group);
  for (int64_t r = 0; r < t; ++r) DequantizeRow(l, table, ids[r], h, out + r * h);
}

const char* LinearInt8Path() { return ChosenPath().name; }

}  // namespace carpool::kernels::cpu
