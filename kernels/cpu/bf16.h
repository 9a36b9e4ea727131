// bfloat16 <-> fp32 conversions for the CPU kernels (internal to kernels/cpu/ and the CPU
// device). A bf16 value is the upper 16 bits of an fp32 one, held as uint16_t bits.
//
// Narrowing rounds to nearest, ties to even (what torch's `.to(torch.bfloat16)` does); a NaN
// stays a (quiet) NaN. Widening is exact.
#ifndef CARPOOL_KERNELS_CPU_BF16_H_
#define CARPOOL_KERNELS_CPU_BF16_H_

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace carpool::kernels::cpu {

inline float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// f rounded to the nearest bf16 and widened back: the value a bf16 store keeps.
inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

// dst[i] = FloatToBf16(src[i]) / Bf16ToFloat(src[i]) for i in [0, n).
inline void FloatToBf16(const float* src, int64_t n, uint16_t* dst);
inline void Bf16ToFloat(const uint16_t* src, int64_t n, float* dst);

#if defined(__AVX2__)
// Eight bf16 values at p, widened to fp32 lanes.
inline __m256 LoadBf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Eight fp32 lanes rounded to bf16 (nearest even, NaN kept quiet), stored at p.
inline void StoreBf16x8(uint16_t* p, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  rounded = _mm256_srli_epi32(rounded, 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  rounded = _mm256_blendv_epi8(rounded, quiet_nan, _mm256_castps_si256(is_nan));
  // Lanes hold values < 2^16: pack the two 128-bit halves' 32-bit lanes into 16 bits each.
  const __m128i lo = _mm256_castsi256_si128(rounded);
  const __m128i hi = _mm256_extracti128_si256(rounded, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(lo, hi));
}
#endif

inline void FloatToBf16(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) StoreBf16x8(dst + i, _mm256_loadu_ps(src + i));
#endif
  for (; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

inline void Bf16ToFloat(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadBf16x8(src + i));
#endif
  for (; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

}  // namespace carpool::kernels::cpu

#endif  // CARPOOL_KERNELS_CPU_BF16_H_
