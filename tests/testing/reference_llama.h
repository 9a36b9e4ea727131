// An independent float64 Llama forward pass for parity tests: no paging, no batching, no
// kernels from kernels/, no loader. It recomputes the whole sequence for every token, so it is
// meant for tiny models only.
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
  // `tensors` maps Hugging Face tensor names to their values (row-major, as in the checkpoint).
  // rope_scaling must be none or linear.
  ReferenceLlama(const worker::ModelConfig& config,
                 std::map<std::string, std::vector<float>> tensors);

  // Log-softmax of the next-token logits after `tokens`.
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
  std::vector<double> Norm(const std::string& name, const std::vector<double>& x) const;
  void Rope(std::vector<double>* v, int heads, int pos) const;

  worker::ModelConfig config_;
  std::map<std::string, std::vector<float>> tensors_;
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_REFERENCE_LLAMA_H_
