// Turns one row of logits into one token, following a request's SamplingParams.
//
// Deterministic: the result depends only on the logits, the parameters, the token history and
// the position, never on the rest of the batch. Randomness comes from a counter-based generator
// keyed by (seed, position), so a stream resumed elsewhere continues identically.
#ifndef CARPOOL_WORKER_SAMPLER_SAMPLER_H_
#define CARPOOL_WORKER_SAMPLER_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "worker/sampler/sampling_params.h"

namespace carpool::worker {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                     // raw-distribution logprob of `token`
  std::vector<TokenLogprob> top_logprobs;   // params.logprobs entries, most likely first
};

struct SampleInput {
  const float* logits = nullptr;            // [vocab_size], not modified
  const SamplingParams* params = nullptr;
  absl::Span<const int32_t> prompt_tokens;  // for the repetition penalty
  absl::Span<const int32_t> output_tokens;  // for all penalties
  int64_t position = 0;                     // sequence position of the token being sampled
};

// Uniform double in [0, 1) that depends only on (seed, position): Philox4x32-10 with the seed
// as key and the position as counter.
double CounterUniform(uint64_t seed, uint64_t position);

// Not thread-safe (keeps scratch buffers); use one per thread.
class Sampler {
 public:
  explicit Sampler(int vocab_size);

  // REQUIRES: input.params->Validate(vocab_size) is OK.
  SampleResult Sample(const SampleInput& input);

  int vocab_size() const { return vocab_size_; }

 private:
  int vocab_size_;
  std::vector<float> scratch_logits_;
  std::vector<float> scratch_logprobs_;
  std::vector<int32_t> scratch_index_;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_SAMPLER_SAMPLER_H_
