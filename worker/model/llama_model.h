// The Llama-family forward pass over a paged KV cache, computed through a ModelDevice
// (worker/model/model_device.h): the CPU's kernels by default, a GPU's when given one.
//
// Semantics follow Hugging Face LlamaForCausalLM: RMSNorm, rotate-half RoPE (with rope_scaling),
// grouped-query attention, SwiGLU MLP, optional q/k/v bias (Qwen2), tied or separate lm_head;
// and what the newer families change (ModelConfig): per-head q/k norms before RoPE (Qwen3,
// Gemma 3), Gemma 3's sandwich norms, embedding multiplier, GELU-tanh MLP, query_pre_attn_scalar,
// attention and final logit softcapping, and sliding-window layers with their own RoPE table.
// (1 + w) norms need nothing here: the loader stores 1 + w.
// The model sees plain steps only (worker/model/step_plan.h), never the scheduler's objects:
// one Forward() computes one engine step, any mix of prefill chunks and decodes, as the engine
// described it. Embed() runs prefill-only passes over one-shot inputs and pools their final
// hidden states (embeddings); it keeps no KV blocks (its keys and values live in a scratch
// buffer for the pass).
//
// Tensor parallelism (Megatron): with weights sliced for rank r of a group
// (worker/weights/shard_layout.h) and the group's Communicator, each rank computes its query and
// key/value heads and its share of the MLP's intermediate features; the partial outputs of
// o_proj and down_proj are all-reduced, the vocabulary-parallel embedding is all-reduced, and the
// head's logits are gathered on the leader (group rank 0). The leader broadcasts every step it
// computes, generation steps (Forward) and embedding passes (Embed) alike, as its StepPlan
// before computing it; followers receive each one and run it (Follow), so every rank makes the
// same collectives in the same order. A collective that fails ends the process
// (cluster::FailGroup): the group cannot finish the step.
//
// Where the collectives run. By default through host memory over `group` (MPI): each sum copies
// its array to the host where the device's memory is not the host's, and back; such a step is
// never padded nor recorded. Given a cluster::DeviceCommunicator (NCCL) and a device with a
// stream (a GPU), the sums after o_proj and down_proj and the gather of the head's logits run
// on the device's arrays instead, enqueued on the device's stream between the kernels (an
// all-gather, of which the followers drop their copy). The vocabulary-parallel embedding's
// rows of tokens other ranks hold are zeroed on the host (one copy each way per step) first;
// everything after that, the embedding's sum included, is enqueued with no host wait, so a
// decode-only step is padded and run through RunStep like a whole model's, and a GPU records
// it as a CUDA graph with the NCCL kernels inside (every rank pads to the same size, so every
// rank records and replays the same collectives in the same order). The host waits for the
// stream with the group's timeout only after RunStep. The leader interleaves the gathered
// slices into [sampled row][vocab_size] on its device (CopyRows, inside the step), then either
// copies them to the host (Forward) or samples them there (ForwardAndSample: only ids and
// logprobs come back). Tensor-parallel steps are never asynchronous (CanStepAsync). Step plans
// always go over `group`.
//
// Decode-only steps are padded to the device's GraphBatchSize with dummy sequences (their
// logits dropped) and run through ModelDevice::RunStep, so a GPU can replay them as graphs;
// every row is computed independently, so padding changes no result.
//
// Thread-compatible: one engine loop drives it. Kernels parallelize internally.
#ifndef CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_
#define CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cluster/communicator.h"
#include "common/pooling.h"
#include "kernels/kernel_params.h"
#include "worker/model/model_device.h"
#include "worker/model/step_plan.h"
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
  // Device collectives only: waiting at the end of a step for the device's stream (its kernels
  // and collectives; enqueueing takes no time worth counting).
  int64_t device_wait_micros = 0;
};

