// The Llama-family forward pass over a paged KV cache, on the CPU kernels.
//
// Semantics follow Hugging Face LlamaForCausalLM: RMSNorm, rotate-half RoPE (with rope_scaling),
// grouped-query attention, SwiGLU MLP, optional q/k/v bias (Qwen2), tied or separate lm_head.
// One Forward() runs one scheduler step: any mix of prefill chunks and decodes. Embed() runs
// a prefill-only pass over one-shot inputs and pools their final hidden states (embeddings);
// it keeps no KV blocks (its keys and values live in a scratch buffer for the pass).
//
// Tensor parallelism (Megatron): with weights sliced for rank r of a group
// (worker/weights/shard_layout.h) and the group's Communicator, each rank computes its query and
// key/value heads and its share of the MLP's intermediate features; the partial outputs of
// o_proj and down_proj are all-reduced, the vocabulary-parallel embedding is all-reduced, and the
// head's logits are gathered on the leader (group rank 0). The leader's Forward broadcasts the
// step (worker/model/step_plan.h) before computing it; followers receive it and call
// ForwardStep. A collective that fails ends the process (cluster::FailGroup): the group cannot
// finish the step.
//
// Thread-compatible: one engine loop drives it. Kernels parallelize internally.
#ifndef CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_
#define CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cluster/communicator.h"
#include "common/messages.h"
#include "kernels/kernel_params.h"
#include "worker/model/step_plan.h"
#include "worker/scheduler/scheduler.h"
#include "worker/weights/weights.h"

namespace carpool::worker {

struct KvCacheShape {
  int num_blocks = 0;
  int block_size = 16;
};

// One input of LlamaModel::Embed.
struct EmbeddingInput {
  std::vector<int32_t> tokens;  // the whole input, position 0 first; not empty
  // kMean: the mean of the final-norm hidden states of all tokens; kLast: the last token's.
  Pooling pooling = Pooling::kMean;
  // Scale the pooled vector to unit L2 norm (a zero vector stays zero).
  bool normalize = true;
};

// Where a tensor-parallel rank's time in collectives went, cumulative, in microseconds.
struct CollectiveTimes {
  int64_t all_reduce_micros = 0;  // embedding, o_proj and down_proj sums
  int64_t all_reduces = 0;
  int64_t gather_micros = 0;      // logits to the leader
  int64_t broadcast_micros = 0;   // the leader's step plans
};

class LlamaModel {
 public:
  // Takes the weights and allocates the KV pool: num_blocks x block_size slots per layer (of
  // this rank's key/value heads). `group` (not owned, outlives the model) is the
  // tensor-parallel group when weights->tp.size > 1, and must then match weights->tp; nullptr
  // otherwise.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape,
      cluster::Communicator* group = nullptr);

  // Bytes of KV cache one block takes across all layers (keys and values, fp32).
  static int64_t KvBytesPerBlock(const ModelConfig& config, int block_size);

  // Computes the plan's tokens, stores their keys and values in the cache, and writes the
  // logits of every scheduled sequence with `sample` set, in plan order, to `logits`
  // ([num sampled, vocab_size]). REQUIRES: every block table covers its sequence's tokens.
  // Under tensor parallelism only the leader calls it, and it broadcasts the step first.
  void Forward(const BatchPlan& plan, std::vector<float>* logits);

  // A tensor-parallel follower's Forward: the step the leader broadcast. `logits` is left
  // empty (only the leader gathers them).
  void ForwardStep(const StepPlan& step, std::vector<float>* logits);

