// OpenAI's JSON shapes for the HTTP gateway (docs/http.md): request parsing and validation into
// carpool's GenerateInput / EmbedInput, response and stream-chunk bodies, server-sent events, and
// the error body with the HTTP status of each carpool error reason.
//
// Pure functions of their arguments; thread-safe. Every JSON body is valid UTF-8 (invalid bytes in
// token text become U+FFFD).
#ifndef CARPOOL_ROUTER_OPENAI_JSON_H_
#define CARPOOL_ROUTER_OPENAI_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/messages.h"

namespace carpool::router {

// ---- errors

struct HttpError {
  int status = 500;
  std::string type;     // OpenAI's error type: invalid_request_error, rate_limit_error, ...
  std::string code;     // carpool's reason: queue_full, model_not_found, ...
  std::string message;
  int64_t retry_after_s = 0;  // > 0: send a Retry-After header (429 and 503)
  std::string param;          // the offending request field ("messages[0].content"); "" if unknown
};

// The HTTP status for a carpool reason, else for the status code:
//   400 invalid_argument, prompt_too_long       401 unauthenticated
//   404 unknown_model (NOT_FOUND)                429 queue_full, token_budget, tenant_quota
//   503 draining, worker_lost (UNAVAILABLE)      504 deadline_exceeded, deadline_unmeetable
//   499 cancelled                                500 anything else
// Retry-After is retry_after_ms rounded up to seconds, at least 1 on 429 and 503. `param` is the
// field named by the status (ErrorParam), "model" for unknown_model.
HttpError HttpErrorFromStatus(const absl::Status& status);
HttpError BadRequest(std::string message, std::string code = "invalid_argument",
                     std::string param = "");
// 400 for a request the parsers below refused, with the field they named as `param`.
HttpError BadRequest(const absl::Status& status);
// The request field an INVALID_ARGUMENT from the parsers below is about ("" when none).
std::string ErrorParam(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}}; param is null when unknown.
std::string ErrorBody(const HttpError& error);

// ---- generation requests

enum class ApiKind { kCompletion, kChat };

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                  // "" when the request names none
  // prompt (completions) or chat (input.chat: messages, tools, chat_template_kwargs,
  // add_generation_prompt, rendered by the router with the model's chat template), sampling,
  // priority, deadline, stream, and the text options: stop, include_stop_str_in_output,
  // skip_special_tokens (vLLM's extra fields; default true)
  GenerateInput input;
  std::vector<std::string> stop;      // as input.stop
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool logprobs = false;              // return logprobs
  int top_logprobs = 0;               // alternatives per token
};

struct RequestDefaults {
  int completion_max_tokens = 16;
  int chat_max_tokens = 256;
};

// INVALID_ARGUMENT naming the field (in the message and as ErrorParam) for bad JSON, wrong types
// and options carpool cannot honour: n, best_of other than 1, echo, suffix, non-empty logit_bias,
// functions, a tool_choice other than "none" (carpool parses no tool calls from the output),
// continue_final_message, a response_format other than text. Chat messages are checked as the
// templates need them: a role of system, developer, user, assistant or tool; content a string,
// a list of {"type": "text", "text": string} parts, or (assistant only) null; tools a list of
// {"type": "function", "function": {"name", ...}}; chat_template_kwargs an object. They go to the
// router as JSON in the request's key order (ChatInput), every other message field (name,
// tool_calls, tool_call_id, reasoning_content, ...) kept.
// Null fields count as absent; unknown fields are ignored. Ranges the router and the worker check
// (temperature, top_p, penalties, max_tokens against the model) are left to them.
absl::StatusOr<GenerationRequest> ParseGenerationRequest(ApiKind kind, const std::string& body,
                                                         const RequestDefaults& defaults = {});

// ---- generation responses

struct ResponseMeta {
  std::string id;        // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;   // unix seconds
  std::string model;
  bool byte_tokens = false;  // the model uses the byte tokenizer: token text is its bytes
};

