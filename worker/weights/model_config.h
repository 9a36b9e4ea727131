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

struct ModelConfig {
  std::string architecture;    // "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"
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
  std::vector<int32_t> eos_token_ids;

  // Consistency checks (positive sizes, heads divisible by kv heads, ...).
  absl::Status Validate() const;
};

// Parses config.json text. Errors name the field: a missing or mistyped key, or an
// architecture other than the Llama family (INVALID_ARGUMENT / UNIMPLEMENTED).
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);

// RoPE inverse frequencies, head_dim / 2 of them, with rope_scaling applied
// (linear: divided by factor; llama3: the piecewise wavelength rule).
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_WEIGHTS_MODEL_CONFIG_H_
