// OpenAI's JSON shapes for the HTTP gateway (docs/http.md): request parsing and validation into
// carpool's GenerateInput / EmbedInput, response and stream-chunk bodies, server-sent events, and
// the error body with the HTTP status of each carpool error reason.
//
// Pure functions of their arguments; thread-safe. Every JSON body is valid UTF-8 (invalid bytes in
// token text become U+FFFD).
#ifndef CARPOOL_ROUTER_OPENAI_JSON_H_
#define CARPOOL_ROUTER_OPENAI_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/messages.h"
#include "router/chat_template.h"

namespace carpool::router {

// ---- errors

struct HttpError {
  int status = 500;
  std::string type;     // OpenAI's error type: invalid_request_error, rate_limit_error, ...
  std::string code;     // carpool's reason: queue_full, model_not_found, ...
  std::string message;
  int64_t retry_after_s = 0;  // > 0: send a Retry-After header (429 and 503)
};

// The HTTP status for a carpool reason, else for the status code:
//   400 invalid_argument, prompt_too_long       401 unauthenticated
//   404 unknown_model (NOT_FOUND)                429 queue_full, token_budget, tenant_quota
//   503 draining, worker_lost (UNAVAILABLE)      504 deadline_exceeded, deadline_unmeetable
//   499 cancelled                                500 anything else
// Retry-After is retry_after_ms rounded up to seconds, at least 1 on 429 and 503.
HttpError HttpErrorFromStatus(const absl::Status& status);
HttpError BadRequest(std::string message, std::string code = "invalid_argument");
// {"error": {"message", "type", "param": null, "code"}}
std::string ErrorBody(const HttpError& error);

// ---- generation requests

enum class ApiKind { kCompletion, kChat };

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                  // "" when the request names none
  GenerateInput input;                // prompt (completions), sampling, priority, deadline, stream
  std::vector<ChatMessage> messages;  // chat only; rendered into input.text by the gateway
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool logprobs = false;              // return logprobs
  int top_logprobs = 0;               // alternatives per token
};

struct RequestDefaults {
  int completion_max_tokens = 16;
  int chat_max_tokens = 256;
};

// INVALID_ARGUMENT naming the field for bad JSON, wrong types, n != 1, unsupported options.
// Ranges the router checks (temperature, top_p, max_tokens against the model) are left to it.
absl::StatusOr<GenerationRequest> ParseGenerationRequest(ApiKind kind, const std::string& body,
                                                         const RequestDefaults& defaults = {});

// ---- generation responses

struct ResponseMeta {
  std::string id;        // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;   // unix seconds
  std::string model;
  bool byte_tokens = false;  // the model uses the byte tokenizer: token text is its bytes
};

// A token's text for logprobs: its byte (byte tokenizer) or "token_id:N".
std::string TokenText(int32_t token, bool byte_tokens);

// The whole answer (stream: false).
std::string ResponseBody(const GenerationRequest& request, const ResponseMeta& meta,
                         const std::string& text, const std::vector<SampleResult>& tokens,
                         const std::string& finish_reason, const Usage& usage);

// One stream chunk. `text_offset`: completions' text_offset of tokens[0]. `finish_reason` empty
// for all but the last; `first` adds the chat role.
std::string StreamChunkBody(const GenerationRequest& request, const ResponseMeta& meta,
                            const std::string& text, const std::vector<SampleResult>& tokens,
                            int64_t text_offset, const std::string& finish_reason, bool first);
// The usage chunk of stream_options.include_usage (empty choices).
std::string UsageChunkBody(const GenerationRequest& request, const ResponseMeta& meta,
                           const Usage& usage);

// "data: BODY\n\n"
std::string SseEvent(const std::string& body);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// ---- embeddings and models

struct EmbeddingsRequest {
  std::string model;
  EmbedInput input;
};

// input: a string, a list of strings, a list of token ids, or a list of lists of token ids;
// encoding_format "float" only.
absl::StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(const std::string& body);
std::string EmbeddingsBody(const std::vector<std::vector<float>>& embeddings,
                           const std::string& model, const Usage& usage);

// {"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "carpool"}]}
std::string ModelsBody(const std::vector<std::string>& models);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_OPENAI_JSON_H_
