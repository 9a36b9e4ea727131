// Row-wise and elementwise kernels: embedding gather, (add +) RMSNorm, per-head RMSNorm, RoPE,
// SiLU·mul and GELU-tanh·mul, softcap, scale, KV-cache writes and dtype conversion. Memory-bound;
// one thread block per row where a row is reduced.
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"

namespace carpool::kernels::cuda::internal {
namespace {

constexpr int kRowThreads = 256;
constexpr int kElementThreads = 256;
// Grid-stride kernels use at most this many blocks.
constexpr int64_t kMaxElementBlocks = 65536;

unsigned ElementBlocks(int64_t n) {
  const int64_t blocks = (n + kElementThreads - 1) / kElementThreads;
  return static_cast<unsigned>(blocks < kMaxElementBlocks ? (blocks > 0 ? blocks : 1)
                                                          : kMaxElementBlocks);
}

template <typename T>
__global__ void EmbeddingGatherKernel(const T* table, int64_t vocab, const int32_t* ids, T* out,
                                      int64_t h) {
  const int64_t row = blockIdx.x;
  const int64_t id = ids[row];
  T* dst = out + row * h;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dst[i] = Store<T>(0.0f);
    return;
  }
  const T* src = table + id * h;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dst[i] = src[i];
}

// residual == nullptr: plain RMSNorm of x.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    AddRmsNormKernel(const T* x, T* residual, const float* weight, float eps, T* out, int64_t h) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  float sum_squares = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    float v = Load(x[base + i]);
    if (residual != nullptr) {
      const T sum = Store<T>(Load(residual[base + i]) + v);
      residual[base + i] = sum;
      v = Load(sum);
    }
    sum_squares += v * v;
  }
  sum_squares = BlockSum(sum_squares, scratch);
  const float inv_rms = 1.0f / sqrtf(sum_squares / static_cast<float>(h) + eps);
  // Each thread reads back only the elements it wrote, so no barrier is needed.
  const T* normed = residual != nullptr ? residual : x;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    out[base + i] = Store<T>(Load(normed[base + i]) * inv_rms * weight[i]);
  }
}

template <typename T>
__global__ void RotaryKernel(T* x, const int32_t* positions, const float* inv_freq, int num_heads,
                             int head_dim, int half) {
  const int64_t row = blockIdx.x;
  const float position = static_cast<float>(positions[row]);
  T* base = x + row * num_heads * head_dim;
  for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int head = idx / half;
    const int i = idx % half;
    const float angle = position * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    T* pair = base + head * head_dim;
    const float a = Load(pair[i]);
    const float b = Load(pair[i + half]);
    pair[i] = Store<T>(a * c - b * s);
    pair[i + half] = Store<T>(b * c + a * s);
  }
}

template <typename T>
__global__ void SiluMulKernel(const T* gate, const T* up, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = Load(gate[i]);
    out[i] = Store<T>(g / (1.0f + expf(-g)) * Load(up[i]));
  }
}

template <typename T>
__global__ void GeluTanhMulKernel(const T* gate, const T* up, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = Load(gate[i]);
    // 0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)), u = sqrt(2 / pi) (g + 0.044715 g^3).
    const float u = 0.7978845608028654f * fmaf(0.044715f, g * g * g, g);
    out[i] = Store<T>(g / (1.0f + expf(-2.0f * u)) * Load(up[i]));
  }
}

template <typename T>
__global__ void SoftCapKernel(T* x, float cap, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = Store<T>(cap * tanhf(Load(x[i]) / cap));
  }
}

template <typename T>
__global__ void ScaleKernel(T* x, float factor, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = Store<T>(Load(x[i]) * factor);
  }
}

