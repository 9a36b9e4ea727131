#include "worker/weights/weights.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/weights/safetensors.h"

namespace carpool::worker {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kSyntheticPrefix[] = "synthetic:";
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::string> ReadTextFile(const fs::path& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    return absl::NotFoundError(absl::StrCat(path.string(), ": not found"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": cannot be read"));
  return text.str();
}

// Where each checkpoint tensor lives: one file, or the shards of an index.
class Checkpoint {
 public:
  struct Located {
    const SafetensorsFile* file;
    const SafetensorsEntry* entry;
  };

  static absl::StatusOr<Checkpoint> Open(const fs::path& dir) {
    Checkpoint checkpoint;
    std::error_code error;
    if (fs::exists(dir / kSingleFile, error)) {
      checkpoint.description_ = kSingleFile;
      RETURN_IF_ERROR(checkpoint.AddShard(dir, kSingleFile));
      for (const auto& [name, entry] : checkpoint.shards_.begin()->second.tensors()) {
        checkpoint.located_[name] = {&checkpoint.shards_.begin()->second, &entry};
      }
      return checkpoint;
    }
    if (!fs::exists(dir / kIndexFile, error)) {
      return absl::NotFoundError(
          absl::StrCat(dir.string(), ": neither ", kSingleFile, " nor ", kIndexFile, " found"));
    }
    checkpoint.description_ = kIndexFile;
    ASSIGN_OR_RETURN(std::string text, ReadTextFile(dir / kIndexFile));
    Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat((dir / kIndexFile).string(), ": not JSON with a \"weight_map\" object"));
    }
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat((dir / kIndexFile).string(),
                                                       ": weight_map entry for ", name,
                                                       " must be a file name in the same folder"));
      }
      const std::string shard_name = shard.get<std::string>();
      if (!checkpoint.shards_.contains(shard_name)) {
        RETURN_IF_ERROR(checkpoint.AddShard(dir, shard_name));
      }
      const SafetensorsFile& file = checkpoint.shards_.at(shard_name);
      const SafetensorsEntry* entry = file.Find(name);
      if (entry == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(file.path(), ": has no tensor ", name,
                                                       " although ", kIndexFile, " says so"));
      }
      checkpoint.located_[name] = {&file, entry};
    }
    return checkpoint;
  }

  bool Has(const std::string& name) const { return located_.contains(name); }
  // How many tensors' names start with `prefix`.
  int CountWithPrefix(const std::string& prefix) const {
    int count = 0;
    for (auto it = located_.lower_bound(prefix);
         it != located_.end() && absl::StartsWith(it->first, prefix); ++it) {
      ++count;
    }
    return count;
  }
  const std::string& description() const { return description_; }

  // Norms are read as fp32 whatever `options` says.
  absl::StatusOr<Tensor> Read(const TensorSlot& slot, ThreadPool* pool,
                              const LoadOptions& options) const {
    auto it = located_.find(slot.name);
    if (it == located_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing tensor ", slot.name, " (not in ", description_, ")"));
    }
    const SafetensorsEntry& entry = *it->second.entry;
    if (entry.shape != slot.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape mismatch for ", slot.name, ": expected ", ShapeString(slot.shape), ", got ",
          ShapeString(entry.shape), " in ", fs::path(it->second.file->path()).filename().string()));
    }
    LoadOptions read_options = options;
    if (slot.norm) read_options.keep_bf16 = false;
    if (slot.split_dim < 0) return it->second.file->Read(entry, pool, read_options);
    return it->second.file->ReadSlice(entry, slot.split_dim, slot.split_begin, slot.split_end,
                                      pool, read_options);
  }

  std::vector<std::shared_ptr<MappedFile>> Files() const {
    std::vector<std::shared_ptr<MappedFile>> files;
    for (const auto& [name, shard] : shards_) files.push_back(shard.file());
    return files;
  }

 private:
  absl::Status AddShard(const fs::path& dir, const std::string& name) {
    ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open((dir / name).string()));
    shards_.emplace(name, std::move(file));
    return absl::OkStatus();
  }

  std::string description_;
  std::map<std::string, SafetensorsFile> shards_;  // node-based: Located pointers stay valid
  std::map<std::string, Located> located_;
};

// Where a checkpoint keeps the language model. Gemma3ForConditionalGeneration checkpoints hold
// it under "language_model." as published (language_model.model.layers..., and
// language_model.lm_head when untied), or under "model.language_model." as newer transformers
// versions save them (lm_head stays lm_head); their vision tower and projector are not read.
struct LanguageModelNames {
  std::string model = "model.";
  std::string lm_head = "lm_head.weight";
  bool multimodal = false;

