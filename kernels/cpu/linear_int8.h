// int8 weight-only quantized Linear for the CPU (issue 17): a quarter of fp32's weight bytes.
//
// The arithmetic, exactly (linear_int8_test.cc recomputes it in float64):
//
// Groups. Along K, a row is cut into G = `group` consecutive values (G = 32 or 64); the last
// group of a row holds k - G * (groups - 1) values when G does not divide k and is treated
// as zero-padded to G.
//
// Quantizing a group v[0..G) (weights at load, activations at every call), in fp32:
//   amax  = max |v[t]|                     (a NaN wins over every number)
//   scale = amax / 127                     (one fp32 division)
//   q[t]  = 0                              when scale == 0 (an all-zero group, or amax so
//                                          small that amax / 127 underflows to 0);
//   q[t]  = clamp(round(v[t] / scale), -127, 127) otherwise, where v[t] / scale is one fp32
//           division, round() is to nearest with ties away from zero (std::round), and NaN
//           becomes -127.
// Weights: per output feature j, per group g: w_scale[j][g] and qw[j][.]. Activations: per
// row i of x, per group g: x_scale[i][g] and qx[i][.], quantized on the fly.
//
// One output element, for row i and output feature j:
//   s[g]  = sum over the group of qx * qw, exact in int32 (|s| <= 64 * 127 * 127 < 2^24, so
//           it is also exact as an fp32 value);
//   acc   = +0; for g = 0, 1, ...: acc = fma(float(s[g]), x_scale[i][g] * w_scale[j][g], acc)
//           (the product of the scales is one fp32 multiplication, the fma one rounding);
//   y     = acc, then y = y + bias[j] when there is a bias.
// Every element is computed by these operations whatever M, the tiling, the thread count or
// the instruction set (integer sums are exact on every path), so LinearInt8 is batch-invariant
// like Linear: row i of y depends only on row i of x and the weights, bit for bit. A NaN or an
// infinity in a group of x or w makes that group's scale non-finite, so the outputs it feeds
// are NaN or infinite, never silently finite.
//
// Paths: AVX-512 VNNI (256-bit vpdpbusd) or AVX-VNNI where the CPU has them, AVX2 otherwise
// (pmaddubsw + pmaddwd), chosen at run time; a portable scalar loop where the build has no
// AVX2. All give the same bits.
#ifndef CARPOOL_KERNELS_CPU_LINEAR_INT8_H_
#define CARPOOL_KERNELS_CPU_LINEAR_INT8_H_

#include <cstdint>

#include "common/thread_pool.h"

namespace carpool::kernels::cpu {

// The group sizes along K that are supported; kInt8Group is the default the measurements chose
// (see linear_int8.cc).
inline constexpr int kInt8Group = 64;
bool IsSupportedInt8Group(int group);  // 32 and 64

// Bytes of the quantized form of a [n, k] weight in groups of `group` along K (a multiple of
// 64). REQUIRES: IsSupportedInt8Group(group), n >= 0, k >= 0.
int64_t QuantizedInt8Bytes(int64_t n, int64_t k, int group);

// Symmetric weight-only quantization of w [n, k] (row-major, one row per output feature) as
// defined above, from fp32 or from bf16 bits (widened exactly, so bf16 bits and the fp32 values
// they stand for give the same bytes). dst: QuantizedInt8Bytes(n, k, group) bytes, 64-byte
// aligned; every byte is written (padding included), so equal weights give equal bytes.
void QuantizeInt8Weights(const float* w, int64_t n, int64_t k, int group, void* dst,
                         ThreadPool* pool);
void QuantizeInt8Weights(const uint16_t* w_bf16, int64_t n, int64_t k, int group, void* dst,
                         ThreadPool* pool);

// The fp32 values the quantized weight stands for, w_scale[j][g] * qw[j][t] (one fp32
// multiplication), [n, k] row-major: for tests, the reference and the embedding gather.
void DequantizeInt8Weights(const void* w, int64_t n, int64_t k, int group, float* dst);

// y[m, n] = x[m, k] . dequant(w)[n, k]^T (+ bias[n] when bias != nullptr), computed as defined
// above; w from QuantizeInt8Weights with the same n, k and group. The N dimension is split over
// the pool. x needs no alignment.
void LinearInt8(const float* x, const void* w, const float* bias, float* y, int64_t m, int64_t n,
                int64_t k, int group, ThreadPool* pool);

// out[r] = row ids[r] of the dequantized [vocab, h] table, for r in [0, t) (the embedding of a
// table quantized for LinearInt8, e.g. tied with the LM head). REQUIRES: 0 <= ids[r] < vocab.
void EmbeddingGatherInt8(const void* table, int64_t vocab, int64_t h, int group, const int32_t* ids,
                         int64_t t, float* out);

// The path LinearInt8 takes on this CPU: "avx512_vnni", "avx_vnni", "avx2" (or "portable" in
// a build without AVX2).
const char* LinearInt8Path();

}  // namespace carpool::kernels::cpu

#endif  // CARPOOL_KERNELS_CPU_LINEAR_INT8_H_
