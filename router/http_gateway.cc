#include "router/http_gateway.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
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
#include "httplib.h"
#include "router/openai_json.h"
#include "router/peer_socket.h"
#include "router/text_stream.h"

namespace carpool::router {
namespace {

constexpr char kJson[] = "application/json";
constexpr char kEventStream[] = "text/event-stream";
constexpr char kPrometheusText[] = "text/plain; version=0.0.4";
// Threads beyond max_connections that only answer 503 to connections over the limit.
constexpr int kRejectThreads = 4;
// How long a stream waits for the next chunk before it checks the client and the gateway.
constexpr int64_t kStreamPollMs = 250;
// A stream with nothing to send writes an SSE comment this often, so a gone client is noticed.
constexpr int64_t kStreamKeepAliveMs = 1000;
// How long the served-model list from the router's stats is reused.
constexpr absl::Duration kModelsTtl = absl::Seconds(1);
constexpr int64_t kStatsTimeoutMs = 2000;
// Added to a request's deadline_ms for the SDK call timeout (the router ends it first).
constexpr int64_t kDeadlineSlackMs = 5000;

// Set on a thread of ConnectionPool while it serves a connection over the limit.
thread_local bool t_over_limit = false;

// httplib's TaskQueue (one task = one connection, kept for its keep-alive lifetime) with a fixed
// set of threads: max_connections serve, kRejectThreads more answer 503 at once to connections
// beyond the limit, so those are never stuck behind slow ones. httplib 0.11's own ThreadPool
// queues them silently instead.
class ConnectionPool : public httplib::TaskQueue {
 public:
  ConnectionPool(int max_connections, std::atomic<int>* active, std::atomic<int64_t>* rejected)
      : max_(max_connections), active_(active), rejected_(rejected) {
    for (int i = 0; i < max_connections + kRejectThreads; ++i) {
      threads_.emplace_back([this] { Work(); });
    }
  }
  ~ConnectionPool() override = default;

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return shutdown_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      const int n = active_->fetch_add(1) + 1;
      t_over_limit = n > max_;
      if (t_over_limit) rejected_->fetch_add(1);
      fn();
      t_over_limit = false;
      active_->fetch_sub(1);
    }
  }

  const int max_;
  std::atomic<int>* active_;
  std::atomic<int64_t>* rejected_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool shutdown_ = false;
  std::vector<std::thread> threads_;
};

void SendError(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", absl::StrCat(e.retry_after_s));
  res.set_content(ErrorBody(e), kJson);
}

HttpError MakeError(int status, std::string type, std::string code, std::string message,
                    int64_t retry_after_s = 0) {
  return HttpError{status, std::move(type), std::move(code), std::move(message), retry_after_s, ""};
}

std::string BearerKey(const httplib::Request& req) {
  const std::string auth = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "bearer ";
  if (auth.size() > kBearer.size() &&
      absl::AsciiStrToLower(auth.substr(0, kBearer.size())) == kBearer) {
    return std::string(absl::StripAsciiWhitespace(auth.substr(kBearer.size())));
  }
  return "";
}

bool ByteTokens(const std::string& model) {
  return model == "echo" || absl::StartsWith(model, "synthetic:");
}

// Prompt tokens as the router counts them, for answers cut short by a stop string (the router's
// usage never arrives then): exact for the byte tokenizer and for token-id prompts.
int EstimatePromptTokens(const GenerateInput& in, bool byte_tokens) {
  if (!in.has_text) return static_cast<int>(in.token_ids.size());
  if (!byte_tokens) return 0;
  return static_cast<int>(in.text.size()) + (in.add_bos ? 1 : 0);
}

}  // namespace

