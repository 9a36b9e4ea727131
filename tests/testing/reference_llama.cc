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
  const double offset = config_.norm_weight_plus_one ? 1.0 : 0.0;
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * (offset + w[i]);
  return y;
}

void ReferenceLlama::HeadNorm(const std::string& name, std::vector<double>* v, int heads) const {
  const int d = config_.head_dim;
  for (int h = 0; h < heads; ++h) {
    const std::vector<double> head(v->begin() + h * d, v->begin() + (h + 1) * d);
    const std::vector<double> normed = Norm(name, head);
    std::copy(normed.begin(), normed.end(), v->begin() + h * d);
  }
}

namespace {

bool Slides(const worker::ModelConfig& c, int layer) {
  return c.sliding_window > 0 && (c.layer_sliding.empty() || c.layer_sliding[layer]);
}

double Softcap(double x, double cap) { return cap > 0.0 ? cap * std::tanh(x / cap) : x; }

// The tanh approximation of GELU (PyTorch's gelu(approximate="tanh")).
double GeluTanh(double x) {
  const double k = std::sqrt(2.0 / std::acos(-1.0));
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

}  // namespace

std::vector<double> ReferenceLlama::InvFreq(int layer) const {
  const worker::ModelConfig& c = config_;
  const int d = c.head_dim;
  const bool local = Slides(c, layer) && c.rope_local_theta > 0.0;
  const double theta = local ? c.rope_local_theta : c.rope_theta;
  const worker::RopeScaling& s = c.rope_scaling;
  std::vector<double> inv(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    double f = std::pow(theta, -2.0 * i / d);
    if (!local && s.type == worker::RopeScaling::Type::kLinear) {
      f /= s.factor;
    } else if (!local && s.type == worker::RopeScaling::Type::kLlama3) {
      // Llama 3.1: wavelengths longer than original_context / low_freq_factor are scaled by
      // 1 / factor, shorter than original_context / high_freq_factor kept, and those between
      // interpolated by where original_context / wavelength falls between the two factors.
      const double wavelength = 2.0 * std::acos(-1.0) / f;
      const double context = s.original_max_position_embeddings;
      if (wavelength > context / s.low_freq_factor) {
        f /= s.factor;
      } else if (wavelength >= context / s.high_freq_factor) {
        const double t = (context / wavelength - s.low_freq_factor) /
                         (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - t) * (f / s.factor) + t * f;
      }
    }
    inv[i] = f;
  }
  return inv;
}

void ReferenceLlama::Rope(std::vector<double>* v, int heads, int pos,
                          const std::vector<double>& inv_freq) const {
  const int d = config_.head_dim;
  const int half = d / 2;
  for (int h = 0; h < heads; ++h) {
    double* x = v->data() + static_cast<size_t>(h) * d;
    for (int i = 0; i < half; ++i) {
      const double angle = pos * inv_freq[i];
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
  const double scale = 1.0 / std::sqrt(c.query_pre_attn_scalar > 0.0 ? c.query_pre_attn_scalar
                                                                       : static_cast<double>(d));
  const std::vector<float>& emb = W("model.embed_tokens.weight");
  std::vector<std::vector<double>> x(n, std::vector<double>(c.hidden_size));
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < c.hidden_size; ++i) {
      x[t][i] = emb[static_cast<size_t>(tokens[t]) * c.hidden_size + i] *
                static_cast<double>(c.embedding_multiplier);
    }
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::vector<double> inv_freq = InvFreq(l);
    // Keys j a query at position t sees: first(t) <= j <= t.
    auto first = [&](int t) { return Slides(c, l) ? std::max(0, t - c.sliding_window + 1) : 0; };
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const std::vector<double> h = Norm(p + "input_layernorm.weight", x[t]);
      q[t] = Mat(p + "self_attn.q_proj", h);
      k[t] = Mat(p + "self_attn.k_proj", h);
      v[t] = Mat(p + "self_attn.v_proj", h);
      if (c.qk_norm) {
        HeadNorm(p + "self_attn.q_norm.weight", &q[t], c.num_heads);
        HeadNorm(p + "self_attn.k_norm.weight", &k[t], c.num_kv_heads);
      }
      Rope(&q[t], c.num_heads, t, inv_freq);
      Rope(&k[t], c.num_kv_heads, t, inv_freq);
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> attn(static_cast<size_t>(c.num_heads) * d, 0.0);
      const int begin = first(t);
      for (int hd = 0; hd < c.num_heads; ++hd) {
        const int kvh = hd / group;
        std::vector<double> scores(t + 1 - begin);
        for (int s = begin; s <= t; ++s) {
          double dot = 0.0;
          for (int i = 0; i < d; ++i) dot += q[t][hd * d + i] * k[s][kvh * d + i];
          scores[s - begin] = Softcap(dot * scale, c.attn_logit_softcapping);
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double& sc : scores) sum += (sc = std::exp(sc - mx));
        for (int s = begin; s <= t; ++s) {
          for (int i = 0; i < d; ++i) {
            attn[hd * d + i] += scores[s - begin] / sum * v[s][kvh * d + i];
          }
        }
      }
      std::vector<double> o = Mat(p + "self_attn.o_proj", attn);
      if (c.sandwich_norms) o = Norm(p + "post_attention_layernorm.weight", o);
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += o[i];
      const std::vector<double> h =
          Norm(p + (c.sandwich_norms ? "pre_feedforward_layernorm.weight"
                                     : "post_attention_layernorm.weight"),
               x[t]);
      std::vector<double> g = Mat(p + "mlp.gate_proj", h);
      const std::vector<double> u = Mat(p + "mlp.up_proj", h);
      for (size_t i = 0; i < g.size(); ++i) {
        const double act = c.hidden_activation == worker::Activation::kGeluTanh
                               ? GeluTanh(g[i])
                               : g[i] / (1.0 + std::exp(-g[i]));
        g[i] = act * u[i];
      }
      std::vector<double> m = Mat(p + "mlp.down_proj", g);
      if (c.sandwich_norms) m = Norm(p + "post_feedforward_layernorm.weight", m);
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
  for (double& l : logits) l = Softcap(l, config_.final_logit_softcapping);
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