  static LanguageModelNames Of(const Checkpoint& checkpoint) {
    LanguageModelNames names;
    if (checkpoint.Has("language_model.model.embed_tokens.weight")) {
      names = {"language_model.model.", "language_model.lm_head.weight", true};
    } else if (checkpoint.Has("model.language_model.embed_tokens.weight")) {
      names = {"model.language_model.", "lm_head.weight", true};
    }
    return names;
  }

  // The checkpoint's name for TensorSlots' `name` ("model.*" or "lm_head.weight").
  std::string Of(const std::string& name) const {
    if (name == "lm_head.weight") return lm_head;
    return model + name.substr(std::string("model.").size());
  }
};

// Every tensor of a layer (the optional ones empty when the model has none). Layer is
// LayerWeights or const LayerWeights.
template <typename Layer>
auto LayerTensors(Layer& l) {
  return std::array{&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.q_bias,
                    &l.k_bias, &l.v_bias, &l.o_proj, &l.post_attention_norm, &l.q_norm,
                    &l.k_norm, &l.pre_feedforward_norm, &l.post_feedforward_norm,
                    &l.gate_proj, &l.up_proj, &l.down_proj};
}

// Replaces each norm tensor w by 1 + w, added in fp32 (transformers' Gemma RMSNorm computes
// (1.0 + weight.float())). Norms are replicated under tensor parallelism, so every rank folds
// its own whole copy.
void FoldNormWeights(const std::vector<TensorSlot>& slots) {
  for (const TensorSlot& slot : slots) {
    if (!slot.norm) continue;
    const Tensor& w = *slot.tensor;
    std::vector<float> folded(w.data(), w.data() + w.numel());
    for (float& v : folded) v = 1.0f + v;
    *slot.tensor = Tensor::Owned(std::move(folded), w.shape());
  }
}

absl::StatusOr<std::unique_ptr<LlamaWeights>> LoadFolder(const std::string& folder,
                                                         const TensorParallelRank& tp,
                                                         ThreadPool* pool,
                                                         const LoadOptions& options) {
  const fs::path dir(folder);
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return absl::NotFoundError(absl::StrCat(folder, ": no such model folder"));
  }
  ASSIGN_OR_RETURN(std::string config_text, ReadTextFile(dir / "config.json"));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(config_text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(folder, "/", config.status().message()));
  }
  ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(dir));

  auto weights = std::make_unique<LlamaWeights>();
  weights->config = *std::move(config);
  const LanguageModelNames names = LanguageModelNames::Of(checkpoint);
  if (names.multimodal) {
    std::cerr << "carpool: " << folder << ": a multimodal checkpoint; serving its language model ("
              << names.model << "*), "
              << checkpoint.CountWithPrefix("vision_tower.") +
                     checkpoint.CountWithPrefix("multi_modal_projector.") +
                     checkpoint.CountWithPrefix("model.vision_tower.") +
                     checkpoint.CountWithPrefix("model.multi_modal_projector.")
              << " vision tower and projector tensors are not loaded\n";
  }
  // Some checkpoints carry q/k/v biases that config.json does not announce.
  if (checkpoint.Has(names.Of("model.layers.0.self_attn.q_proj.bias"))) {
    if (weights->config.qk_norm) {
      // Qwen 3 and Gemma 3 would bias o_proj as well, which carpool does not implement.
      return absl::UnimplementedError(
          absl::StrCat(folder, ": ", names.Of("model.layers.0.self_attn.q_proj.bias"),
                       ": biased attention is not implemented for ",
                       weights->config.architecture));
    }
    weights->config.attention_bias = true;
  }
  weights->tp = tp;
  absl::StatusOr<ShardLayout> shard = PlanShard(weights->config, tp);
  if (!shard.ok()) {
    return absl::Status(shard.status().code(),
                        absl::StrCat(folder, ": ", shard.status().message()));
  }
  weights->shard = *shard;
  const std::vector<TensorSlot> slots = TensorSlots(weights.get());
  for (TensorSlot slot : slots) {
    slot.name = names.Of(slot.name);
    if (slot.name == names.lm_head && !checkpoint.Has(slot.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing tensor ", slot.name, " (not in ", checkpoint.description(),
                       ") and config.json does not set tie_word_embeddings"));
    }
    ASSIGN_OR_RETURN(*slot.tensor, checkpoint.Read(slot, pool, options));
  }
  if (weights->config.norm_weight_plus_one) FoldNormWeights(slots);
  if (weights->config.tie_word_embeddings) weights->lm_head = weights->embed_tokens;
  weights->files = checkpoint.Files();
  return weights;
}

}  // namespace

