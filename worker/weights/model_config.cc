#include "worker/weights/model_config.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/weights/safetensors.h"

namespace carpool::worker {
namespace {

using Json = nlohmann::json;

// The families carpool computes. Each differs from Llama only in the ModelConfig fields that
// FromJson sets for it.
enum class Family { kLlama, kMistral, kQwen2, kQwen3, kGemma3 };

struct Architecture {
  const char* name;        // config.json "architectures"[0]
  const char* model_type;  // config.json "model_type" when "architectures" is absent
  Family family;
};

// Gemma3ForConditionalGeneration is the multimodal checkpoint: carpool reads its text_config and
// serves the language model as Gemma3ForCausalLM.
constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", Family::kLlama},
    {"MistralForCausalLM", "mistral", Family::kMistral},
    {"Qwen2ForCausalLM", "qwen2", Family::kQwen2},
    {"Qwen3ForCausalLM", "qwen3", Family::kQwen3},
    {"Gemma3ForCausalLM", "gemma3_text", Family::kGemma3},
    {"Gemma3ForConditionalGeneration", "gemma3", Family::kGemma3},
};
constexpr char kGemma3Multimodal[] = "Gemma3ForConditionalGeneration";

std::string SupportedList() {
  std::vector<std::string> names;
  for (const Architecture& a : kArchitectures) names.push_back(a.name);
  return absl::StrJoin(names, ", ");
}

absl::Status TypeError(const std::string& key, const char* expected, const Json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: key '", key, "' must be ", expected, ", got ", value.type_name()));
}

absl::Status Refused(const std::string& key, const std::string& why) {
  return absl::UnimplementedError(absl::StrCat("config.json: key '", key, "' ", why));
}

// Looks up `key`; a JSON null counts as absent (Hugging Face writes "head_dim": null).
const Json* Find(const Json& object, const std::string& key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& object, const std::string& key) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number_integer()) return TypeError(key, "an integer", *value);
  return value->get<int64_t>();
}

absl::StatusOr<int> RequiredInt(const Json& object, const std::string& key) {
  ASSIGN_OR_RETURN(std::optional<int64_t> value, OptionalInt(object, key));
  if (!value.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: missing key '", key, "'"));
  }
  if (*value < INT32_MIN || *value > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: key '", key, "' is out of range: ", *value));
  }
  return static_cast<int>(*value);
}

absl::StatusOr<int> IntOr(const Json& object, const std::string& key, int fallback) {
  const Json* value = Find(object, key);
  if (value == nullptr) return fallback;
  return RequiredInt(object, key);
}

absl::StatusOr<double> DoubleOr(const Json& object, const std::string& key, double fallback) {
  const Json* value = Find(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_number()) return TypeError(key, "a number", *value);
  return value->get<double>();
}

absl::StatusOr<bool> BoolOr(const Json& object, const std::string& key, bool fallback) {
  const Json* value = Find(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return TypeError(key, "a boolean", *value);
  return value->get<bool>();
}

absl::StatusOr<std::string> StringOr(const Json& object, const std::string& key,
                                     const std::string& fallback) {
  const Json* value = Find(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_string()) return TypeError(key, "a string", *value);
  return value->get<std::string>();
}

absl::StatusOr<const Architecture*> FindArchitecture(const Json& root) {
  const Json* architectures = Find(root, "architectures");
  if (architectures == nullptr) {
    // Some configs carry only model_type.
    const Json* model_type = Find(root, "model_type");
    if (model_type == nullptr || !model_type->is_string()) {
      return absl::InvalidArgumentError("config.json: missing key 'architectures'");
    }
    const std::string type = model_type->get<std::string>();
    for (const Architecture& a : kArchitectures) {
      if (type == a.model_type) return &a;
    }
    return absl::UnimplementedError(absl::StrCat(
        "config.json: model_type '", type, "' is not supported; supported: ", SupportedList()));
  }
  if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string()) {
    return absl::InvalidArgumentError(
        "config.json: key 'architectures' must be a non-empty list of strings");
  }
  const std::string name = (*architectures)[0].get<std::string>();
  for (const Architecture& a : kArchitectures) {
    if (name == a.name) return &a;
  }
  return absl::UnimplementedError(absl::StrCat("config.json: architecture '", name,
                                               "' is not supported; supported: ", SupportedList()));
}

