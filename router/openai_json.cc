#include "router/openai_json.h"

#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/carpool_client.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "router/text_stream.h"

namespace carpool::router {
namespace {

using nlohmann::json;
// Requests are parsed once, keeping key order: the chat fields go on to the router as JSON text
// (ChatInput) in the order the client wrote them, for a template's tojson.
using ReqJson = nlohmann::ordered_json;

constexpr int kMaxStops = 4;
// The status payload that names the offending request field (ErrorParam).
constexpr char kParamPayload[] = "type.carpool.dev/openai.param";

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

absl::Status Bad(absl::string_view field, absl::string_view what) {
  absl::Status s = absl::InvalidArgumentError(absl::StrCat("'", field, "' ", what));
  s.SetPayload(kParamPayload, absl::Cord(field));
  return s;
}

// Reads an optional field of `body` when present and not null.
const ReqJson* Field(const ReqJson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status GetInt(const ReqJson& body, const char* name, int64_t* out) {
  const ReqJson* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_number_integer()) return Bad(name, "must be an integer");
  *out = f->get<int64_t>();
  return absl::OkStatus();
}

absl::Status GetIntInRange(const ReqJson& body, const char* name, int64_t lo, int64_t hi, int* out) {
  int64_t v = *out;
  if (absl::Status s = GetInt(body, name, &v); !s.ok()) return s;
  if (v < lo || v > hi) return Bad(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status GetFloat(const ReqJson& body, const char* name, float* out) {
  const ReqJson* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_number()) return Bad(name, "must be a number");
  *out = f->get<float>();
  return absl::OkStatus();
}

absl::Status GetBool(const ReqJson& body, const char* name, bool* out) {
  const ReqJson* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_boolean()) return Bad(name, "must be a boolean");
  *out = f->get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const ReqJson& body, const char* name, std::string* out) {
  const ReqJson* f = Field(body, name);
  if (f == nullptr) return absl::OkStatus();
  if (!f->is_string()) return Bad(name, "must be a string");
  *out = f->get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const ReqJson& list, absl::string_view field) {
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (const ReqJson& t : list) {
    if (!t.is_number_integer()) return Bad(field, "must hold integers (token ids)");
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v > INT32_MAX) return Bad(field, "holds a token id out of range");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

absl::StatusOr<ReqJson> ParseObject(const std::string& body) {
  ReqJson j = ReqJson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  return j;
}

absl::Status ParsePrompt(const ReqJson& body, GenerateInput* input) {
  const ReqJson* p = Field(body, "prompt");
  if (p == nullptr) return Bad("prompt", "is required");
  if (p->is_string()) {
    input->has_text = true;
    input->text = p->get<std::string>();
    return absl::OkStatus();
  }
  if (!p->is_array() || p->empty()) {
    return Bad("prompt", "must be a string or a non-empty list of token ids");
  }
  if ((*p)[0].is_string() || (*p)[0].is_array()) {
    if (p->size() != 1) return Bad("prompt", "must be one prompt (batches are not supported)");
    if ((*p)[0].is_string()) {
      input->has_text = true;
      input->text = (*p)[0].get<std::string>();
      return absl::OkStatus();
    }
    p = &(*p)[0];
  }
  absl::StatusOr<std::vector<int32_t>> ids = TokenIds(*p, "prompt");
  if (!ids.ok()) return ids.status();
  input->token_ids = std::move(*ids);
  return absl::OkStatus();
}

bool IsChatRole(const std::string& role) {
  return role == "system" || role == "developer" || role == "user" || role == "assistant" ||
         role == "tool";
}

// Checks `messages` as a chat template may receive them, naming the field: a role the
// templates know (any other string would reach the prompt verbatim: "user\nassistant: ..."
// forges a turn), content a string, a list of text parts, or (assistant) null or absent.
absl::Status CheckMessages(const ReqJson& body) {
  const ReqJson* m = Field(body, "messages");
  if (m == nullptr) return Bad("messages", "is required");
  if (!m->is_array() || m->empty()) return Bad("messages", "must be a non-empty list");
  for (size_t i = 0; i < m->size(); ++i) {
    const ReqJson& msg = (*m)[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!msg.is_object()) return Bad(field, "must be an object");
    std::string role;
    if (const ReqJson* r = Field(msg, "role"); r != nullptr && !r->is_string()) {
      return Bad(field + ".role", "must be a string");
    }
    RETURN_IF_ERROR(GetString(msg, "role", &role));
    if (role.empty()) return Bad(field + ".role", "is required");
    if (!IsChatRole(role)) {
      constexpr size_t kShown = 40;
      return Bad(field + ".role",
                 absl::StrCat("must be system, developer, user, assistant or tool, not \"",
                              absl::CHexEscape(absl::string_view(role).substr(0, kShown)),
                              role.size() > kShown ? "...\"" : "\""));
    }
    const ReqJson* content = Field(msg, "content");
    if (content == nullptr) {
      if (role != "assistant") return Bad(field + ".content", "is required");
    } else if (content->is_array()) {
      for (const ReqJson& part : *content) {  // [{"type": "text", "text": "..."}]
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return Bad(field + ".content", "parts must be {\"type\": \"text\", \"text\": string}");
        }
      }
    } else if (!content->is_string()) {
      return Bad(field + ".content", "must be a string or a list of text parts");
    }
  }
  return absl::OkStatus();
}

// OpenAI's tools: a list of {"type": "function", "function": {"name": string, ...}}.
absl::Status CheckTools(const ReqJson& tools) {
  if (!tools.is_array()) return Bad("tools", "must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string field = absl::StrCat("tools[", i, "]");
    const ReqJson& t = tools[i];
    if (!t.is_object()) return Bad(field, "must be an object");
    if (t.value("type", ReqJson()) != "function") return Bad(field + ".type", "must be \"function\"");
    const ReqJson* f = Field(t, "function");
    if (f == nullptr || !f->is_object()) return Bad(field + ".function", "must be an object");
    const ReqJson* name = Field(*f, "name");
    if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
      return Bad(field + ".function.name", "must be a non-empty string");
    }
  }
  return absl::OkStatus();
}

// tool_choice: carpool renders the tools into the prompt but never parses a tool call out of
// the output, so only "none" (or none given) is honest.
absl::Status CheckToolChoice(const ReqJson& body) {
  for (const char* name : {"tool_choice", "function_call"}) {
    const ReqJson* c = Field(body, name);
    if (c == nullptr || *c == "none") continue;
    std::string shown;
    if (c->is_string()) {
      shown = c->get<std::string>();
    } else if (c->is_object() && c->contains("function") && (*c)["function"].is_object() &&
               (*c)["function"].value("name", ReqJson()).is_string()) {
      shown = absl::StrCat("function ", (*c)["function"]["name"].get<std::string>());
    } else if (c->is_object() && c->value("name", ReqJson()).is_string()) {
      shown = absl::StrCat("function ", (*c)["name"].get<std::string>());  // function_call
    } else {
      shown = Dump(json(*c)).substr(0, 80);  // sorted keys, as before
    }
    return Bad(name, absl::StrCat("\"", absl::CHexEscape(absl::string_view(shown).substr(0, 80)),
                                  "\" is not supported: carpool does not parse tool calls from "
                                  "the output; send ",
                                  name, " \"none\""));
  }
  return absl::OkStatus();
}

// The chat fields of the request `j` as the router's ChatInput: messages, tools and
// chat_template_kwargs re-serialized from the one order-keeping parse, so a template's tojson
// prints their keys in the request's order.
absl::Status ParseChatInput(const ReqJson& j, ChatInput* out) {
  RETURN_IF_ERROR(CheckMessages(j));
  const ReqJson* tools = Field(j, "tools");
  if (tools != nullptr) RETURN_IF_ERROR(CheckTools(*tools));
  if (const ReqJson* f = Field(j, "functions")) {
    if (!f->is_array()) return Bad("functions", "must be a list");
    if (!f->empty()) return Bad("functions", "is not supported: send them as tools");
  }
  const ReqJson* kwargs = Field(j, "chat_template_kwargs");
  if (kwargs != nullptr && !kwargs->is_object()) {
    return Bad("chat_template_kwargs", "must be an object");
  }
  RETURN_IF_ERROR(GetBool(j, "add_generation_prompt", &out->add_generation_prompt));
  bool continue_final = false;
  RETURN_IF_ERROR(GetBool(j, "continue_final_message", &continue_final));
  if (continue_final) return Bad("continue_final_message", "is not supported");
  const auto dump = [](const ReqJson& v) {
    return v.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  out->messages_json = dump(*Field(j, "messages"));  // CheckMessages: present
  // An empty list stays one: transformers passes tools=[] to the template (not None).
  out->tools_json = tools != nullptr ? dump(*tools) : "";
  out->chat_template_kwargs_json = kwargs != nullptr ? dump(*kwargs) : "";
  return absl::OkStatus();
}

absl::Status ParseStop(const ReqJson& body, std::vector<std::string>* out) {
  const ReqJson* s = Field(body, "stop");
  if (s == nullptr) return absl::OkStatus();
  if (s->is_string()) {
    out->push_back(s->get<std::string>());
  } else if (s->is_array()) {
    if (s->size() > kMaxStops) return Bad("stop", "may hold at most 4 strings");
    for (const ReqJson& x : *s) {
      if (!x.is_string()) return Bad("stop", "must be a string or a list of strings");
      out->push_back(x.get<std::string>());
    }
  } else {
    return Bad("stop", "must be a string or a list of strings");
  }
  for (const std::string& x : *out) {
    if (x.empty()) return Bad("stop", "strings must not be empty");
  }
  return absl::OkStatus();
}

absl::Status ParseLogprobs(ApiKind kind, const ReqJson& body, GenerationRequest* r) {
  if (kind == ApiKind::kCompletion) {
    const ReqJson* l = Field(body, "logprobs");
    if (l == nullptr) return absl::OkStatus();
    if (!l->is_number_integer()) return Bad("logprobs", "must be an integer (top-N) or null");
    r->logprobs = true;
    return GetIntInRange(body, "logprobs", 0, kMaxLogprobs, &r->top_logprobs);
  }
  if (absl::Status s = GetBool(body, "logprobs", &r->logprobs); !s.ok()) return s;
  if (absl::Status s = GetIntInRange(body, "top_logprobs", 0, kMaxLogprobs,
                                     &r->top_logprobs);
      !s.ok()) {
    return s;
  }
  if (r->top_logprobs > 0 && !r->logprobs) return Bad("top_logprobs", "needs logprobs: true");
  return absl::OkStatus();
}

absl::Status ParsePriority(const ReqJson& body, Priority* out) {
  std::string p;
  if (absl::Status s = GetString(body, "priority", &p); !s.ok()) return s;
  std::optional<Priority> priority = p.empty() ? Priority::kDefault : PriorityFromName(p);
  if (!priority) return Bad("priority", "must be \"interactive\", \"default\" or \"batch\"");
  *out = *priority;
  return absl::OkStatus();
}

absl::Status ParseSampling(ApiKind kind, const ReqJson& body, const RequestDefaults& d,
                           GenerationRequest* r) {
  SamplingParams& p = r->input.sampling;
  int64_t max_tokens = kind == ApiKind::kChat ? d.chat_max_tokens : d.completion_max_tokens;
  const char* max_field = "max_tokens";  // null means the default, as absent
  RETURN_IF_ERROR(GetInt(body, "max_tokens", &max_tokens));
  if (kind == ApiKind::kChat && Field(body, "max_completion_tokens") != nullptr) {
    max_field = "max_completion_tokens";  // wins over the deprecated max_tokens
    RETURN_IF_ERROR(GetInt(body, max_field, &max_tokens));
  }
  if (max_tokens < 1 || max_tokens > INT32_MAX) return Bad(max_field, "must be >= 1");
  p.max_tokens = static_cast<int>(max_tokens);
  RETURN_IF_ERROR(GetFloat(body, "temperature", &p.temperature));
  RETURN_IF_ERROR(GetFloat(body, "top_p", &p.top_p));
  RETURN_IF_ERROR(GetFloat(body, "min_p", &p.min_p));
  RETURN_IF_ERROR(GetFloat(body, "presence_penalty", &p.presence_penalty));
  RETURN_IF_ERROR(GetFloat(body, "frequency_penalty", &p.frequency_penalty));
  RETURN_IF_ERROR(GetFloat(body, "repetition_penalty", &p.repetition_penalty));
  RETURN_IF_ERROR(GetIntInRange(body, "top_k", -1, INT32_MAX, &p.top_k));
  RETURN_IF_ERROR(GetBool(body, "ignore_eos", &p.ignore_eos));
  if (const ReqJson* seed = Field(body, "seed")) {
    if (!seed->is_number_integer()) return Bad("seed", "must be an integer");
    p.has_seed = true;
    p.seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                        : static_cast<uint64_t>(seed->get<int64_t>());
  }
  RETURN_IF_ERROR(ParseLogprobs(kind, body, r));
  p.logprobs = r->top_logprobs;
  return absl::OkStatus();
}

// An option carpool cannot honour is refused rather than silently ignored.
absl::Status RefuseUnsupported(ApiKind kind, const ReqJson& j) {
  if (kind == ApiKind::kCompletion) {
    bool echo = false;
    RETURN_IF_ERROR(GetBool(j, "echo", &echo));
    if (echo) return Bad("echo", "is not supported (only the completion is returned)");
    int64_t best_of = 1;
    RETURN_IF_ERROR(GetInt(j, "best_of", &best_of));
    if (best_of != 1) return Bad("best_of", "must be 1 (one candidate per request)");
    std::string suffix;
    RETURN_IF_ERROR(GetString(j, "suffix", &suffix));
    if (!suffix.empty()) return Bad("suffix", "is not supported (no insertion)");
  }
  int64_t n = 1;
  RETURN_IF_ERROR(GetInt(j, "n", &n));
  if (n != 1) return Bad("n", "must be 1 (one choice per request)");
  if (const ReqJson* bias = Field(j, "logit_bias")) {
    if (!bias->is_object()) return Bad("logit_bias", "must be an object");
    if (!bias->empty()) return Bad("logit_bias", "is not supported");
  }
  if (kind == ApiKind::kChat) RETURN_IF_ERROR(CheckToolChoice(j));
  if (const ReqJson* f = Field(j, "response_format")) {
    if (!f->is_object()) return Bad("response_format", "must be an object");
    const auto type = f->find("type");
    if (type == f->end() || !type->is_string()) {
      return Bad("response_format.type", "must be a string");
    }
    if (*type != "text") return Bad("response_format.type", "must be \"text\" (no JSON mode)");
  }
  return absl::OkStatus();
}

}  // namespace

// ---- errors

std::string ErrorParam(const absl::Status& status) {
  const auto p = status.GetPayload(kParamPayload);
  return p.has_value() ? std::string(*p) : "";
}

HttpError HttpErrorFromStatus(const absl::Status& status) {
  HttpError e;
  e.code = ErrorReason(status);
  e.message = std::string(status.message());
  const std::string& r = e.code;
  if (r == reason::kInvalidArgument || r == reason::kPromptTooLong || r == reason::kTooLarge) {
    e.status = 400;  // too_large: the cluster could never run it, so retrying cannot help
  } else if (r == reason::kUnauthenticated) {
    e.status = 401;
  } else if (r == reason::kUnknownModel) {
    e.status = 404;
  } else if (r == reason::kQueueFull || r == reason::kTokenBudget || r == reason::kTenantQuota) {
    e.status = 429;
  } else if (r == reason::kDraining || r == reason::kWorkerLost) {
    e.status = 503;
  } else if (r == reason::kDeadlineExceeded || r == reason::kDeadlineUnmeetable) {
    e.status = 504;
  } else if (r == reason::kCancelled) {
    e.status = 499;
  } else if (r == reason::kDuplicateRequestId) {
    e.status = 409;
  } else {
    switch (status.code()) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kOutOfRange:
      case absl::StatusCode::kFailedPrecondition:
        e.status = 400;
        break;
      case absl::StatusCode::kUnauthenticated:
      case absl::StatusCode::kPermissionDenied:
        e.status = 401;
        break;
      case absl::StatusCode::kNotFound:
        e.status = 404;
        break;
      case absl::StatusCode::kResourceExhausted:
        e.status = 429;
        break;
      case absl::StatusCode::kUnavailable:
        e.status = 503;
        break;
      case absl::StatusCode::kDeadlineExceeded:
        e.status = 504;
        break;
      case absl::StatusCode::kCancelled:
        e.status = 499;
        break;
      default:
        e.status = 500;
    }
    if (e.code.empty()) e.code = e.status == 500 ? reason::kInternal : "";
    if (e.code.empty()) e.code = absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  }
  switch (e.status) {
    case 400:
    case 404:
    case 409:
      e.type = "invalid_request_error";
      break;
    case 401:
      e.type = "authentication_error";
      break;
    case 429:
      e.type = "rate_limit_error";
      break;
    case 504:
      e.type = "timeout_error";
      break;
    default:
      e.type = "server_error";
  }
  e.param = ErrorParam(status);
  if (e.param.empty() && r == reason::kUnknownModel) e.param = "model";
  if (e.status == 429 || e.status == 503) {
    const int64_t ms = RetryAfterMs(status);
    e.retry_after_s = ms > 0 ? (ms + 999) / 1000 : 1;
  }
  return e;
}

