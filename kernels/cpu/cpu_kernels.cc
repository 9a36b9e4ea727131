// Row-wise fp32 CPU kernels. Linear is in linear.cc, attention in attention.cc.
//
// Every kernel here treats rows independently, in a fixed order within a row, so a row's result
// never depends on the batch around it.

#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/simd.h"

namespace carpool::kernels::cpu {
namespace {

using simd::F8;

// Below this many elements of work the pool's hand-off costs more than it saves.
constexpr int64_t kMinParallelElements = 1 << 15;

// Calls fn(begin, end) over [0, rows), on the pool when rows * row_cost is large enough.
void ForRows(ThreadPool* pool, int64_t rows, int64_t row_cost,
             const std::function<void(int64_t, int64_t)>& fn) {
  if (rows <= 0) return;
  if (rows == 1 || rows * row_cost < kMinParallelElements) {
    fn(0, rows);
  } else {
    ParallelFor(pool, rows, fn);
  }
}

// Sum of squares of x[0..n), lane-wise then simd::HSum.
float SumOfSquares(const float* x, int64_t n) { return simd::Dot(x, x, n); }

// out[i] = x[i] * s * weight[i]. out may alias x.
void ScaleByWeight(const float* x, float s, const float* weight, float* out, int64_t n) {
  const F8 sv = simd::Set1(s);
  int64_t i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes) {
    simd::Store(out + i, simd::Mul(simd::Mul(simd::Load(x + i), sv), simd::Load(weight + i)));
  }
  for (; i < n; ++i) out[i] = x[i] * s * weight[i];
}

void RmsNormRow(const float* x, const float* weight, float eps, float* out, int64_t h) {
  const float mean_square = SumOfSquares(x, h) / static_cast<float>(h);
  ScaleByWeight(x, 1.0f / std::sqrt(mean_square + eps), weight, out, h);
}

// Rotates every head of one token with the token's cos/sin tables ([half] each).
void RotateToken(float* x, const float* cos, const float* sin, int num_heads, int head_dim,
                 int half) {
  for (int h = 0; h < num_heads; ++h) {
    float* lo = x + static_cast<int64_t>(h) * head_dim;
    float* hi = lo + half;
    for (int i = 0; i < half; ++i) {
      const float a = lo[i];
      const float b = hi[i];
      lo[i] = a * cos[i] - b * sin[i];
      hi[i] = b * cos[i] + a * sin[i];
    }
  }
}

// Largest of x[0..n). REQUIRES: n >= 1. Unspecified if x holds a NaN.
float RowMax(const float* x, int64_t n) {
  int64_t i = 0;
  float max = x[0];
  if (n >= simd::kLanes) {
    F8 acc = simd::Load(x);
    for (i = simd::kLanes; i + simd::kLanes <= n; i += simd::kLanes) {
      acc = simd::Max(acc, simd::Load(x + i));
    }
    max = simd::HMax(acc);
  }
  for (; i < n; ++i) max = std::max(max, x[i]);
  return max;
}

// out[i] = act(gate[i]) * up[i] for i in [0, n), eight lanes at a time. out may alias gate or up.
template <typename Act>
void GatedMul(const float* gate, const float* up, float* out, int64_t n, ThreadPool* pool,
              Act act) {
  const int64_t vectors = (n + simd::kLanes - 1) / simd::kLanes;
  ForRows(pool, vectors, simd::kLanes, [&](int64_t begin, int64_t end) {
    for (int64_t v = begin; v < end; ++v) {
      const int64_t i = v * simd::kLanes;
      const int lanes = static_cast<int>(std::min<int64_t>(simd::kLanes, n - i));
      const F8 g = simd::LoadPartial(gate + i, lanes);
      const F8 u = simd::LoadPartial(up + i, lanes);
      simd::StorePartial(out + i, simd::Mul(act(g), u), lanes);
    }
  });
}

}  // namespace

void RmsNorm(const float* x, const float* weight, float eps, float* out, int64_t t, int64_t h,
             ThreadPool* pool) {
  ForRows(pool, t, h, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) RmsNormRow(x + r * h, weight, eps, out + r * h, h);
  });
}

void AddRmsNorm(const float* x, float* residual, const float* weight, float eps, float* out,
                int64_t t, int64_t h, ThreadPool* pool) {
  ForRows(pool, t, h, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* res = residual + r * h;
      const float* xr = x + r * h;
      for (int64_t i = 0; i < h; ++i) res[i] += xr[i];
      RmsNormRow(res, weight, eps, out + r * h, h);
    }
  });
}

void HeadRmsNorm(float* x, const float* weight, float eps, int64_t t, int num_heads, int head_dim,
                 ThreadPool* pool) {
  // [T, heads, D] is [T * heads] rows of D; each row is normalized in place.
  RmsNorm(x, weight, eps, x, t * num_heads, head_dim, pool);
}