// Whether `model` uses the byte tokenizer (echo and the synthetic: presets).
bool ByteTokenModel(const std::string& model);
// A token's text for logprobs: its byte (byte tokenizer) or "token_id:N".
std::string TokenText(int32_t token, bool byte_tokens);
// How far `t` moves a completion's text_offset: its byte (byte tokenizer), else the text the
// router's stream decoder says it completed (SampleResult::text; 0 while a character is
// incomplete, then all of it with the token that completes it).
size_t TokenTextBytes(const SampleResult& t, bool byte_tokens);

// The whole answer (stream: false).
std::string ResponseBody(const GenerationRequest& request, const ResponseMeta& meta,
                         const std::string& text, const std::vector<SampleResult>& tokens,
                         const std::string& finish_reason, const Usage& usage);

// One stream chunk. `text_offset`: completions' text_offset of tokens[0]. `finish_reason` empty
// (null) for all but the last. Chat deltas carry `content` only; the last one is empty ({}).
std::string StreamChunkBody(const GenerationRequest& request, const ResponseMeta& meta,
                            const std::string& text, const std::vector<SampleResult>& tokens,
                            int64_t text_offset, const std::string& finish_reason);
// A chat stream's first chunk: delta {"role": "assistant", "content": ""}.
std::string RoleChunkBody(const GenerationRequest& request, const ResponseMeta& meta);
// The usage chunk of stream_options.include_usage (empty choices).
std::string UsageChunkBody(const GenerationRequest& request, const ResponseMeta& meta,
                           const Usage& usage);

// "data: BODY\n\n"
std::string SseEvent(const std::string& body);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// ---- tokenize and detokenize (vLLM's /tokenize and /detokenize)

struct TokenizeHttpRequest {
  std::string model;
  bool chat = false;     // "messages" rather than "prompt"
  std::string prompt;    // !chat
  ChatInput chat_input;  // chat: rendered by the router with the model's chat template
  // add_special_tokens as given; unset: true for a prompt (Hugging Face encode), false for
  // messages (the template writes the special tokens: the ids /v1/chat/completions uses).
  std::optional<bool> add_special_tokens;
};

// {"model", "prompt": string} or vLLM's {"model", "messages": [...], "add_generation_prompt",
// "tools", "chat_template_kwargs"}, checked as ParseGenerationRequest checks chat;
// "add_special_tokens" either way. continue_final_message and return_token_strs true are
// refused (not supported); INVALID_ARGUMENT naming the field, as ParseGenerationRequest.
absl::StatusOr<TokenizeHttpRequest> ParseTokenizeRequest(const std::string& body);
// {"count", "max_model_len", "tokens"}
std::string TokenizeBody(const std::vector<int32_t>& tokens, int max_model_len);

struct DetokenizeHttpRequest {
  std::string model;
  std::vector<int32_t> tokens;
};

// {"model", "tokens": [ids]}.
absl::StatusOr<DetokenizeHttpRequest> ParseDetokenizeRequest(const std::string& body);
// {"prompt": text}, invalid UTF-8 as U+FFFD.
std::string DetokenizeBody(const std::string& text);

// ---- embeddings and models

struct EmbeddingsRequest {
  std::string model;
  EmbedInput input;
  bool base64 = false;  // encoding_format "base64"
};

// input: a string, a list of strings, a list of token ids, or a list of lists of token ids;
// encoding_format "float" (default) or "base64"; `dimensions` is refused (full size only).
absl::StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(const std::string& body);
// `base64`: each embedding is the base64 of its float32 values, little-endian (as OpenAI's).
std::string EmbeddingsBody(const std::vector<std::vector<float>>& embeddings,
                           const std::string& model, const Usage& usage, bool base64 = false);

// One model object: {"id", "object": "model", "created" (unix seconds), "owned_by": "carpool"}.
std::string ModelBody(const std::string& model, int64_t created);
// {"object": "list", "data": [model objects]}
std::string ModelsBody(const std::vector<std::string>& models, int64_t created);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_OPENAI_JSON_H_
