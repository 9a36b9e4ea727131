#include "tests/testing/checkpoint_writer.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/weights/weights.h"

namespace carpool::testing {
namespace {

namespace fs = std::filesystem;
using worker::DType;
using Json = nlohmann::ordered_json;

const char* ModelType(const std::string& architecture) {
  if (architecture == "MistralForCausalLM") return "mistral";
  if (architecture == "Qwen2ForCausalLM") return "qwen2";
  if (architecture == "Qwen3ForCausalLM") return "qwen3";
  if (architecture == "Gemma3ForCausalLM") return "gemma3_text";
  return "llama";
}

Json RopeScalingJson(const worker::RopeScaling& scaling) {
  switch (scaling.type) {
    case worker::RopeScaling::Type::kNone:
      return nullptr;
    case worker::RopeScaling::Type::kLinear:
      return {{"rope_type", "linear"}, {"factor", scaling.factor}};
    case worker::RopeScaling::Type::kLlama3:
      return {{"rope_type", "llama3"},
              {"factor", scaling.factor},
              {"low_freq_factor", scaling.low_freq_factor},
              {"high_freq_factor", scaling.high_freq_factor},
              {"original_max_position_embeddings", scaling.original_max_position_embeddings}};
  }
  return nullptr;
}

const char* TorchDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
  }
  return "float32";
}

Json OrNull(double value) { return value > 0.0 ? Json(value) : Json(nullptr); }

void EosJson(const worker::ModelConfig& config, Json* json) {
  if (config.eos_token_ids.size() == 1) {
    (*json)["eos_token_id"] = config.eos_token_ids[0];
  } else if (!config.eos_token_ids.empty()) {
    (*json)["eos_token_id"] = config.eos_token_ids;
  }
}

// gemma-3-1b-it's config.json keys (layer_types instead of sliding_window_pattern when the
// local layers follow no pattern).
Json Gemma3Json(const worker::ModelConfig& c, DType dtype) {
  Json json;
  json["architectures"] = {c.architecture};
  json["attention_bias"] = false;
  json["attention_dropout"] = 0.0;
  json["attn_logit_softcapping"] = OrNull(c.attn_logit_softcapping);
  if (c.bos_token_id >= 0) json["bos_token_id"] = c.bos_token_id;
  json["cache_implementation"] = "hybrid";
  EosJson(c, &json);
  json["final_logit_softcapping"] = OrNull(c.final_logit_softcapping);
  json["head_dim"] = c.head_dim;
  json["hidden_activation"] = "gelu_pytorch_tanh";
  json["hidden_size"] = c.hidden_size;
  json["initializer_range"] = 0.02;
  json["intermediate_size"] = c.intermediate_size;
  // Published Gemma 3 configs give sliding_window_pattern; newer ones list layer_types, which
  // also says what no pattern can.
  std::vector<bool> sliding = c.layer_sliding;
  if (sliding.empty()) sliding.assign(c.num_layers, true);
  int pattern = 0;
  for (int p = 1; p <= c.num_layers + 1 && pattern == 0; ++p) {
    bool matches = true;
    for (int i = 0; i < c.num_layers; ++i) matches &= sliding[i] == ((i + 1) % p != 0);
    if (matches) pattern = p;
  }
  if (pattern == 0) {
    Json types = Json::array();
    for (bool slides : sliding) types.push_back(slides ? "sliding_attention" : "full_attention");
    json["layer_types"] = types;
  }
  json["max_position_embeddings"] = c.max_position_embeddings;
  json["model_type"] = "gemma3_text";
  json["num_attention_heads"] = c.num_heads;
  json["num_hidden_layers"] = c.num_layers;
  json["num_key_value_heads"] = c.num_kv_heads;
  json["pad_token_id"] = 0;
  json["query_pre_attn_scalar"] =
      c.query_pre_attn_scalar > 0.0 ? c.query_pre_attn_scalar : static_cast<double>(c.head_dim);
  json["rms_norm_eps"] = c.rms_norm_eps;
  json["rope_local_base_freq"] = c.rope_local_theta > 0.0 ? c.rope_local_theta : c.rope_theta;
  json["rope_scaling"] = RopeScalingJson(c.rope_scaling);
  json["rope_theta"] = c.rope_theta;
  json["sliding_window"] = c.sliding_window;
  if (pattern > 0) json["sliding_window_pattern"] = pattern;
  json["tie_word_embeddings"] = c.tie_word_embeddings;
  json["torch_dtype"] = TorchDType(dtype);
  json["transformers_version"] = "4.50.0.dev0";
  json["use_cache"] = true;
  json["vocab_size"] = c.vocab_size;
  return json;
}

