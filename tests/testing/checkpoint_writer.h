// Writes Hugging Face-format checkpoints (config.json + safetensors) for tests, and the
// malformed files loader tests need.
//
// The values are SyntheticWeights(config, seed) rounded to the checkpoint's dtype, so they have
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
};

struct CheckpointTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;  // as stored, after rounding to the dtype
};

// Hugging Face tensor name -> what was written.
using CheckpointTensors = std::map<std::string, CheckpointTensor>;

// Creates `dir` (and parents) and writes config.json and the safetensors file(s).
absl::StatusOr<CheckpointTensors> WriteCheckpoint(const std::string& dir,
                                                  const CheckpointSpec& spec);

// The small Llama the model, engine and embedding tests write checkpoints of: vocabulary 300,
// hidden 64, 2 layers, 4 query heads over 2 key/value heads of 16, BOS 1, EOS 2.
worker::ModelConfig TinyTestConfig();

// config.json text with the Hugging Face keys for `config`.
std::string ConfigJson(const worker::ModelConfig& config);

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