  // Embeddings: runs the layers over every input (causal attention within each input, each
  // from position 0), applies the final RMSNorm and pools per input as it asks. Writes one
  // vector of hidden_size floats per input, in input order, to `out`. Inputs are grouped into
  // passes of at most `max_tokens_per_pass` tokens (0: all in one pass; an input longer than
  // the budget runs alone), which bounds the activation memory; a result depends only on its
  // own input, bit for bit, never on the rest of the batch, the passes or the thread count.
  // Keys and values go to a scratch buffer reused across layers and calls, never to the KV
  // pool. Errors (nothing written then): INVALID_ARGUMENT for an empty input, a token outside
  // the vocabulary or an input longer than max_position_embeddings, naming the input;
  // UNIMPLEMENTED under tensor parallelism (the step-plan broadcast carries only generation
  // steps, so the followers could not join the pass's collectives).
  absl::Status Embed(absl::Span<const EmbeddingInput* const> inputs,
                     std::vector<std::vector<float>>* out, int64_t max_tokens_per_pass = 0);

  const ModelConfig& config() const { return weights_->config; }
  const LlamaWeights& weights() const { return *weights_; }
  const KvCacheShape& kv_shape() const { return kv_shape_; }

  // Bytes one decode step must read at batch 1: every layer's weights, the final norm and the
  // head, but a single embedding row.
  int64_t DecodeWeightBytes() const;

  // Null without tensor parallelism.
  cluster::Communicator* group() const { return group_; }
  const CollectiveTimes& collective_times() const { return times_; }

 private:
  LlamaModel(std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape,
             cluster::Communicator* group);

  // Per-step inputs derived from the plan.
  struct StepInputs {
    std::vector<int32_t> token_ids;
    std::vector<int32_t> positions;
    std::vector<int64_t> slots;
    std::vector<kernels::AttentionSeq> attention_seqs;
    std::vector<int64_t> sample_rows;
    bool decode_only = true;
    // Keys and values go to embed_keys_ / embed_values_ (layout embed_layout_, shared by every
    // layer) instead of the KV pool.
    bool scratch_kv = false;
  };
  void PrepareInputs(const BatchPlan& plan, StepInputs* in) const;
  void PrepareInputs(const StepPlan& step, StepInputs* in) const;
  void Compute(const StepInputs& in, std::vector<float>* logits);
  // Embeddings through the final norm: leaves the final-norm hidden states in hidden_.
  void RunLayers(const StepInputs& in);
  // One pass of Embed over inputs already checked.
  void EmbedPass(absl::Span<const EmbeddingInput* const> inputs, std::vector<float>* out);
  void EmbedTokens(const StepInputs& in, int64_t t);
  void Attention(int layer, const StepInputs& in, int64_t t);
  void Mlp(int layer, int64_t t);
  void Head(const StepInputs& in, std::vector<float>* logits);
  // Sums `count` floats of `data` over the group (no-op without one).
  void AllReduce(float* data, int64_t count);

  std::unique_ptr<LlamaWeights> weights_;
  KvCacheShape kv_shape_;
  cluster::Communicator* const group_;
  // This rank's heads and widths (the whole model's without tensor parallelism).
  int num_heads_;
  int num_kv_heads_;
  int64_t intermediate_;
  int64_t vocab_;
  CollectiveTimes times_;
  kernels::KvCacheLayout layout_;
  std::vector<float> inv_freq_;
  // KV pool: per layer, keys then values, each num_blocks * block_size * kv_heads * head_dim.
  std::vector<std::unique_ptr<float[]>> key_cache_;
  std::vector<std::unique_ptr<float[]>> value_cache_;
  // Embed's keys and values of one layer at a time: [tokens of the pass][kv heads][head_dim],
  // addressed through embed_layout_ (block_size 1) and embed_table_ (0, 1, 2, ...).
  kernels::KvCacheLayout embed_layout_;
  std::vector<float> embed_keys_, embed_values_;
  std::vector<int32_t> embed_table_;
  // Activation scratch, grown on demand and reused across steps.
  std::vector<float> residual_, hidden_, q_, k_, v_, attn_, gate_, up_, out_;
  std::vector<float> local_logits_, gathered_;  // tensor parallelism: the head's slices
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_