absl::Status HttpGatewayOptions::Validate() const {
  if (router_endpoint.empty()) return absl::InvalidArgumentError("the gateway needs a router");
  if (listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--http must be HOST:PORT, not '", listen, "'"));
  }
  if (max_connections < 1) return absl::InvalidArgumentError("--http-max-connections must be >= 1");
  if (max_body_bytes < 1024) return absl::InvalidArgumentError("--http-max-body-bytes must be >= 1024");
  if (max_header_bytes < 1024) {
    return absl::InvalidArgumentError("--http-max-header-bytes must be >= 1024");
  }
  if (idle_timeout_ms < 100) return absl::InvalidArgumentError("--http-idle-timeout-ms must be >= 100");
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

  void Install();
  void HandleGeneration(ApiKind kind, const httplib::Request& req, httplib::Response& res);
  void RespondWhole(GenerationRequest r, ResponseMeta meta, const httplib::Request& req,
                    httplib::Response& res);
  void RespondStream(GenerationRequest r, ResponseMeta meta, httplib::Response& res);
  void HandleEmbeddings(const httplib::Request& req, httplib::Response& res);
  void HandleModels(httplib::Response& res);
  // GET /v1/models/{id}: the model object, or 404 model_not_found.
  void HandleModel(const std::string& id, httplib::Response& res);
  void HandleReady(httplib::Response& res);
  void HandleMetrics(httplib::Response& res);
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
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::string id_prefix_;
  int64_t started_ = 0;  // unix seconds: the models' `created`
  std::atomic<uint64_t> next_id_{0};
  std::atomic<int> active_connections_{0};
  std::atomic<int64_t> rejected_connections_{0};
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
  co.max_message_bytes = std::max<int64_t>(64 << 20, options_.max_body_bytes * 4);
  ASSIGN_OR_RETURN(client_, Client::Connect(co));

  const size_t colon = options_.listen.rfind(':');
  const std::string host = options_.listen.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(options_.listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http: bad port in '", options_.listen, "'"));
  }
  Install();
  if (port == 0) {
    port_ = server_.bind_to_any_port(host);
    if (port_ <= 0) return absl::UnavailableError(absl::StrCat("cannot bind ", options_.listen));
  } else {
    if (!server_.bind_to_port(host, port)) {
      return absl::UnavailableError(absl::StrCat("cannot bind ", options_.listen));
    }
    port_ = port;
  }
  thread_ = std::thread([this] { server_.listen_after_bind(); });
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
  server_.stop();
  if (thread_.joinable()) thread_.join();
  client_.reset();
}

void HttpGateway::Impl::Install() {
  const int max_connections = options_.max_connections;
  server_.new_task_queue = [this, max_connections] {
    return new ConnectionPool(max_connections, &active_connections_, &rejected_connections_);
  };
  const time_t idle_s = static_cast<time_t>(options_.idle_timeout_ms / 1000);
  const time_t idle_us = static_cast<time_t>(options_.idle_timeout_ms % 1000 * 1000);
  server_.set_keep_alive_timeout(std::max<time_t>(1, (options_.idle_timeout_ms + 999) / 1000));
  server_.set_read_timeout(idle_s, idle_us);
  server_.set_write_timeout(idle_s, idle_us);
  server_.set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  server_.set_tcp_nodelay(true);

  server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (t_over_limit) {
      res.set_header("Connection", "close");
      SendError(res, MakeError(503, "server_error", "too_many_connections",
                               absl::StrCat("the gateway serves at most ",
                                            options_.max_connections, " connections at once"),
                               1));
      return httplib::Server::HandlerResponse::Handled;
    }
    size_t header_bytes = req.method.size() + req.target.size() + 12;
    for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
    if (static_cast<int64_t>(header_bytes) > options_.max_header_bytes) {
      res.set_header("Connection", "close");
      SendError(res, MakeError(431, "invalid_request_error", "headers_too_large",
                               absl::StrCat("request headers exceed ", options_.max_header_bytes,
                                            " bytes")));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    switch (res.status) {
      case 404:
        SendError(res, MakeError(404, "invalid_request_error", "not_found",
                                 absl::StrCat("no route ", req.method, " ", req.path)));
        break;
      case 413:
        SendError(res, MakeError(413, "invalid_request_error", "payload_too_large",
                                 "the request body is too large"));
        break;
      default:
        SendError(res, MakeError(res.status, res.status >= 500 ? "server_error"
                                                               : "invalid_request_error",
                                 absl::StrCat("http_", res.status), "bad HTTP request"));
    }
  });
  server_.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, MakeError(500, "server_error", reason::kInternal, "internal error"));
      });
  server_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    static const std::set<std::string> kRoutes = {
        "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models",
        "/health",         "/ready",               "/metrics"};
    const std::string route = kRoutes.contains(req.path)                  ? req.path
                              : absl::StartsWith(req.path, "/v1/models/") ? "/v1/models/{id}"
                                                                          : "other";
    absl::MutexLock lock(&mu_);
    ++responses_[{route, res.status}];
  });

  server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(ApiKind::kCompletion, req, res);
  });
  server_.Post("/v1/chat/completions",
               [this](const httplib::Request& req, httplib::Response& res) {
                 HandleGeneration(ApiKind::kChat, req, res);
               });
  server_.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
    HandleEmbeddings(req, res);
  });
  server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    HandleModels(res);
  });
  // Model ids hold ':' and '/' (synthetic:tiny, org/name): everything after /v1/models/.
  server_.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    HandleModel(req.matches[1], res);
  });
  server_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", kJson);
  });
  server_.Get("/ready", [this](const httplib::Request&, httplib::Response& res) {
    HandleReady(res);
  });
  server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    HandleMetrics(res);
  });
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

