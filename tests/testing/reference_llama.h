// An independent float64 forward pass of the Llama family and its newer relatives (Mistral,
// Qwen 2, Qwen 3, Gemma 3) for parity tests: no paging, no batching, no kernels from kernels/,
// no loader. It is written from the transformers semantics of each feature that ModelConfig
// names, not from worker/model. It recomputes the whole sequence for every token, so it is meant
// for tiny models only.
//
// What it computes, per ModelConfig field:
//   embedding_multiplier     embedding rows times the multiplier
//   qk_norm                  RMSNorm over each head of q and k (self_attn.q_norm / k_norm) after
//                            the projections, before RoPE
//   norm_weight_plus_one     every RMSNorm applies its checkpoint weight w as (1 + w)
//   sandwich_norms           post_attention_layernorm on the attention output and
//                            post_feedforward_layernorm on the MLP output, each before its
//                            residual add; pre_feedforward_layernorm before the MLP
//   hidden_activation        down(act(gate(x)) * up(x)), act silu or the tanh GELU
//   query_pre_attn_scalar    scores scaled by its ** -0.5 instead of head_dim ** -0.5
//   attn/final_logit_softcapping  cap * tanh(x / cap) on the scores, before the mask and
//                            softmax, and on the final logits
//   sliding_window, layer_sliding  on a sliding layer token i attends keys j with
//                            i - window < j <= i
//   rope_local_theta         the sliding layers' RoPE base, unscaled; rope_scaling (linear or
//                            llama3) applies to the other layers
#ifndef CARPOOL_TESTS_TESTING_REFERENCE_LLAMA_H_
#define CARPOOL_TESTS_TESTING_REFERENCE_LLAMA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/messages.h"
#include "worker/weights/model_config.h"

namespace carpool::testing {

class ReferenceLlama {
 public:
  // `tensors` maps Hugging Face tensor names of a text-only checkpoint ("model.layers.0...",
  // "lm_head.weight" unless tied) to their values, row-major, exactly as the checkpoint stores
  // them: the RAW tensors, as WriteCheckpoint returns them. With config.norm_weight_plus_one the
  // norm tensors hold w and the reference applies 1 + w itself; never pass the loader's folded
  // tensors (LlamaWeights), which hold 1 + w already.
  ReferenceLlama(const worker::ModelConfig& config,
                 std::map<std::string, std::vector<float>> tensors);

  // Log-softmax of the next-token logits after `tokens` (after final softcapping).
  std::vector<double> NextLogprobs(const std::vector<int32_t>& tokens) const;

  // The embedding of `tokens`: the final-norm hidden states pooled (kMean: averaged over every
  // token; kLast: the last token's), scaled to unit L2 norm when `normalize`.
  std::vector<double> Embedding(const std::vector<int32_t>& tokens, Pooling pooling,
                                bool normalize) const;

  struct Greedy {
    std::vector<int32_t> tokens;
    std::vector<double> logprobs;
  };
  // Greedy continuation of `prompt` for `n` tokens (stops early on an EOS unless ignore_eos).
  Greedy Generate(const std::vector<int32_t>& prompt, int n, bool ignore_eos) const;

 private:
  // The residual stream of every token after the last layer (before the final norm).
  std::vector<std::vector<double>> Layers(const std::vector<int32_t>& tokens) const;
  const std::vector<float>& W(const std::string& name) const;
  // y = W x (+ b) for one row; W is [out, in].
  std::vector<double> Mat(const std::string& name, const std::vector<double>& x) const;
  // RMSNorm of x (any length equal to the weight's) with weight tensor `name`.
  std::vector<double> Norm(const std::string& name, const std::vector<double>& x) const;
  // RMSNorm of each of `heads` head_dim-long pieces of *v with weight tensor `name`.
  void HeadNorm(const std::string& name, std::vector<double>* v, int heads) const;
  // The RoPE inverse frequencies of layer `layer`.
  std::vector<double> InvFreq(int layer) const;
  void Rope(std::vector<double>* v, int heads, int pos, const std::vector<double>& inv_freq) const;

  worker::ModelConfig config_;
  std::map<std::string, std::vector<float>> tensors_;
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_REFERENCE_LLAMA_H_