void RotaryEmbedding(float* x, const int32_t* positions, const float* inv_freq, int64_t t,
                     int num_heads, int head_dim, int rotary_dim, ThreadPool* pool) {
  const int half = rotary_dim / 2;
  ForRows(pool, t, static_cast<int64_t>(num_heads) * head_dim, [&](int64_t begin, int64_t end) {
    std::vector<float> cos(half);
    std::vector<float> sin(half);
    for (int64_t r = begin; r < end; ++r) {
      for (int i = 0; i < half; ++i) {
        // The angle is rounded to fp32 first, as the HF reference does; see the header.
        const float angle = static_cast<float>(positions[r]) * inv_freq[i];
        cos[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      RotateToken(x + r * num_heads * head_dim, cos.data(), sin.data(), num_heads, head_dim, half);
    }
  });
}

void SiluMul(const float* gate, const float* up, float* out, int64_t t, int64_t inter,
             ThreadPool* pool) {
  GatedMul(gate, up, out, t * inter, pool, [](F8 g) {
    return simd::Div(g, simd::Add(simd::Set1(1.0f), simd::Exp(simd::Sub(simd::Zero(), g))));
  });
}

void GeluTanhMul(const float* gate, const float* up, float* out, int64_t t, int64_t inter,
                 ThreadPool* pool) {
  GatedMul(gate, up, out, t * inter, pool, [](F8 g) {
    // 0.5 g (1 + tanh(u)) = g / (1 + e^(-2u)), u = sqrt(2 / pi) (g + 0.044715 g^3).
    const F8 g3 = simd::Mul(simd::Mul(g, g), g);
    const F8 u =
        simd::Mul(simd::Set1(0.7978845608028654f), simd::Fma(simd::Set1(0.044715f), g3, g));
    const F8 e = simd::Exp(simd::Mul(simd::Set1(-2.0f), u));
    return simd::Div(g, simd::Add(simd::Set1(1.0f), e));
  });
}

void SoftCap(float* x, float cap, int64_t n, ThreadPool* pool) {
  const int64_t vectors = (n + simd::kLanes - 1) / simd::kLanes;
  ForRows(pool, vectors, simd::kLanes, [&](int64_t begin, int64_t end) {
    const F8 c = simd::Set1(cap);
    const F8 inv = simd::Set1(1.0f / cap);
    for (int64_t v = begin; v < end; ++v) {
      const int64_t i = v * simd::kLanes;
      const int lanes = static_cast<int>(std::min<int64_t>(simd::kLanes, n - i));
      const F8 capped = simd::Mul(c, simd::Tanh(simd::Mul(simd::LoadPartial(x + i, lanes), inv)));
      simd::StorePartial(x + i, capped, lanes);
    }
  });
}

void Scale(float* x, float factor, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void EmbeddingGather(const float* table, const int32_t* ids, float* out, int64_t t, int64_t h) {
  for (int64_t r = 0; r < t; ++r) {
    std::memcpy(out + r * h, table + static_cast<int64_t>(ids[r]) * h, h * sizeof(float));
  }
}

void WriteKvCache(const float* k, const float* v, const int64_t* slots, int64_t t,
                  const KvCacheLayout& layout, float* key_cache, float* value_cache) {
  // Slot s is row s of a [num_blocks * block_size, num_kv_heads * head_dim] view of the pool.
  const int64_t row = static_cast<int64_t>(layout.num_kv_heads) * layout.head_dim;
  for (int64_t r = 0; r < t; ++r) {
    if (slots[r] < 0) continue;
    std::memcpy(key_cache + slots[r] * row, k + r * row, row * sizeof(float));
    std::memcpy(value_cache + slots[r] * row, v + r * row, row * sizeof(float));
  }
}

void WriteKvCacheBf16(const float* k, const float* v, const int64_t* slots, int64_t t,
                      const KvCacheLayout& layout, uint16_t* key_cache, uint16_t* value_cache) {
  const int64_t row = static_cast<int64_t>(layout.num_kv_heads) * layout.head_dim;
  for (int64_t r = 0; r < t; ++r) {
    if (slots[r] < 0) continue;
    FloatToBf16(k + r * row, row, key_cache + slots[r] * row);
    FloatToBf16(v + r * row, row, value_cache + slots[r] * row);
  }
}

void LogSoftmax(float* x, int64_t rows, int64_t n, ThreadPool* pool) {
  ForRows(pool, rows, n, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = x + r * n;
      const float max = RowMax(row, n);
      F8 sum = simd::Zero();
      for (int64_t i = 0; i < n; i += simd::kLanes) {
        const int lanes = static_cast<int>(std::min<int64_t>(simd::kLanes, n - i));
        const F8 shifted = simd::Sub(simd::LoadPartial(row + i, lanes), simd::Set1(max));
        // Lanes past n hold exp(0 - max); mask them out by storing only the live lanes' sum.
        const F8 e = simd::Exp(shifted);
        if (lanes == simd::kLanes) {
          sum = simd::Add(sum, e);
        } else {
          float tail[simd::kLanes] = {};
          simd::StorePartial(tail, e, lanes);
          sum = simd::Add(sum, simd::Load(tail));
        }
      }
      const float log_sum = max + std::log(simd::HSum(sum));
      for (int64_t i = 0; i < n; ++i) row[i] -= log_sum;
    }
  });
}

int64_t Argmax(const float* x, int64_t n) {
  if (n <= 0) return 0;
  const float max = RowMax(x, n);
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] == max) return i;
  }
  // Only reached when x holds a NaN: fall back to a plain scan.
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace carpool::kernels::cpu