// One RoPE description: an old-style rope_scaling object or an entry of rope_parameters (which
// also carries rope_theta). `key` is where it sits, for errors. Absent or "default": no scaling.
absl::StatusOr<RopeScaling> ParseRopeScaling(const Json* value, const std::string& key) {
  RopeScaling scaling;
  if (value == nullptr) return scaling;
  if (!value->is_object()) return TypeError(key, "an object or null", *value);
  const Json* type_json = Find(*value, "rope_type");
  if (type_json == nullptr) type_json = Find(*value, "type");
  if (type_json == nullptr) {
    // rope_parameters may hold only rope_theta; a scaling object must name its type.
    if (key == "rope_scaling") {
      return absl::InvalidArgumentError("config.json: rope_scaling needs a string 'rope_type'");
    }
    return scaling;
  }
  if (!type_json->is_string()) return TypeError(key + ".rope_type", "a string", *type_json);
  const std::string type = type_json->get<std::string>();
  if (type == "default") return scaling;
  if (type != "linear" && type != "llama3") {
    return Refused(key, absl::StrCat("has rope type '", type,
                                     "', which carpool does not implement (default, linear, "
                                     "llama3)"));
  }
  if (Find(*value, "factor") == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, " needs 'factor'"));
  }
  ASSIGN_OR_RETURN(scaling.factor, DoubleOr(*value, "factor", 1.0));
  if (type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    return scaling;
  }
  scaling.type = RopeScaling::Type::kLlama3;
  for (const char* field :
       {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (Find(*value, field) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: llama3 ", key, " needs '", field, "'"));
    }
  }
  ASSIGN_OR_RETURN(scaling.low_freq_factor, DoubleOr(*value, "low_freq_factor", 1.0));
  ASSIGN_OR_RETURN(scaling.high_freq_factor, DoubleOr(*value, "high_freq_factor", 4.0));
  ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                   RequiredInt(*value, "original_max_position_embeddings"));
  return scaling;
}