void HttpGateway::Impl::HandleGeneration(ApiKind kind, const httplib::Request& req,
                                         httplib::Response& res) {
  RequestDefaults defaults{options_.completion_max_tokens, options_.chat_max_tokens};
  absl::StatusOr<GenerationRequest> r = ParseGenerationRequest(kind, req.body, defaults);
  if (!r.ok()) return SendError(res, BadRequest(r.status()));
  std::optional<HttpError> error;
  ResponseMeta meta;
  meta.model = ResolveModel(r->model, &error);
  if (error.has_value()) return SendError(res, *error);
  meta.byte_tokens = ByteTokens(meta.model);
  meta.created = absl::ToUnixSeconds(absl::Now());
  const std::string id = NextId();
  meta.id = absl::StrCat(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-", id);
  if (kind == ApiKind::kChat) {
    const ChatTemplate t = ResolveChatTemplate(options_.chat_template, meta.model);
    r->input.has_text = true;
    r->input.text = RenderChat(t, r->messages);
    r->input.add_bos = ChatTemplateWantsBos(t);
  }
  r->input.request_id = id;
  r->input.api_key = BearerKey(req);
  if (r->stream) return RespondStream(*std::move(r), std::move(meta), res);
  RespondWhole(*std::move(r), std::move(meta), req, res);
}

void HttpGateway::Impl::RespondWhole(GenerationRequest r, ResponseMeta meta,
                                     const httplib::Request& req, httplib::Response& res) {
  const std::string id = r.input.request_id;
  Track(id);
  // Streamed from the router even here: reading chunk by chunk lets the handler look at its
  // connection between them and cancel the request when the client has gone (its socket is
  // found once; -1 if not, and then the request runs to its end).
  absl::StatusOr<std::unique_ptr<Stream>> stream = client_->StartStream(r.input, CallFor(r.input));
  if (!stream.ok()) {
    Untrack(id);
    return SendError(res, HttpErrorFromStatus(stream.status()));
  }
  const int fd = FindConnectionFd(req.remote_addr, req.remote_port, req.local_port);
  std::vector<SampleResult> tokens;
  TextStream pipeline(r.stop);
  std::string text;
  absl::Time next_check = absl::Now() + absl::Milliseconds(kStreamPollMs);
  for (;;) {
    absl::StatusOr<std::optional<GenerateChunkOut>> next = (*stream)->Next(kStreamPollMs);
    if (fd >= 0 && absl::Now() >= next_check) {
      next_check = absl::Now() + absl::Milliseconds(kStreamPollMs);
      if (PeerClosed(fd)) {
        (*stream)->Cancel();  // frees the request on its worker
        Untrack(id);
        res.status = 499;     // nobody reads it: the client went away
        return;
      }
    }
    if (!next.ok()) {
      if (!(*stream)->done()) continue;  // only the poll interval passed
      Untrack(id);
      return SendError(res, HttpErrorFromStatus(next.status()));
    }
    if (!next->has_value()) break;
    tokens.insert(tokens.end(), (*next)->tokens.begin(), (*next)->tokens.end());
    text += pipeline.Feed((*next)->text);
    if (pipeline.stopped()) {
      // Stop strings are watched in the decoded text; the request ends at the first one.
      (*stream)->Cancel();
      break;
    }
  }
  Untrack(id);
  std::string finish_reason;
  Usage usage;
  if (pipeline.stopped()) {
    finish_reason = "stop";
    usage.prompt_tokens = EstimatePromptTokens(r.input, meta.byte_tokens);
    usage.completion_tokens = static_cast<int>(tokens.size());
  } else {
    text += pipeline.Flush();
    finish_reason = (*stream)->result().finish_reason;
    usage = (*stream)->result().usage;
  }
  res.set_content(ResponseBody(r, meta, text, tokens, finish_reason, usage), kJson);
}

// One SSE response's state, shared by httplib's content provider and its releaser.
struct HttpGateway::Impl::StreamState {
  GenerationRequest request;
  ResponseMeta meta;
  std::unique_ptr<Stream> stream;
  TextStream text;
  std::optional<GenerateChunkOut> first_chunk;  // read before the 200 was committed
  bool role_sent = false;
  bool done = false;
  int completion_tokens = 0;
  int64_t token_offset = 0;  // completions' text_offset of the next token
  absl::Time last_write = absl::Now();

  StreamState(GenerationRequest r, ResponseMeta m)
      : request(std::move(r)), meta(std::move(m)), text(request.stop) {}

  // A chat stream's role chunk, before its first other chunk.
  std::string Role() {
    if (role_sent || request.kind != ApiKind::kChat) return "";
    role_sent = true;
    return SseEvent(RoleChunkBody(request, meta));
  }

  // Events for one chunk from the router (nothing when it adds nothing visible).
  std::string OnChunk(const GenerateChunkOut& chunk) {
    completion_tokens += static_cast<int>(chunk.tokens.size());
    const std::string visible = text.Feed(chunk.text);
    std::string out = Role();
    const bool want_tokens = request.logprobs && !chunk.tokens.empty();
    if (!visible.empty() || want_tokens) {
      out += SseEvent(StreamChunkBody(
          request, meta, visible, request.logprobs ? chunk.tokens : kNoTokens, token_offset, ""));
    }
    for (const SampleResult& t : chunk.tokens) {
      token_offset += static_cast<int64_t>(TokenText(t.token, meta.byte_tokens).size());
    }
    if (text.stopped()) {
      stream->Cancel();
      Usage usage;
      usage.prompt_tokens = EstimatePromptTokens(request.input, meta.byte_tokens);
      usage.completion_tokens = completion_tokens;
      out += Finish("stop", usage);
    }
    return out;
  }

  // The last chunk (finish_reason), the usage chunk when asked for, and [DONE].
  std::string Finish(const std::string& finish_reason, const Usage& usage) {
    done = true;
    const std::string rest = text.stopped() ? "" : text.Flush();
    std::string out = Role();
    out += SseEvent(StreamChunkBody(request, meta, rest, kNoTokens, token_offset, finish_reason));
    if (request.include_usage) out += SseEvent(UsageChunkBody(request, meta, usage));
    return out + kSseDone;
  }

  static inline const std::vector<SampleResult> kNoTokens;
};

void HttpGateway::Impl::RespondStream(GenerationRequest r, ResponseMeta meta,
                                      httplib::Response& res) {
  const std::string id = r.input.request_id;
  Track(id);
  absl::StatusOr<std::unique_ptr<Stream>> stream = client_->StartStream(r.input, CallFor(r.input));
  // Wait for the first chunk, so a refusal still gets its HTTP status instead of a 200 stream.
  absl::StatusOr<std::optional<GenerateChunkOut>> first =
      stream.ok() ? (*stream)->Next() : absl::StatusOr<std::optional<GenerateChunkOut>>(
                                            stream.status());
  if (!first.ok()) {
    Untrack(id);
    return SendError(res, HttpErrorFromStatus(first.status()));
  }
  auto state = std::make_shared<StreamState>(std::move(r), std::move(meta));
  state->stream = *std::move(stream);
  state->first_chunk = *std::move(first);  // nullopt: it ended without chunks
  active_streams_.fetch_add(1);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      kEventStream,
      [this, state](size_t, httplib::DataSink& sink) {
        std::string out;
        if (state->first_chunk.has_value() || state->stream->done()) {
          if (state->first_chunk.has_value()) {
            out = state->OnChunk(*state->first_chunk);
            state->first_chunk.reset();
          }
          if (!state->done && state->stream->done()) {
            out += state->Finish(state->stream->result().finish_reason,
                                 state->stream->result().usage);
          }
        } else if (stopping_.load()) {
          state->stream->Cancel();
          state->done = true;
          out = SseEvent(ErrorBody(MakeError(503, "server_error", reason::kDraining,
                                             "the gateway is shutting down"))) +
                kSseDone;
        } else {
          absl::StatusOr<std::optional<GenerateChunkOut>> next = state->stream->Next(kStreamPollMs);
          if (next.ok() && next->has_value()) {
            out = state->OnChunk(**next);
          } else if (next.ok()) {
            out = state->Finish(state->stream->result().finish_reason,
                                state->stream->result().usage);
          } else if (!state->stream->done()) {  // only the poll interval passed
            if (absl::Now() - state->last_write > absl::Milliseconds(kStreamKeepAliveMs)) {
              out = ": keep-alive\n\n";
            }
          } else {
            state->done = true;
            out = SseEvent(ErrorBody(HttpErrorFromStatus(next.status()))) + kSseDone;
          }
        }
        if (!out.empty()) {
          if (!sink.write(out.data(), out.size())) {
            state->stream->Cancel();  // the client is gone: free the request
            return false;
          }
          state->last_write = absl::Now();
        }
        if (state->done) sink.done();
        return true;
      },
      [this, state, id](bool) {
        state->stream->Cancel();  // no effect once it ended
        Untrack(id);
        active_streams_.fetch_sub(1);
      });
}

