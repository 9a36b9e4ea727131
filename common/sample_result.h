// One sampled token with its logprobs: what a worker's sampler produces and every process passes
// on unchanged.
#ifndef CARPOOL_COMMON_SAMPLE_RESULT_H_
#define CARPOOL_COMMON_SAMPLE_RESULT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace carpool {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                    // raw-distribution logprob of `token`
  std::vector<TokenLogprob> top_logprobs;  // SamplingParams::logprobs entries, most likely first
  // Set by the router for its clients: the text this token completed (proto Token.text);
  // empty from workers.
  std::string text;
};

}  // namespace carpool

#endif  // CARPOOL_COMMON_SAMPLE_RESULT_H_
