// Per-request sampling and stopping parameters: what the SDKs send, the router validates and the
// worker's sampler follows.
#ifndef CARPOOL_COMMON_SAMPLING_PARAMS_H_
#define CARPOOL_COMMON_SAMPLING_PARAMS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace carpool {

inline constexpr int kMaxLogprobs = 20;

struct SamplingParams {
  // 0 means greedy (argmax). Default: 1.
  float temperature = 1.0f;
  // Keep only the k most likely tokens; 0 or -1 disables. Default: 0.
  int top_k = 0;
  // Keep the smallest set of most likely tokens whose mass reaches top_p; in (0, 1]. Default: 1.
  float top_p = 1.0f;
  // Drop tokens whose probability is below min_p times the top probability; [0, 1]. Default: 0.
  float min_p = 0.0f;
  // >1 discourages tokens already in the prompt or output (logit / p if > 0, else * p). Default: 1.
  float repetition_penalty = 1.0f;
  // Subtracted once from the logit of every token already in the output; [-2, 2]. Default: 0.
  float presence_penalty = 0.0f;
  // Subtracted per occurrence in the output; [-2, 2]. Default: 0.
  float frequency_penalty = 0.0f;
  // Randomness is a pure function of (seed, position). Requests without a seed get one drawn
  // when they are admitted. Default: unset.
  bool has_seed = false;
  uint64_t seed = 0;
  // Number of new tokens to generate, >= 1. Default: 16.
  int max_tokens = 16;
  // Generation stops (finish reason "stop") after emitting any of these.
  std::vector<int32_t> stop_token_ids;
  // Keep going past the model's EOS token(s). Default: false.
  bool ignore_eos = false;
  // Return the sampled token's logprob plus this many top alternatives; 0..kMaxLogprobs.
  // Logprobs are those of the model's raw distribution (log-softmax of the logits, before
  // penalties, temperature and truncation). Default: 0 (the sampled token's logprob only).
  int logprobs = 0;

  // Checks ranges; `vocab_size` bounds stop_token_ids. Errors name the offending field.
  absl::Status Validate(int vocab_size) const;
};

}  // namespace carpool

#endif  // CARPOOL_COMMON_SAMPLING_PARAMS_H_