// rope_theta and rope_scaling, from the older keys or from transformers' newer rope_parameters:
// one object for every layer, or (Gemma 3) one per layer type, "full_attention" and
// "sliding_attention". Gemma 3's sliding layers use rope_local_base_freq, never scaled.
absl::Status ParseRope(const Json& root, Family family, ModelConfig* config) {
  const double default_theta = family == Family::kGemma3 ? 1'000'000.0 : 10'000.0;
  ASSIGN_OR_RETURN(config->rope_theta, DoubleOr(root, "rope_theta", default_theta));
  if (family == Family::kGemma3) {
    ASSIGN_OR_RETURN(config->rope_local_theta, DoubleOr(root, "rope_local_base_freq", 10'000.0));
  }
  const Json* params = Find(root, "rope_parameters");
  if (params == nullptr) {
    ASSIGN_OR_RETURN(config->rope_scaling,
                     ParseRopeScaling(Find(root, "rope_scaling"), "rope_scaling"));
    return absl::OkStatus();
  }
  if (!params->is_object()) return TypeError("rope_parameters", "an object or null", *params);
  // The per-layer-type form maps layer types to objects; the flat form holds numbers and names.
  bool per_layer_type = false;
  for (const auto& [key, value] : params->items()) {
    per_layer_type |= value.is_object() || key == "full_attention" || key == "sliding_attention";
  }
  if (!per_layer_type) {
    ASSIGN_OR_RETURN(config->rope_theta, DoubleOr(*params, "rope_theta", config->rope_theta));
    ASSIGN_OR_RETURN(config->rope_scaling, ParseRopeScaling(params, "rope_parameters"));
    return absl::OkStatus();
  }
  if (family != Family::kGemma3) {
    return Refused("rope_parameters",
                   "is given per layer type, which carpool reads for Gemma 3 only");
  }
  for (const auto& [type, unused] : params->items()) {
    if (type != "full_attention" && type != "sliding_attention") {
      return Refused("rope_parameters", absl::StrCat("has layer type '", type,
                                                     "' (full_attention, sliding_attention)"));
    }
  }
  if (const Json* full = Find(*params, "full_attention"); full != nullptr) {
    if (!full->is_object()) return TypeError("rope_parameters.full_attention", "an object", *full);
    ASSIGN_OR_RETURN(config->rope_theta, DoubleOr(*full, "rope_theta", config->rope_theta));
    ASSIGN_OR_RETURN(config->rope_scaling,
                     ParseRopeScaling(full, "rope_parameters.full_attention"));
  }
  if (const Json* sliding = Find(*params, "sliding_attention"); sliding != nullptr) {
    if (!sliding->is_object()) {
      return TypeError("rope_parameters.sliding_attention", "an object", *sliding);
    }
    ASSIGN_OR_RETURN(RopeScaling local,
                     ParseRopeScaling(sliding, "rope_parameters.sliding_attention"));
    if (local.type != RopeScaling::Type::kNone) {
      return Refused("rope_parameters.sliding_attention",
                     "scales the sliding layers' RoPE; carpool scales only the global layers'");
    }
    ASSIGN_OR_RETURN(config->rope_local_theta,
                     DoubleOr(*sliding, "rope_theta", config->rope_local_theta));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ParseEosTokens(const Json& root) {
  const Json* value = Find(root, "eos_token_id");
  std::vector<int32_t> ids;
  if (value == nullptr) return ids;
  auto add = [&ids](const Json& id) -> absl::Status {
    if (!id.is_number_integer()) return TypeError("eos_token_id", "a list of integers", id);
    const int64_t v = id.get<int64_t>();
    if (v < INT32_MIN || v > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: eos_token_id ", v, " is out of range"));
    }
    ids.push_back(static_cast<int32_t>(v));
    return absl::OkStatus();
  };
  if (value->is_number_integer()) {
    RETURN_IF_ERROR(add(*value));
    return ids;
  }
  if (!value->is_array()) return TypeError("eos_token_id", "an integer or a list", *value);
  for (const Json& id : *value) RETURN_IF_ERROR(add(id));
  return ids;
}

// Keys no supported family computes; present with a value other than null, 0 or false they
// describe a model carpool would compute wrongly (mixture-of-experts layers, bidirectional
// attention, partial rotary embeddings, biased MLPs).
absl::Status RefuseUnimplementedKeys(const Json& root, Family family) {
  constexpr const char* kMoeKeys[] = {"num_experts",
                                      "num_local_experts",
                                      "num_experts_per_tok",
                                      "n_routed_experts",
                                      "n_shared_experts",
                                      "moe_intermediate_size",
                                      "shared_expert_intermediate_size",
                                      "num_experts_per_token",
                                      "enable_moe_block",
                                      "moe_layer_freq",
                                      "first_k_dense_replace"};
  auto set = [](const Json* v) {
    return v != nullptr && !(v->is_boolean() && !v->get<bool>()) &&
           !(v->is_number() && v->get<double>() == 0.0);
  };
  for (const char* key : kMoeKeys) {
    if (set(Find(root, key))) {
      return Refused(key, "describes mixture-of-experts layers, which carpool does not implement");
    }
  }
  if (set(Find(root, "use_bidirectional_attention"))) {
    return Refused("use_bidirectional_attention",
                   "is true: carpool implements causal attention only");
  }
  if (const Json* v = Find(root, "partial_rotary_factor"); v != nullptr) {
    if (!v->is_number() || v->get<double>() != 1.0) {
      return Refused("partial_rotary_factor",
                     "rotates part of each head; carpool rotates all of it");
    }
  }
  if (set(Find(root, "mlp_bias"))) {
    return Refused("mlp_bias", "is true: carpool's MLP projections carry no bias");
  }
  if (family != Family::kGemma3) {
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
      if (Find(root, key) != nullptr) {
        return Refused(key, "is set: carpool applies logit softcapping for Gemma 3 only");
      }
    }
  }
  if (family == Family::kQwen2 || family == Family::kQwen3) {
    ASSIGN_OR_RETURN(bool sliding, BoolOr(root, "use_sliding_window", false));
    if (sliding) {
      return Refused("use_sliding_window",
                     "is true: carpool does not implement Qwen's sliding window (no published "
                     "checkpoint uses it)");
    }
    // transformers' newer Qwen configs list each layer's attention; all must be full.
    if (const Json* types = Find(root, "layer_types"); types != nullptr) {
      if (!types->is_array()) return TypeError("layer_types", "a list of strings", *types);
      for (const Json& type : *types) {
        if (type != "full_attention") {
          return Refused("layer_types", absl::StrCat("has layer type ", type.dump(),
                                                     "; carpool runs Qwen with full attention"));
        }
      }
    }
  }
  if ((family == Family::kQwen3 || family == Family::kGemma3) &&
      set(Find(root, "attention_bias"))) {
    // These families put the bias on o_proj too, which carpool does not load.
    return Refused("attention_bias",
                   "is true: carpool does not implement biased Qwen 3 or "
                   "Gemma 3 attention");
  }
  return absl::OkStatus();
}

// sqrt(hidden_size) as Gemma's embedding scale: a float32 tensor cast to the weights' dtype.
absl::StatusOr<float> GemmaEmbeddingMultiplier(int hidden_size, const std::string& dtype) {
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(hidden_size)));
  if (dtype == "float32") return scale;
  if (dtype == "bfloat16") return BFloat16ToFloat(FloatToBFloat16(scale));
  if (dtype == "float16") return HalfToFloat(FloatToHalf(scale));
  return Refused("torch_dtype", absl::StrCat("is '", dtype,
                                             "'; Gemma's embedding scale is defined for "
                                             "float32, bfloat16 and float16"));
}

// Which layers slide and how far: Mistral (every layer; sliding_window null: none) and Gemma 3
// (local layers from layer_types, or every layer but each sliding_window_pattern-th).
absl::Status ParseSlidingWindow(const Json& root, Family family, ModelConfig* config) {
  if (family == Family::kMistral) {
    // MistralConfig's default is 4096; an explicit null turns the window off (Mistral v0.2+).
    auto it = root.find("sliding_window");
    if (it != root.end() && it->is_null()) return absl::OkStatus();
    ASSIGN_OR_RETURN(config->sliding_window, IntOr(root, "sliding_window", 4096));
    if (config->sliding_window <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: key 'sliding_window' must be positive or null, got ",
                       config->sliding_window));
    }
    return absl::OkStatus();
  }
  if (family != Family::kGemma3) return absl::OkStatus();
  if (auto it = root.find("sliding_window"); it != root.end() && it->is_null()) {
    return Refused("sliding_window", "is null: Gemma 3's local layers need a window");
  }
  ASSIGN_OR_RETURN(config->sliding_window, IntOr(root, "sliding_window", 4096));
  if (config->sliding_window <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: key 'sliding_window' must be positive, got ", config->sliding_window));
  }
  config->layer_sliding.assign(config->num_layers, false);
  if (const Json* types = Find(root, "layer_types"); types != nullptr) {
    if (!types->is_array()) return TypeError("layer_types", "a list of strings", *types);
    if (static_cast<int>(types->size()) != config->num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: key 'layer_types' has ", types->size(),
                       " entries for num_hidden_layers ", config->num_layers));
    }
    for (int i = 0; i < config->num_layers; ++i) {
      const Json& type = (*types)[i];
      if (type == "sliding_attention") {
        config->layer_sliding[i] = true;
      } else if (type != "full_attention") {
        return Refused("layer_types", absl::StrCat("has layer type ", type.dump(),
                                                   " (sliding_attention, full_attention)"));
      }
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(int pattern, IntOr(root, "sliding_window_pattern", 6));
  if (pattern <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: key 'sliding_window_pattern' must be positive, got ", pattern));
  }
  for (int i = 0; i < config->num_layers; ++i) config->layer_sliding[i] = (i + 1) % pattern != 0;
  return absl::OkStatus();
}

