// Checks a GenerateRequest before any worker sees it: the same checks the CLI makes, against
// the limits of the model the workers serve.
#ifndef CARPOOL_ROUTER_REQUEST_VALIDATOR_H_
#define CARPOOL_ROUTER_REQUEST_VALIDATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/messages.h"
#include "common/tokenizer.h"

namespace carpool::router {

// What the router knows about the served model, from the workers' registrations.
struct ModelLimits {
  bool known = false;        // false until a worker has registered
  int vocab_size = 0;
  int max_model_len = 0;
  std::shared_ptr<const Tokenizer> tokenizer;  // null: the model takes token ids only
  int bos_token_id = -1;
};

struct RequestLimits {
  // Longest client request_id. Default: 128 bytes.
  int max_request_id_bytes = 128;
  // Longest text prompt. Default: 1 MiB.
  int64_t max_prompt_bytes = 1 << 20;
  // Most stop token ids (carpool's stop sequences are single tokens). Default: 64.
  int max_stop_token_ids = 64;
  // Most prompt token ids, checked before the model is known. Default: 262144.
  int64_t max_prompt_tokens = 1 << 18;
  // Largest max_tokens, checked before the model is known (then max_model_len bounds it).
  // Default: 1048576.
  int64_t max_max_tokens = 1 << 20;
  // Most inputs in one embed request. Default: 2048.
  int max_embed_inputs = 2048;
};

// The request's prompt as token ids (tokenizing text with the model's tokenizer), or an error
// naming the problem: INVALID_ARGUMENT with ErrorInfo.reason invalid_argument or
// prompt_too_long. REQUIRES: limits.known.
struct ValidatedPrompt {
  std::vector<int32_t> tokens;
};
absl::StatusOr<ValidatedPrompt> ValidateGenerate(const GenerateInput& request,
                                                 const ModelLimits& model,
                                                 const RequestLimits& limits);

// Checks that need no model (ids, sizes, sampling ranges); run at arrival.
absl::Status ValidateShape(const GenerateInput& request, const RequestLimits& limits);

// An embed request's inputs as token ids (text tokenized with the model's tokenizer), or an
// error naming the input: INVALID_ARGUMENT with reason invalid_argument (no inputs, more than
// max_embed_inputs, an empty input, a token id outside the vocabulary, text without a tokenizer)
// or prompt_too_long (an input longer than max_model_len tokens). REQUIRES: model.known.
struct ValidatedEmbed {
  std::vector<std::vector<int32_t>> inputs;
  int64_t total_tokens = 0;
};
absl::StatusOr<ValidatedEmbed> ValidateEmbed(const EmbedInput& request, const ModelLimits& model,
                                             const RequestLimits& limits);

// The embed checks that need no model; run at arrival.
absl::Status ValidateEmbedShape(const EmbedInput& request, const RequestLimits& limits);

// The reason string for a validation error (prompt_too_long or invalid_argument).
const char* ValidationReason(const absl::Status& status);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_REQUEST_VALIDATOR_H_