class LlamaModel {
 public:
  // Takes the weights and allocates the KV pool: num_blocks x block_size slots per layer (of
  // this rank's key/value heads). `group` (not owned, outlives the model) is the
  // tensor-parallel group when weights->tp.size > 1, and must then match weights->tp; nullptr
  // otherwise. `device` computes everything (weights, KV pool and activations live there);
  // nullptr means CreateCpuDevice() (its kernels on the calling thread; the engine passes a
  // device on its own thread pool). RESOURCE_EXHAUSTED when the weights or the pool do not fit.
  // `device_group` (not owned, outlives the model; nullptr: none) is the same group's
  // collectives on device buffers: the model's sums and its logits' gather then run on the
  // device's stream (see the header comment); it needs `group` and a device with a stream
  // (ModelDevice::stream), else INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(
      std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape,
      cluster::Communicator* group = nullptr, std::unique_ptr<ModelDevice> device = nullptr,
      cluster::DeviceCommunicator* device_group = nullptr);

  // Bytes of KV cache one block takes across all layers (keys and values) in `storage` (the
  // device's kv_storage_type()).
  static int64_t KvBytesPerBlock(const ModelConfig& config, int block_size,
                                 StorageType storage = StorageType::kF32);

  // Computes the step (kind kGenerate), stores its keys and values in the cache, and writes the
  // logits of every sequence with `sample` set, in plan order, to `logits`
  // ([num sampled, vocab_size]). REQUIRES: every block table covers its sequence's tokens.
  // Under tensor parallelism the leader broadcasts the step first; a follower gets it through
  // Follow.
  void Forward(const StepPlan& step, std::vector<float>* logits);

  // Whether ForwardAndSample can run: the device samples (ModelDevice::SamplesOnDevice) and the
  // model is whole, or tensor-parallel with device collectives (the leader's device then holds
  // the gathered logits, interleaved into [sampled row][vocab_size]; with host staging they are
  // gathered on the leader's host).
  bool CanSampleOnDevice() const;

  // Forward, but the sampled rows are sampled on the device instead of copied to the host: the
  // i-th sequence of `step` with `sample` set (plan order) is sampled with requests[i]
  // (ModelDevice::Sample) into (*samples)[i]; only ids and logprobs come back. Padding rows of
  // a graph-sized decode step are not sampled. Under tensor parallelism only the leader calls it
  // (it publishes the step, as Forward does; the followers Follow it). REQUIRES:
  // CanSampleOnDevice(); requests.size() is the number of sampled sequences.
  void ForwardAndSample(const StepPlan& step, absl::Span<const SampleRequest> requests,
                        std::vector<SampleResult>* samples);

  // Whether LaunchStep can run: the model samples on the device (CanSampleOnDevice), the
  // device runs steps asynchronously (ModelDevice::SupportsAsyncStep), and there is no tensor
  // parallelism (followers cannot resolve the pending ids of a step whose tokens only the
  // leader's device sampled).
  bool CanStepAsync() const;

  // An asynchronous ForwardAndSample: enqueues the step and its sampling on the device and
  // returns without waiting; FinishStep writes its samples later. The host may prepare and
  // launch the next step before it finishes this one (at most two steps launched and not
  // finished): the model keeps each step's inputs in one of two buffers, so the next step's
  // inputs never overwrite a step the device still reads. A token id < 0 in `step` (and in a
  // request's output_tokens) stands for a token the previous launched step sampled
  // (PendingTokenId); the device gathers it. `step` need not outlive the call (its block
  // tables are copied). REQUIRES: CanStepAsync(); requests.size() is the number of sampled
  // sequences.
  void LaunchStep(const StepPlan& step, absl::Span<const SampleRequest> requests);
  // Waits for the oldest launched step and writes its samples (ForwardAndSample's `samples`).
  // REQUIRES: a step launched and not finished.
  void FinishStep(std::vector<SampleResult>* samples);
  // Steps launched and not finished (0, 1 or 2).
  int steps_in_flight() const { return launched_ - finished_; }

  // A tensor-parallel follower (group rank > 0): runs a step its leader broadcast, of either
  // kind, making the collectives the leader makes. Its results stay on the leader: a follower
  // gathers no logits and pools no embeddings.
  void Follow(const StepPlan& step);

  // Embeddings: runs the layers over every input (causal attention within each input, each
  // from position 0), applies the final RMSNorm and pools per input as it asks. Writes one
  // vector of hidden_size floats per input, in input order, to `out`. Inputs are grouped into
  // passes of at most `max_tokens_per_pass` tokens (0: all in one pass; an input longer than
  // the budget runs alone), which bounds the activation memory; a result depends only on its
  // own input, bit for bit, never on the rest of the batch, the passes or the thread count.
  // Keys and values go to a scratch buffer reused across layers and calls, never to the KV
  // pool. Under tensor parallelism only the leader calls it: each pass goes to the followers as
  // an embed step (StepPlan::Kind::kEmbed) first. Errors (nothing written and nothing
  // broadcast then): INVALID_ARGUMENT for an empty input, a token outside the vocabulary or an
  // input longer than max_position_embeddings, naming the input; FAILED_PRECONDITION on a
  // tensor-parallel follower.
  absl::Status Embed(absl::Span<const EmbeddingInput* const> inputs,
                     std::vector<std::vector<float>>* out, int64_t max_tokens_per_pass = 0);

  const ModelConfig& config() const { return weights_->config; }
  // Config, tensor-parallel rank and shard always. The tensors' values only where the device
  // borrows them (the CPU in fp32); a device whose arrays hold every weight themselves (a GPU,
  // the CPU in bf16 or int8) makes the model release them once it has its arrays
  // (LlamaWeights::ReleaseTensors), keeping their shapes, so numel() and ParameterBytes() read 0
  // there.
  const LlamaWeights& weights() const { return *weights_; }
  const KvCacheShape& kv_shape() const { return kv_shape_; }

  // Bytes one decode step must read at batch 1: every layer's weights, the final norm and the
  // head, but a single embedding row, as the device holds them (its storage type, or the packed
  // or quantized bytes of the CPU's bf16 and int8 weights; computed in Create).
  int64_t DecodeWeightBytes() const;

  ModelDevice& device() const { return *device_; }

  // Null without tensor parallelism.
  cluster::Communicator* group() const { return group_; }
  // Null unless the collectives run on the device's buffers.
  cluster::DeviceCommunicator* device_group() const { return device_group_; }
  const CollectiveTimes& collective_times() const { return times_; }

 private:
  LlamaModel(std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape,
             cluster::Communicator* group, std::unique_ptr<ModelDevice> device,
             cluster::DeviceCommunicator* device_group);
  // Puts the weights on the device and allocates the KV pool.
  absl::Status Init();
  // Every weight array holds its own memory (none borrows the host tensors without keeping them
  // alive).
  bool WeightsCopied() const;

  // Per-step inputs derived from the step plan.
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
    // An asynchronous step (LaunchStep): the device may read these after the call.
    bool async = false;
    // LaunchStep: the step's block tables, which attention_seqs point into.
    std::vector<std::vector<int32_t>> block_tables;
    // Empties the vectors, keeping their memory.
    void Clear();
  };
  // The device's arrays of one layer's weights (empty biases when the model has none).
  struct LayerArrays {
    DeviceArray input_norm, q_proj, k_proj, v_proj, q_bias, k_bias, v_bias, o_proj,
        post_attention_norm, q_norm, k_norm, pre_feedforward_norm, post_feedforward_norm, gate_proj,
        up_proj, down_proj;
  };
  // Every array of a layer.
  static std::array<const DeviceArray*, 16> LayerArrayList(const LayerArrays& a);
  // The step's rows, slots and attention sequences. For an embed step, also sizes the scratch
  // KV buffer (embed_keys_, embed_values_, embed_layout_, embed_table_) for its tokens.
  void PrepareInputs(const StepPlan& step, StepInputs* in);
  // Leader: sends the step to the followers (no-op without tensor parallelism or on a follower).
  void Publish(const StepPlan& step);
  // Pads a decode-only step to the device's GraphBatchSize; false when it does not run as one.
  bool PadDecode(StepInputs* in) const;
  // The step's layers and head. With `samples` (ForwardAndSample), the device samples the
  // wanted rows with `requests` into it and `logits` is only the host's scratch for them where
  // the device's memory is the host's; else the wanted rows' logits go to `logits`.
  // With `launch_only` (LaunchStep) the sampling is only enqueued (SampleAsync).
  void Compute(StepInputs* in, std::vector<float>* logits,
               absl::Span<const SampleRequest> requests = {},
               std::vector<SampleResult>* samples = nullptr, bool launch_only = false);
  // Hands the step to the device and sizes the activations for t tokens and s sampled rows.
  void Stage(const StepInputs& in, int64_t s);
  // Embeddings through the final norm: leaves the final-norm hidden states in hidden_.
  void RunLayers(const StepInputs& in);
  // The layers after the embedding (summed over the group) in residual_, through the final
  // norm.
  void RunLayersFromResidual(const StepInputs& in);
  // One embed step through the final norm (hidden_ holds its final-norm hidden states after).
  void RunEmbedStep(const StepPlan& step, StepInputs* in);
  // One pass of Embed over inputs already checked: published, computed and pooled into `out`.
  void EmbedPass(absl::Span<const EmbeddingInput* const> inputs, std::vector<float>* out);
  // The step's embeddings into residual_; under tensor parallelism summed over the group only
  // with `sum` (else the caller enqueues the sum on the device's stream).
  void EmbedTokens(const StepInputs& in, int64_t t, bool sum);
  void Attention(int layer, const StepInputs& in, int64_t t);
  void Mlp(int layer, int64_t t);
  // final_logit_softcapping on s rows of this rank's logits (no-op without it).
  void CapLogits(int64_t s, DeviceArray* logits);
  // Tensor parallelism: the step's layers and head, the sampled rows' logits gathered on the
  // leader into `logits` ([s, vocab_size]; empty on a follower). With device collectives and
  // `whole_step`, everything after the embedding's host-side masking runs as one RunStep.
  // With `samples` (the leader's ForwardAndSample, device collectives only) the leader's device
  // samples the first requests.size() rows into it instead.
  void ParallelStep(const StepInputs& in, int64_t s, bool whole_step,
                    std::vector<float>* logits, absl::Span<const SampleRequest> requests,
                    std::vector<SampleResult>* samples);
  // Host staging: this rank's slice of the sampled rows' logits, gathered on the leader.
  void ParallelHead(int64_t s, std::vector<float>* logits);
  // Device collectives: the head's slice and its all-gather into gathered_logits_, and on the
  // leader their interleaving into full_logits_, enqueued on the device's stream (no host
  // wait: it may be recorded).
  void DeviceParallelHead(int64_t s);
  // gathered_ ([rank][s][vocab_]) into `logits` as [s][vocab_size].
  void InterleaveGathered(int64_t s, std::vector<float>* logits) const;
  // `count` floats of x as host memory: in place where the device's memory is the host's,
  // else copied into host_scratch_. Release() copies a changed host view back.
  float* HostView(const DeviceArray& x, int64_t count);
  void Release(float* host, int64_t count, DeviceArray* x);
  // Sums `count` elements of `x` over the group (no-op without one): on the device's stream
  // with device_group_, else through host memory.
  void AllReduce(DeviceArray* x, int64_t count);
  void SumOverGroup(float* host, int64_t count);
  // Device collectives: waits for the device's stream (the step's kernels and collectives).
  void WaitForDevice();

  std::unique_ptr<LlamaWeights> weights_;
  KvCacheShape kv_shape_;
  cluster::Communicator* const group_;
  std::unique_ptr<ModelDevice> device_;
  cluster::DeviceCommunicator* const device_group_;
  // The device's storage type as a collective's element type (device collectives only).
  cluster::DeviceElementType element_type_ = cluster::DeviceElementType::kF32;
  // The device's memory is the host's (ModelDevice::HostData is non-null).
  bool host_memory_ = false;
  // This rank's heads and widths (the whole model's without tensor parallelism).
  int num_heads_;
  int num_kv_heads_;
  int64_t intermediate_;
  int64_t vocab_;
  CollectiveTimes times_;
  int64_t decode_weight_bytes_ = 0;
  kernels::KvCacheLayout layout_;
  // Weights on the device. lm_head_ is &embed_ when the checkpoint ties them.
  DeviceArray embed_, final_norm_, own_lm_head_;
  const DeviceArray* lm_head_ = nullptr;
  std::vector<LayerArrays> layers_;
  const DeviceArray no_bias_;
  // KV pool: per layer, keys then values, each num_blocks * block_size * kv_heads * head_dim.
  std::vector<DeviceArray> key_cache_;
  std::vector<DeviceArray> value_cache_;
  // Embed's keys and values of one layer at a time: [tokens of the pass][kv heads][head_dim],
  // addressed through embed_layout_ (block_size 1) and embed_table_ (0, 1, 2, ...).
  kernels::KvCacheLayout embed_layout_;
  DeviceArray embed_keys_, embed_values_;
  std::vector<int32_t> embed_table_;
  // Activation scratch on the device, grown on demand and reused across steps.
  DeviceArray residual_, hidden_, q_, k_, v_, attn_, gate_, up_, out_, sampled_, logits_;
  // Device collectives: every rank's logits slices, [rank][sampled row][vocab_], and on the
  // leader the same interleaved, [sampled row][vocab_size].
  DeviceArray gathered_logits_, full_logits_;
  // Host side: token ids as this rank's vocabulary rows (tensor parallelism), collectives'
  // and pooling's copies where the device's memory is not the host's, the gathered logits.
  std::vector<int32_t> local_ids_;
  std::vector<float> host_scratch_, gathered_;
  // A follower's (empty) logits of the generation steps it follows.
  std::vector<float> follower_logits_;
  // ForwardAndSample on a device whose memory is the host's: the head's output rows.
  std::vector<float> sample_scratch_;
  // LaunchStep's inputs, double-buffered: step k uses async_inputs_[k % 2], which the device
  // may read until that step's FinishStep.
  std::array<StepInputs, 2> async_inputs_;
  int64_t launched_ = 0;
  int64_t finished_ = 0;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_LLAMA_MODEL_H_