// One warp per row of head_dim features (a head of one token), in place.
constexpr int kHeadNormWarps = kRowThreads / 32;
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    HeadRmsNormKernel(T* x, const float* weight, float eps, int64_t rows, int head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kHeadNormWarps + threadIdx.x / 32;
  if (row >= rows) return;  // a whole warp leaves together
  const int lane = threadIdx.x % 32;
  T* v = x + row * head_dim;
  float sum_squares = 0.0f;
  for (int i = lane; i < head_dim; i += 32) {
    const float e = Load(v[i]);
    sum_squares += e * e;
  }
  sum_squares = WarpSum(sum_squares);
  const float inv_rms = 1.0f / sqrtf(sum_squares / static_cast<float>(head_dim) + eps);
  for (int i = lane; i < head_dim; i += 32) {
    v[i] = Store<T>(Load(v[i]) * inv_rms * weight[i]);
  }
}

// Slot s of the pool is row s of [num_blocks * block_size, num_kv_heads * head_dim].
template <typename T>
__global__ void WriteKvCacheKernel(const T* k, const T* v, const int64_t* slots, int64_t width,
                                   int64_t num_slots, T* key_cache, T* value_cache) {
  const int64_t row = blockIdx.x;
  const int64_t slot = slots[row];
  if (slot < 0 || slot >= num_slots) return;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    key_cache[slot * width + i] = k[row * width + i];
    value_cache[slot * width + i] = v[row * width + i];
  }
}

