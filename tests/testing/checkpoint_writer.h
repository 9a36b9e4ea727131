// Writes Hugging Face-format checkpoints (config.json + safetensors) for tests, and the
// malformed files loader tests need.
//
// The values are SyntheticWeights(config, seed) (norms of a norm_weight_plus_one config as w,
// not 1 + w) rounded to the checkpoint's dtype, so they have
// the synthetic presets' scale (greedy decoding does not collapse to one token), and
// WriteCheckpoint returns exactly what it stored: a test can build an independent reference
// model from the same numbers.
#ifndef CARPOOL_TESTS_TESTING_CHECKPOINT_WRITER_H_
#define CARPOOL_TESTS_TESTING_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/weights/model_config.h"
#include "worker/weights/safetensors.h"

namespace carpool::testing {

struct CheckpointSpec {
  worker::ModelConfig config;
  // Default: F32.
  worker::DType dtype = worker::DType::kF32;
  // 1: model.safetensors; n > 1: model-0000i-of-0000n.safetensors + model.safetensors.index.json.
  int num_shards = 1;
  uint64_t seed = 1;
  // Default (nullopt): write lm_head.weight exactly when the config does not tie it.
  std::optional<bool> write_lm_head;
  // Write a Gemma3ForConditionalGeneration checkpoint of config (a Gemma 3 config): config.json
  // with text_config and vision_config, the language model's tensors under "language_model."
  // and two vision tensors the loader must skip. Default: a text-only checkpoint.
  bool gemma3_multimodal = false;
  // config.json verbatim (e.g. a published config's exact keys); it must describe `config`'s
  // tensors. Default (empty): ConfigJson(config, dtype, gemma3_multimodal).
  std::string config_json;
};

struct CheckpointTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;  // as stored, after rounding to the dtype
};

// Hugging Face tensor name of the text-only model ("model.*", "lm_head.weight"; a multimodal
// checkpoint stores them under "language_model.") -> what was written. Norm tensors of a
// norm_weight_plus_one config hold w (the loader folds them into 1 + w): this is what
// ReferenceLlama takes.
using CheckpointTensors = std::map<std::string, CheckpointTensor>;

// Creates `dir` (and parents) and writes config.json and the safetensors file(s).
absl::StatusOr<CheckpointTensors> WriteCheckpoint(const std::string& dir,
                                                  const CheckpointSpec& spec);

// Each tensor's values by name: what ReferenceLlama takes.
std::map<std::string, std::vector<float>> RawValues(const CheckpointTensors& tensors);

// The small Llama the model, engine and embedding tests write checkpoints of: vocabulary 300,
// hidden 64, 2 layers, 4 query heads over 2 key/value heads of 16, BOS 1, EOS 2.
worker::ModelConfig TinyTestConfig();

// config.json text for `config` with the keys Hugging Face publishes for its family (those of
// Llama-3.2-1B, Mistral-7B-v0.1, Qwen3-0.6B / Qwen2, gemma-3-1b-it, or gemma-3-4b-it's
// Gemma3ForConditionalGeneration with `gemma3_multimodal`); torch_dtype is `dtype`'s. For Gemma 3
// the parsed embedding_multiplier is sqrt(hidden_size) rounded to `dtype`.
std::string ConfigJson(const worker::ModelConfig& config,
                       worker::DType dtype = worker::DType::kF32, bool gemma3_multimodal = false);

// One tensor of a safetensors file, as raw little-endian bytes.
struct RawTensor {
  std::string name;
  std::string dtype;  // any string: "F32", "BF16", "I8", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

// `values` rounded to `dtype` and encoded little-endian.
std::string EncodeValues(const std::vector<float>& values, worker::DType dtype);
// The values EncodeValues(values, dtype) decodes to.
std::vector<float> RoundToDType(const std::vector<float>& values, worker::DType dtype);
// Every tensor of `tensors`, encoded as `dtype`.
std::vector<RawTensor> ToRawTensors(const CheckpointTensors& tensors, worker::DType dtype);

// The JSON header for `tensors` laid out back to back in order, without padding.
std::string SafetensorsHeader(const std::vector<RawTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});
// A well-formed safetensors file: the header padded with spaces to a multiple of 8 bytes, as
// the Python library writes it.
absl::Status WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors);
// Exactly: `header_length` as 8 little-endian bytes, then `header`, then `data`. For corrupt
// files (a length that disagrees with the header, a truncated data section, ...).
absl::Status WriteSafetensorsRaw(const std::string& path, uint64_t header_length,
                                 const std::string& header, const std::string& data);
// Writes `contents` to `path` verbatim.
absl::Status WriteFile(const std::string& path, const std::string& contents);

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_CHECKPOINT_WRITER_H_
