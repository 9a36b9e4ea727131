#include "tests/testing/reference_llama.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

namespace carpool::testing {

ReferenceLlama::ReferenceLlama(const worker::ModelConfig& config,
                               std::map<std::string, std::vector<float>> tensors)
    : config_(config), tensors_(std::move(tensors)) {}

const std::vector<float>& ReferenceLlama::W(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::cerr << "reference model: no tensor " << name << "\n";
    std::abort();
  }
  return it->second;
}

std::vector<double> ReferenceLlama::Mat(const std::string& name,
                                        const std::vector<double>& x) const {
  const std::vector<float>& w = W(name + ".weight");
  const size_t in = x.size();
  const size_t out = w.size() / in;
  std::vector<double> y(out, 0.0);
  for (size_t o = 0; o < out; ++o) {
    double acc = 0.0;
    for (size_t i = 0; i < in; ++i) acc += static_cast<double>(w[o * in + i]) * x[i];
    y[o] = acc;
  }
  if (tensors_.count(name + ".bias")) {
    const std::vector<float>& b = W(name + ".bias");
    for (size_t o = 0; o < out; ++o) y[o] += b[o];
  }
  return y;
}

std::vector<double> ReferenceLlama::Norm(const std::string& name,
                                         const std::vector<double>& x) const {
  const std::vector<float>& w = W(name);
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + config_.rms_norm_eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

void ReferenceLlama::Rope(std::vector<double>* v, int heads, int pos) const {
  const int d = config_.head_dim;
  const int half = d / 2;
  double factor = 1.0;
  if (config_.rope_scaling.type == worker::RopeScaling::Type::kLinear) {
    factor = config_.rope_scaling.factor;
  }
  for (int h = 0; h < heads; ++h) {
    double* x = v->data() + static_cast<size_t>(h) * d;
    for (int i = 0; i < half; ++i) {
      const double inv_freq = std::pow(config_.rope_theta, -2.0 * i / d) / factor;
      const double angle = pos * inv_freq;
      const double a = x[i], b = x[i + half];
      x[i] = a * std::cos(angle) - b * std::sin(angle);
      x[i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
  }
}

std::vector<std::vector<double>> ReferenceLlama::Layers(const std::vector<int32_t>& tokens) const {
  const worker::ModelConfig& c = config_;
  const int n = static_cast<int>(tokens.size());
  const int d = c.head_dim;
  const int group = c.num_heads / c.num_kv_heads;
  const std::vector<float>& emb = W("model.embed_tokens.weight");
  std::vector<std::vector<double>> x(n, std::vector<double>(c.hidden_size));
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < c.hidden_size; ++i) {
      x[t][i] = emb[static_cast<size_t>(tokens[t]) * c.hidden_size + i];
    }
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const std::vector<double> h = Norm(p + "input_layernorm.weight", x[t]);
      q[t] = Mat(p + "self_attn.q_proj", h);
      k[t] = Mat(p + "self_attn.k_proj", h);
      v[t] = Mat(p + "self_attn.v_proj", h);
      Rope(&q[t], c.num_heads, t);
      Rope(&k[t], c.num_kv_heads, t);
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> attn(static_cast<size_t>(c.num_heads) * d, 0.0);
      for (int hd = 0; hd < c.num_heads; ++hd) {
        const int kvh = hd / group;
        std::vector<double> scores(t + 1);
        for (int s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (int i = 0; i < d; ++i) dot += q[t][hd * d + i] * k[s][kvh * d + i];
          scores[s] = dot / std::sqrt(static_cast<double>(d));
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double& sc : scores) sum += (sc = std::exp(sc - mx));
        for (int s = 0; s <= t; ++s) {
          for (int i = 0; i < d; ++i) attn[hd * d + i] += scores[s] / sum * v[s][kvh * d + i];
        }
      }
      const std::vector<double> o = Mat(p + "self_attn.o_proj", attn);
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += o[i];
      const std::vector<double> h = Norm(p + "post_attention_layernorm.weight", x[t]);
      std::vector<double> g = Mat(p + "mlp.gate_proj", h);
      const std::vector<double> u = Mat(p + "mlp.up_proj", h);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const std::vector<double> m = Mat(p + "mlp.down_proj", g);
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += m[i];
    }
  }
  return x;
}

std::vector<double> ReferenceLlama::Embedding(const std::vector<int32_t>& tokens, Pooling pooling,
                                              bool normalize) const {
  const std::vector<std::vector<double>> x = Layers(tokens);
  std::vector<double> pooled(config_.hidden_size, 0.0);
  if (pooling == Pooling::kLast) {
    pooled = Norm("model.norm.weight", x.back());
  } else {
    for (const std::vector<double>& row : x) {
      const std::vector<double> h = Norm("model.norm.weight", row);
      for (size_t i = 0; i < h.size(); ++i) pooled[i] += h[i] / static_cast<double>(x.size());
    }
  }
  if (normalize) {
    double ss = 0.0;
    for (double v : pooled) ss += v * v;
    const double norm = std::sqrt(ss);
    if (norm > 0.0) {
      for (double& v : pooled) v /= norm;
    }
  }
  return pooled;
}

std::vector<double> ReferenceLlama::NextLogprobs(const std::vector<int32_t>& tokens) const {
  const std::vector<std::vector<double>> x = Layers(tokens);
  const int n = static_cast<int>(x.size());
  const std::vector<double> h = Norm("model.norm.weight", x[n - 1]);
  const bool tied = tensors_.count("lm_head.weight") == 0;
  std::vector<double> logits = Mat(tied ? "model.embed_tokens" : "lm_head", h);
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (double l : logits) sum += std::exp(l - mx);
  const double lse = mx + std::log(sum);
  for (double& l : logits) l -= lse;
  return logits;
}

ReferenceLlama::Greedy ReferenceLlama::Generate(const std::vector<int32_t>& prompt, int n,
                                                bool ignore_eos) const {
  Greedy out;
  std::vector<int32_t> tokens = prompt;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> lp = NextLogprobs(tokens);
    const int32_t next =
        static_cast<int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
    out.tokens.push_back(next);
    out.logprobs.push_back(lp[next]);
    tokens.push_back(next);
    const auto& eos = config_.eos_token_ids;
    if (!ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
  }
  return out;
}

}  // namespace carpool::testing
