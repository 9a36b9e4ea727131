// Internal device helpers shared by the .cu files: storage-type mapping, fp32 conversion,
// 16-byte vector loads and warp / block reductions.
#ifndef CARPOOL_KERNELS_CUDA_DEVICE_COMMON_CUH_
#define CARPOOL_KERNELS_CUDA_DEVICE_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dtype.h"

namespace carpool::kernels::cuda::internal {

// The CUDA type behind each public storage type (same size and layout).
template <typename T>
struct DeviceTypeOf {
  using type = T;
};
template <>
struct DeviceTypeOf<BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceTypeOf<Half> {
  using type = __half;
};
template <typename T>
using DeviceType = typename DeviceTypeOf<T>::type;

template <typename T>
DeviceType<T>* ToDevice(T* p) {
  return reinterpret_cast<DeviceType<T>*>(p);
}
template <typename T>
const DeviceType<T>* ToDevice(const T* p) {
  return reinterpret_cast<const DeviceType<T>*>(p);
}

__device__ __forceinline__ float Load(float x) { return x; }
__device__ __forceinline__ float Load(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float Load(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T Store(float x);
template <>
__device__ __forceinline__ float Store<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half Store<__half>(float x) {
  return __float2half_rn(x);
}

// Elements of T in one 16-byte vector.
template <typename T>
inline constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// out[j] = float(p[j]) for the kVec16<T> elements at p. REQUIRES: p 16-byte aligned.
template <typename T>
__device__ __forceinline__ void LoadVec16(const T* p, float (&out)[kVec16<T>]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < kVec16<T>; ++j) out[j] = Load(e[j]);
}

// out[j] = float(p[j]) for the N elements at p, in 16-byte loads. REQUIRES: N a multiple of
// kVec16<T>, p 16-byte aligned.
template <typename T, int N>
__device__ __forceinline__ void LoadVec(const T* p, float (&out)[N]) {
  static_assert(N % kVec16<T> == 0);
#pragma unroll
  for (int c = 0; c < N / kVec16<T>; ++c) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p) + c);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < kVec16<T>; ++j) out[c * kVec16<T> + j] = Load(e[j]);
  }
}

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

template <typename V>
__device__ __forceinline__ V WarpSum(V v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ uint64_t WarpMaxU64(uint64_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint64_t other = __shfl_xor_sync(kFullMask, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Block-wide reductions; every thread gets the result. REQUIRES: blockDim.x a multiple of 32,
// called by all threads; `scratch` holds 32 values and is free for reuse after the call.
template <typename V, typename WarpOp, typename Op>
__device__ __forceinline__ V BlockReduce(V v, V* scratch, WarpOp warp_op, Op op) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_op(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  V total = scratch[0];
  for (int w = 1; w < warps; ++w) total = op(total, scratch[w]);
  return total;
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  return BlockReduce(
      v, scratch, [](float x) { return WarpMax(x); }, [](float a, float b) { return fmaxf(a, b); });
}

template <typename V>
__device__ __forceinline__ V BlockSum(V v, V* scratch) {
  return BlockReduce(
      v, scratch, [](V x) { return WarpSum(x); }, [](V a, V b) { return a + b; });
}

__device__ __forceinline__ uint64_t BlockMaxU64(uint64_t v, uint64_t* scratch) {
  return BlockReduce(
      v, scratch, [](uint64_t x) { return WarpMaxU64(x); },
      [](uint64_t a, uint64_t b) { return a > b ? a : b; });
}

inline unsigned CeilDiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace carpool::kernels::cuda::internal

#endif  // CARPOOL_KERNELS_CUDA_DEVICE_COMMON_CUH_
