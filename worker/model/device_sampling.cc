#include "worker/model/device_sampling.h"

#include <algorithm>

namespace carpool::worker {

void DeviceSamplingRows::Pack(absl::Span<const SampleRequest> requests, int64_t vocab) {
  rows_.resize(requests.size());
  penalties_.clear();
  num_penalized_ = 0;
  if (static_cast<int64_t>(counts_.size()) < vocab) counts_.assign(vocab, 0);
  const auto in_vocab = [vocab](int32_t t) { return t >= 0 && t < vocab; };
  for (size_t i = 0; i < requests.size(); ++i) {
    const SampleRequest& r = requests[i];
    const SamplingParams& q = *r.params;
    kernels::cuda::SamplingRow& row = rows_[i];
    row = kernels::cuda::SamplingRow();
    row.seed = q.has_seed ? q.seed : 0;
    row.position = r.position;
    row.temperature = q.temperature;
    row.top_k = q.top_k;
    row.top_p = q.top_p;
    row.min_p = q.min_p;
    row.num_top_logprobs = std::clamp(q.logprobs, 0, kernels::cuda::kMaxTopLogprobs);
    row.repetition_penalty = q.repetition_penalty;
    row.frequency_penalty = q.frequency_penalty;
    row.presence_penalty = q.presence_penalty;

    const bool repetition = q.repetition_penalty != 1.0f &&
                            (!r.prompt_tokens.empty() || !r.output_tokens.empty());
    const bool output_penalties = (q.frequency_penalty != 0.0f || q.presence_penalty != 0.0f) &&
                                  !r.output_tokens.empty();
    if (!repetition && !output_penalties) continue;
    const size_t begin = penalties_.size();
    for (int32_t t : r.output_tokens) {
      if (in_vocab(t)) ++counts_[t];
    }
    for (int32_t t : r.output_tokens) {
      if (!in_vocab(t) || counts_[t] <= 0) continue;
      penalties_.push_back({t, counts_[t]});
      counts_[t] = -1;
    }
    if (repetition) {
      for (int32_t t : r.prompt_tokens) {
        if (!in_vocab(t) || counts_[t] != 0) continue;
        penalties_.push_back({t, 0});
        counts_[t] = -1;
      }
    }
    for (int32_t t : r.output_tokens) {
      if (in_vocab(t)) counts_[t] = 0;
    }
    for (int32_t t : r.prompt_tokens) {
      if (in_vocab(t)) counts_[t] = 0;
    }
    if (penalties_.size() == begin) continue;
    row.penalty_begin = static_cast<int64_t>(begin);
    row.num_penalty_tokens = static_cast<int32_t>(penalties_.size() - begin);
    row.penalized_row = num_penalized_++;
  }
}

SampleResult ToSampleResult(const kernels::cuda::SampledToken& sampled, int num_top) {
  SampleResult r;
  r.token = sampled.token;
  r.logprob = sampled.logprob;
  num_top = std::clamp(num_top, 0, kernels::cuda::kMaxTopLogprobs);
  r.top_logprobs.reserve(num_top);
  for (int i = 0; i < num_top; ++i) {
    r.top_logprobs.push_back({sampled.top_tokens[i], sampled.top_logprobs[i]});
  }
  return r;
}

}  // namespace carpool::worker