HttpError BadRequest(std::string message, std::string code, std::string param) {
  HttpError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

HttpError BadRequest(const absl::Status& status) {
  return BadRequest(std::string(status.message()), "invalid_argument", ErrorParam(status));
}

std::string ErrorBody(const HttpError& error) {
  return Dump(json{{"error",
                    {{"message", error.message},
                     {"type", error.type},
                     {"param", error.param.empty() ? json(nullptr) : json(error.param)},
                     {"code", error.code}}}});
}

// ---- generation requests

absl::StatusOr<GenerationRequest> ParseGenerationRequest(ApiKind kind, const std::string& body,
                                                         const RequestDefaults& defaults) {
  absl::StatusOr<ReqJson> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  const ReqJson& j = *parsed;
  GenerationRequest r;
  r.kind = kind;
  RETURN_IF_ERROR(GetString(j, "model", &r.model));
  if (kind == ApiKind::kCompletion) {
    RETURN_IF_ERROR(ParsePrompt(j, &r.input));
  } else {
    r.input.chat.emplace();
    RETURN_IF_ERROR(ParseChatInput(j, &*r.input.chat));
  }
  RETURN_IF_ERROR(RefuseUnsupported(kind, j));
  RETURN_IF_ERROR(ParseSampling(kind, j, defaults, &r));
  RETURN_IF_ERROR(ParseStop(j, &r.stop));
  r.input.stop = r.stop;
  RETURN_IF_ERROR(GetBool(j, "include_stop_str_in_output", &r.input.include_stop_str_in_output));
  RETURN_IF_ERROR(GetBool(j, "skip_special_tokens", &r.input.skip_special_tokens));
  RETURN_IF_ERROR(GetBool(j, "stream", &r.stream));
  if (const ReqJson* so = Field(j, "stream_options")) {
    if (!so->is_object()) return Bad("stream_options", "must be an object");
    RETURN_IF_ERROR(GetBool(*so, "include_usage", &r.include_usage));
  }
  RETURN_IF_ERROR(ParsePriority(j, &r.input.priority));
  RETURN_IF_ERROR(GetInt(j, "deadline_ms", &r.input.deadline_ms));
  if (r.input.deadline_ms < 0) return Bad("deadline_ms", "must be >= 0");
  r.input.stream = r.stream;
  return r;
}

// ---- generation responses

bool ByteTokenModel(const std::string& model) {
  return model == "echo" || absl::StartsWith(model, "synthetic:");
}

std::string TokenText(int32_t token, bool byte_tokens) {
  if (byte_tokens) return ByteTokenizer().Decode({token}, /*skip_special_tokens=*/true);
  return absl::StrCat("token_id:", token);
}

size_t TokenTextBytes(const SampleResult& t, bool byte_tokens) {
  return byte_tokens ? TokenText(t.token, true).size() : t.text.size();
}

namespace {

json Bytes(const std::string& s) {
  json b = json::array();
  for (char c : s) b.push_back(static_cast<uint8_t>(c));
  return b;
}

json CompletionLogprobs(const std::vector<SampleResult>& tokens, int top_n, int64_t text_offset,
                        bool byte_tokens) {
  json out{{"tokens", json::array()},
           {"token_logprobs", json::array()},
           {"top_logprobs", json::array()},
           {"text_offset", json::array()}};
  for (const SampleResult& t : tokens) {
    const std::string text = TokenText(t.token, byte_tokens);
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (size_t i = 0; i < t.top_logprobs.size() && static_cast<int>(i) < top_n; ++i) {
      top[SanitizeUtf8(TokenText(t.top_logprobs[i].token, byte_tokens))] =
          t.top_logprobs[i].logprob;
    }
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(text_offset);
    text_offset += static_cast<int64_t>(TokenTextBytes(t, byte_tokens));
  }
  return out;
}

json ChatLogprobs(const std::vector<SampleResult>& tokens, int top_n, bool byte_tokens) {
  json content = json::array();
  for (const SampleResult& t : tokens) {
    const std::string text = TokenText(t.token, byte_tokens);
    json top = json::array();
    for (size_t i = 0; i < t.top_logprobs.size() && static_cast<int>(i) < top_n; ++i) {
      const std::string alt = TokenText(t.top_logprobs[i].token, byte_tokens);
      top.push_back({{"token", alt}, {"logprob", t.top_logprobs[i].logprob}, {"bytes", Bytes(alt)}});
    }
    content.push_back(
        {{"token", text}, {"logprob", t.logprob}, {"bytes", Bytes(text)}, {"top_logprobs", top}});
  }
  return json{{"content", std::move(content)}};
}

json LogprobsJson(const GenerationRequest& r, const ResponseMeta& meta,
                  const std::vector<SampleResult>& tokens, int64_t text_offset) {
  if (!r.logprobs) return nullptr;
  if (r.kind == ApiKind::kCompletion) {
    return CompletionLogprobs(tokens, r.top_logprobs, text_offset, meta.byte_tokens);
  }
  return ChatLogprobs(tokens, r.top_logprobs, meta.byte_tokens);
}

json UsageJson(const Usage& u) {
  json usage{{"prompt_tokens", u.prompt_tokens},
             {"completion_tokens", u.completion_tokens},
             {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (u.cached_prompt_tokens > 0) {
    usage["prompt_tokens_details"] = {{"cached_tokens", u.cached_prompt_tokens}};
  }
  return usage;
}

json Envelope(const GenerationRequest& r, const ResponseMeta& meta, bool chunk) {
  const char* object = r.kind == ApiKind::kCompletion ? "text_completion"
                       : chunk                        ? "chat.completion.chunk"
                                                      : "chat.completion";
  return json{{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

json FinishReason(const std::string& f) { return f.empty() ? json(nullptr) : json(f); }

}  // namespace

std::string ResponseBody(const GenerationRequest& request, const ResponseMeta& meta,
                         const std::string& text, const std::vector<SampleResult>& tokens,
                         const std::string& finish_reason, const Usage& usage) {
  json out = Envelope(request, meta, /*chunk=*/false);
  json choice{{"index", 0},
              {"logprobs", LogprobsJson(request, meta, tokens, 0)},
              {"finish_reason", FinishReason(finish_reason)}};
  if (request.kind == ApiKind::kCompletion) {
    choice["text"] = text;
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}};
  }
  out["choices"] = json::array({std::move(choice)});
  out["usage"] = UsageJson(usage);
  return Dump(out);
}

std::string StreamChunkBody(const GenerationRequest& request, const ResponseMeta& meta,
                            const std::string& text, const std::vector<SampleResult>& tokens,
                            int64_t text_offset, const std::string& finish_reason) {
  json out = Envelope(request, meta, /*chunk=*/true);
  json choice{{"index", 0},
              {"logprobs", LogprobsJson(request, meta, tokens, text_offset)},
              {"finish_reason", FinishReason(finish_reason)}};
  if (request.kind == ApiKind::kCompletion) {
    choice["text"] = text;
  } else {
    json delta = json::object();
    if (!text.empty() || finish_reason.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  }
  out["choices"] = json::array({std::move(choice)});
  if (request.include_usage) out["usage"] = nullptr;
  return Dump(out);
}

std::string RoleChunkBody(const GenerationRequest& request, const ResponseMeta& meta) {
  json out = Envelope(request, meta, /*chunk=*/true);
  out["choices"] = json::array({json{{"index", 0},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
  if (request.include_usage) out["usage"] = nullptr;
  return Dump(out);
}

std::string UsageChunkBody(const GenerationRequest& request, const ResponseMeta& meta,
                           const Usage& usage) {
  json out = Envelope(request, meta, /*chunk=*/true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  return Dump(out);
}

std::string SseEvent(const std::string& body) { return absl::StrCat("data: ", body, "\n\n"); }

// ---- tokenize and detokenize

absl::StatusOr<TokenizeHttpRequest> ParseTokenizeRequest(const std::string& body) {
  absl::StatusOr<ReqJson> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  const ReqJson& j = *parsed;
  TokenizeHttpRequest r;
  RETURN_IF_ERROR(GetString(j, "model", &r.model));
  const bool has_prompt = Field(j, "prompt") != nullptr;
  r.chat = Field(j, "messages") != nullptr;
  if (has_prompt && r.chat) return Bad("messages", "goes without 'prompt' (give one of them)");
  if (r.chat) {
    RETURN_IF_ERROR(ParseChatInput(j, &r.chat_input));
  } else {
    if (!has_prompt) return Bad("prompt", "is required (or 'messages')");
    if (!Field(j, "prompt")->is_string()) return Bad("prompt", "must be a string");
    RETURN_IF_ERROR(GetString(j, "prompt", &r.prompt));
  }
  if (Field(j, "add_special_tokens") != nullptr) {
    bool add = false;
    RETURN_IF_ERROR(GetBool(j, "add_special_tokens", &add));
    r.add_special_tokens = add;
  }
  bool token_strs = false;
  RETURN_IF_ERROR(GetBool(j, "return_token_strs", &token_strs));
  if (token_strs) return Bad("return_token_strs", "is not supported");
  return r;
}

std::string TokenizeBody(const std::vector<int32_t>& tokens, int max_model_len) {
  return Dump(json{{"count", tokens.size()}, {"max_model_len", max_model_len}, {"tokens", tokens}});
}

absl::StatusOr<DetokenizeHttpRequest> ParseDetokenizeRequest(const std::string& body) {
  absl::StatusOr<ReqJson> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  const ReqJson& j = *parsed;
  DetokenizeHttpRequest r;
  RETURN_IF_ERROR(GetString(j, "model", &r.model));
  const ReqJson* tokens = Field(j, "tokens");
  if (tokens == nullptr) return Bad("tokens", "is required");
  if (!tokens->is_array()) return Bad("tokens", "must be a list of token ids");
  absl::StatusOr<std::vector<int32_t>> ids = TokenIds(*tokens, "tokens");
  if (!ids.ok()) return ids.status();
  r.tokens = std::move(*ids);
  return r;
}

std::string DetokenizeBody(const std::string& text) {
  return Dump(json{{"prompt", SanitizeUtf8(text)}});
}

// ---- embeddings and models

absl::StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(const std::string& body) {
  absl::StatusOr<ReqJson> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  const ReqJson& j = *parsed;
  EmbeddingsRequest r;
  RETURN_IF_ERROR(GetString(j, "model", &r.model));
  std::string format = "float";
  RETURN_IF_ERROR(GetString(j, "encoding_format", &format));
  if (format != "float" && format != "base64") {
    return Bad("encoding_format", "must be \"float\" or \"base64\"");
  }
  r.base64 = format == "base64";
  if (Field(j, "dimensions") != nullptr) {
    return Bad("dimensions", "is not supported (embeddings have the model's full size)");
  }
  const ReqJson* in = Field(j, "input");
  if (in == nullptr) return Bad("input", "is required");
  const auto text_item = [](const ReqJson& s) {
    EmbedItem item;
    item.has_text = true;
    item.text = s.get<std::string>();
    return item;
  };
  if (in->is_string()) {
    r.input.inputs.push_back(text_item(*in));
  } else if (in->is_array() && !in->empty()) {
    if ((*in)[0].is_number_integer()) {
      absl::StatusOr<std::vector<int32_t>> ids = TokenIds(*in, "input");
      if (!ids.ok()) return ids.status();
      r.input.inputs.push_back(EmbedItem{false, "", std::move(*ids)});
    } else {
      for (const ReqJson& x : *in) {
        if (x.is_string()) {
          r.input.inputs.push_back(text_item(x));
        } else if (x.is_array() && !x.empty()) {
          absl::StatusOr<std::vector<int32_t>> ids = TokenIds(x, "input");
          if (!ids.ok()) return ids.status();
          r.input.inputs.push_back(EmbedItem{false, "", std::move(*ids)});
        } else {
          return Bad("input", "items must be strings or non-empty lists of token ids");
        }
      }
    }
  } else {
    return Bad("input", "must be a string, a list of strings or a list of token-id lists");
  }
  RETURN_IF_ERROR(ParsePriority(j, &r.input.priority));
  RETURN_IF_ERROR(GetInt(j, "deadline_ms", &r.input.deadline_ms));
  if (r.input.deadline_ms < 0) return Bad("deadline_ms", "must be >= 0");
  return r;
}

std::string EmbeddingsBody(const std::vector<std::vector<float>>& embeddings,
                           const std::string& model, const Usage& usage, bool base64) {
  json data = json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    json e = embeddings[i];
    if (base64) {
      std::string raw;
      raw.reserve(embeddings[i].size() * 4);
      for (float f : embeddings[i]) {
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof(bits));
        for (int b = 0; b < 4; ++b) raw.push_back(static_cast<char>((bits >> (8 * b)) & 0xff));
      }
      e = absl::Base64Escape(raw);
    }
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(e)}});
  }
  return Dump(json{{"object", "list"},
                   {"data", std::move(data)},
                   {"model", model},
                   {"usage",
                    {{"prompt_tokens", usage.prompt_tokens},
                     {"total_tokens", usage.prompt_tokens}}}});
}

namespace {
json ModelJson(const std::string& model, int64_t created) {
  return json{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "carpool"}};
}
}  // namespace

std::string ModelBody(const std::string& model, int64_t created) {
  return Dump(ModelJson(model, created));
}

std::string ModelsBody(const std::vector<std::string>& models, int64_t created) {
  json data = json::array();
  for (const std::string& m : models) data.push_back(ModelJson(m, created));
  return Dump(json{{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace carpool::router