// ---- embeddings, models, health, metrics

void HttpGateway::Impl::HandleEmbeddings(const httplib::Request& req, httplib::Response& res) {
  absl::StatusOr<EmbeddingsRequest> r = ParseEmbeddingsRequest(req.body);
  if (!r.ok()) return SendError(res, BadRequest(r.status()));
  std::optional<HttpError> error;
  const std::string model = ResolveModel(r->model, &error);
  if (error.has_value()) return SendError(res, *error);
  r->input.request_id = NextId();
  r->input.api_key = BearerKey(req);
  CallOptions call;
  call.timeout_ms = r->input.deadline_ms > 0 ? r->input.deadline_ms + kDeadlineSlackMs
                                             : options_.request_timeout_ms;
  Track(r->input.request_id);
  absl::StatusOr<EmbedResult> result = client_->Embed(r->input, call);
  Untrack(r->input.request_id);
  if (!result.ok()) return SendError(res, HttpErrorFromStatus(result.status()));
  res.set_content(EmbeddingsBody(result->embeddings, model, result->usage, r->base64), kJson);
}

void HttpGateway::Impl::HandleModels(httplib::Response& res) {
  absl::StatusOr<std::vector<std::string>> models = ServedModels(true);
  if (!models.ok()) return SendError(res, HttpErrorFromStatus(models.status()));
  res.set_content(ModelsBody(*models, started_), kJson);
}