// Gemma 3's own keys: the norms, activation, attention scale and softcapping.
absl::Status ParseGemma3(const Json& root, const std::string& dtype, ModelConfig* config) {
  config->qk_norm = true;
  config->norm_weight_plus_one = true;
  config->sandwich_norms = true;
  ASSIGN_OR_RETURN(std::string activation,
                   StringOr(root, "hidden_activation", "gelu_pytorch_tanh"));
  if (activation != "gelu_pytorch_tanh") {
    return Refused("hidden_activation",
                   absl::StrCat("is '", activation, "'; carpool implements gelu_pytorch_tanh"));
  }
  config->hidden_activation = Activation::kGeluTanh;
  ASSIGN_OR_RETURN(config->query_pre_attn_scalar, DoubleOr(root, "query_pre_attn_scalar", 256.0));
  ASSIGN_OR_RETURN(config->attn_logit_softcapping, DoubleOr(root, "attn_logit_softcapping", 0.0));
  ASSIGN_OR_RETURN(config->final_logit_softcapping, DoubleOr(root, "final_logit_softcapping", 0.0));
  for (const auto& [key, value] :
       {std::pair<const char*, double>{"query_pre_attn_scalar", config->query_pre_attn_scalar},
        {"attn_logit_softcapping", config->attn_logit_softcapping},
        {"final_logit_softcapping", config->final_logit_softcapping}}) {
    if (value < 0.0 || (value == 0.0 && std::string(key) == "query_pre_attn_scalar")) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: key '", key, "' must be positive, got ", value));
    }
  }
  ASSIGN_OR_RETURN(config->embedding_multiplier,
                   GemmaEmbeddingMultiplier(config->hidden_size, dtype));
  return absl::OkStatus();
}

