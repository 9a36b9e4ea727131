// Llama-family weights, from a Hugging Face folder or a synthetic preset.
//
// By default every tensor is fp32: F32 tensors of a safetensors file are used in place from the
// memory map; F16 and BF16 ones are converted once into owned fp32 buffers. With
// LoadOptions::keep_bf16, BF16 tensors other than norms stay bf16 (in place where they can), so
// a bf16 model costs 2 bytes a parameter rather than 4 plus the mapping. Linear weights keep the
// checkpoint layout [out_features, in_features].
//
// Under tensor parallelism (TensorParallelRank) each rank reads only its slices
// (worker/weights/shard_layout.h): row slices of aligned F32 (and kept BF16) tensors are views
// into the mapping, other slices are copies of just the slice. No rank copies a whole split
// tensor.
#ifndef CARPOOL_WORKER_WEIGHTS_WEIGHTS_H_
#define CARPOOL_WORKER_WEIGHTS_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "worker/weights/model_config.h"
#include "worker/weights/shard_layout.h"

namespace carpool::worker {

// How a Tensor stores its values.
enum class TensorType {
  kF32,   // float
  kBF16,  // bfloat16 bits as uint16_t (the upper half of the fp32 value), as checkpoints hold
};

// A read-only tensor of fp32 or bf16 values. Its memory is owned by the tensor (Owned), by
// whatever `owner` a View was given (a mapped checkpoint file), or by the caller (a View without
// an owner). Copies share the memory.
class Tensor {
 public:
  Tensor() = default;
  // A view of memory owned elsewhere; `owner`, when given, is kept alive by the view and its
  // copies (the loader passes the mapped file, so a view keeps its mapping).
  static Tensor View(const float* data, std::vector<int64_t> shape,
                     std::shared_ptr<const void> owner = nullptr);
  static Tensor ViewBf16(const uint16_t* data, std::vector<int64_t> shape,
                         std::shared_ptr<const void> owner = nullptr);
  // Owns its values. REQUIRES: values.size() == the product of shape.
  static Tensor Owned(std::vector<float> values, std::vector<int64_t> shape);
  // Owns a buffer of the product of shape elements (lets large loads skip zero-filling).
  static Tensor Owned(std::unique_ptr<float[]> values, std::vector<int64_t> shape);
  static Tensor OwnedBf16(std::unique_ptr<uint16_t[]> values, std::vector<int64_t> shape);

  // kF32 for Tensor(), View and Owned; kBF16 for ViewBf16 and OwnedBf16.
  TensorType type() const { return type_; }
  // The fp32 values. REQUIRES (checked): type() == kF32 or empty() (then nullptr). Code that
  // may meet bf16 weights checks type() first.
  const float* data() const;
  // The bf16 bits. REQUIRES (checked): type() == kBF16 or empty() (then nullptr).
  const uint16_t* bf16_data() const;
  // The memory whatever the type: for byte copies and for telling whether two tensors share it
  // (a tied head). nullptr when empty.
  const void* raw_data() const { return data_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;   // 0 for an empty Tensor
  int64_t nbytes() const;  // numel() times 4 (kF32) or 2 (kBF16)
  bool empty() const { return data_ == nullptr; }

 private:
  const void* data_ = nullptr;
  TensorType type_ = TensorType::kF32;
  std::vector<int64_t> shape_;
  std::shared_ptr<const void> owned_;  // keeps data_ alive, when the tensor owns it or has an owner
};

struct LayerWeights {
  Tensor input_norm;                     // [H]
  Tensor q_proj, k_proj, v_proj;         // [heads*D, H], [kv*D, H], [kv*D, H]
  Tensor q_bias, k_bias, v_bias;         // empty unless config.attention_bias
  Tensor o_proj;                         // [H, heads*D]
  Tensor post_attention_norm;            // [H]; with config.sandwich_norms it normalizes the
                                         // attention output before the residual add
  Tensor q_norm, k_norm;                 // [D], only with config.qk_norm
  Tensor pre_feedforward_norm;           // [H], only with config.sandwich_norms (pre-MLP)
  Tensor post_feedforward_norm;          // [H], only with config.sandwich_norms (MLP output)
  Tensor gate_proj, up_proj;             // [I, H]
  Tensor down_proj;                      // [H, I]
};

class MappedFile;  // defined in safetensors.h

// Shapes are the whole model's; a tensor-parallel rank holds its slices of them (`shard`).
struct LlamaWeights {
  ModelConfig config;
  TensorParallelRank tp;                 // the whole model unless tp.size > 1
  ShardLayout shard;                     // what this rank holds (PlanShard(config, tp))
  Tensor embed_tokens;                   // [V, H]
  std::vector<LayerWeights> layers;
  Tensor final_norm;                     // [H]
  // With config.norm_weight_plus_one every norm tensor above holds 1 + w (computed in fp32 at
  // load, as transformers does), so the model applies each as a plain RMSNorm weight.
  Tensor lm_head;                        // [V, H]; the same data as embed_tokens when tied
  // The checkpoint's mapped files. Views hold their file too, so a mapping lives exactly as
  // long as this list or a tensor that views it.
  std::vector<std::shared_ptr<MappedFile>> files;