void HttpGateway::Impl::HandleModel(const std::string& id, httplib::Response& res) {
  absl::StatusOr<std::vector<std::string>> models = ServedModels(true);
  if (!models.ok()) return SendError(res, HttpErrorFromStatus(models.status()));
  if (std::find(models->begin(), models->end(), id) == models->end()) {
    HttpError e = MakeError(404, "invalid_request_error", "model_not_found",
                            absl::StrCat("the model '", id, "' does not exist"));
    e.param = "model";
    return SendError(res, e);
  }
  res.set_content(ModelBody(id, started_), kJson);
}

void HttpGateway::Impl::HandleReady(httplib::Response& res) {
  absl::StatusOr<StatsOut> stats = client_->Stats(kStatsTimeoutMs);
  int healthy = 0;
  if (stats.ok()) {
    for (const WorkerStatsOut& w : stats->workers) healthy += w.healthy ? 1 : 0;
  }
  if (!stats.ok() || healthy == 0 || stats->draining) {
    const std::string why = !stats.ok()       ? "the router does not answer"
                            : stats->draining ? "the router is draining"
                                              : "no healthy worker";
    return SendError(res, MakeError(503, "server_error", "not_ready", why, 1));
  }
  res.set_content(absl::StrCat("{\"status\":\"ready\",\"healthy_workers\":", healthy, "}"), kJson);
}

void HttpGateway::Impl::HandleMetrics(httplib::Response& res) {
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
  absl::StrAppend(
      &out,
      "# HELP carpool_http_connections Connections the gateway holds now (one thread each).\n"
      "# TYPE carpool_http_connections gauge\ncarpool_http_connections ",
      active_connections_.load(), "\n",
      "# HELP carpool_http_connections_rejected_total Connections refused over "
      "--http-max-connections.\n"
      "# TYPE carpool_http_connections_rejected_total counter\n"
      "carpool_http_connections_rejected_total ",
      rejected_connections_.load(), "\n",
      "# HELP carpool_http_streams SSE streams in progress.\n"
      "# TYPE carpool_http_streams gauge\ncarpool_http_streams ",
      active_streams_.load(), "\n");
  if (options_.metrics) out += options_.metrics();
  res.set_content(out, kPrometheusText);
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