Tensor Tensor::View(const float* data, std::vector<int64_t> shape,
                    std::shared_ptr<const void> owner) {
  Tensor tensor;
  tensor.data_ = data;
  tensor.shape_ = std::move(shape);
  tensor.owned_ = std::move(owner);
  return tensor;
}

Tensor Tensor::ViewBf16(const uint16_t* data, std::vector<int64_t> shape,
                        std::shared_ptr<const void> owner) {
  Tensor tensor;
  tensor.data_ = data;
  tensor.type_ = TensorType::kBF16;
  tensor.shape_ = std::move(shape);
  tensor.owned_ = std::move(owner);
  return tensor;
}

Tensor Tensor::Owned(std::vector<float> values, std::vector<int64_t> shape) {
  CARPOOL_CHECK(static_cast<int64_t>(values.size()) == Product(shape));
  auto owned = std::make_shared<const std::vector<float>>(std::move(values));
  Tensor tensor;
  tensor.data_ = owned->data();
  tensor.shape_ = std::move(shape);
  tensor.owned_ = std::move(owned);
  return tensor;
}

Tensor Tensor::Owned(std::unique_ptr<float[]> values, std::vector<int64_t> shape) {
  std::shared_ptr<const float[]> owned(std::move(values));
  Tensor tensor;
  tensor.data_ = owned.get();
  tensor.shape_ = std::move(shape);
  tensor.owned_ = std::move(owned);
  return tensor;
}

Tensor Tensor::OwnedBf16(std::unique_ptr<uint16_t[]> values, std::vector<int64_t> shape) {
  std::shared_ptr<const uint16_t[]> owned(std::move(values));
  Tensor tensor;
  tensor.data_ = owned.get();
  tensor.type_ = TensorType::kBF16;
  tensor.shape_ = std::move(shape);
  tensor.owned_ = std::move(owned);
  return tensor;
}

const float* Tensor::data() const {
  CARPOOL_CHECK(type_ == TensorType::kF32 || data_ == nullptr);
  return static_cast<const float*>(data_);
}

const uint16_t* Tensor::bf16_data() const {
  CARPOOL_CHECK(type_ == TensorType::kBF16 || data_ == nullptr);
  return static_cast<const uint16_t*>(data_);
}

int64_t Tensor::numel() const { return data_ == nullptr ? 0 : Product(shape_); }

int64_t Tensor::nbytes() const { return numel() * (type_ == TensorType::kF32 ? 4 : 2); }

std::vector<int64_t> TensorSlot::LocalShape() const {
  std::vector<int64_t> local = shape;
  if (split_dim >= 0) local[split_dim] = split_end - split_begin;
  return local;
}

int64_t LlamaWeights::ParameterBytes() const {
  int64_t bytes = embed_tokens.nbytes() + final_norm.nbytes();
  if (lm_head.raw_data() != embed_tokens.raw_data()) bytes += lm_head.nbytes();
  for (const LayerWeights& layer : layers) {
    for (const Tensor* t : LayerTensors(layer)) bytes += t->nbytes();
  }
  return bytes;
}

void LlamaWeights::ReleaseTensors() {
  const auto release = [](Tensor* t) {
    *t = t->type() == TensorType::kF32 ? Tensor::View(nullptr, t->shape())
                                       : Tensor::ViewBf16(nullptr, t->shape());
  };
  release(&embed_tokens);
  release(&final_norm);
  release(&lm_head);
  for (LayerWeights& layer : layers) {
    for (Tensor* t : LayerTensors(layer)) release(t);
  }
  files.clear();
}

