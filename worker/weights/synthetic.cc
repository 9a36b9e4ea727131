// Synthetic presets and deterministic random weights.
//
// Scale, chosen so greedy decoding is not degenerate (checked with a naive fp32 forward pass:
// `small` untied gives ~84 distinct tokens in 5 prompts x 17 greedy steps, tied ~45):
// - every [out, in] matrix is uniform with std 1/sqrt(in), so a projection keeps the RMS of its
//   normalized input and attention scores and logits have std ~1;
// - the embedding has std 1 when the head is separate, so the current token stays visible in
//   the residual stream. With a tied head that would make the last input token score ~sqrt(H)
//   standard deviations above the rest and greedy decoding would only repeat it, so a tied
//   embedding gets std 1/sqrt(hidden) like the other matrices;
// - RMSNorm weights are 1 + uniform(-0.1, 0.1); biases are uniform(-0.1, 0.1). For Gemma
//   (norm_weight_plus_one) these are the folded values: its checkpoints store w = value - 1.
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "worker/weights/safetensors.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// splitmix64's output function: a bijective 64-bit mixer.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Element `index` of a stream: uniform in (-1, 1), a pure function of (key, index), so any
// split of the work gives the same values.
float Uniform(uint64_t key, uint64_t index) {
  const uint64_t bits = Mix(key + (index + 1) * kGolden) >> 40;  // 24 bits
  return (static_cast<float>(bits) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
}

// value = center + half_width * Uniform.
struct Distribution {
  float center;
  float half_width;
};

Distribution DistributionFor(const TensorSlot& slot, const ModelConfig& config) {
  if (slot.norm) return {1.0f, 0.1f};
  if (absl::EndsWith(slot.name, ".bias")) return {0.0f, 0.1f};
  if (slot.name == "model.embed_tokens.weight" && !config.tie_word_embeddings) {
    return {0.0f, std::sqrt(3.0f)};  // std 1
  }
  // [out, in] matrices and a tied [vocab, hidden] embedding: std = 1/sqrt(in).
  const float in_features = static_cast<float>(slot.shape.back());
  if (slot.name == "model.embed_tokens.weight" && config.embedding_multiplier != 1.0f) {
    // Gemma: rows scaled by ~sqrt(hidden) in the model; half the tied std keeps the token's own
    // row from winning every greedy step (with the full std gemma3-tiny decodes 4 distinct
    // tokens in 3 prompts x 12 steps, with half 9; an untied head would give 32).
    return {0.0f, /*K*/0.25f * std::sqrt(3.0f / in_features)};
  }
  return {0.0f, std::sqrt(3.0f / in_features)};
}

// The slot's slice (or whole tensor): element i of the slice is element WholeIndex(i) of the
// whole tensor, so every split of the model draws the same values. With `bf16` each value is
// rounded to bf16 (nearest even) as it is drawn.
Tensor Generate(const TensorSlot& slot, const ModelConfig& config, uint64_t key, bool bf16,
                ThreadPool* pool) {
  const std::vector<int64_t> shape = slot.LocalShape();
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  // Row length of the whole tensor and of the slice (1-D tensors are one row).
  const int64_t whole_row = slot.shape.size() == 2 ? slot.shape[1] : slot.shape[0];
  const int64_t local_row = shape.size() == 2 ? shape[1] : shape[0];
  auto whole_index = [&](int64_t i) -> int64_t {
    if (slot.split_dim < 0) return i;
    if (slot.split_dim == 0) return slot.split_begin * (slot.shape.size() == 2 ? whole_row : 1) + i;
    return (i / local_row) * whole_row + slot.split_begin + i % local_row;
  };
  const Distribution dist = DistributionFor(slot, config);
  const auto value = [&](int64_t i) {
    return dist.center + dist.half_width * Uniform(key, static_cast<uint64_t>(whole_index(i)));
  };
  constexpr int64_t kChunk = 1 << 16;
  const auto fill = [&](auto* out, auto store) {
    ParallelFor(pool, (count + kChunk - 1) / kChunk, [&](int64_t begin, int64_t end) {
      const int64_t last = std::min(count, end * kChunk);
      for (int64_t i = begin * kChunk; i < last; ++i) out[i] = store(value(i));
    });
  };
  if (bf16) {
    auto values = std::make_unique_for_overwrite<uint16_t[]>(count);
    fill(values.get(), [](float v) { return FloatToBFloat16(v); });
    return Tensor::OwnedBf16(std::move(values), shape);
  }
  auto values = std::make_unique_for_overwrite<float[]>(count);
  fill(values.get(), [](float v) { return v; });
  return Tensor::Owned(std::move(values), shape);
}

ModelConfig Preset(int vocab, int hidden, int intermediate, int layers, int heads, int kv_heads) {
  ModelConfig config;
  config.architecture = "LlamaForCausalLM";
  config.vocab_size = vocab;
  config.hidden_size = hidden;
  config.intermediate_size = intermediate;
  config.num_layers = layers;
  config.num_heads = heads;
  config.num_kv_heads = kv_heads;
  config.head_dim = hidden / heads;
  config.rms_norm_eps = 1e-5;
  config.rope_theta = 10000.0;
  return config;
}

// Qwen 3: q/k head norms. The tiny one's head_dim (32) differs from hidden / heads (16).
ModelConfig Qwen3(ModelConfig config, int head_dim) {
  config.architecture = "Qwen3ForCausalLM";
  config.head_dim = head_dim;
  config.qk_norm = true;
  config.rms_norm_eps = 1e-6;
  config.rope_theta = 1'000'000.0;
  return config;
}

// Gemma 3: every feature of the family, with local layers every `pattern`-th layer excepted.
ModelConfig Gemma3(ModelConfig config, int head_dim, int window, int pattern) {
  config.architecture = "Gemma3ForCausalLM";
  config.head_dim = head_dim;
  config.qk_norm = true;
  config.norm_weight_plus_one = true;
  config.sandwich_norms = true;
  config.hidden_activation = Activation::kGeluTanh;
  config.tie_word_embeddings = true;
  config.rms_norm_eps = 1e-6;
  // Synthetic weights are fp32, so sqrt(hidden) rounds to float.
  config.embedding_multiplier = static_cast<float>(std::sqrt(config.hidden_size));
  config.rope_theta = 1'000'000.0;
  config.rope_local_theta = 10'000.0;
  config.sliding_window = window;
  config.layer_sliding.assign(config.num_layers, false);
  for (int i = 0; i < config.num_layers; ++i) config.layer_sliding[i] = (i + 1) % pattern != 0;
  return config;
}

ModelConfig Mistral(ModelConfig config, int window) {
  config.architecture = "MistralForCausalLM";
  config.sliding_window = window;  // every layer
  return config;
}

// The newer families at the sizes of "tiny" and "small".
void AddFamilyPresets(const ModelConfig& tiny, const ModelConfig& small,
                      std::map<std::string, ModelConfig>* presets) {
  (*presets)["qwen3-tiny"] = Qwen3(tiny, 32);
  ModelConfig qwen3_small = Qwen3(small, small.head_dim);
  (*presets)["qwen3-small"] = qwen3_small;

  // 4 layers, local-global-local-global, a window of 8; query_pre_attn_scalar (24) differs from
  // head_dim (32); linear RoPE scaling that only the global layers get; both softcaps set low
  // enough (logits and scores of std ~1) to bend the top values.
  ModelConfig gemma3_tiny = tiny;
  gemma3_tiny.num_layers = 4;
  gemma3_tiny = Gemma3(gemma3_tiny, 32, 8, 2);
  gemma3_tiny.rope_scaling = {RopeScaling::Type::kLinear, 4.0};
  gemma3_tiny.query_pre_attn_scalar = 24.0;
  gemma3_tiny.attn_logit_softcapping = 5.0;
  gemma3_tiny.final_logit_softcapping = 3.0;
  (*presets)["gemma3-tiny"] = gemma3_tiny;
  // gemma-3's 5:1 local:global pattern with no softcapping, as published.
  ModelConfig gemma3_small = Gemma3(small, small.head_dim, 512, 6);
  gemma3_small.query_pre_attn_scalar = small.head_dim;
  gemma3_small.max_position_embeddings = 8192;
  (*presets)["gemma3-small"] = gemma3_small;

  (*presets)["mistral-tiny"] = Mistral(tiny, 16);
  ModelConfig mistral_small = Mistral(small, 512);
  mistral_small.tie_word_embeddings = false;
  mistral_small.max_position_embeddings = 8192;
  (*presets)["mistral-small"] = mistral_small;
}

std::map<std::string, ModelConfig> Presets() {
  std::map<std::string, ModelConfig> presets;

  ModelConfig tiny = Preset(258, 64, 176, 2, 4, 2);  // byte tokenizer: 0..255, BOS, EOS
  tiny.max_position_embeddings = 2048;
  tiny.bos_token_id = 256;
  tiny.eos_token_ids = {257};
  presets["tiny"] = tiny;

  ModelConfig small = Preset(32000, 768, 2048, 12, 12, 4);  // ~100M parameters
  small.max_position_embeddings = 4096;
  small.tie_word_embeddings = true;
  small.bos_token_id = 256;
  small.eos_token_ids = {257};
  presets["small"] = small;

  AddFamilyPresets(tiny, small, &presets);

  ModelConfig llama_1b = Preset(128256, 2048, 8192, 16, 32, 8);  // Llama-3.2-1B
  llama_1b.rope_theta = 500000.0;
  llama_1b.rope_scaling = {RopeScaling::Type::kLlama3, 32.0, 1.0, 4.0, 8192};
  llama_1b.max_position_embeddings = 131072;
  llama_1b.tie_word_embeddings = true;
  llama_1b.bos_token_id = 128000;
  llama_1b.eos_token_ids = {128001};
  presets["1b"] = llama_1b;

  ModelConfig llama_8b = Preset(128256, 4096, 14336, 32, 32, 8);  // Llama-3-8B
  llama_8b.rope_theta = 500000.0;
  llama_8b.max_position_embeddings = 8192;
  llama_8b.bos_token_id = 128000;
  llama_8b.eos_token_ids = {128001};
  presets["8b"] = llama_8b;
  return presets;
}

}  // namespace

absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& preset) {
  const std::map<std::string, ModelConfig> presets = Presets();
  auto it = presets.find(preset);
  if (it == presets.end()) {
    std::vector<std::string> names;
    for (const auto& [name, config] : presets) names.push_back(name);
    return absl::InvalidArgumentError(absl::StrCat("unknown synthetic preset '", preset,
                                                   "'; presets: ", absl::StrJoin(names, ", ")));
  }
  return it->second;
}

std::unique_ptr<LlamaWeights> SyntheticWeights(const ModelConfig& config, uint64_t seed,
                                               const TensorParallelRank& tp, ThreadPool* pool,
                                               const LoadOptions& options) {
  auto weights = std::make_unique<LlamaWeights>();
  weights->config = config;
  weights->tp = tp;
  absl::StatusOr<ShardLayout> shard = PlanShard(config, tp);
  CARPOOL_CHECK(shard.ok());
  weights->shard = *shard;
  const std::vector<TensorSlot> slots = TensorSlots(weights.get());
  for (size_t i = 0; i < slots.size(); ++i) {
    const bool bf16 = options.keep_bf16 && !slots[i].norm;  // norms stay fp32, as loaded
    *slots[i].tensor = Generate(slots[i], config, Mix(seed + (i + 1) * kGolden), bf16, pool);
  }
  if (config.tie_word_embeddings) weights->lm_head = weights->embed_tokens;
  return weights;
}

}  // namespace carpool::worker
