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
#include "common/sample_result.h"
#include "common/sampling_params.h"
#include "worker/sampler/philox.h"  // CounterUniform

namespace carpool::worker {

// A logit of -inf masks its token. Token ids in the histories outside [0, vocab_size) are
// ignored by the penalties.
struct SampleInput {
  const float* logits = nullptr;  // [vocab_size], not modified
  const SamplingParams* params = nullptr;
  absl::Span<const int32_t> prompt_tokens;  // for the repetition penalty
  absl::Span<const int32_t> output_tokens;  // for all penalties
  int64_t position = 0;                     // sequence position of the token being sampled
};

// Pipeline (vLLM's order):
//   1. raw logprobs = log_softmax(logits) -> result.logprob, result.top_logprobs
//      (ties broken by lower token id);
//   2. on a scratch copy: repetition penalty over distinct tokens of prompt + output, then
//      frequency (per occurrence in the output) and presence (once if in the output);
//   3. temperature == 0: argmax of the penalized logits (lowest id among ties), done;
//      otherwise divide by temperature;
//   4. top-k; 5. top-p (smallest most-likely set with mass >= top_p, at least one token);
//   6. min-p (drop probability < min_p * max probability);
//   7. renormalize and draw by inverse CDF with u = CounterUniform(seed, position) over the kept
//      tokens ordered by (probability desc, id asc). A request without has_seed uses seed 0.
// Probabilities use a fast exp (relative error ~1e-7) and treat those below e^-87 of the top
// one as 0 (never drawn). Cost: a few vectorized O(V) passes plus expected O(V) selection; no
// sort of the vocabulary, no allocation after the first calls.
//
// Not thread-safe (keeps scratch buffers); use one per thread.
class Sampler {
 public:
  // REQUIRES: vocab_size >= 1.
  explicit Sampler(int vocab_size);

  // REQUIRES: input.params->Validate(vocab_size) is OK; input.logits holds vocab_size values.
  // NaN logits are treated as -inf and +inf as the largest float; if every logit is -inf the
  // distribution is taken as uniform.
  SampleResult Sample(const SampleInput& input);

  int vocab_size() const { return vocab_size_; }

 private:
  // Returns logits without NaN or +inf (the input itself, or a fixed copy in scratch_raw_) and
  // sets *max_logit to their maximum, which is finite.
  const float* SanitizedLogits(const float* logits, float* max_logit);
  // Returns the penalized logits: `raw` itself when no penalty applies, else scratch_logits_.
  const float* ApplyPenalties(const SampleInput& input, const float* raw);
  // Steps 4-7 for temperature > 0. A non-null `known_mass` says scratch_weights_ already holds
  // the weights of `logits` at this temperature, summing to *known_mass.
  int32_t SampleFromTruncated(const float* logits, const SamplingParams& params, int64_t position,
                              const double* known_mass);
  // REQUIRES: 0 < params.top_k < vocab_size. Fills candidates_[0][0, n) with the top-k tokens
  // of positive weight and returns n; *total gets their mass. `known_mass` as above.
  int WeighTopK(const float* logits, const SamplingParams& params, const double* known_mass,
                double* total);
  // Fills scratch_weights_ (unless `known_mass`) and returns it; *total gets its sum.
  const float* WeighAll(const float* logits, float temperature, const double* known_mass,
                        double* total);
  void FillTopLogprobs(const float* raw, double log_normalizer, int count, SampleResult* result);

  int vocab_size_;
  std::vector<float> scratch_raw_;      // sanitized logits, only when the input needs it
  std::vector<float> scratch_logits_;   // penalized logits
  std::vector<float> scratch_weights_;  // e^((logit - max) / temperature), by token id
  // Candidates as (weight bits << 32 | ~token) keys, two buffers for out-of-place partitions.
  std::vector<uint64_t> candidates_[2];
  std::vector<int32_t> scratch_top_;     // ids picked by a top-k heap
  std::vector<int32_t> scratch_counts_;  // per-token output counts; all zero between calls
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_SAMPLER_SAMPLER_H_