// `root` is the language model's config: config.json itself, or Gemma3ForConditionalGeneration's
// text_config (then `outer` is config.json, consulted for the dtype and EOS tokens it may hold
// instead).
absl::StatusOr<ModelConfig> FromJson(const Json& root, const Json& outer, Family family) {
  ModelConfig config;
  const bool gemma = family == Family::kGemma3;
  for (const Architecture& a : kArchitectures) {
    if (a.family == family) {
      config.architecture = a.name;  // the CausalLM of the family
      break;
    }
  }
  RETURN_IF_ERROR(RefuseUnimplementedKeys(root, family));
  if (!gemma) {
    if (const Json* act = Find(root, "hidden_act");
        act != nullptr && !(act->is_string() && act->get<std::string>() == "silu")) {
      return Refused("hidden_act", absl::StrCat("is ", act->dump(), "; carpool implements silu"));
    }
  }
  // Gemma 3 configs (gemma-3-4b-it's text_config) leave out keys that have transformers'
  // Gemma3TextConfig defaults; the other families' published configs carry every size.
  auto size = [&](const char* key, int gemma_default) -> absl::StatusOr<int> {
    if (gemma) return IntOr(root, key, gemma_default);
    return RequiredInt(root, key);
  };
  ASSIGN_OR_RETURN(config.vocab_size, size("vocab_size", 262208));
  ASSIGN_OR_RETURN(config.hidden_size, size("hidden_size", 2304));
  ASSIGN_OR_RETURN(config.intermediate_size, size("intermediate_size", 9216));
  ASSIGN_OR_RETURN(config.num_layers, size("num_hidden_layers", 26));
  ASSIGN_OR_RETURN(config.num_heads, size("num_attention_heads", 8));
  ASSIGN_OR_RETURN(config.num_kv_heads,
                   IntOr(root, "num_key_value_heads", gemma ? 4 : config.num_heads));
  if (family == Family::kGemma3 || family == Family::kQwen3) {
    // Their configs' head_dim default is a constant, not hidden_size / heads.
    ASSIGN_OR_RETURN(config.head_dim, IntOr(root, "head_dim", gemma ? 256 : 128));
  } else {
    if (Find(root, "head_dim") == nullptr && config.num_heads > 0 &&
        config.hidden_size % config.num_heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: hidden_size ", config.hidden_size, " is not divisible by ",
                       "num_attention_heads ", config.num_heads, " and head_dim is not given"));
    }
    ASSIGN_OR_RETURN(
        config.head_dim,
        IntOr(root, "head_dim", config.num_heads > 0 ? config.hidden_size / config.num_heads : 0));
  }
  ASSIGN_OR_RETURN(config.rms_norm_eps, DoubleOr(root, "rms_norm_eps", 1e-6));
  RETURN_IF_ERROR(ParseRope(root, family, &config));
  ASSIGN_OR_RETURN(config.max_position_embeddings,
                   IntOr(root, "max_position_embeddings", gemma ? 131072 : 2048));
  ASSIGN_OR_RETURN(config.tie_word_embeddings, BoolOr(root, "tie_word_embeddings", gemma));
  ASSIGN_OR_RETURN(config.attention_bias, BoolOr(root, "attention_bias", false));
  if (family == Family::kQwen2) config.attention_bias = true;
  if (family == Family::kQwen3) config.qk_norm = true;
  ASSIGN_OR_RETURN(config.bos_token_id, IntOr(root, "bos_token_id", gemma ? 2 : -1));
  const Json& eos_source = Find(root, "eos_token_id") != nullptr ? root : outer;
  ASSIGN_OR_RETURN(config.eos_token_ids, ParseEosTokens(eos_source));
  if (gemma && config.eos_token_ids.empty()) config.eos_token_ids = {1};
  RETURN_IF_ERROR(ParseSlidingWindow(root, family, &config));
  if (gemma) {
    // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
    std::string dtype = "float32";
    for (const Json* source : {&outer, &root}) {
      for (const char* key : {"torch_dtype", "dtype"}) {
        ASSIGN_OR_RETURN(dtype, StringOr(*source, key, dtype));
      }
    }
    RETURN_IF_ERROR(ParseGemma3(root, dtype, &config));
  }
  RETURN_IF_ERROR(config.Validate());
  return config;
}