// gemma-3-4b-it's config.json: the language model's keys in text_config, a vision tower's in
// vision_config (never read by carpool).
Json Gemma3MultimodalJson(const worker::ModelConfig& c, DType dtype) {
  Json text = Gemma3Json(c, dtype);
  for (const char* key : {"architectures", "torch_dtype", "transformers_version"}) {
    text.erase(key);
  }
  Json json;
  json["architectures"] = {"Gemma3ForConditionalGeneration"};
  json["boi_token_index"] = 255999;
  json["eoi_token_index"] = 256000;
  EosJson(c, &json);
  text.erase("eos_token_id");
  json["image_token_index"] = 262144;
  json["initializer_range"] = 0.02;
  json["mm_tokens_per_image"] = 256;
  json["model_type"] = "gemma3";
  json["text_config"] = text;
  json["torch_dtype"] = TorchDType(dtype);
  json["transformers_version"] = "4.50.0.dev0";
  json["vision_config"] = {{"hidden_size", 8},         {"image_size", 28},
                           {"intermediate_size", 16},  {"model_type", "siglip_vision_model"},
                           {"num_attention_heads", 2}, {"num_hidden_layers", 1},
                           {"patch_size", 14},         {"vision_use_head", false}};
  return json;
}

}  // namespace

worker::ModelConfig TinyTestConfig() {
  worker::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 256;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

std::string ConfigJson(const worker::ModelConfig& config, DType dtype, bool gemma3_multimodal) {
  if (gemma3_multimodal) return Gemma3MultimodalJson(config, dtype).dump(2);
  if (config.architecture == "Gemma3ForCausalLM") return Gemma3Json(config, dtype).dump(2);
  Json json;
  json["architectures"] = {config.architecture};
  json["model_type"] = ModelType(config.architecture);
  json["hidden_act"] = "silu";
  json["vocab_size"] = config.vocab_size;
  json["hidden_size"] = config.hidden_size;
  json["intermediate_size"] = config.intermediate_size;
  json["num_hidden_layers"] = config.num_layers;
  json["num_attention_heads"] = config.num_heads;
  json["num_key_value_heads"] = config.num_kv_heads;
  json["head_dim"] = config.head_dim;
  json["rms_norm_eps"] = config.rms_norm_eps;
  json["rope_theta"] = config.rope_theta;
  json["rope_scaling"] = RopeScalingJson(config.rope_scaling);
  json["max_position_embeddings"] = config.max_position_embeddings;
  json["tie_word_embeddings"] = config.tie_word_embeddings;
  json["attention_bias"] = config.attention_bias;
  if (config.bos_token_id >= 0) json["bos_token_id"] = config.bos_token_id;
  EosJson(config, &json);
  if (config.architecture == "MistralForCausalLM") {
    json["sliding_window"] = config.sliding_window > 0 ? Json(config.sliding_window) : Json();
  }
  if (config.architecture == "Qwen2ForCausalLM" || config.architecture == "Qwen3ForCausalLM") {
    json["max_window_layers"] = config.num_layers;
    json["sliding_window"] = nullptr;
    json["use_sliding_window"] = false;
  }
  json["attention_dropout"] = 0.0;
  json["initializer_range"] = 0.02;
  if (config.architecture == "LlamaForCausalLM") {
    json["mlp_bias"] = false;
    json["pretraining_tp"] = 1;
  }
  json["torch_dtype"] = TorchDType(dtype);
  json["use_cache"] = true;
  return json.dump(2);
}

std::string EncodeValues(const std::vector<float>& values, DType dtype) {
  std::string bytes(values.size() * worker::DTypeSize(dtype), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      continue;
    }
    const uint16_t bits =
        dtype == DType::kF16 ? worker::FloatToHalf(values[i]) : worker::FloatToBFloat16(values[i]);
    bytes[2 * i] = static_cast<char>(bits & 0xff);
    bytes[2 * i + 1] = static_cast<char>(bits >> 8);
  }
  return bytes;
}

std::vector<float> RoundToDType(const std::vector<float>& values, DType dtype) {
  const std::string bytes = EncodeValues(values, dtype);
  std::vector<float> rounded(values.size());
  worker::ConvertToFloat(dtype, reinterpret_cast<const uint8_t*>(bytes.data()),
                         static_cast<int64_t>(values.size()), rounded.data());
  return rounded;
}