  // Bytes of the tensors as they are stored (4 per fp32 value, 2 per bf16 one); a tied head
  // counts once. 0 after ReleaseTensors.
  int64_t ParameterBytes() const;

  // Drops the host copy of every tensor once a device has made its own (packed, quantized or
  // uploaded) copies: each tensor becomes empty, keeping its shape and type (numel() and
  // ParameterBytes() read 0 after), and `files` is cleared. Owned buffers are freed and each
  // mapped file is unmapped as soon as no tensor references it any more, so a device that
  // still borrows some tensor must hold a copy of that Tensor (which keeps its memory), not
  // just its pointer. config, tp and shard stay.
  void ReleaseTensors();
};

// One tensor a config calls for: its Hugging Face name, its shape, and where it goes.
struct TensorSlot {
  std::string name;              // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;    // the whole tensor's, as the checkpoint stores it
  Tensor* tensor;
  // The part this rank holds: indices [split_begin, split_end) of dimension split_dim (0: rows,
  // 1: columns); split_dim -1: the whole tensor.
  int split_dim = -1;
  int64_t split_begin = 0;
  int64_t split_end = 0;
  // An RMSNorm weight (replicated under tensor parallelism). With config.norm_weight_plus_one
  // the checkpoint stores w and the loader puts 1 + w in `tensor`.
  bool norm = false;

  // `shape` with the split dimension cut to the slice.
  std::vector<int64_t> LocalShape() const;
};
// Every tensor `weights->config` calls for, in checkpoint order: embed_tokens, per layer
// input_layernorm, q/k/v_proj (+ their biases with attention_bias), o_proj,
// self_attn.q_norm/k_norm (qk_norm), post_attention_layernorm, pre/post_feedforward_layernorm
// (sandwich_norms), gate/up/down_proj, then model.norm and, unless tied, lm_head. Names are the
// text-only checkpoint's ("model.*"); the loader finds a multimodal checkpoint's language model
// under its own prefix. With weights->tp.size > 1 each slot names this rank's slice of
// weights->shard.
// Resizes weights->layers to config.num_layers; the pointers stay valid while `weights` does.
std::vector<TensorSlot> TensorSlots(LlamaWeights* weights);

// How LoadWeights and SyntheticWeights store the values.
struct LoadOptions {
  // Keep BF16 checkpoint tensors (and their TP slices) bf16 instead of converting them to fp32:
  // whole tensors and row slices are views of the mapping (owned copies where the file's data
  // is not 2-byte aligned), column slices owned bf16 copies. Norm weights are always fp32 (with
  // norm_weight_plus_one, 1 + w is folded in fp32); F32 and F16 tensors load as fp32 as without
  // it. Synthetic weights are drawn as without it, then every tensor but the norms is rounded to
  // bf16 (nearest even). Default: false (every tensor fp32).
  bool keep_bf16 = false;
};

// The seed LoadWeights("synthetic:<preset>") uses.
inline constexpr uint64_t kSyntheticSeed = 0x5eed'ca49'0017'2024ULL;

// `spec` is "synthetic:<preset>" or a folder with config.json and model.safetensors (or
// model.safetensors.index.json plus shards). Errors: NOT_FOUND (no such folder or file),
// INVALID_ARGUMENT (bad config, missing tensor, shape mismatch, truncated or malformed file),
// UNIMPLEMENTED (architecture or dtype not supported). Each message names the file and tensor.
// With tp.size > 1, only rank tp.rank's slices are read; INVALID_ARGUMENT (PlanShard) when the
// model does not divide by tp.size. Converting (or generating) values runs on `pool`'s threads
// (not owned; null: on the calling thread); the values do not depend on it.
absl::StatusOr<std::unique_ptr<LlamaWeights>> LoadWeights(const std::string& spec,
                                                          const TensorParallelRank& tp = {},
                                                          ThreadPool* pool = nullptr,
                                                          const LoadOptions& options = {});

// Presets: "tiny" (a few MB, vocab 258 for the byte tokenizer), "small" (~100M parameters),
// "1b" and "8b" (Llama 3 shapes; generated lazily, meant for GPUs); per newer family
// "qwen3-tiny", "gemma3-tiny", "mistral-tiny" (vocab 258, sliding windows short enough for tests
// to cross) and "qwen3-small", "gemma3-small", "mistral-small" (~100M parameters, the shapes of
// "small"). docs/models.md lists what each exercises.
absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& preset);
// Deterministic random weights for `config` from `seed`; same config + seed, same values. Norm
// tensors hold 1 + uniform(-0.1, 0.1) in every family: for norm_weight_plus_one configs that is
// already the folded 1 + w the loader makes (w = the value minus 1, exactly). Every
// value is a pure function of (seed, tensor, index in the whole tensor), so rank r of a group
// gets exactly its slices of the whole model. Generated on `pool` as LoadWeights.
// REQUIRES: PlanShard(config, tp) is OK.
std::unique_ptr<LlamaWeights> SyntheticWeights(const ModelConfig& config, uint64_t seed,
                                               const TensorParallelRank& tp = {},
                                               ThreadPool* pool = nullptr,
                                               const LoadOptions& options = {});

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_WEIGHTS_WEIGHTS_H_
