#include "worker/weights/model_config.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace carpool::worker {
namespace {

using Json = nlohmann::json;

constexpr const char* kSupportedArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                                   "Qwen2ForCausalLM"};

absl::Status TypeError(const std::string& key, const char* expected, const Json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: key '", key, "' must be ", expected, ", got ", value.type_name()));
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

absl::StatusOr<std::string> Architecture(const Json& root) {
  const Json* architectures = Find(root, "architectures");
  if (architectures == nullptr) {
    // Some configs carry only model_type.
    const Json* model_type = Find(root, "model_type");
    if (model_type == nullptr || !model_type->is_string()) {
      return absl::InvalidArgumentError("config.json: missing key 'architectures'");
    }
    const std::string type = model_type->get<std::string>();
    if (type == "llama") return std::string("LlamaForCausalLM");
    if (type == "mistral") return std::string("MistralForCausalLM");
    if (type == "qwen2") return std::string("Qwen2ForCausalLM");
    return absl::UnimplementedError(absl::StrCat(
        "config.json: model_type '", type,
        "' is not supported; supported: ", absl::StrJoin(kSupportedArchitectures, ", ")));
  }
  if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string()) {
    return absl::InvalidArgumentError(
        "config.json: key 'architectures' must be a non-empty list of strings");
  }
  std::string name = (*architectures)[0].get<std::string>();
  for (const char* supported : kSupportedArchitectures) {
    if (name == supported) return name;
  }
  return absl::UnimplementedError(absl::StrCat(
      "config.json: architecture '", name,
      "' is not supported; supported: ", absl::StrJoin(kSupportedArchitectures, ", ")));
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& root) {
  RopeScaling scaling;
  const Json* value = Find(root, "rope_scaling");
  if (value == nullptr) return scaling;
  if (!value->is_object()) return TypeError("rope_scaling", "an object or null", *value);
  const Json* type_json = Find(*value, "rope_type");
  if (type_json == nullptr) type_json = Find(*value, "type");
  if (type_json == nullptr || !type_json->is_string()) {
    return absl::InvalidArgumentError("config.json: rope_scaling needs a string 'rope_type'");
  }
  const std::string type = type_json->get<std::string>();
  if (type == "default") return scaling;
  if (type != "linear" && type != "llama3") {
    return absl::UnimplementedError(absl::StrCat("config.json: rope_scaling type '", type,
                                                 "' is not supported (linear, llama3)"));
  }
  const Json* factor = Find(*value, "factor");
  if (factor == nullptr) {
    return absl::InvalidArgumentError("config.json: rope_scaling needs 'factor'");
  }
  ASSIGN_OR_RETURN(scaling.factor, DoubleOr(*value, "factor", 1.0));
  if (type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    return scaling;
  }
  scaling.type = RopeScaling::Type::kLlama3;
  for (const char* key :
       {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (Find(*value, key) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: llama3 rope_scaling needs '", key, "'"));
    }
  }
  ASSIGN_OR_RETURN(scaling.low_freq_factor, DoubleOr(*value, "low_freq_factor", 1.0));
  ASSIGN_OR_RETURN(scaling.high_freq_factor, DoubleOr(*value, "high_freq_factor", 4.0));
  ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                   RequiredInt(*value, "original_max_position_embeddings"));
  return scaling;
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

absl::StatusOr<ModelConfig> FromJson(const Json& root) {
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig config;
  ASSIGN_OR_RETURN(config.architecture, Architecture(root));
  if (const Json* act = Find(root, "hidden_act");
      act != nullptr && !(act->is_string() && act->get<std::string>() == "silu")) {
    return absl::UnimplementedError(
        absl::StrCat("config.json: hidden_act ", act->dump(), " is not supported (silu)"));
  }
  ASSIGN_OR_RETURN(config.vocab_size, RequiredInt(root, "vocab_size"));
  ASSIGN_OR_RETURN(config.hidden_size, RequiredInt(root, "hidden_size"));
  ASSIGN_OR_RETURN(config.intermediate_size, RequiredInt(root, "intermediate_size"));
  ASSIGN_OR_RETURN(config.num_layers, RequiredInt(root, "num_hidden_layers"));
  ASSIGN_OR_RETURN(config.num_heads, RequiredInt(root, "num_attention_heads"));
  ASSIGN_OR_RETURN(config.num_kv_heads, IntOr(root, "num_key_value_heads", config.num_heads));
  if (Find(root, "head_dim") == nullptr && config.num_heads > 0 &&
      config.hidden_size % config.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_size ", config.hidden_size,
                                                   " is not divisible by num_attention_heads ",
                                                   config.num_heads, " and head_dim is not given"));
  }
  ASSIGN_OR_RETURN(
      config.head_dim,
      IntOr(root, "head_dim", config.num_heads > 0 ? config.hidden_size / config.num_heads : 0));
  ASSIGN_OR_RETURN(config.rms_norm_eps, DoubleOr(root, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(config.rope_theta, DoubleOr(root, "rope_theta", 10000.0));
  ASSIGN_OR_RETURN(config.rope_scaling, ParseRopeScaling(root));
  ASSIGN_OR_RETURN(config.max_position_embeddings, IntOr(root, "max_position_embeddings", 2048));
  ASSIGN_OR_RETURN(config.tie_word_embeddings, BoolOr(root, "tie_word_embeddings", false));
  ASSIGN_OR_RETURN(config.attention_bias, BoolOr(root, "attention_bias", false));
  if (config.architecture == "Qwen2ForCausalLM") config.attention_bias = true;
  ASSIGN_OR_RETURN(config.bos_token_id, IntOr(root, "bos_token_id", -1));
  ASSIGN_OR_RETURN(config.eos_token_ids, ParseEosTokens(root));
  RETURN_IF_ERROR(config.Validate());
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

std::vector<float> RopeInvFreq(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  const RopeScaling& scaling = config.rope_scaling;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    double freq = 1.0 / std::pow(config.rope_theta, 2.0 * i / config.head_dim);
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

}  // namespace carpool::worker
