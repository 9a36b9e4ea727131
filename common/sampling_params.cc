#include "common/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace carpool {
namespace {

// Each check is written so that NaN fails it.
bool InClosed(float value, float lo, float hi) { return value >= lo && value <= hi; }

}  // namespace

absl::Status SamplingParams::Validate(int vocab_size) const {
  if (!(temperature >= 0.0f && std::isfinite(temperature))) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be >= 0 and finite, got ", temperature));
  }
  if (top_k < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be >= -1 (0 or -1 disables), got ", top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (!InClosed(min_p, 0.0f, 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", min_p));
  }
  if (!(repetition_penalty > 0.0f && std::isfinite(repetition_penalty))) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0 and finite, got ", repetition_penalty));
  }
  if (!InClosed(presence_penalty, -2.0f, 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("presence_penalty must be in [-2, 2], got ", presence_penalty));
  }
  if (!InClosed(frequency_penalty, -2.0f, 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frequency_penalty must be in [-2, 2], got ", frequency_penalty));
  }
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  }
  if (logprobs < 0 || logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs must be in [0, ", kMaxLogprobs, "], got ", logprobs));
  }
  for (int32_t token : stop_token_ids) {
    if (token < 0 || token >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids must be in [0, ", vocab_size, "), got ", token));
    }
  }
  return absl::OkStatus();
}

}  // namespace carpool
