// Checks a GenerateRequest before any worker sees it: the same checks the CLI makes, against
// the limits of the model the workers serve.
#ifndef CARPOOL_ROUTER_REQUEST_VALIDATOR_H_
#define CARPOOL_ROUTER_REQUEST_VALIDATOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// Text a request asks the router to tokenize, and each text's label in errors ("" for a
// generate prompt, "inputs[3]: " for an embed input). `chat`, when set, is a conversation the
// pool first renders with the model's chat template into the first text (router_text.cc).
struct PromptTexts {
  std::vector<std::string> texts;
  std::vector<std::string> labels;
  bool add_special_tokens = true;
  std::optional<ChatInput> chat;
};
// The bytes a PromptTexts holds (its texts and chat fields): what it costs the tokenizer pool.
int64_t PromptBytes(const PromptTexts& texts);
// The bytes of a chat input's JSON fields together (bounded by max_prompt_bytes).
int64_t ChatBytes(const ChatInput& chat);
// One token-id list per PromptTexts text, in order.
using EncodedTexts = std::vector<std::vector<int32_t>>;

// Tokenizes `texts` with `tokenizer`: INVALID_ARGUMENT naming the label and the byte offset
// when a text is not valid UTF-8 (for every tokenizer, the byte tokenizer too), or the
// tokenizer's error. Thread-safe: the router's tokenizer pool runs it.
absl::StatusOr<EncodedTexts> EncodeTexts(const Tokenizer& tokenizer, const PromptTexts& texts);

// OK, or INVALID_ARGUMENT "`what` is not valid UTF-8 at byte N".
absl::Status CheckUtf8(std::string_view text, std::string_view what);

struct RequestLimits {
  // Longest client request_id. Default: 128 bytes.
  int max_request_id_bytes = 128;
  // Longest text prompt. Default: 1 MiB.
  int64_t max_prompt_bytes = 1 << 20;
  // Most stop token ids. Default: 64.
  int max_stop_token_ids = 64;
  // Most stop strings, and the longest one. Defaults: 64, 1024 bytes.
  int max_stop_strings = 64;
  int max_stop_string_bytes = 1024;
  // Most prompt token ids, checked before the model is known. Default: 262144.
  int64_t max_prompt_tokens = 1 << 18;
  // Largest max_tokens, checked before the model is known (then max_model_len bounds it).
  // Default: 1048576.
  int64_t max_max_tokens = 1 << 20;
  // Most inputs in one embed request. Default: 2048.
  int max_embed_inputs = 2048;
  // Whether a request may say it is a batch job's (GenerateInput::batch_job): true only for the
  // in-process client, where the router's batch runner sends them. Default: false.
  bool allow_batch_job = false;
};

// The request's prompt as token ids (tokenizing text with the model's tokenizer), or an error
// naming the problem: INVALID_ARGUMENT with ErrorInfo.reason invalid_argument or
// prompt_too_long. REQUIRES: limits.known.
struct ValidatedPrompt {
  std::vector<int32_t> tokens;
  // GenerateInput::resume_tokens, each checked against the vocabulary.
  std::vector<int32_t> resume_tokens;
};
absl::StatusOr<ValidatedPrompt> ValidateGenerate(const GenerateInput& request,
                                                 const ModelLimits& model,
                                                 const RequestLimits& limits);
// A chat prompt is refused here: only the router's tokenizer pool renders chat templates.
// The same with its text already tokenized: `encoded` holds one list when request.has_text or
// request.chat (the router renders and tokenizes on its pool and validates on the loop).
// REQUIRES: ValidateShape passed (at arrival; the text may since have been moved out).
absl::StatusOr<ValidatedPrompt> ValidateGenerate(const GenerateInput& request,
                                                 const EncodedTexts& encoded,
                                                 const ModelLimits& model,
                                                 const RequestLimits& limits);

// Checks that need no model (ids, sizes, sampling ranges, batch_job against
// limits.allow_batch_job); run at arrival.
absl::Status ValidateShape(const GenerateInput& request, const RequestLimits& limits);

// A client's request_id: not empty and at most limits.max_request_id_bytes.
absl::Status CheckRequestId(const std::string& id, const RequestLimits& limits);

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
// The same with its text inputs already tokenized: `encoded` holds one list per text input, in
// order. REQUIRES: ValidateEmbedShape passed (at arrival).
absl::StatusOr<ValidatedEmbed> ValidateEmbed(const EmbedInput& request,
                                             const EncodedTexts& encoded,
                                             const ModelLimits& model,
                                             const RequestLimits& limits);

// The embed checks that need no model (batch_job as for a generate request); run at arrival.
absl::Status ValidateEmbedShape(const EmbedInput& request, const RequestLimits& limits);

// The texts of a request to tokenize (moved out of it). A chat prompt moves into
// PromptTexts::chat, with add_special_tokens false (the template writes the special tokens).
PromptTexts TakeTexts(GenerateInput* request);
PromptTexts TakeTexts(EmbedInput* request);

// A NOT_FOUND error for a model no worker serves: its reason is unknown_model.
absl::Status UnknownModel(std::string message);

// The reason string for a validation error (prompt_too_long, unknown_model or
// invalid_argument).
const char* ValidationReason(const absl::Status& status);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_REQUEST_VALIDATOR_H_
