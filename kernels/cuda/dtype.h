// 16-bit storage types of the CUDA kernels, as seen from host code.
//
// BFloat16 and Half hold the raw bits of a bf16 / IEEE fp16 value. They have the size and
// alignment of CUDA's __nv_bfloat16 / __half, so device buffers of either are interchangeable;
// the kernels reinterpret them. Host code never does arithmetic on them: it converts to float.
// The conversions round to nearest even and keep NaN a NaN. No CUDA header is needed.
#ifndef CARPOOL_KERNELS_CUDA_DTYPE_H_
#define CARPOOL_KERNELS_CUDA_DTYPE_H_

#include <bit>
#include <cstdint>

namespace carpool::kernels::cuda {

struct BFloat16 {
  uint16_t bits = 0;
};
struct Half {
  uint16_t bits = 0;
};
static_assert(sizeof(BFloat16) == 2 && alignof(BFloat16) == 2);
static_assert(sizeof(Half) == 2 && alignof(Half) == 2);

inline float ToFloat(float x) { return x; }

inline float ToFloat(BFloat16 x) { return std::bit_cast<float>(uint32_t{x.bits} << 16); }

inline BFloat16 ToBFloat16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((bits >> 16) | 0x40)};
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // to nearest, ties to even
  return {static_cast<uint16_t>((bits + rounding) >> 16)};
}

inline float ToFloat(Half x) {
  const uint32_t sign = uint32_t{x.bits & 0x8000u} << 16;
  const uint32_t exponent = (x.bits >> 10) & 0x1fu;
  const uint32_t mantissa = x.bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign != 0 ? -magnitude : magnitude;
}

inline Half ToHalf(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): round abs / 2^-24 to an integer, ties to even.
    const float scaled = std::bit_cast<float>(abs) * 0x1p24f;  // exact: a power-of-two scale
    const uint32_t whole = static_cast<uint32_t>(scaled);
    const float fraction = scaled - static_cast<float>(whole);
    const uint32_t rounded = whole + (fraction > 0.5f || (fraction == 0.5f && (whole & 1u)));
    return {static_cast<uint16_t>(sign | rounded)};
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  const uint32_t rebiased = abs - (112u << 23);
  const uint32_t rounding = 0xfffu + ((rebiased >> 13) & 1u);
  return {static_cast<uint16_t>(sign | ((rebiased + rounding) >> 13))};
}

// FromFloat<T>(x): x rounded to the storage type T (float, Half or BFloat16).
template <typename T>
T FromFloat(float x);
template <>
inline float FromFloat<float>(float x) {
  return x;
}
template <>
inline BFloat16 FromFloat<BFloat16>(float x) {
  return ToBFloat16(x);
}
template <>
inline Half FromFloat<Half>(float x) {
  return ToHalf(x);
}

}  // namespace carpool::kernels::cuda

#endif  // CARPOOL_KERNELS_CUDA_DTYPE_H_
