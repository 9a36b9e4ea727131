// Eight-lane fp32 vector helpers for the CPU kernels (internal to kernels/cpu/).
//
// With AVX2 + FMA (the build uses -march=native) F8 is an __m256; elsewhere it is a plain
// array with the same semantics, so the kernels compile everywhere. Every operation is
// deterministic: the same inputs give the same bits, whatever the caller's loop structure.
// That is what makes Linear batch-invariant (see linear.cc).
#ifndef CARPOOL_KERNELS_CPU_SIMD_H_
#define CARPOOL_KERNELS_CPU_SIMD_H_

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CARPOOL_SIMD_AVX2 1
#endif

namespace carpool::kernels::cpu::simd {

inline constexpr int kLanes = 8;

#ifdef CARPOOL_SIMD_AVX2

using F8 = __m256;

inline F8 Zero() { return _mm256_setzero_ps(); }
inline F8 Set1(float v) { return _mm256_set1_ps(v); }
inline F8 Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, F8 v) { _mm256_storeu_ps(p, v); }

// Mask whose first n lanes are set. REQUIRES: 0 <= n <= 8.
inline __m256i PrefixMask(int n) {
  alignas(32) static constexpr int32_t kBits[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                    0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kBits + 8 - n));
}
// Loads the first n lanes of p, zero elsewhere; never touches p[n..7]. REQUIRES: 0 <= n <= 8.
inline F8 LoadPartial(const float* p, int n) { return _mm256_maskload_ps(p, PrefixMask(n)); }
// Stores the first n lanes of v to p; never touches p[n..7].
inline void StorePartial(float* p, F8 v, int n) { _mm256_maskstore_ps(p, PrefixMask(n), v); }

inline F8 Add(F8 a, F8 b) { return _mm256_add_ps(a, b); }
inline F8 Sub(F8 a, F8 b) { return _mm256_sub_ps(a, b); }
inline F8 Mul(F8 a, F8 b) { return _mm256_mul_ps(a, b); }
inline F8 Div(F8 a, F8 b) { return _mm256_div_ps(a, b); }
// a * b + c with a single rounding.
inline F8 Fma(F8 a, F8 b, F8 c) { return _mm256_fmadd_ps(a, b, c); }
// NaN in b propagates.
inline F8 Max(F8 a, F8 b) { return _mm256_max_ps(a, b); }
inline F8 Min(F8 a, F8 b) { return _mm256_min_ps(a, b); }

// Sum of the eight lanes in a fixed order: ((0+4)+(2+6)) + ((1+5)+(3+7)).
inline float HSum(F8 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HMax(F8 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x, within ~2 ulp (Cephes expf). Inputs below about -87.3 give a value below 1.2e-38
// (effectively 0); inputs above 88 saturate at e^88 (1.65e38); NaN stays NaN.
inline F8 Exp(F8 x) {
  x = Min(Set1(88.0f), x);
  x = Max(Set1(-87.3f), x);
  const F8 n = _mm256_round_ps(Mul(x, Set1(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  F8 r = Fma(n, Set1(-0.693359375f), x);
  r = Fma(n, Set1(2.12194440e-4f), r);
  F8 p = Set1(1.9875691500e-4f);
  p = Fma(p, r, Set1(1.3981999507e-3f));
  p = Fma(p, r, Set1(8.3334519073e-3f));
  p = Fma(p, r, Set1(4.1665795894e-2f));
  p = Fma(p, r, Set1(1.6666665459e-1f));
  p = Fma(p, r, Set1(5.0000001201e-1f));
  p = Fma(p, Mul(r, r), Add(r, Set1(1.0f)));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return Mul(p, _mm256_castsi256_ps(bits));
}

#else  // portable fallback: same contracts, one lane at a time

struct F8 {
  float v[kLanes];
};

inline F8 Zero() { return F8{}; }
inline F8 Set1(float s) {
  F8 r;
  for (float& x : r.v) x = s;
  return r;
}
inline F8 LoadPartial(const float* p, int n) {
  F8 r{};
  for (int i = 0; i < n; ++i) r.v[i] = p[i];
  return r;
}
inline F8 Load(const float* p) { return LoadPartial(p, kLanes); }
inline void StorePartial(float* p, F8 v, int n) {
  for (int i = 0; i < n; ++i) p[i] = v.v[i];
}
inline void Store(float* p, F8 v) { StorePartial(p, v, kLanes); }

template <typename Op>
inline F8 Map2(F8 a, F8 b, Op op) {
  F8 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = op(a.v[i], b.v[i]);
  return r;
}
inline F8 Add(F8 a, F8 b) {
  return Map2(a, b, [](float x, float y) { return x + y; });
}
inline F8 Sub(F8 a, F8 b) {
  return Map2(a, b, [](float x, float y) { return x - y; });
}
inline F8 Mul(F8 a, F8 b) {
  return Map2(a, b, [](float x, float y) { return x * y; });
}
inline F8 Div(F8 a, F8 b) {
  return Map2(a, b, [](float x, float y) { return x / y; });
}
inline F8 Max(F8 a, F8 b) {
  return Map2(a, b, [](float x, float y) { return x > y ? x : y; });
}
inline F8 Min(F8 a, F8 b) {
  return Map2(a, b, [](float x, float y) { return x < y ? x : y; });
}
inline F8 Fma(F8 a, F8 b, F8 c) {
  F8 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
  return r;
}
inline float HSum(F8 v) {
  return ((v.v[0] + v.v[4]) + (v.v[2] + v.v[6])) + ((v.v[1] + v.v[5]) + (v.v[3] + v.v[7]));
}
inline float HMax(F8 v) {
  float m = v.v[0];
  for (int i = 1; i < kLanes; ++i) m = v.v[i] > m ? v.v[i] : m;
  return m;
}
inline F8 Exp(F8 x) {
  F8 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = std::exp(x.v[i]);
  return r;
}

#endif  // CARPOOL_SIMD_AVX2

// tanh(x) as 1 - 2 / (e^(2x) + 1): within ~2e-7 absolute (not relative: tiny |x| lose digits),
// exactly +-1 for |x| beyond ~9 (Exp's saturation included).
inline F8 Tanh(F8 x) {
  const F8 one = Set1(1.0f);
  return Sub(one, Div(Set1(2.0f), Add(Exp(Add(x, x)), one)));
}

// Dot product of a[0..n) and b[0..n), accumulated lane-wise and reduced with HSum. The result
// depends only on the values and n.
inline float Dot(const float* a, const float* b, int64_t n) {
  F8 acc = Zero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc = Fma(Load(a + i), Load(b + i), acc);
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    acc = Fma(LoadPartial(a + i, rest), LoadPartial(b + i, rest), acc);
  }
  return HSum(acc);
}

}  // namespace carpool::kernels::cpu::simd

#endif  // CARPOOL_KERNELS_CPU_SIMD_H_
