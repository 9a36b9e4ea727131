// The architecture of a Llama-family model, from a Hugging Face config.json or a preset.
#ifndef CARPOOL_WORKER_WEIGHTS_MODEL_CONFIG_H_
#define CARPOOL_WORKER_WEIGHTS_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace carpool::worker {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  // Llama 3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

// The MLP's gate activation: down(act(gate(x)) * up(x)).
enum class Activation {
  kSilu,      // Llama, Mistral, Qwen2, Qwen3 ("silu")
  kGeluTanh,  // Gemma 3 ("gelu_pytorch_tanh": the tanh approximation of GELU)
};

struct ModelConfig {
  std::string architecture;    // "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                               // "Qwen3ForCausalLM", "Gemma3ForCausalLM" (also for a
                               // Gemma3ForConditionalGeneration checkpoint's language model)
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;        // defaults to num_heads
  int head_dim = 0;            // defaults to hidden_size / num_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false; // q/k/v projections carry a bias (always true for Qwen2)
  int32_t bos_token_id = -1;   // -1: none

  // ---- what the newer families change (issue 15); the defaults are Llama's math.
  // Qwen3, Gemma 3: an RMSNorm over each head of q and k (self_attn.q_norm / k_norm, [head_dim])
  // after the projections, before RoPE.
  bool qk_norm = false;
  // Gemma: every RMSNorm weight w (layers, q/k norms, final norm) applies as (1 + w).
  bool norm_weight_plus_one = false;
  // Gemma 3: post_attention_layernorm normalizes the attention output before its residual add,
  // and pre_feedforward_layernorm / post_feedforward_layernorm wrap the MLP the same way.
  bool sandwich_norms = false;
  // Gemma: the embedding rows are multiplied by this (sqrt(hidden_size) rounded to the
  // checkpoint's dtype, as transformers does); 1: not scaled.
  float embedding_multiplier = 1.0f;
  Activation hidden_activation = Activation::kSilu;
  // Attention logits are scaled by query_pre_attn_scalar ** -0.5 (Gemma 3); 0: head_dim ** -0.5.
  double query_pre_attn_scalar = 0.0;
  // tanh capping, cap * tanh(x / cap), of attention logits (before the softmax) and of the final
  // logits; 0: none.
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  // Sliding-window attention: token i attends keys j with i - sliding_window < j <= i, on the
  // layers marked in layer_sliding (Mistral: every layer; Gemma 3: the local layers).
  // 0: no layer slides.
  int sliding_window = 0;
  std::vector<bool> layer_sliding;  // [num_layers]; empty: every layer slides
  // RoPE of the sliding layers when it differs from the global one (Gemma 3's
  // rope_local_base_freq, never scaled); 0: the sliding layers use rope_theta and rope_scaling.
  double rope_local_theta = 0.0;
  std::vector<int32_t> eos_token_ids;

  // Consistency checks (positive sizes, heads divisible by kv heads, ...).
  absl::Status Validate() const;
};

// Parses config.json text: the keys of each family as transformers reads them (older keys and
// the newer rope_parameters), with transformers' defaults where a published config leaves keys
// out (Gemma 3's text_config). Errors name the key: a missing or mistyped key
// (INVALID_ARGUMENT), an architecture outside the supported families, or a key that changes the
// math in a way carpool does not implement (UNIMPLEMENTED: an unknown RoPE type, softcapping
// outside Gemma 3, mixture-of-experts keys, bidirectional attention, Qwen's sliding window, ...).
// docs/models.md lists what each family reads and refuses.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);

// RoPE inverse frequencies, head_dim / 2 of them, with rope_scaling applied
// (linear: divided by factor; llama3: the piecewise wavelength rule).
std::vector<float> RopeInvFreq(const ModelConfig& config);
// The sliding layers' inverse frequencies: rope_local_theta's, unscaled, when it is set; else
// RopeInvFreq(config).
std::vector<float> LocalRopeInvFreq(const ModelConfig& config);

// Whether layer `layer` uses the sliding window.
inline bool LayerSlides(const ModelConfig& config, int layer) {
  return config.sliding_window > 0 &&
         (config.layer_sliding.empty() || config.layer_sliding[layer]);
}

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_WEIGHTS_MODEL_CONFIG_H_