std::map<std::string, std::vector<float>> RawValues(const CheckpointTensors& tensors) {
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, tensor] : tensors) values[name] = tensor.values;
  return values;
}

std::vector<RawTensor> ToRawTensors(const CheckpointTensors& tensors, DType dtype) {
  std::vector<RawTensor> raw;
  for (const auto& [name, tensor] : tensors) {
    raw.push_back(
        {name, worker::DTypeName(dtype), tensor.shape, EncodeValues(tensor.values, dtype)});
  }
  return raw;
}

std::string SafetensorsHeader(const std::vector<RawTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const RawTensor& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  return header.dump();
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::Status WriteSafetensorsRaw(const std::string& path, uint64_t header_length,
                                 const std::string& header, const std::string& data) {
  std::string contents(8, '\0');
  for (int i = 0; i < 8; ++i) contents[i] = static_cast<char>((header_length >> (8 * i)) & 0xff);
  contents += header;
  contents += data;
  return WriteFile(path, contents);
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  std::string header = SafetensorsHeader(tensors);
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string data;
  for (const RawTensor& tensor : tensors) data += tensor.bytes;
  return WriteSafetensorsRaw(path, header.size(), header, data);
}

absl::StatusOr<CheckpointTensors> WriteCheckpoint(const std::string& dir,
                                                  const CheckpointSpec& spec) {
  RETURN_IF_ERROR(spec.config.Validate());
  if (spec.num_shards < 1) return absl::InvalidArgumentError("num_shards must be >= 1");
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat(dir, ": ", error.message()));

  std::unique_ptr<worker::LlamaWeights> weights = worker::SyntheticWeights(spec.config, spec.seed);
  std::vector<worker::TensorSlot> slots = worker::TensorSlots(weights.get());
  const bool tied = spec.config.tie_word_embeddings;
  const bool write_lm_head = spec.write_lm_head.value_or(!tied);
  if (tied && write_lm_head) {
    slots.push_back({"lm_head.weight", slots.front().shape, &weights->embed_tokens});
  } else if (!tied && !write_lm_head) {
    slots.pop_back();
  }

  CheckpointTensors written;
  std::vector<RawTensor> raw;
  for (const worker::TensorSlot& slot : slots) {
    const worker::Tensor& tensor = *slot.tensor;
    std::vector<float> values(tensor.data(), tensor.data() + tensor.numel());
    // The synthetic norms are the folded 1 + w; the checkpoint stores w (exact in fp32: the
    // values lie in [0.9, 1.1]).
    if (slot.norm && spec.config.norm_weight_plus_one) {
      for (float& v : values) v -= 1.0f;
    }
    values = RoundToDType(values, spec.dtype);
    std::string name = slot.name;
    if (spec.gemma3_multimodal) {
      name = name == "lm_head.weight" ? "language_model.lm_head.weight"
                                      : "language_model." + slot.name;
    }
    raw.push_back(
        {name, worker::DTypeName(spec.dtype), slot.shape, EncodeValues(values, spec.dtype)});
    written[slot.name] = {slot.shape, std::move(values)};
  }
  if (spec.gemma3_multimodal) {
    // Stand-ins for the vision tower and projector, which the loader must skip.
    for (const char* name : {"vision_tower.vision_model.embeddings.patch_embedding.weight",
                             "multi_modal_projector.mm_input_projection_weight"}) {
      raw.push_back({name, worker::DTypeName(spec.dtype), {2, 4},
                     EncodeValues(std::vector<float>(8, 0.5f), spec.dtype)});
    }
  }

  const std::string config_json =
      spec.config_json.empty() ? ConfigJson(spec.config, spec.dtype, spec.gemma3_multimodal)
                               : spec.config_json;
  RETURN_IF_ERROR(WriteFile((fs::path(dir) / "config.json").string(), config_json));
  if (spec.num_shards == 1) {
    RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / "model.safetensors").string(), raw));
    return written;
  }
  Json index;
  uint64_t total_size = 0;
  for (const RawTensor& tensor : raw) total_size += tensor.bytes.size();
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = Json::object();
  const size_t n = raw.size();
  for (int shard = 0; shard < spec.num_shards; ++shard) {
    const std::string name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, spec.num_shards);
    std::vector<RawTensor> part(raw.begin() + n * shard / spec.num_shards,
                                raw.begin() + n * (shard + 1) / spec.num_shards);
    for (const RawTensor& tensor : part) index["weight_map"][tensor.name] = name;
    RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / name).string(), part));
  }
  RETURN_IF_ERROR(
      WriteFile((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2)));
  return written;
}

}  // namespace carpool::testing