template <typename From, typename To>
__global__ void ConvertKernel(const From* in, To* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = Store<To>(Load(in[i]));
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchEmbeddingGather(const T* table, int64_t vocab, const int32_t* ids, T* out,
                                  int64_t t, int64_t h, cudaStream_t stream) {
  EmbeddingGatherKernel<<<static_cast<unsigned>(t), kRowThreads, 0, stream>>>(
      ToDevice(table), vocab, ids, ToDevice(out), h);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchAddRmsNorm(const T* x, T* residual, const float* weight, float eps, T* out,
                             int64_t t, int64_t h, cudaStream_t stream) {
  AddRmsNormKernel<<<static_cast<unsigned>(t), kRowThreads, 0, stream>>>(
      ToDevice(x), ToDevice(residual), weight, eps, ToDevice(out), h);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchRotaryEmbedding(T* x, const int32_t* positions, const float* inv_freq, int64_t t,
                                  int num_heads, int head_dim, int rotary_dim,
                                  cudaStream_t stream) {
  RotaryKernel<<<static_cast<unsigned>(t), kRowThreads, 0, stream>>>(
      ToDevice(x), positions, inv_freq, num_heads, head_dim, rotary_dim / 2);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchSiluMul(const T* gate, const T* up, T* out, int64_t n, cudaStream_t stream) {
  SiluMulKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(ToDevice(gate), ToDevice(up),
                                                                  ToDevice(out), n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchGeluTanhMul(const T* gate, const T* up, T* out, int64_t n, cudaStream_t stream) {
  GeluTanhMulKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(ToDevice(gate), ToDevice(up),
                                                                      ToDevice(out), n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchSoftCap(T* x, float cap, int64_t n, cudaStream_t stream) {
  SoftCapKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(ToDevice(x), cap, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchScale(T* x, float factor, int64_t n, cudaStream_t stream) {
  ScaleKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(ToDevice(x), factor, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchHeadRmsNorm(T* x, const float* weight, float eps, int64_t rows, int head_dim,
                              cudaStream_t stream) {
  HeadRmsNormKernel<<<CeilDiv(rows, kHeadNormWarps), kRowThreads, 0, stream>>>(ToDevice(x), weight,
                                                                               eps, rows, head_dim);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchWriteKvCache(const T* k, const T* v, const int64_t* slots, int64_t t,
                               const KvCacheLayout& layout, T* key_cache, T* value_cache,
                               cudaStream_t stream) {
  const int64_t width = static_cast<int64_t>(layout.num_kv_heads) * layout.head_dim;
  const int64_t num_slots = static_cast<int64_t>(layout.num_blocks) * layout.block_size;
  WriteKvCacheKernel<<<static_cast<unsigned>(t), kRowThreads, 0, stream>>>(
      ToDevice(k), ToDevice(v), slots, width, num_slots, ToDevice(key_cache),
      ToDevice(value_cache));
  return cudaGetLastError();
}

template <typename From, typename To>
cudaError_t LaunchConvert(const From* in, To* out, int64_t n, cudaStream_t stream) {
  ConvertKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(ToDevice(in), ToDevice(out), n);
  return cudaGetLastError();
}

#define CARPOOL_INSTANTIATE_ELEMENTWISE(T)                                                        \
  template cudaError_t LaunchEmbeddingGather<T>(const T*, int64_t, const int32_t*, T*, int64_t,   \
                                                int64_t, cudaStream_t);                           \
  template cudaError_t LaunchAddRmsNorm<T>(const T*, T*, const float*, float, T*, int64_t,        \
                                           int64_t, cudaStream_t);                                \
  template cudaError_t LaunchRotaryEmbedding<T>(T*, const int32_t*, const float*, int64_t, int,   \
                                                int, int, cudaStream_t);                          \
  template cudaError_t LaunchSiluMul<T>(const T*, const T*, T*, int64_t, cudaStream_t);           \
  template cudaError_t LaunchGeluTanhMul<T>(const T*, const T*, T*, int64_t, cudaStream_t);       \
  template cudaError_t LaunchSoftCap<T>(T*, float, int64_t, cudaStream_t);                        \
  template cudaError_t LaunchScale<T>(T*, float, int64_t, cudaStream_t);                          \
  template cudaError_t LaunchHeadRmsNorm<T>(T*, const float*, float, int64_t, int, cudaStream_t); \
  template cudaError_t LaunchWriteKvCache<T>(const T*, const T*, const int64_t*, int64_t,         \
                                             const KvCacheLayout&, T*, T*, cudaStream_t);

CARPOOL_INSTANTIATE_ELEMENTWISE(float)
CARPOOL_INSTANTIATE_ELEMENTWISE(Half)
CARPOOL_INSTANTIATE_ELEMENTWISE(BFloat16)
#undef CARPOOL_INSTANTIATE_ELEMENTWISE

#define CARPOOL_INSTANTIATE_CONVERT(From, To) \
  template cudaError_t LaunchConvert<From, To>(const From*, To*, int64_t, cudaStream_t);
CARPOOL_INSTANTIATE_CONVERT(float, float)
CARPOOL_INSTANTIATE_CONVERT(float, Half)
CARPOOL_INSTANTIATE_CONVERT(float, BFloat16)
CARPOOL_INSTANTIATE_CONVERT(Half, float)
CARPOOL_INSTANTIATE_CONVERT(Half, Half)
CARPOOL_INSTANTIATE_CONVERT(Half, BFloat16)
CARPOOL_INSTANTIATE_CONVERT(BFloat16, float)
CARPOOL_INSTANTIATE_CONVERT(BFloat16, Half)
CARPOOL_INSTANTIATE_CONVERT(BFloat16, BFloat16)
#undef CARPOOL_INSTANTIATE_CONVERT

// The asynchronous step's gather (worker/model/model_device.h, PendingTokenId): an id < 0 is
// the previous step's sampled token -(id + 1); one outside its rows becomes 0.
__global__ void GatherPendingTokensKernel(int32_t* ids, int64_t n, const SampledToken* previous,
                                          int64_t num_previous) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = ids[i];
    if (id >= 0) continue;
    const int64_t row = -static_cast<int64_t>(id) - 1;
    ids[i] = row < num_previous ? previous[row].token : 0;
  }
}

cudaError_t LaunchGatherPendingTokens(int32_t* ids, int64_t n, const SampledToken* previous,
                                      int64_t num_previous, cudaStream_t stream) {
  GatherPendingTokensKernel<<<ElementBlocks(n), kElementThreads, 0, stream>>>(ids, n, previous,
                                                                              num_previous);
  return cudaGetLastError();
}

}  // namespace carpool::kernels::cuda::internal
