// The Llama-family forward pass over a paged KV cache, on the CPU kernels.
//
// Semantics follow Hugging Face LlamaForCausalLM: RMSNorm, rotate-half RoPE (with rope_scaling),
// grouped-query attention, SwiGLU MLP, optional q/k/v bias (Qwen2), tied or separate lm_head.
// One Forward() runs one scheduler step: any mix of prefill chunks and decodes.
//
// Thread-compatible: one engine loop drives it. Kernels parallelize internally.
#ifndef CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_
#define CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kernel_params.h"
#include "worker/scheduler/scheduler.h"
#include "worker/weights/weights.h"

namespace carpool::worker {

struct KvCacheShape {
  int num_blocks = 0;
  int block_size = 16;
};

class LlamaModel {
 public:
  // Takes the weights and allocates the KV pool: num_blocks x block_size slots per layer.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape);

  // Bytes of KV cache one block takes across all layers (keys and values, fp32).
  static int64_t KvBytesPerBlock(const ModelConfig& config, int block_size);

  // Computes the plan's tokens, stores their keys and values in the cache, and writes the
  // logits of every scheduled sequence with `sample` set, in plan order, to `logits`
  // ([num sampled, vocab_size]). REQUIRES: every block table covers its sequence's tokens.
  void Forward(const BatchPlan& plan, std::vector<float>* logits);

  const ModelConfig& config() const { return weights_->config; }
  const LlamaWeights& weights() const { return *weights_; }
  const KvCacheShape& kv_shape() const { return kv_shape_; }

  // Bytes one decode step must read at batch 1: every layer's weights, the final norm and the
  // head, but a single embedding row.
  int64_t DecodeWeightBytes() const;

 private:
  LlamaModel(std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape);

  // Per-step inputs derived from the plan.
  struct StepInputs {
    std::vector<int32_t> token_ids;
    std::vector<int32_t> positions;
    std::vector<int64_t> slots;
    std::vector<kernels::AttentionSeq> attention_seqs;
    std::vector<int64_t> sample_rows;
    bool decode_only = true;
  };
  void PrepareInputs(const BatchPlan& plan, StepInputs* in) const;
  void Attention(int layer, const StepInputs& in, int64_t t);
  void Mlp(int layer, int64_t t);

  std::unique_ptr<LlamaWeights> weights_;
  KvCacheShape kv_shape_;
  kernels::KvCacheLayout layout_;
  std::vector<float> inv_freq_;
  // KV pool: per layer, keys then values, each num_blocks * block_size * kv_heads * head_dim.
  std::vector<std::unique_ptr<float[]>> key_cache_;
  std::vector<std::unique_ptr<float[]>> value_cache_;
  // Activation scratch, grown on demand and reused across steps.
  std::vector<float> residual_, hidden_, q_, k_, v_, attn_, gate_, up_, out_;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_
