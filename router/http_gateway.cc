#include "router/http_gateway.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/carpool_client.h"
#include "common/status.h"
#include "router/batch/batch_http.h"
#include "router/http_server.h"
#include "router/openai_json.h"
#include "router/text_stream.h"

namespace carpool::router {
namespace {

constexpr char kJson[] = "application/json";
constexpr char kEventStream[] = "text/event-stream";
constexpr char kPrometheusText[] = "text/plain; version=0.0.4";
// How long a stream waits for the next chunk before it checks the client and the gateway.
constexpr int64_t kStreamPollMs = 250;
// A stream with nothing to send writes an SSE comment this often, so a gone client is noticed.
constexpr int64_t kStreamKeepAliveMs = 1000;
// How long the served-model list from the router's stats is reused.
constexpr absl::Duration kModelsTtl = absl::Seconds(1);
constexpr int64_t kStatsTimeoutMs = 2000;
// Added to a request's deadline_ms for the SDK call timeout (the router ends it first).
constexpr int64_t kDeadlineSlackMs = 5000;

HttpResponse JsonResponse(std::string body, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.content_type = kJson;
  r.body = std::move(body);
  return r;
}

HttpResponse ErrorResponse(const HttpError& e) {
  HttpResponse r = JsonResponse(ErrorBody(e), e.status);
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", absl::StrCat(e.retry_after_s));
  return r;
}

HttpError MakeError(int status, std::string type, std::string code, std::string message,
                    int64_t retry_after_s = 0) {
  return HttpError{status, std::move(type), std::move(code), std::move(message), retry_after_s, ""};
}

std::string BearerKey(const HttpRequest& req) {
  const std::string auth = req.Header("Authorization");
  constexpr absl::string_view kBearer = "bearer ";
  if (auth.size() > kBearer.size() &&
      absl::AsciiStrToLower(auth.substr(0, kBearer.size())) == kBearer) {
    return std::string(absl::StripAsciiWhitespace(auth.substr(kBearer.size())));
  }
  return "";
}

}  // namespace

absl::Status HttpGatewayOptions::Validate() const {
  if (router_endpoint.empty()) return absl::InvalidArgumentError("the gateway needs a router");
  if (listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--http must be HOST:PORT, not '", listen, "'"));
  }
  RETURN_IF_ERROR(server.Validate());
  if (request_timeout_ms < 1) return absl::InvalidArgumentError("request_timeout_ms must be >= 1");
  if (completion_max_tokens < 1 || chat_max_tokens < 1) {
    return absl::InvalidArgumentError("default max_tokens must be >= 1");
  }
  return absl::OkStatus();
}

class HttpGateway::Impl {
 public:
  explicit Impl(const HttpGatewayOptions& options) : options_(options) {}
  ~Impl();

  absl::Status Start();
  int port() const { return port_; }

 private:
  struct Served {
    std::vector<std::string> models;
    absl::Time fetched = absl::InfinitePast();
  };
  struct StreamState;

  // Routes one request (a handler thread of server_).
  void Handle(const HttpRequest& req, HttpResponder& res);
  // Counts an answer for carpool_http_responses_total.
  void Count(absl::string_view path, int status);
  void HandleGeneration(ApiKind kind, const HttpRequest& req, HttpResponder& res);
  void RespondWhole(GenerationRequest r, ResponseMeta meta, HttpResponder& res);
  void RespondStream(GenerationRequest r, ResponseMeta meta, HttpResponder& res);
  void HandleEmbeddings(const HttpRequest& req, HttpResponder& res);
  // POST /tokenize and /detokenize (vLLM's shapes), answered by the router's tokenizer.
  void HandleTokenize(const HttpRequest& req, HttpResponder& res);
  void HandleDetokenize(const HttpRequest& req, HttpResponder& res);
  void HandleModels(HttpResponder& res);
  // GET /v1/models/{id}: the model object, or 404 model_not_found.
  void HandleModel(const std::string& id, HttpResponder& res);
  void HandleReady(HttpResponder& res);
  void HandleMetrics(HttpResponder& res);
  // The model a request names, checked against the served ones (404 when unknown); the first
  // served one when it names none.
  std::string ResolveModel(const std::string& requested, std::optional<HttpError>* error);
  absl::StatusOr<std::vector<std::string>> ServedModels(bool refresh);
  std::string NextId();
  CallOptions CallFor(const GenerateInput& in) const;
  void Track(const std::string& id);
  void Untrack(const std::string& id);