std::vector<TensorSlot> TensorSlots(LlamaWeights* weights) {
  const ModelConfig& c = weights->config;
  const ShardLayout& shard = weights->shard;
  const bool split = weights->tp.size > 1;
  const int64_t hidden = c.hidden_size;
  const int64_t d = c.head_dim;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * d;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * d;
  const int64_t inter = c.intermediate_size;
  // Slices along dimension `dim` (a no-op for the whole model).
  // Norm weights are replicated on every rank.
  auto norm = [](std::string name, int64_t size, Tensor* tensor) {
    TensorSlot slot{std::move(name), {size}, tensor};
    slot.norm = true;
    return slot;
  };
  auto part = [&](TensorSlot slot, int dim, int64_t begin, int64_t count) {
    if (split) {
      slot.split_dim = dim;
      slot.split_begin = begin;
      slot.split_end = begin + count;
    }
    return slot;
  };
  const int64_t q_begin = shard.heads_begin * d, q_count = shard.num_heads * d;
  const int64_t kv_begin = shard.kv_heads_begin * d, kv_count = shard.num_kv_heads * d;
  weights->layers.resize(c.num_layers);
  std::vector<TensorSlot> slots;
  slots.push_back(part({"model.embed_tokens.weight", {c.vocab_size, hidden}, &weights->embed_tokens},
                       0, shard.vocab_begin, shard.vocab));
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& layer = weights->layers[i];
    const std::string prefix = absl::StrCat("model.layers.", i, ".");
    const std::string attn = prefix + "self_attn.";
    slots.push_back(norm(prefix + "input_layernorm.weight", hidden, &layer.input_norm));
    slots.push_back(part({attn + "q_proj.weight", {q_dim, hidden}, &layer.q_proj}, 0, q_begin,
                         q_count));
    slots.push_back(part({attn + "k_proj.weight", {kv_dim, hidden}, &layer.k_proj}, 0, kv_begin,
                         kv_count));
    slots.push_back(part({attn + "v_proj.weight", {kv_dim, hidden}, &layer.v_proj}, 0, kv_begin,
                         kv_count));
    if (c.attention_bias) {
      slots.push_back(part({attn + "q_proj.bias", {q_dim}, &layer.q_bias}, 0, q_begin, q_count));
      slots.push_back(part({attn + "k_proj.bias", {kv_dim}, &layer.k_bias}, 0, kv_begin,
                           kv_count));
      slots.push_back(part({attn + "v_proj.bias", {kv_dim}, &layer.v_bias}, 0, kv_begin,
                           kv_count));
    }
    slots.push_back(part({attn + "o_proj.weight", {hidden, q_dim}, &layer.o_proj}, 1, q_begin,
                         q_count));
    if (c.qk_norm) {
      slots.push_back(norm(attn + "q_norm.weight", d, &layer.q_norm));
      slots.push_back(norm(attn + "k_norm.weight", d, &layer.k_norm));
    }
    slots.push_back(
        norm(prefix + "post_attention_layernorm.weight", hidden, &layer.post_attention_norm));
    if (c.sandwich_norms) {
      slots.push_back(
          norm(prefix + "pre_feedforward_layernorm.weight", hidden, &layer.pre_feedforward_norm));
      slots.push_back(norm(prefix + "post_feedforward_layernorm.weight", hidden,
                           &layer.post_feedforward_norm));
    }
    slots.push_back(part({prefix + "mlp.gate_proj.weight", {inter, hidden}, &layer.gate_proj}, 0,
                         shard.intermediate_begin, shard.intermediate));
    slots.push_back(part({prefix + "mlp.up_proj.weight", {inter, hidden}, &layer.up_proj}, 0,
                         shard.intermediate_begin, shard.intermediate));
    slots.push_back(part({prefix + "mlp.down_proj.weight", {hidden, inter}, &layer.down_proj}, 1,
                         shard.intermediate_begin, shard.intermediate));
  }
  slots.push_back(norm("model.norm.weight", hidden, &weights->final_norm));
  if (!c.tie_word_embeddings) {
    slots.push_back(part({"lm_head.weight", {c.vocab_size, hidden}, &weights->lm_head}, 0,
                         shard.vocab_begin, shard.vocab));
  }
  return slots;
}

absl::StatusOr<std::unique_ptr<LlamaWeights>> LoadWeights(const std::string& spec,
                                                          const TensorParallelRank& tp,
                                                          ThreadPool* pool,
                                                          const LoadOptions& options) {
  if (absl::StartsWith(spec, kSyntheticPrefix)) {
    ASSIGN_OR_RETURN(ModelConfig config,
                     SyntheticConfig(spec.substr(sizeof(kSyntheticPrefix) - 1)));
    absl::StatusOr<ShardLayout> shard = PlanShard(config, tp);
    if (!shard.ok()) {
      return absl::Status(shard.status().code(),
                          absl::StrCat(spec, ": ", shard.status().message()));
    }
    return SyntheticWeights(config, kSyntheticSeed, tp, pool, options);
  }
  return LoadFolder(spec, tp, pool, options);
}

}  // namespace carpool::worker
