#include "router/router.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/codec.h"
#include "common/status.h"
#include "router/embed_kind.h"
#include "router/generate_kind.h"
#include "router/router_impl.h"

namespace carpool::router {
namespace {

constexpr int kPollMillis = 20;
// While some client has a backlog: how often it is retried.
constexpr int kBacklogPollMillis = 5;
constexpr int kMaxMessagesPerWake = 512;
constexpr int64_t kCheckIntervalMicros = 50'000;
// With no request in the router: how often the backend (heartbeats, registrations) is read.
constexpr int64_t kIdleBackendMicros = 5'000;
// How long the frontend keeps trying to deliver the last answers when Run returns after a drain.
constexpr int kDrainLingerMillis = 1000;
// After a drain, how long the router waits for its workers to confirm (deregister) and how often
// it repeats the request meanwhile: a worker busy or slow to read still hears it.
constexpr int64_t kWorkerDrainWaitMicros = 5'000'000;
constexpr int64_t kWorkerDrainResendMicros = 500'000;

// A client's name inside the router: the socket it came on (one byte) and its routing id there,
// so routing ids on the two client sockets never clash.
constexpr char kTcpClient = 't';
constexpr char kInprocClient = 'i';

std::string ClientKey(char kind, const std::string& routing_id) {
  std::string key(1, kind);
  key += routing_id;
  return key;
}

int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool IsInproc(const std::string& client) { return !client.empty() && client[0] == kInprocClient; }

}  // namespace

absl::Status RouterOptions::Validate() const {
  if (heartbeat_timeout_ms < 10) {
    return absl::InvalidArgumentError("--heartbeat-timeout-ms must be >= 10");
  }
  if (max_request_bytes < 1024 || max_request_bytes > max_frame_bytes) {
    return absl::InvalidArgumentError(
        "--max-request-bytes must be >= 1024 and <= the frame limit");
  }
  if (client_send_hwm < 1) return absl::InvalidArgumentError("client_send_hwm must be >= 1");
  if (client_backlog.max_messages < 1 || client_backlog.max_bytes < 1024) {
    return absl::InvalidArgumentError(
        "client_backlog needs max_messages >= 1 and max_bytes >= 1024");
  }
  if (max_batch_call_bytes < 1024) {
    return absl::InvalidArgumentError("max_batch_call_bytes must be >= 1024");
  }
  if (max_inproc_request_bytes < max_request_bytes) {
    return absl::InvalidArgumentError(
        "max_inproc_request_bytes must be >= --max-request-bytes");
  }
  RETURN_IF_ERROR(admission.Validate());
  if (max_migrations < 0) return absl::InvalidArgumentError("--max-migrations must be >= 0");
  if (io_threads < 1 || io_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--io-threads must be in [1, 64], got ", io_threads));
  }
  if (stall_timeout_ms < 0) return absl::InvalidArgumentError("--stall-timeout-ms must be >= 0");
  if (affinity_load_weight < 0) {
    return absl::InvalidArgumentError("--affinity-load-weight must be >= 0");
  }
  if (drain_grace_ms < 0) return absl::InvalidArgumentError("--drain-grace-ms must be >= 0");
  if (tokenizer_threads < 1 || tokenizer_threads > 256) {
    return absl::InvalidArgumentError("--tokenizer-threads must be in [1, 256]");
  }
  if (chat_render.limits.max_output_bytes < 1) {
    return absl::InvalidArgumentError("--chat-template-max-output-bytes must be >= 1");
  }
  if (chat_render.limits.max_run_time_us < 1000) {
    return absl::InvalidArgumentError("--chat-template-timeout-ms must be >= 1");
  }
  if (max_tokenizing_bytes < max_request_bytes) {
    return absl::InvalidArgumentError("max_tokenizing_bytes must be >= --max-request-bytes");
  }
  for (const std::string& key : admin_api_keys) {
    if (key.empty()) return absl::InvalidArgumentError("an admin API key is empty");
  }
  if (curve_secret_key.empty() && !curve_allowed_client_keys.empty()) {
    return absl::InvalidArgumentError("--curve-allow needs --curve-secret-key-file");
  }
  return absl::OkStatus();
}

Router::Impl::Impl(const RouterOptions& o)
    : options_(o),
      clock_(o.clock ? o.clock : Clock::Real()),
      context_(o.io_threads),
      stats_(o),
      models_(ByteModelsChatTemplate(o.chat_template)) {
  options_.admission.clock = clock_;
  admission_ = std::make_unique<AdmissionController>(options_.admission, options_.tenants);
  admission_->SetWorkersAvailable(false);  // none has registered yet
  kinds_.push_back(std::make_unique<GenerateKind>(this, options_));
  kinds_.push_back(std::make_unique<EmbedKind>(this));
  backlog_ = std::make_unique<ClientBacklog>(options_.client_backlog);
  inproc_limits_ = options_.request_limits;
  inproc_limits_.max_prompt_bytes =
      std::max(inproc_limits_.max_prompt_bytes, options_.max_inproc_request_bytes);
  inproc_limits_.allow_batch_job = true;  // the batch runner is an in-process client
}

Router::Impl::~Impl() = default;

absl::Status Router::Impl::Init() {
  ASSIGN_OR_RETURN(pool_, TokenizerPool::Create(options_.tokenizer_threads));
  ASSIGN_OR_RETURN(batch_pool_, TokenizerPool::Create(1));
  SocketOptions so;
  so.max_message_bytes = options_.max_frame_bytes;
  // A worker that reconnects after a network cut comes back under its own id, possibly before
  // its old connection is seen dead; its registration (a new epoch) then takes the id over.
  so.router_handover = true;
  ASSIGN_OR_RETURN(backend_, Socket::Create(&context_, zmq::socket_type::router, so));
  so.router_handover = false;
  // Clients may send a batch call's upload.
  so.max_message_bytes = std::max(options_.max_frame_bytes, options_.max_batch_call_bytes);
  if (!options_.curve_secret_key.empty()) {
    ASSIGN_OR_RETURN(curve_public_key_, CurvePublicKey(options_.curve_secret_key));
    // The ZAP handler must be bound before the frontend accepts its first connection.
    ASSIGN_OR_RETURN(zap_, ZapHandler::Start(&context_, options_.curve_allowed_client_keys));
    so.curve_server = CurveServerKeys{curve_public_key_, options_.curve_secret_key};
  }
  so.high_water_mark = options_.client_send_hwm;
  ASSIGN_OR_RETURN(frontend_, Socket::Create(&context_, zmq::socket_type::router, so));
  RETURN_IF_ERROR(frontend_->Bind(options_.frontend));
  RETURN_IF_ERROR(backend_->Bind(options_.backend));
  frontend_endpoint_ = frontend_->LastEndpoint();
  backend_endpoint_ = backend_->LastEndpoint();
  // One context per Router, so a fixed name cannot clash.
  inproc_endpoint_ = "inproc://carpool-frontend";
  SocketOptions io;
  io.max_message_bytes = std::max({options_.max_frame_bytes, options_.max_inproc_request_bytes,
                                   options_.max_batch_call_bytes});
  io.high_water_mark = options_.client_send_hwm;
  ASSIGN_OR_RETURN(inproc_, Socket::Create(&context_, zmq::socket_type::router, io));
  RETURN_IF_ERROR(inproc_->Bind(inproc_endpoint_));
  return absl::OkStatus();
}

absl::Status Router::Impl::Run(const std::atomic<bool>& stop, const std::atomic<bool>& drain) {
  int64_t next_check = 0;
  int64_t backend_due = 0;  // while idle: when the backend is read next
  while (!stop.load(std::memory_order_relaxed)) {
    // With no request in the router the backend carries only heartbeats, registrations and the
    // like, none of which needs an answer within milliseconds: it is read every
    // kIdleBackendMicros instead of on every message, so 1,024 workers' heartbeats wake this
    // loop about 200 times a second instead of 5,120. Anything else readable reads it at once,
    // before a client's request, so a request never meets a stale view of the workers. Real
    // time, not clock_: this is about wake-ups, and a test's frozen clock must not stop it.
    int64_t wall = SteadyMicros();
    const bool watch_backend = !requests_.empty() || draining_ || wall >= backend_due;
    int timeout_ms = backlog_->empty() ? kPollMillis : kBacklogPollMillis;
    if (!watch_backend) {
      timeout_ms = std::min<int64_t>(timeout_ms, (backend_due - wall + 999) / 1000);
    }
    const PollItem items[] = {{frontend_.get()},
                              {inproc_.get()},
                              {nullptr, pool_->wake_fd()},
                              {nullptr, batch_pool_->wake_fd()},
                              {backend_.get()}};
    ASSIGN_OR_RETURN(const PollResult readable,
                     Poll(absl::MakeConstSpan(items, watch_backend ? 5 : 4), timeout_ms));
    const bool any = readable[0] || readable[1] || readable[2] || readable[3];
    if (readable[2]) pool_->RunCompletions();
    if (readable[3]) batch_pool_->RunCompletions();
    wall = SteadyMicros();
    if ((watch_backend && readable[4]) || (!watch_backend && (any || wall >= backend_due))) {
      RETURN_IF_ERROR(DrainBackend());
      if (!watch_backend || requests_.empty()) backend_due = wall + kIdleBackendMicros;
    }
    if (readable[0]) RETURN_IF_ERROR(DrainFrontend(frontend_.get(), kTcpClient));
    if (readable[1]) RETURN_IF_ERROR(DrainFrontend(inproc_.get(), kInprocClient));
    const int64_t now = clock_->NowMicros();
    if (!draining_ && drain.load(std::memory_order_relaxed)) StartDraining(now);
    if (now >= next_check) {
      CheckWorkers(now);
      ExpireDeadlines();
      ExpireUnadmitted(now);
      next_check = now + kCheckIntervalMicros;
    }
    TryDispatch();
    ServeBacklog();
    // After a drain, answers still queued for slow readers get until the grace period's end.
    if (draining_ && DrainDone(now) && WorkersDrained(now) &&
        (backlog_->empty() || now >= drain_deadline_)) {
      for (Socket* socket : {frontend_.get(), inproc_.get(), backend_.get()}) {
        if (absl::Status s = socket->SetLinger(kDrainLingerMillis); !s.ok()) {
          std::cerr << "carpool-router: " << s.message() << "\n";
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// ---- socket plumbing

absl::Status Router::Impl::DrainFrontend(Socket* socket, char kind) {
  for (int i = 0; i < kMaxMessagesPerWake; ++i) {
    ASSIGN_OR_RETURN(std::optional<Frames> frames, socket->Recv(0));
    if (!frames) break;
    if (frames->empty()) continue;
    const std::string client = ClientKey(kind, frames->front());
    // A slow reader that sends on without reading: past a bound, not even a refusal is queued.
    if (!backlog_->TakeMessage(client)) continue;
    if (frames->size() != 2) {
      RefuseFrame(client, frames->size() > 1 ? std::string_view((*frames)[1]) : "",
                  "expected exactly one frame per message");
      continue;
    }
    OnClientFrame(client, (*frames)[1]);
  }
  return absl::OkStatus();
}

absl::Status Router::Impl::DrainBackend() {
  for (int i = 0; i < kMaxMessagesPerWake; ++i) {
    ASSIGN_OR_RETURN(std::optional<Frames> frames, backend_->Recv(0));
    if (!frames) break;
    if (frames->size() != 2) continue;
    absl::StatusOr<WorkerMessage> m = DecodeWorkerMessage((*frames)[1]);
    if (!m.ok()) {
      std::cerr << "carpool-router: bad worker frame: " << m.status().message() << "\n";
      continue;
    }
    OnWorkerMessage((*frames)[0], std::move(*m));
  }
  return absl::OkStatus();
}

bool Router::Impl::SendToClient(const std::string& client, const ServerMessage& message) {
  const std::string& request_id = RequestIdOf(message);
  if (std::holds_alternative<GenerateFinalOut>(message) &&
      backlog_->LostChunks(client, request_id)) {
    // Chunks of this stream were dropped for a slow reader: it cannot end as if whole.
    return SendError(client, request_id, absl::StatusCode::kResourceExhausted,
                     reason::kClientTooSlow,
                     "the client did not read its answers: chunks of this stream were dropped");
  }
  std::string frame = Encode(message);
  if (!backlog_->Has(client)) {
    Socket* socket = IsInproc(client) ? inproc_.get() : frontend_.get();
    absl::Status s = socket->Send({client.substr(1), frame});
    if (s.ok()) return true;
    if (absl::IsUnavailable(s)) {  // the client is gone
      DropClient(client);
      return false;
    }
    if (!absl::IsResourceExhausted(s)) {
      std::cerr << "carpool-router: send to client failed: " << s.message() << "\n";
      return true;
    }
    // Its pipe is full: the message waits in the backlog.
  }
  const bool chunk = std::holds_alternative<GenerateChunkOut>(message);
  if (backlog_->Add(client, request_id, std::move(frame), chunk) ==
      ClientBacklog::Added::kTooSlow) {
    too_slow_.push_back(client);
  }
  return true;
}

void Router::Impl::ServeBacklog() {
  std::vector<std::string> too_slow;
  too_slow.swap(too_slow_);
  for (const std::string& client : too_slow) {
    std::vector<uint64_t> router_ids;
    for (const auto& [key, router_id] : by_client_) {
      if (key.first == client) router_ids.push_back(router_id);
    }
    std::sort(router_ids.begin(), router_ids.end());
    std::cerr << "carpool-router: a client is not reading its answers (backlog over "
              << options_.client_backlog.max_messages << " messages or "
              << options_.client_backlog.max_bytes << " bytes): " << router_ids.size()
              << " request(s) cancelled\n";
    for (uint64_t router_id : router_ids) {
      Fail(router_id, absl::StatusCode::kResourceExhausted, reason::kClientTooSlow,
           absl::StrCat("the client did not read its answers: the router's backlog for it "
                        "passed ",
                        options_.client_backlog.max_messages, " messages or ",
                        options_.client_backlog.max_bytes,
                        " bytes, so its requests were cancelled"));
    }
  }
  if (backlog_->empty()) return;
  std::vector<std::string> gone;
  backlog_->Flush(
      [this](const std::string& client, const std::string& frame) {
        Socket* socket = IsInproc(client) ? inproc_.get() : frontend_.get();
        return socket->Send({client.substr(1), frame});
      },
      &gone);
  for (const std::string& client : gone) DropClient(client);
}

void Router::Impl::SendToWorker(const std::string& identity, const RouterMessage& message) {
  absl::Status s = backend_->Send({identity, Encode(message)});
  if (!s.ok()) std::cerr << "carpool-router: send to worker failed: " << s.message() << "\n";
}

bool Router::Impl::SendError(const std::string& client, const std::string& request_id,
                             absl::StatusCode code, const char* why, std::string message,
                             int64_t retry_after_ms) {
  stats_.OnError(why);
  return SendToClient(client, ErrorInfo{request_id, code, why, std::move(message), retry_after_ms});
}

// ---- clients

void Router::Impl::OnClientFrame(const std::string& client, const std::string& payload) {
  int64_t limit =
      IsInproc(client) ? options_.max_inproc_request_bytes : options_.max_request_bytes;
  const char* limit_name = IsInproc(client) ? " (in-process)" : " (--max-request-bytes)";
  if (static_cast<int64_t>(payload.size()) > limit && IsBatchCallFrame(payload)) {
    limit = std::max(limit, options_.max_batch_call_bytes);
    limit_name = " (a batch call: --batch-max-file-bytes + 1 MiB)";
  }
  if (static_cast<int64_t>(payload.size()) > limit) {
    RefuseFrame(client, payload,
                absl::StrCat("message of ", payload.size(), " bytes exceeds the limit of ", limit,
                             limit_name));
    return;
  }
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(payload);
  if (!m.ok()) {
    RefuseFrame(client, payload, std::string(m.status().message()));
    return;
  }
  for (const std::unique_ptr<RequestKind>& kind : kinds_) {
    if (std::optional<Arrival> arrival = kind->Receive(*m, LimitsFor(client))) {
      OnRequest(client, std::move(*arrival));
      return;
    }
  }
  if (auto* c = std::get_if<CancelInput>(&*m)) {
    OnCancel(client, c->request_id);
  } else if (auto* t = std::get_if<TokenizeInput>(&*m)) {
    OnTokenize(client, std::move(*t));
  } else if (auto* d = std::get_if<DetokenizeInput>(&*m)) {
    OnDetokenize(client, std::move(*d));
  } else if (auto* b = std::get_if<BatchCallInfo>(&*m)) {
    OnBatchCall(client, std::move(*b));
  } else {
    OnStats(client, std::get<StatsQuery>(*m));
  }
}

void Router::Impl::OnStats(const std::string& client, const StatsQuery& query) {
  StatsOut stats = stats_.Build(Sources());
  if (batch_stats_) batch_stats_(&stats);
  // The in-process client (the HTTP gateway) is trusted. Over the network, with tenants, a key
  // is needed, and a tenant sees the cluster and itself, not the other tenants.
  if (options_.tenants.enabled() && !IsInproc(client)) {
    bool admin = false;
    for (const std::string& key : options_.admin_api_keys) {
      admin = ConstantTimeEquals(key, query.api_key) || admin;  // no early exit
    }
    const int tenant = options_.tenants.Authenticate(query.api_key);
    if (admin) {
      SendToClient(client, stats);
      return;
    }
    if (tenant < 0) {
      SendError(client, "", absl::StatusCode::kUnauthenticated, reason::kUnauthenticated,
                query.api_key.empty() ? "stats need an API key on this router"
                                      : "unknown API key");
      return;
    }
    std::erase_if(stats.tenants, [&](const TenantStatsOut& t) {
      return t.name != options_.tenants.at(tenant).name;
    });
  }
  SendToClient(client, stats);
}

void Router::Impl::RefuseFrame(const std::string& client, std::string_view frame,
                              std::string message) {
  std::string request_id = ScanClientRequestId(frame);
  // An id the router would refuse anyway is not echoed: it cannot be a request in flight.
  if (static_cast<int>(request_id.size()) > LimitsFor(client).max_request_id_bytes) {
    request_id.clear();
  }
  if (!request_id.empty() && by_client_.contains({client, request_id})) {
    // The error names a live request: its reason must say it is not that request's end.
    SendError(client, request_id, absl::StatusCode::kAlreadyExists, reason::kDuplicateRequestId,
              absl::StrCat("request_id '", request_id,
                           "' is already in flight; this message was refused (", message,
                           "), the request in flight goes on"));
    return;
  }
  SendError(client, request_id, absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
            std::move(message));
}

const RequestLimits& Router::Impl::LimitsFor(const std::string& client) const {
  return IsInproc(client) ? inproc_limits_ : options_.request_limits;
}

bool Router::Impl::Accept(const std::string& client, const std::string& request_id,
                          const absl::Status& shape, const std::string& api_key, int* tenant) {
  // First: every refusal below would name a live request.
  if (by_client_.contains({client, request_id}) || text_calls_.contains({client, request_id}) ||
      batch_calls_.contains({client, request_id})) {
    SendError(client, request_id, absl::StatusCode::kAlreadyExists, reason::kDuplicateRequestId,
              absl::StrCat("request_id '", request_id,
                           "' is already in flight; this request is refused, the one in flight "
                           "goes on"));
    return false;
  }
  if (draining_) {
    SendError(client, request_id, absl::StatusCode::kUnavailable, reason::kDraining,
              "the router is shutting down and takes no new requests", 1000);
    return false;
  }
  if (!shape.ok()) {
    SendError(client, request_id, shape.code(), ValidationReason(shape),
              std::string(shape.message()));
    return false;
  }
  if (backlog_->TooSlow(client)) {
    SendError(client, request_id, absl::StatusCode::kResourceExhausted, reason::kClientTooSlow,
              "this client has not read its earlier answers yet; read them, then send again");
    return false;
  }
  *tenant = -1;
  if (options_.tenants.enabled()) {
    *tenant = options_.tenants.Authenticate(api_key);
    if (*tenant < 0) {
      SendError(client, request_id, absl::StatusCode::kUnauthenticated, reason::kUnauthenticated,
                api_key.empty() ? "an API key is required" : "unknown API key");
      return false;
    }
  }
  return true;
}

void Router::Impl::OnRequest(const std::string& client, Arrival arrival) {
  Request& r = *arrival.request;
  stats_.OnReceived(r.kind->name());
  int tenant = -1;
  if (!Accept(client, r.request_id, arrival.shape, arrival.api_key, &tenant)) return;
  if (tenant >= 0) {
    r.priority = ResolvePriority(r.priority, options_.tenants.at(tenant).max_priority);
  }
  r.client = client;
  r.tenant = tenant;
  AdmissionRequest& a = r.admission;
  if (std::optional<Refusal> refusal = r.kind->Admit(r, &a)) {
    SendError(client, r.request_id, refusal->code, refusal->reason, std::move(refusal->message),
              refusal->retry_after_ms);
    return;
  }
  const uint64_t router_id = next_router_id_++;
  r.router_id = router_id;
  r.arrival = clock_->NowMicros();
  a.id = router_id;
  a.tenant = tenant;
  a.priority = r.priority;
  if (arrival.deadline_ms > 0) {
    r.deadline = a.deadline_micros = r.arrival + arrival.deadline_ms * 1000;
  }
  // From here the request is in the tables: a duplicate request_id, a cancel or its client's
  // loss finds it at every stage.
  by_client_[{client, r.request_id}] = router_id;
  requests_.emplace(router_id, std::move(arrival.request));
  if (!models_.empty() && !ResolveModel(r)) {
    End(router_id);
    return;
  }
  // Admission counts the real prompt tokens, so a request with text is admitted after its text
  // is tokenized (on the pool), not before on a bound from its bytes: that bound (a byte per
  // token) is about four times a real tokenizer's count and would refuse prompts that fit.
  // Meanwhile it holds no budget; its deadline and the no-worker timeout still end it.
  if (r.kind->NeedsTokenizer(r)) {
    // Not admitted yet, so bounded here: as many as may queue (in the batch lane, for a batch
    // job's request).
    const bool batch_job = r.kind->BatchJob(r);
    const auto batch_waiting = static_cast<int64_t>(unadmitted_batch_jobs_.size());
    const int64_t waiting =
        batch_job ? batch_waiting : static_cast<int64_t>(unadmitted_.size()) - batch_waiting;
    const int64_t limit = batch_job ? options_.admission.batch_max_queued
                                    : options_.admission.max_queued_requests;
    if (waiting >= limit) {
      SendError(client, r.request_id, absl::StatusCode::kUnavailable, reason::kQueueFull,
                absl::StrCat(waiting,
                             batch_job ? " batch jobs' requests" : " requests",
                             " are waiting for their text to be tokenized (",
                             batch_job ? "--batch-max-queued" : "--max-queued-requests", ")"),
                kTokenizerBusyRetryMs);
      End(router_id);
      return;
    }
    if (batch_job) unadmitted_batch_jobs_.insert(router_id);
    StartTokenizing(r);
    return;
  }
  // Before any worker has registered the model is unknown: PromptTokens is then the token ids'
  // count, and the request is validated before its first placement.
  if (r.model_resolved && !Validate(r, {})) {
    End(router_id);
    return;
  }
  Submit(r);
}

bool Router::Impl::ResolveModel(Request& r) {
  absl::StatusOr<const ServedModel*> m = models_.Resolve(r.model);
  if (!m.ok()) {
    SendError(r.client, r.request_id, m.status().code(), ValidationReason(m.status()),
              std::string(m.status().message()));
    return false;
  }
  r.model = (*m)->name;
  r.model_resolved = true;
  return true;
}

bool Router::Impl::Submit(Request& r) {
  const uint64_t router_id = r.router_id;
  r.admission.prompt_tokens = r.kind->PromptTokens(r);
  if (std::optional<Refusal> refusal = admission_->Admit(r.admission)) {
    Refuse(r.client, r.request_id, r.tenant, *refusal);
    End(router_id);
    return false;
  }
  r.stage = Stage::kAdmitted;
  unadmitted_.erase(router_id);
  unadmitted_batch_jobs_.erase(router_id);
  return true;
}

void Router::Impl::Refuse(const std::string& client, const std::string& request_id, int tenant,
                          const Refusal& refusal) {
  stats_.OnTenantRefused(tenant);
  SendError(client, request_id, refusal.code, refusal.reason, refusal.message,
            refusal.retry_after_ms);
}

bool Router::Impl::Validate(Request& r, const EncodedTexts& encoded) {
  const ServedModel* m = models_.Find(r.model);
  const absl::Status s =
      m == nullptr ? absl::InternalError("the request's model is not known")
                   : r.kind->Validate(r, m->limits, LimitsFor(r.client), encoded);
  if (!s.ok()) {
    SendError(r.client, r.request_id, s.code(), ValidationReason(s), std::string(s.message()));
    return false;
  }
  r.validated = true;
  return true;
}

void Router::Impl::OnCancel(const std::string& client, const std::string& request_id) {
  auto it = by_client_.find({client, request_id});
  if (it == by_client_.end()) return;  // already ended: nothing to do
  const uint64_t router_id = it->second;
  SendError(client, request_id, absl::StatusCode::kCancelled, reason::kCancelled,
            "cancelled by the client");
  End(router_id);
}

void Router::Impl::DropClient(const std::string& client) {
  backlog_->Erase(client);
  std::erase_if(parked_text_calls_, [&](const ParkedTextCall& c) {
    if (c.client != client) return false;
    text_calls_.erase({c.client, c.request_id});
    return true;
  });
  std::vector<uint64_t> router_ids;
  for (const auto& [key, router_id] : by_client_) {
    if (key.first == client) router_ids.push_back(router_id);
  }
  for (uint64_t router_id : router_ids) End(router_id);
}

void Router::Impl::End(uint64_t router_id, bool completed) {
  auto it = requests_.find(router_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (!r.worker.empty()) {
    WorkerState* w = registry_.Find(r.worker);
    if (w != nullptr && DetachFromWorker(r, w)) {
      SendToWorker(r.worker, WorkerCancelInfo{r.dispatch_id});
    }
  }
  if (r.stage == Stage::kAdmitted) {
    admission_->Release(router_id, r.kind->GeneratedTokens(r), completed);
  }
  unadmitted_.erase(router_id);
  unadmitted_batch_jobs_.erase(router_id);
  by_dispatch_.erase(r.dispatch_id);
  by_client_.erase({r.client, r.request_id});
  requests_.erase(it);
}

void Router::Impl::Fail(uint64_t router_id, absl::StatusCode code, const char* why,
                        std::string message) {
  auto it = requests_.find(router_id);
  if (it == requests_.end()) return;
  SendError(it->second->client, it->second->request_id, code, why, std::move(message));
  End(router_id);
}

void Router::Impl::ExpireDeadlines() {
  for (uint64_t router_id : admission_->Expired()) {
    Fail(router_id, absl::StatusCode::kDeadlineExceeded, reason::kDeadlineExceeded,
         "the deadline passed before a worker was free");
  }
  for (uint64_t router_id : admission_->Overdue()) {
    Fail(router_id, absl::StatusCode::kDeadlineExceeded, reason::kDeadlineExceeded,
         "the deadline passed while the request ran");
  }
}

void Router::Impl::ExpireUnadmitted(int64_t now) {
  if (!parked_text_calls_.empty()) ResumeTextCalls(now, /*expire_only=*/true);
  std::vector<uint64_t> router_ids(unadmitted_.begin(), unadmitted_.end());
  std::sort(router_ids.begin(), router_ids.end());
  const int64_t wait_limit = options_.admission.no_worker_timeout_ms * 1000;
  for (uint64_t router_id : router_ids) {
    auto it = requests_.find(router_id);
    if (it == requests_.end()) continue;
    const Request& r = *it->second;
    if (r.deadline > 0 && now >= r.deadline) {
      Fail(router_id, absl::StatusCode::kDeadlineExceeded, reason::kDeadlineExceeded,
           "the deadline passed before the request's text was tokenized");
    } else if (r.stage == Stage::kWaitingForTokenizer && wait_limit > 0 &&
               now - r.arrival >= wait_limit) {
      SendError(r.client, r.request_id, absl::StatusCode::kUnavailable, reason::kNoWorkers,
                absl::StrCat("the request's model had no tokenizer ready for ",
                             options_.admission.no_worker_timeout_ms,
                             " ms (--no-worker-timeout-ms): no worker registered it yet, or "
                             "its tokenizer is still loading"),
                kNoWorkersRetryMs);
      End(router_id);
    }
  }
}

void Router::Impl::StartDraining(int64_t now) {
  draining_ = true;
  drain_deadline_ = now + options_.drain_grace_ms * 1000;
  std::cerr << "carpool-router: draining: " << requests_.size()
            << " request(s) to finish, refusing new ones\n";
}

bool Router::Impl::DrainDone(int64_t now) {
  if (requests_.empty() && parked_text_calls_.empty() && batch_calls_.empty()) return true;
  if (now < drain_deadline_) return false;
  std::vector<uint64_t> router_ids;
  for (const auto& [router_id, r] : requests_) router_ids.push_back(router_id);
  std::sort(router_ids.begin(), router_ids.end());
  for (uint64_t router_id : router_ids) {
    Fail(router_id, absl::StatusCode::kUnavailable, reason::kDraining,
         "the router shut down before the request finished");
  }
  for (const ParkedTextCall& c : std::exchange(parked_text_calls_, {})) {
    text_calls_.erase({c.client, c.request_id});
    SendError(c.client, c.request_id, absl::StatusCode::kUnavailable, reason::kDraining,
              "the router shut down before the model's tokenizer was ready");
  }
  return true;
}

bool Router::Impl::WorkersDrained(int64_t now) {
  if (!options_.drain_workers || registry_.All().empty()) return true;
  if (workers_drain_deadline_ == 0) workers_drain_deadline_ = now + kWorkerDrainWaitMicros;
  if (now >= workers_drain_deadline_) {
    std::cerr << "carpool-router: " << registry_.All().size()
              << " worker(s) did not confirm the drain in time; exiting anyway\n";
    return true;
  }
  if (now >= next_worker_drain_send_) {
    // Deregistering answers it: each confirmed worker leaves the registry.
    for (const WorkerState* w : registry_.All()) SendToWorker(w->identity, DrainInfo{});
    next_worker_drain_send_ = now + kWorkerDrainResendMicros;
  }
  return false;
}

StatsSources Router::Impl::Sources() const {
  return {registry_, *admission_, prefix_index_, draining_, clock_->NowMicros()};
}

// ---- Router

Router::Router(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Router::~Router() = default;

absl::StatusOr<std::unique_ptr<Router>> Router::Create(const RouterOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

const std::string& Router::frontend_endpoint() const { return impl_->frontend_endpoint(); }
const std::string& Router::backend_endpoint() const { return impl_->backend_endpoint(); }
const std::string& Router::curve_public_key() const { return impl_->curve_public_key(); }
std::string Router::RenderMetrics() const { return impl_->metrics().Render(); }
const std::string& Router::inproc_endpoint() const { return impl_->inproc_endpoint(); }
zmq::context_t* Router::zmq_context() { return impl_->zmq_context(); }
void Router::SetBatchCalls(BatchCallHandler handler) { impl_->SetBatchCalls(std::move(handler)); }
void Router::SetBatchStats(std::function<void(StatsOut*)> source) {
  impl_->SetBatchStats(std::move(source));
}

absl::Status Router::Run() { return impl_->Run(stop_, drain_); }

}  // namespace carpool::router
