// Naive float64 kernels: one loop per formula, no blocking, no threads.

#include "kernels/reference/reference_kernels.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace carpool::kernels::reference {

std::vector<double> Linear(const float* x, const float* w, const float* bias, int64_t m, int64_t n,
                           int64_t k) {
  std::vector<double> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias != nullptr ? bias[j] : 0.0;
      for (int64_t l = 0; l < k; ++l) sum += double{x[i * k + l]} * double{w[j * k + l]};
      y[i * n + j] = sum;
    }
  }
  return y;
}

namespace {

std::vector<double> RmsNormOfDoubles(const std::vector<double>& x, const float* weight, double eps,
                                     int64_t t, int64_t h) {
  std::vector<double> out(t * h);
  for (int64_t r = 0; r < t; ++r) {
    double sum_squares = 0.0;
    for (int64_t i = 0; i < h; ++i) sum_squares += x[r * h + i] * x[r * h + i];
    const double inv_rms = 1.0 / std::sqrt(sum_squares / static_cast<double>(h) + eps);
    for (int64_t i = 0; i < h; ++i) out[r * h + i] = x[r * h + i] * inv_rms * weight[i];
  }
  return out;
}

}  // namespace

std::vector<double> RmsNorm(const float* x, const float* weight, double eps, int64_t t, int64_t h) {
  return RmsNormOfDoubles(std::vector<double>(x, x + t * h), weight, eps, t, h);
}

std::pair<std::vector<double>, std::vector<double>> AddRmsNorm(const float* x,
                                                               const float* residual,
                                                               const float* weight, double eps,
                                                               int64_t t, int64_t h) {
  std::vector<double> sum(t * h);
  for (int64_t i = 0; i < t * h; ++i) sum[i] = double{residual[i]} + double{x[i]};
  std::vector<double> normed = RmsNormOfDoubles(sum, weight, eps, t, h);
  return {std::move(sum), std::move(normed)};
}

std::vector<double> RotaryEmbedding(const float* x, const int32_t* positions, const float* inv_freq,
                                    int64_t t, int num_heads, int head_dim, int rotary_dim) {
  std::vector<double> out(x, x + t * num_heads * head_dim);
  const int half = rotary_dim / 2;
  for (int64_t r = 0; r < t; ++r) {
    for (int h = 0; h < num_heads; ++h) {
      const int64_t base = (r * num_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        // The contract rounds the angle to fp32 (as HF does); only the trigonometry is double.
        const double angle = static_cast<float>(positions[r]) * inv_freq[i];
        const double a = x[base + i];
        const double b = x[base + i + half];
        out[base + i] = a * std::cos(angle) - b * std::sin(angle);
        out[base + i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  return out;
}

std::vector<double> SiluMul(const float* gate, const float* up, int64_t t, int64_t inter) {
  std::vector<double> out(t * inter);
  for (int64_t i = 0; i < t * inter; ++i) {
    const double g = gate[i];
    out[i] = g / (1.0 + std::exp(-g)) * up[i];
  }
  return out;
}

std::vector<double> GeluTanhMul(const float* gate, const float* up, int64_t t, int64_t inter) {
  const double k = std::sqrt(2.0 / std::acos(-1.0));
  std::vector<double> out(t * inter);
  for (int64_t i = 0; i < t * inter; ++i) {
    const double g = gate[i];
    out[i] = 0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g))) * up[i];
  }
  return out;
}

std::vector<double> SoftCap(const float* x, double cap, int64_t n) {
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = cap * std::tanh(x[i] / cap);
  return out;
}

std::vector<double> EmbeddingGather(const float* table, const int32_t* ids, int64_t t, int64_t h) {
  std::vector<double> out(t * h);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < h; ++i) out[r * h + i] = table[int64_t{ids[r]} * h + i];
  }
  return out;
}

namespace {

// Start of the key or value row of (position, kv_head) for a sequence's block table.
int64_t CacheOffset(const KvCacheLayout& c, const int32_t* block_table, int position, int kv_head) {
  const int64_t block = block_table[position / c.block_size];
  const int64_t offset = position % c.block_size;
  return ((block * c.block_size + offset) * c.num_kv_heads + kv_head) * c.head_dim;
}

}  // namespace

std::vector<double> PagedAttention(const float* q, const float* key_cache, const float* value_cache,
                                   const AttentionParams& params) {
  const KvCacheLayout& c = params.cache;
  const int d = c.head_dim;
  const int group = params.num_heads / c.num_kv_heads;
  int64_t num_tokens = 0;
  for (int s = 0; s < params.num_seqs; ++s) {
    num_tokens =
        std::max<int64_t>(num_tokens, params.seqs[s].query_start + params.seqs[s].query_len);
  }
  std::vector<double> out(num_tokens * params.num_heads * d, 0.0);
  for (int s = 0; s < params.num_seqs; ++s) {
    const AttentionSeq& seq = params.seqs[s];
    for (int j = 0; j < seq.query_len; ++j) {
      const int64_t row = seq.query_start + j;
      const int last = seq.context_len - seq.query_len + j;  // attends to first .. last
      const int first =
          params.sliding_window > 0 ? std::max(0, last - params.sliding_window + 1) : 0;
      for (int h = 0; h < params.num_heads; ++h) {
        const int kv_head = h / group;
        const float* qh = q + (row * params.num_heads + h) * d;
        // scores[p - first] for p in [first, last].
        std::vector<double> scores(last - first + 1);
        for (int p = first; p <= last; ++p) {
          const float* k = key_cache + CacheOffset(c, seq.block_table, p, kv_head);
          double dot = 0.0;
          for (int i = 0; i < d; ++i) dot += double{qh[i]} * double{k[i]};
          double score = dot * params.scale;
          if (params.logit_softcap > 0.0f) {
            score = params.logit_softcap * std::tanh(score / params.logit_softcap);
          }
          scores[p - first] = score;
        }
        const double max = *std::max_element(scores.begin(), scores.end());
        double total = 0.0;
        for (double& sc : scores) {
          sc = std::exp(sc - max);
          total += sc;
        }
        double* o = &out[(row * params.num_heads + h) * d];
        for (int p = first; p <= last; ++p) {
          const float* v = value_cache + CacheOffset(c, seq.block_table, p, kv_head);
          for (int i = 0; i < d; ++i) o[i] += scores[p - first] / total * v[i];
        }
      }
    }
  }
  return out;
}

std::vector<double> LogSoftmax(const float* x, int64_t rows, int64_t n) {
  std::vector<double> out(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    const double max = *std::max_element(row, row + n);
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += std::exp(row[i] - max);
    const double log_sum = max + std::log(total);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = row[i] - log_sum;
  }
  return out;
}

}  // namespace carpool::kernels::reference
