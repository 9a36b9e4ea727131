// Linear with bf16 weights and fp32 activations, accumulation and output (issue 17).
//
// A decode step reads every weight once, so its time is set by weight bytes: bf16 weights halve
// them. Weights stay plain row-major [n, k] bf16 (Bf16PackingIsRowMajor() is true), so a
// checkpoint's bf16 tensor is used in place.
//
// Batch-invariant like Linear (cpu_kernels.h): row m of y depends only on row m of x, bit for
// bit, whatever M, the tiling and the pool's thread count. What each element is, per path:
//   - "avx2" (any x86-64 with AVX2 + FMA; built without AVX2 the same arithmetic runs one lane
//     at a time, and the path is called "portable"): the weights are widened to fp32 exactly
//     and multiplied by the fp32 activations. K is taken in blocks of 16 (the last one padded
//     with zeros); lane l (of 8) accumulates, from +0 and in increasing k, fma over the
//     elements k with k % 16 == 2l or 2l + 1 (the even element of the pair first); the 8 lanes
//     are summed as ((0+4)+(2+6)) + ((1+5)+(3+7)); then + bias[n].
//   - "avx512_bf16" (CPUs with AVX512-BF16, chosen at run time): the activations are rounded to
//     bf16 (nearest even) too, and vdpbf16ps adds pairs of products into 16 fp32 lanes over
//     blocks of 32 along K (denormals flushed, as the instruction does); the 16 lanes are
//     summed as lanes l + (l + 8), then in the avx2 order; then + bias[n].
#ifndef CARPOOL_KERNELS_CPU_LINEAR_BF16_H_
#define CARPOOL_KERNELS_CPU_LINEAR_BF16_H_

#include <cstdint>

#include "common/thread_pool.h"

namespace carpool::kernels::cpu {

// Number of uint16_t elements of the packed form of a [n, k] weight (n * k: row-major).
int64_t PackedBf16Size(int64_t n, int64_t k);

// Packs w [n, k] into the layout LinearBf16 reads: from fp32 (each value rounded to bf16,
// nearest even, NaN kept) or from bf16 bits as a checkpoint stores them (copied).
// dst holds PackedBf16Size(n, k) elements and must not overlap w. pool may be null.
void PackBf16Weights(const float* w, int64_t n, int64_t k, uint16_t* dst, ThreadPool* pool);
void PackBf16Weights(const uint16_t* w, int64_t n, int64_t k, uint16_t* dst, ThreadPool* pool);

// True when the packed layout is plain row-major [n, k] bf16, so a checkpoint's bf16 tensor can
// be used in place without packing. It is, on every path.
bool Bf16PackingIsRowMajor();

// y[m, n] = x[m, k] . w[n, k]^T (+ bias[n] when bias != nullptr); w packed by PackBf16Weights;
// fp32 accumulation as the header comment defines. x, w, bias need no particular alignment.
// The N dimension is split over the pool (null: the calling thread).
void LinearBf16(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m,
                int64_t n, int64_t k, ThreadPool* pool);

// out[t] = row ids[t] of a packed [vocab, h] table, widened to fp32 (exact): the embedding
// gather, also when the table is tied with the LM head and so packed for LinearBf16.
// REQUIRES: 0 <= ids[i] < vocab (checked: a bad id aborts with a message, as a programmer error).
void EmbeddingGatherBf16(const uint16_t* table, int64_t vocab, int64_t h, const int32_t* ids,
                         int64_t t, float* out);

// The path LinearBf16 takes on this CPU: "avx512_bf16" or "avx2" ("portable" in a build
// without AVX2).
const char* LinearBf16Path();

}  // namespace carpool::kernels::cpu

#endif  // CARPOOL_KERNELS_CPU_LINEAR_BF16_H_