absl::StatusOr<ModelConfig> FromJson(const Json& root) {
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ASSIGN_OR_RETURN(const Architecture* architecture, FindArchitecture(root));
  if (std::string(architecture->name) != kGemma3Multimodal) {
    return FromJson(root, root, architecture->family);
  }
  const Json* text = Find(root, "text_config");
  if (text == nullptr || !text->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: ", kGemma3Multimodal, " needs a 'text_config' object"));
  }
  absl::StatusOr<ModelConfig> config = FromJson(*text, root, Family::kGemma3);
  if (!config.ok()) {
    // Name the nesting: "config.json: text_config: key 'x' ...".
    std::string message(config.status().message());
    if (absl::StartsWith(message, "config.json: ")) {
      message = absl::StrCat("config.json: text_config: ", message.substr(13));
    }
    return absl::Status(config.status().code(), message);
  }
  return config;
}

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("model config: ", message));
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  const std::pair<const char*, int> positive[] = {
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings}};
  for (const auto& [name, value] : positive) {
    if (value <= 0) return Invalid(absl::StrCat(name, " must be positive, got ", value));
  }
  if (num_heads % num_kv_heads != 0) {
    return Invalid(absl::StrCat("num_attention_heads ", num_heads,
                                " is not a multiple of num_key_value_heads ", num_kv_heads));
  }
  if (head_dim % 2 != 0) return Invalid(absl::StrCat("head_dim must be even, got ", head_dim));
  if (!(rms_norm_eps > 0.0)) return Invalid("rms_norm_eps must be positive");
  if (!(rope_theta > 0.0)) return Invalid("rope_theta must be positive");
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0.0)) {
    return Invalid("rope_scaling factor must be positive");
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    if (!(rope_scaling.low_freq_factor > 0.0) ||
        !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
      return Invalid("llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    }
    if (rope_scaling.original_max_position_embeddings <= 0) {
      return Invalid("llama3 rope_scaling original_max_position_embeddings must be positive");
    }
  }
  if (!(embedding_multiplier > 0.0f)) return Invalid("embedding_multiplier must be positive");
  if (query_pre_attn_scalar < 0.0) return Invalid("query_pre_attn_scalar must not be negative");
  if (attn_logit_softcapping < 0.0 || final_logit_softcapping < 0.0) {
    return Invalid("logit softcapping must not be negative");
  }
  if (rope_local_theta < 0.0) return Invalid("rope_local_base_freq must not be negative");
  if (sliding_window < 0) {
    return Invalid(absl::StrCat("sliding_window must not be negative, got ", sliding_window));
  }
  if (!layer_sliding.empty() && static_cast<int>(layer_sliding.size()) != num_layers) {
    return Invalid(absl::StrCat("layer_sliding has ", layer_sliding.size(),
                                " entries for num_hidden_layers ", num_layers));
  }
  if (bos_token_id < -1 || bos_token_id >= vocab_size) {
    return Invalid(absl::StrCat("bos_token_id ", bos_token_id, " is outside the vocabulary"));
  }
  for (int32_t id : eos_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return Invalid(absl::StrCat("eos_token_id ", id, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", e.what()));
  }
  try {
    return FromJson(root);
  } catch (const Json::exception& e) {  // e.g. an integer that does not fit
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", e.what()));
  }
}

namespace {

std::vector<float> InvFreq(double theta, int head_dim, const RopeScaling& scaling) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    double freq = 1.0 / std::pow(theta, 2.0 * i / head_dim);
    if (scaling.type == RopeScaling::Type::kLinear) {
      freq /= scaling.factor;
    } else if (scaling.type == RopeScaling::Type::kLlama3) {
      // transformers' _compute_llama3_parameters.
      const double old_context = scaling.original_max_position_embeddings;
      const double low_freq_wavelen = old_context / scaling.low_freq_factor;
      const double high_freq_wavelen = old_context / scaling.high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / freq;
      if (wavelen > low_freq_wavelen) {
        freq /= scaling.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth = (old_context / wavelen - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        freq = (1.0 - smooth) * freq / scaling.factor + smooth * freq;
      }
    }
    inv_freq[i] = static_cast<float>(freq);
  }
  return inv_freq;
}

}  // namespace

std::vector<float> RopeInvFreq(const ModelConfig& config) {
  return InvFreq(config.rope_theta, config.head_dim, config.rope_scaling);
}

std::vector<float> LocalRopeInvFreq(const ModelConfig& config) {
  if (config.rope_local_theta <= 0.0) return RopeInvFreq(config);
  return InvFreq(config.rope_local_theta, config.head_dim, RopeScaling{});
}

}  // namespace carpool::worker