  const HttpGatewayOptions options_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::string id_prefix_;
  int64_t started_ = 0;  // unix seconds: the models' `created`
  std::atomic<uint64_t> next_id_{0};
  std::atomic<int> active_streams_{0};

  absl::Mutex mu_;
  Served served_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> inflight_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, int64_t> responses_ ABSL_GUARDED_BY(mu_);
};

// ---- lifecycle

absl::Status HttpGateway::Impl::Start() {
  RETURN_IF_ERROR(options_.Validate());
  absl::BitGen gen;
  id_prefix_ = absl::StrFormat("%08x", absl::Uniform<uint32_t>(gen));
  started_ = absl::ToUnixSeconds(absl::Now());
  ClientOptions co;
  co.router_endpoint = options_.router_endpoint;
  co.zmq_context = options_.zmq_context;
  co.default_timeout_ms = options_.request_timeout_ms;
  co.zmtp_heartbeat_ms = 0;  // inproc
  co.max_message_bytes = std::max<int64_t>(64 << 20, options_.server.max_body_bytes * 4);
  ASSIGN_OR_RETURN(client_, Client::Connect(co));

  const size_t colon = options_.listen.rfind(':');
  HttpServerOptions so = options_.server;
  so.host = options_.listen.substr(0, colon);
  if (so.host == "localhost") so.host = "127.0.0.1";
  if (!absl::SimpleAtoi(options_.listen.substr(colon + 1), &so.port) || so.port < 0 ||
      so.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http: bad port in '", options_.listen, "'"));
  }
  so.error_page = [](int status, absl::string_view code, absl::string_view message) {
    HttpResponse r = ErrorResponse(MakeError(
        status, status >= 500 ? "server_error" : "invalid_request_error", std::string(code),
        std::string(message)));
    if (status == 503) r.headers.emplace_back("Retry-After", "1");
    return r;
  };
  so.on_response = [this](absl::string_view path, int status) { Count(path, status); };
  if (options_.batch != nullptr && options_.max_upload_bytes > 0) {
    so.path_max_body_bytes["/v1/files"] = options_.max_upload_bytes;
  }
  ASSIGN_OR_RETURN(server_, HttpServer::Start(so, [this](const HttpRequest& req,
                                                         HttpResponder& res) {
                     Handle(req, res);
                   }));
  port_ = server_->port();
  return absl::OkStatus();
}

HttpGateway::Impl::~Impl() {
  stopping_.store(true);
  if (client_ != nullptr) {
    std::vector<std::string> ids;
    {
      absl::MutexLock lock(&mu_);
      ids.assign(inflight_.begin(), inflight_.end());
    }
    for (const std::string& id : ids) (void)client_->Cancel(id);
  }
  server_.reset();  // closes the connections and waits for the handlers
  client_.reset();
}

void HttpGateway::Impl::Count(absl::string_view path, int status) {
  static const std::set<std::string, std::less<>> kRoutes = {
      "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models",
      "/health",         "/ready",               "/metrics",        "/tokenize",
      "/detokenize",     "/v1/files",            "/v1/batches"};
  const std::string route = kRoutes.contains(path)                   ? std::string(path)
                            : absl::StartsWith(path, "/v1/models/")  ? "/v1/models/{id}"
                            : absl::StartsWith(path, "/v1/files/")   ? "/v1/files/{id}"
                            : absl::StartsWith(path, "/v1/batches/") ? "/v1/batches/{id}"
                                                                     : "other";
  absl::MutexLock lock(&mu_);
  ++responses_[{route, status}];
}

void HttpGateway::Impl::Handle(const HttpRequest& req, HttpResponder& res) {
  const std::string& path = req.path;
  const bool get = req.method == "GET", post = req.method == "POST";
  if (batch::IsBatchApiPath(path)) {
    if (options_.batch == nullptr) {
      return res.Send(ErrorResponse(MakeError(
          404, "invalid_request_error", "not_found",
          "this router serves no batch jobs: its state dir is off (see --state-dir)")));
    }
    return res.Send(batch::ServeBatchApi(*options_.batch, req, BearerKey(req)));
  }
  const char* allowed = nullptr;
  if (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/embeddings" ||
      path == "/tokenize" || path == "/detokenize") {
    if (!post) {
      allowed = "POST";
    } else if (path == "/v1/embeddings") {
      return HandleEmbeddings(req, res);
    } else if (path == "/tokenize") {
      return HandleTokenize(req, res);
    } else if (path == "/detokenize") {
      return HandleDetokenize(req, res);
    } else {
      return HandleGeneration(path == "/v1/completions" ? ApiKind::kCompletion : ApiKind::kChat,
                              req, res);
    }
  } else if (path == "/v1/models" || path == "/health" || path == "/ready" ||
             path == "/metrics" || absl::StartsWith(path, "/v1/models/")) {
    if (!get) {
      allowed = "GET";
    } else if (path == "/v1/models") {
      return HandleModels(res);
    } else if (path == "/health") {
      return res.Send(JsonResponse("{\"status\":\"ok\"}"));
    } else if (path == "/ready") {
      return HandleReady(res);
    } else if (path == "/metrics") {
      return HandleMetrics(res);
    } else {
      // Model ids hold ':' and '/' (synthetic:tiny, org/name): everything after /v1/models/.
      return HandleModel(path.substr(absl::string_view("/v1/models/").size()), res);
    }
  }
  if (allowed != nullptr) {
    HttpResponse r = ErrorResponse(MakeError(
        405, "invalid_request_error", "method_not_allowed",
        absl::StrCat(req.method, " is not allowed on ", path, "; use ", allowed)));
    r.headers.emplace_back("Allow", allowed);
    return res.Send(std::move(r));
  }
  res.Send(ErrorResponse(MakeError(404, "invalid_request_error", "not_found",
                                   absl::StrCat("no route ", req.method, " ", path))));
}

// ---- helpers

std::string HttpGateway::Impl::NextId() {
  return absl::StrCat(id_prefix_, "-", next_id_.fetch_add(1, std::memory_order_relaxed));
}

CallOptions HttpGateway::Impl::CallFor(const GenerateInput& in) const {
  CallOptions call;
  call.timeout_ms =
      in.deadline_ms > 0 ? in.deadline_ms + kDeadlineSlackMs : options_.request_timeout_ms;
  return call;
}

void HttpGateway::Impl::Track(const std::string& id) {
  absl::MutexLock lock(&mu_);
  inflight_.insert(id);
}

void HttpGateway::Impl::Untrack(const std::string& id) {
  absl::MutexLock lock(&mu_);
  inflight_.erase(id);
}

absl::StatusOr<std::vector<std::string>> HttpGateway::Impl::ServedModels(bool refresh) {
  {
    absl::MutexLock lock(&mu_);
    if (!refresh && absl::Now() - served_.fetched < kModelsTtl) return served_.models;
  }
  ASSIGN_OR_RETURN(StatsOut stats, client_->Stats(kStatsTimeoutMs));
  std::set<std::string> unique;
  for (const WorkerStatsOut& w : stats.workers) {
    if (!w.model.empty()) unique.insert(w.model);
  }
  std::vector<std::string> models(unique.begin(), unique.end());
  absl::MutexLock lock(&mu_);
  served_.models = models;
  served_.fetched = absl::Now();
  return models;
}

std::string HttpGateway::Impl::ResolveModel(const std::string& requested,
                                            std::optional<HttpError>* error) {
  absl::StatusOr<std::vector<std::string>> models = ServedModels(false);
  if (models.ok() && !requested.empty() &&
      std::find(models->begin(), models->end(), requested) == models->end()) {
    models = ServedModels(true);  // a worker may have just registered
  }
  if (!models.ok()) {
    *error = HttpErrorFromStatus(models.status());
    return "";
  }
  if (requested.empty()) return models->empty() ? "" : models->front();
  // No worker yet: the router queues the request until one registers.
  if (models->empty()) return requested;
  if (std::find(models->begin(), models->end(), requested) == models->end()) {
    *error = MakeError(404, "invalid_request_error", "model_not_found",
                       absl::StrCat("the model '", requested, "' does not exist; served: ",
                                    absl::StrJoin(*models, ", ")));
    (*error)->param = "model";
    return "";
  }
  return requested;
}

// ---- generation

void HttpGateway::Impl::HandleGeneration(ApiKind kind, const HttpRequest& req,
                                         HttpResponder& res) {
  RequestDefaults defaults{options_.completion_max_tokens, options_.chat_max_tokens};
  absl::StatusOr<GenerationRequest> r = ParseGenerationRequest(kind, req.body, defaults);
  if (!r.ok()) return res.Send(ErrorResponse(BadRequest(r.status())));
  std::optional<HttpError> error;
  ResponseMeta meta;
  meta.model = ResolveModel(r->model, &error);
  if (error.has_value()) return res.Send(ErrorResponse(*error));
  meta.byte_tokens = ByteTokenModel(meta.model);
  meta.created = absl::ToUnixSeconds(absl::Now());
  const std::string id = NextId();
  meta.id = absl::StrCat(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-", id);
  // Chat: r->input.chat goes to the router, which renders it with the model's chat template.
  r->input.request_id = id;
  r->input.api_key = BearerKey(req);
  r->input.model = meta.model;
  if (r->stream) return RespondStream(*std::move(r), std::move(meta), res);
  RespondWhole(*std::move(r), std::move(meta), res);
}

void HttpGateway::Impl::RespondWhole(GenerationRequest r, ResponseMeta meta,
                                     HttpResponder& res) {
  const std::string id = r.input.request_id;
  Track(id);
  // Streamed from the router even here: reading chunk by chunk lets the handler look at its
  // connection between them and cancel the request when the client has gone.
  absl::StatusOr<std::unique_ptr<Stream>> stream = client_->StartStream(r.input, CallFor(r.input));
  if (!stream.ok()) {
    Untrack(id);
    return res.Send(ErrorResponse(HttpErrorFromStatus(stream.status())));
  }
  std::vector<SampleResult> tokens;
  // The router detokenizes and matches the stop strings (ending the request at one, with
  // finish_reason "stop"); its text passes through, checked to be UTF-8.
  Utf8Stream utf8;
  std::string text;
  absl::Time next_check = absl::Now() + absl::Milliseconds(kStreamPollMs);
  for (;;) {
    absl::StatusOr<std::optional<GenerateChunkOut>> next = (*stream)->Next(kStreamPollMs);
    if (absl::Now() >= next_check) {
      next_check = absl::Now() + absl::Milliseconds(kStreamPollMs);
      if (res.Gone()) {
        (*stream)->Cancel();  // frees the request on its worker
        Untrack(id);
        // Nobody reads it: the client went away (counted as 499).
        return res.Send(ErrorResponse(MakeError(499, "invalid_request_error", reason::kCancelled,
                                                "the client closed the connection")));
      }
    }
    if (!next.ok()) {
      if (!(*stream)->done()) continue;  // only the poll interval passed
      Untrack(id);
      return res.Send(ErrorResponse(HttpErrorFromStatus(next.status())));
    }
    if (!next->has_value()) break;
    tokens.insert(tokens.end(), (*next)->tokens.begin(), (*next)->tokens.end());
    text += utf8.Feed((*next)->text);
  }
  Untrack(id);
  text += utf8.Flush();
  res.Send(JsonResponse(ResponseBody(r, meta, text, tokens, (*stream)->result().finish_reason,
                                     (*stream)->result().usage)));
}

// One SSE response's state.
struct HttpGateway::Impl::StreamState {
  GenerationRequest request;
  ResponseMeta meta;
  std::unique_ptr<Stream> stream;
  Utf8Stream text;  // the router's text (stop strings already applied), checked to be UTF-8
  bool role_sent = false;
  bool done = false;
  int64_t token_offset = 0;  // completions' text_offset of the next token
  size_t chunk_bytes = 0;    // text the chunks carried; the final may carry more
  absl::Time last_write = absl::Now();

  StreamState(GenerationRequest r, ResponseMeta m) : request(std::move(r)), meta(std::move(m)) {}

  // A chat stream's role chunk, before its first other chunk.
  std::string Role() {
    if (role_sent || request.kind != ApiKind::kChat) return "";
    role_sent = true;
    return SseEvent(RoleChunkBody(request, meta));
  }

  // Events for one chunk from the router (nothing when it adds nothing visible).
  std::string OnChunk(const GenerateChunkOut& chunk) {
    chunk_bytes += chunk.text.size();
    const std::string visible = text.Feed(chunk.text);
    std::string out = Role();
    const bool want_tokens = request.logprobs && !chunk.tokens.empty();
    if (!visible.empty() || want_tokens) {
      out += SseEvent(StreamChunkBody(
          request, meta, visible, request.logprobs ? chunk.tokens : kNoTokens, token_offset, ""));
    }
    for (const SampleResult& t : chunk.tokens) {
      token_offset += static_cast<int64_t>(TokenTextBytes(t, meta.byte_tokens));
    }
    return out;
  }

  // The last chunk (finish_reason), the usage chunk when asked for, and [DONE].
  std::string Finish(const std::string& finish_reason, const Usage& usage) {
    done = true;
    // Text that only the end completed, when the worker ended without a token, comes in the
    // final, which the stream's result appends after the chunks' text.
    const std::string& all = stream->result().text;
    std::string rest = all.size() > chunk_bytes ? text.Feed(all.substr(chunk_bytes)) : "";
    rest += text.Flush();
    std::string out = Role();
    out += SseEvent(StreamChunkBody(request, meta, rest, kNoTokens, token_offset, finish_reason));
    if (request.include_usage) out += SseEvent(UsageChunkBody(request, meta, usage));
    return out + kSseDone;
  }

  static inline const std::vector<SampleResult> kNoTokens;
};

void HttpGateway::Impl::RespondStream(GenerationRequest r, ResponseMeta meta,
                                      HttpResponder& res) {
  const std::string id = r.input.request_id;
  Track(id);
  absl::StatusOr<std::unique_ptr<Stream>> stream = client_->StartStream(r.input, CallFor(r.input));
  // Wait for the first chunk, so a refusal still gets its HTTP status instead of a 200 stream.
  absl::StatusOr<std::optional<GenerateChunkOut>> first =
      stream.ok() ? (*stream)->Next() : absl::StatusOr<std::optional<GenerateChunkOut>>(
                                            stream.status());
  if (!first.ok()) {
    Untrack(id);
    return res.Send(ErrorResponse(HttpErrorFromStatus(first.status())));
  }
  StreamState state(std::move(r), std::move(meta));
  state.stream = *std::move(stream);
  active_streams_.fetch_add(1);
  HttpResponse head;
  head.content_type = kEventStream;
  head.headers.emplace_back("Cache-Control", "no-cache");
  bool ok = res.StartStream(head);
  std::string out;
  if (ok && first->has_value()) out = state.OnChunk(**first);
  while (ok && !state.done) {
    if (state.stream->done() && out.empty()) {
      out = state.Finish(state.stream->result().finish_reason, state.stream->result().usage);
    } else if (out.empty() && stopping_.load()) {
      state.stream->Cancel();
      state.done = true;
      out = SseEvent(ErrorBody(MakeError(503, "server_error", reason::kDraining,
                                         "the gateway is shutting down"))) +
            kSseDone;
    } else if (out.empty()) {
      absl::StatusOr<std::optional<GenerateChunkOut>> next = state.stream->Next(kStreamPollMs);
      if (next.ok() && next->has_value()) {
        out = state.OnChunk(**next);
      } else if (next.ok()) {
        out = state.Finish(state.stream->result().finish_reason, state.stream->result().usage);
      } else if (!state.stream->done()) {  // only the poll interval passed
        if (res.Gone()) break;
        if (absl::Now() - state.last_write > absl::Milliseconds(kStreamKeepAliveMs)) {
          out = ": keep-alive\n\n";
        }
      } else {
        state.done = true;
        out = SseEvent(ErrorBody(HttpErrorFromStatus(next.status()))) + kSseDone;
      }
    }
    if (!out.empty()) {
      ok = res.Write(out);  // false: the client is gone
      out.clear();
      state.last_write = absl::Now();
    }
  }
  state.stream->Cancel();  // frees the request when the client left; no effect once it ended
  if (ok) res.End();
  Untrack(id);
  active_streams_.fetch_sub(1);
}

// ---- tokenize, detokenize

void HttpGateway::Impl::HandleTokenize(const HttpRequest& req, HttpResponder& res) {
  absl::StatusOr<TokenizeHttpRequest> r = ParseTokenizeRequest(req.body);
  if (!r.ok()) return res.Send(ErrorResponse(BadRequest(r.status())));
  std::optional<HttpError> error;
  TokenizeOptions o;
  o.model = ResolveModel(r->model, &error);
  if (error.has_value()) return res.Send(ErrorResponse(*error));
  // Unset add_special_tokens: true for a prompt, false for messages (the ids
  // /v1/chat/completions uses for them: the template writes the special tokens).
  o.add_special_tokens = r->add_special_tokens;
  o.request_id = NextId();
  o.api_key = BearerKey(req);
  o.timeout_ms = options_.request_timeout_ms;
  Track(o.request_id);
  absl::StatusOr<TokenizeResult> result =
      r->chat ? client_->TokenizeChat(std::move(r->chat_input), o)
              : client_->Tokenize(std::move(r->prompt), o);
  Untrack(o.request_id);
  if (!result.ok()) return res.Send(ErrorResponse(HttpErrorFromStatus(result.status())));
  res.Send(JsonResponse(TokenizeBody(result->token_ids, result->max_model_len)));
}

void HttpGateway::Impl::HandleDetokenize(const HttpRequest& req, HttpResponder& res) {
  absl::StatusOr<DetokenizeHttpRequest> r = ParseDetokenizeRequest(req.body);
  if (!r.ok()) return res.Send(ErrorResponse(BadRequest(r.status())));
  std::optional<HttpError> error;
  DetokenizeOptions o;
  o.model = ResolveModel(r->model, &error);
  if (error.has_value()) return res.Send(ErrorResponse(*error));
  o.request_id = NextId();
  o.api_key = BearerKey(req);
  o.timeout_ms = options_.request_timeout_ms;
  Track(o.request_id);
  absl::StatusOr<std::string> text = client_->Detokenize(std::move(r->tokens), o);
  Untrack(o.request_id);
  if (!text.ok()) return res.Send(ErrorResponse(HttpErrorFromStatus(text.status())));
  res.Send(JsonResponse(DetokenizeBody(*text)));
}

// ---- embeddings, models, health, metrics

void HttpGateway::Impl::HandleEmbeddings(const HttpRequest& req, HttpResponder& res) {
  absl::StatusOr<EmbeddingsRequest> r = ParseEmbeddingsRequest(req.body);
  if (!r.ok()) return res.Send(ErrorResponse(BadRequest(r.status())));
  std::optional<HttpError> error;
  const std::string model = ResolveModel(r->model, &error);
  if (error.has_value()) return res.Send(ErrorResponse(*error));
  r->input.request_id = NextId();
  r->input.api_key = BearerKey(req);
  r->input.model = model;
  CallOptions call;
  call.timeout_ms = r->input.deadline_ms > 0 ? r->input.deadline_ms + kDeadlineSlackMs
                                             : options_.request_timeout_ms;
  Track(r->input.request_id);
  absl::StatusOr<EmbedResult> result = client_->Embed(r->input, call);
  Untrack(r->input.request_id);
  if (!result.ok()) return res.Send(ErrorResponse(HttpErrorFromStatus(result.status())));
  res.Send(JsonResponse(EmbeddingsBody(result->embeddings, model, result->usage, r->base64)));
}

void HttpGateway::Impl::HandleModels(HttpResponder& res) {
  absl::StatusOr<std::vector<std::string>> models = ServedModels(true);
  if (!models.ok()) return res.Send(ErrorResponse(HttpErrorFromStatus(models.status())));
  res.Send(JsonResponse(ModelsBody(*models, started_)));
}

void HttpGateway::Impl::HandleModel(const std::string& id, HttpResponder& res) {
  absl::StatusOr<std::vector<std::string>> models = ServedModels(true);
  if (!models.ok()) return res.Send(ErrorResponse(HttpErrorFromStatus(models.status())));
  if (std::find(models->begin(), models->end(), id) == models->end()) {
    HttpError e = MakeError(404, "invalid_request_error", "model_not_found",
                            absl::StrCat("the model '", id, "' does not exist"));
    e.param = "model";
    return res.Send(ErrorResponse(e));
  }
  res.Send(JsonResponse(ModelBody(id, started_)));
}

void HttpGateway::Impl::HandleReady(HttpResponder& res) {
  absl::StatusOr<StatsOut> stats = client_->Stats(kStatsTimeoutMs);
  int healthy = 0;
  if (stats.ok()) {
    for (const WorkerStatsOut& w : stats->workers) healthy += w.healthy ? 1 : 0;
  }
  if (!stats.ok() || healthy == 0 || stats->draining) {
    const std::string why = !stats.ok()       ? "the router does not answer"
                            : stats->draining ? "the router is draining"
                                              : "no healthy worker";
    return res.Send(ErrorResponse(MakeError(503, "server_error", "not_ready", why, 1)));
  }
  res.Send(JsonResponse(absl::StrCat("{\"status\":\"ready\",\"healthy_workers\":", healthy, "}")));
}

void HttpGateway::Impl::HandleMetrics(HttpResponder& res) {
  std::string out =
      "# HELP carpool_http_responses_total HTTP responses of the gateway, by route and status.\n"
      "# TYPE carpool_http_responses_total counter\n";
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, count] : responses_) {
      absl::StrAppend(&out, "carpool_http_responses_total{route=\"", key.first, "\",code=\"",
                      key.second, "\"} ", count, "\n");
    }
  }
  const HttpServerStats st = server_->Stats();
  absl::StrAppend(
      &out,
      "# HELP carpool_http_connections Connections the gateway holds open now.\n"
      "# TYPE carpool_http_connections gauge\ncarpool_http_connections ", st.connections, "\n",
      "# HELP carpool_http_connections_rejected_total Connections refused over "
      "--http-max-connections.\n"
      "# TYPE carpool_http_connections_rejected_total counter\n"
      "carpool_http_connections_rejected_total ", st.rejected_connections, "\n",
      "# HELP carpool_http_requests_rejected_total Requests refused over "
      "--http-max-concurrent-requests.\n"
      "# TYPE carpool_http_requests_rejected_total counter\n"
      "carpool_http_requests_rejected_total ", st.rejected_requests, "\n",
      "# HELP carpool_http_timeouts_total Connections ended by a read (408) or write deadline.\n"
      "# TYPE carpool_http_timeouts_total counter\ncarpool_http_timeouts_total ", st.timeouts,
      "\n",
      "# HELP carpool_http_active_requests Requests being handled now.\n"
      "# TYPE carpool_http_active_requests gauge\ncarpool_http_active_requests ",
      st.active_requests, "\n",
      "# HELP carpool_http_streams SSE streams in progress.\n"
      "# TYPE carpool_http_streams gauge\ncarpool_http_streams ",
      active_streams_.load(), "\n");
  if (options_.metrics) out += options_.metrics();
  HttpResponse r;
  r.content_type = kPrometheusText;
  r.body = std::move(out);
  res.Send(std::move(r));
}

// ---- HttpGateway

HttpGateway::HttpGateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpGateway::~HttpGateway() = default;

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Start(
    const HttpGatewayOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<HttpGateway>(new HttpGateway(std::move(impl)));
}

int HttpGateway::port() const { return impl_->port(); }

}  // namespace carpool::router
