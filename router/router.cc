#include "router/router.h"

#include <algorithm>
#include <array>
#include <deque>
#include <iostream>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/status.h"
#include "common/transport.h"
#include "router/placement.h"
#include "router/worker_registry.h"
#include "worker/tokenizer.h"

namespace carpool::router {
namespace {

constexpr int kNumPriorities = 3;     // indexed by worker::Priority
constexpr int kPollMillis = 20;
constexpr int kMaxMessagesPerWake = 512;

// A request the router has accepted and not yet ended.
struct Request {
  uint64_t id = 0;
  std::string client;                 // frontend routing id
  std::string client_request_id;
  bool stream = false;
  bool validated = false;
  GenerateInput input;                // kept until validated
  std::vector<int32_t> prompt;
  SamplingParams sampling;            // seed resolved
  Priority priority = Priority::kDefault;
  int64_t arrival = 0;
  int64_t deadline = 0;               // 0: none
  int64_t dispatched = 0;
  int64_t first_token = 0;
  std::vector<SampleResult> output;   // every token so far
  int cached_prompt_tokens = 0;
  bool queued = false;
  std::string worker;                 // set while a worker runs it
  uint64_t dispatch_id = 0;           // the current dispatch; events of older ones are stale
  int64_t outstanding = 0;            // what it adds to its worker's outstanding_tokens
  int migrations = 0;
};

double Millis(int64_t from, int64_t to) { return to > 0 ? (to - from) / 1000.0 : 0.0; }

}  // namespace

absl::Status RouterOptions::Validate() const {
  if (heartbeat_timeout_ms < 10) {
    return absl::InvalidArgumentError("--heartbeat-timeout-ms must be >= 10");
  }
  if (max_request_bytes < 1024 || max_request_bytes > max_frame_bytes) {
    return absl::InvalidArgumentError(
        "--max-request-bytes must be >= 1024 and <= the frame limit");
  }
  if (max_queued_requests < 1) {
    return absl::InvalidArgumentError("--max-queued-requests must be >= 1");
  }
  if (max_migrations < 0) return absl::InvalidArgumentError("--max-migrations must be >= 0");
  return absl::OkStatus();
}

class Router::Impl {
 public:
  Impl(const RouterOptions& o) : options_(o), clock_(o.clock ? o.clock : Clock::Real()) {}

  absl::Status Init() {
    SocketOptions so;
    so.max_message_bytes = options_.max_frame_bytes;
    ASSIGN_OR_RETURN(frontend_, Socket::Create(&context_, zmq::socket_type::router, so));
    ASSIGN_OR_RETURN(backend_, Socket::Create(&context_, zmq::socket_type::router, so));
    RETURN_IF_ERROR(frontend_->Bind(options_.frontend));
    RETURN_IF_ERROR(backend_->Bind(options_.backend));
    frontend_endpoint_ = frontend_->LastEndpoint();
    backend_endpoint_ = backend_->LastEndpoint();
    return absl::OkStatus();
  }

  absl::Status Run(const std::atomic<bool>& stop) {
    int64_t next_check = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      zmq::pollitem_t items[] = {{frontend_->raw().handle(), 0, ZMQ_POLLIN, 0},
                                 {backend_->raw().handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(kPollMillis));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return absl::InternalError(absl::StrCat("poll: ", e.what()));
      }
      if (items[1].revents & ZMQ_POLLIN) RETURN_IF_ERROR(DrainBackend());
      if (items[0].revents & ZMQ_POLLIN) RETURN_IF_ERROR(DrainFrontend());
      const int64_t now = clock_->NowMicros();
      if (now >= next_check) {
        CheckWorkers(now);
        ExpireQueued(now);
        next_check = now + 50'000;
      }
      TryDispatch();
    }
    return absl::OkStatus();
  }

  const std::string& frontend_endpoint() const { return frontend_endpoint_; }
  const std::string& backend_endpoint() const { return backend_endpoint_; }

 private:
  // ---- socket plumbing

  absl::Status DrainFrontend() {
    for (int i = 0; i < kMaxMessagesPerWake; ++i) {
      ASSIGN_OR_RETURN(std::optional<Frames> frames, frontend_->Recv(0));
      if (!frames) break;
      if (frames->size() != 2) {
        if (!frames->empty()) {
          SendError(frames->front(), "", absl::StatusCode::kInvalidArgument,
                    reason::kInvalidArgument, "expected exactly one frame per message");
        }
        continue;
      }
      OnClientFrame((*frames)[0], (*frames)[1]);
    }
    return absl::OkStatus();
  }

  absl::Status DrainBackend() {
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

  // Sends to a client; a client that is gone has its requests cancelled.
  void SendToClient(const std::string& client, const ServerMessage& message) {
    absl::Status s = frontend_->Send({client, Encode(message)});
    if (!s.ok() && absl::IsUnavailable(s)) DropClient(client);
  }

  void SendToWorker(const std::string& identity, const RouterMessage& message) {
    absl::Status s = backend_->Send({identity, Encode(message)});
    if (!s.ok()) std::cerr << "carpool-router: send to worker failed: " << s.message() << "\n";
  }

  void SendError(const std::string& client, const std::string& request_id,
                 absl::StatusCode code, const char* why, std::string message,
                 int64_t retry_after_ms = 0) {
    if (std::string_view(why) != reason::kCancelled) ++rejections_[why];
    SendToClient(client,
                 ErrorInfo{request_id, code, why, std::move(message), retry_after_ms});
  }

  // ---- clients

  void OnClientFrame(const std::string& client, const std::string& payload) {
    if (static_cast<int64_t>(payload.size()) > options_.max_request_bytes) {
      SendError(client, "", absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
                absl::StrCat("message of ", payload.size(), " bytes exceeds the limit of ",
                             options_.max_request_bytes));
      return;
    }
    absl::StatusOr<ClientMessage> m = DecodeClientMessage(payload);
    if (!m.ok()) {
      SendError(client, "", absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
                std::string(m.status().message()));
      return;
    }
    if (auto* g = std::get_if<GenerateInput>(&*m)) {
      OnGenerate(client, std::move(*g));
    } else if (auto* c = std::get_if<CancelInput>(&*m)) {
      OnCancel(client, c->request_id);
    } else {
      SendToClient(client, BuildStats());
    }
  }

  void OnGenerate(const std::string& client, GenerateInput input) {
    ++requests_total_;
    const std::string rid = input.request_id;
    if (absl::Status s = ValidateShape(input, options_.request_limits); !s.ok()) {
      SendError(client, rid, s.code(), ValidationReason(s), std::string(s.message()));
      return;
    }
    if (by_client_.contains({client, rid})) {
      SendError(client, rid, absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
                absl::StrCat("request_id '", rid, "' is already in flight"));
      return;
    }
    if (num_queued_ >= options_.max_queued_requests) {
      SendError(client, rid, absl::StatusCode::kUnavailable, reason::kQueueFull,
                absl::StrCat("the queue holds ", num_queued_, " requests, its limit"), 100);
      return;
    }
    Request r;
    r.id = next_request_id_++;
    r.client = client;
    r.client_request_id = rid;
    r.stream = input.stream;
    r.priority = input.priority;
    r.arrival = clock_->NowMicros();
    if (input.deadline_ms > 0) r.deadline = r.arrival + input.deadline_ms * 1000;
    r.sampling = input.sampling;
    if (!r.sampling.has_seed) {
      r.sampling.has_seed = true;
      r.sampling.seed = rng_();
    }
    r.input = std::move(input);
    if (limits_.known && !Validate(&r)) return;
    by_client_[{client, rid}] = r.id;
    const uint64_t id = r.id;
    requests_.emplace(id, std::move(r));
    Enqueue(id, requests_.at(id).priority, /*front=*/false);
  }

  // Tokenizes and checks `r` against the model; on failure answers the client and returns false
  // (the caller has not stored r, or removes it).
  bool Validate(Request* r) {
    absl::StatusOr<ValidatedPrompt> v =
        ValidateGenerate(r->input, limits_, options_.request_limits);
    if (!v.ok()) {
      SendError(r->client, r->client_request_id, v.status().code(), ValidationReason(v.status()),
                std::string(v.status().message()));
      return false;
    }
    r->prompt = std::move(v->tokens);
    r->validated = true;
    r->input = GenerateInput();
    return true;
  }

  void OnCancel(const std::string& client, const std::string& request_id) {
    auto it = by_client_.find({client, request_id});
    if (it == by_client_.end()) return;  // already ended: nothing to do
    const uint64_t id = it->second;
    SendError(client, request_id, absl::StatusCode::kCancelled, reason::kCancelled,
              "cancelled by the client");
    End(id);
  }

  void DropClient(const std::string& client) {
    std::vector<uint64_t> ids;
    for (const auto& [key, id] : by_client_) {
      if (key.first == client) ids.push_back(id);
    }
    for (uint64_t id : ids) End(id);
  }

  // ---- queue and dispatch

  void Enqueue(uint64_t id, Priority p, bool front) {
    auto& q = queues_[static_cast<int>(p)];
    front ? q.push_front(id) : q.push_back(id);
    requests_.at(id).queued = true;
    ++num_queued_;
  }

  // Removes a request everywhere (queue, worker, tables); tells its worker to stop it.
  void End(uint64_t id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    Request& r = it->second;
    if (r.queued) {
      auto& q = queues_[static_cast<int>(r.priority)];
      q.erase(std::find(q.begin(), q.end(), id));
      --num_queued_;
    } else if (!r.worker.empty()) {
      if (WorkerState* w = registry_.Find(r.worker)) {
        w->requests.erase(id);
        w->outstanding_tokens -= r.outstanding;
        SendToWorker(r.worker, WorkerCancelInfo{r.dispatch_id});
      }
    }
    dispatch_to_request_.erase(r.dispatch_id);
    by_client_.erase({r.client, r.client_request_id});
    requests_.erase(it);
  }

  void ExpireQueued(int64_t now) {
    for (auto& q : queues_) {
      std::vector<uint64_t> expired;
      for (uint64_t id : q) {
        const Request& r = requests_.at(id);
        if (r.deadline > 0 && now >= r.deadline) expired.push_back(id);
      }
      for (uint64_t id : expired) {
        const Request& r = requests_.at(id);
        SendError(r.client, r.client_request_id, absl::StatusCode::kDeadlineExceeded,
                  reason::kDeadlineExceeded, "the deadline passed before a worker was free");
        End(id);
      }
    }
  }

  void TryDispatch() {
    if (num_queued_ == 0 || registry_.empty()) return;
    std::vector<WorkerState*> workers = registry_.Mutable();
    std::vector<WorkerSnapshot> snapshots(workers.size());
    auto refresh = [&](size_t i) {
      snapshots[i] = {workers[i]->credit(), workers[i]->outstanding_tokens};
    };
    for (size_t i = 0; i < workers.size(); ++i) refresh(i);
    for (auto& q : queues_) {
      while (!q.empty()) {
        Request& r = requests_.at(q.front());
        if (!r.validated && !Validate(&r)) {
          const uint64_t id = q.front();
          End(id);
          continue;
        }
        std::optional<int> pick = PlaceLeastLoaded(snapshots);
        if (!pick) return;
        q.pop_front();
        --num_queued_;
        r.queued = false;
        Dispatch(&r, workers[*pick]);
        refresh(*pick);
      }
    }
  }

  void Dispatch(Request* r, WorkerState* w) {
    r->worker = w->identity;
    r->dispatch_id = next_dispatch_id_++;
    dispatch_to_request_[r->dispatch_id] = r->id;
    if (r->dispatched == 0) r->dispatched = clock_->NowMicros();
    r->outstanding = static_cast<int64_t>(r->prompt.size() + r->output.size()) +
                     (r->sampling.max_tokens - static_cast<int64_t>(r->output.size()));
    w->requests.insert(r->id);
    w->outstanding_tokens += r->outstanding;
    DispatchInfo d;
    d.request_id = r->dispatch_id;
    d.prompt_tokens = r->prompt;
    for (const SampleResult& t : r->output) d.output_tokens.push_back(t.token);
    d.sampling = r->sampling;
    d.priority = r->priority;
    SendToWorker(w->identity, d);
  }

  // ---- workers

  void OnWorkerMessage(const std::string& identity, WorkerMessage m) {
    const int64_t now = clock_->NowMicros();
    if (auto* reg = std::get_if<RegisterInfo>(&m)) {
      OnRegister(identity, *reg, now);
      return;
    }
    uint64_t epoch = 0;
    std::visit([&](const auto& v) {
      if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, RegisterInfo>) epoch = v.epoch;
    }, m);
    WorkerState* w = registry_.Find(identity, epoch);
    if (w == nullptr) {
      // Unknown (e.g. after a router restart, or declared dead): ask it to register again.
      if (registry_.Find(identity) == nullptr) SendToWorker(identity, RegisterAckInfo{0});
      return;
    }
    w->last_seen_micros = now;
    if (auto* h = std::get_if<HeartbeatInfo>(&m)) {
      w->load = h->load;
    } else if (auto* s = std::get_if<StepTokensInfo>(&m)) {
      w->load = s->load;
      for (TokenEvent& e : s->events) OnTokenEvent(w, std::move(e), now);
    } else if (auto* f = std::get_if<RequestFailedInfo>(&m)) {
      OnFailed(w, *f);
    } else if (std::holds_alternative<DeregisterInfo>(m)) {
      for (uint64_t id : registry_.Remove(identity)) Failover(id);
    }
  }

  void OnRegister(const std::string& identity, const RegisterInfo& info, int64_t now) {
    std::vector<uint64_t> orphaned;
    const uint64_t epoch = registry_.Register(identity, info, now, &orphaned);
    if (!limits_.known || info.max_model_len < limits_.max_model_len) {
      limits_.known = true;
      limits_.vocab_size = info.vocab_size;
      limits_.max_model_len = info.max_model_len;
      limits_.tokenizer = info.tokenizer;
      limits_.bos_token_id = info.bos_token_id;
    }
    std::cerr << "carpool-router: worker " << info.worker_id << " registered (epoch " << epoch
              << ", model " << info.model << ", " << info.max_num_seqs << " seqs)\n";
    SendToWorker(identity, RegisterAckInfo{epoch});
    for (uint64_t id : orphaned) Failover(id);
  }

  // The request of `e` if the event belongs to its current dispatch on `w`.
  Request* Lookup(const WorkerState* w, uint64_t dispatch_id) {
    auto d = dispatch_to_request_.find(dispatch_id);
    if (d == dispatch_to_request_.end()) return nullptr;
    auto it = requests_.find(d->second);
    if (it == requests_.end() || it->second.worker != w->identity ||
        it->second.dispatch_id != dispatch_id) {
      return nullptr;
    }
    return &it->second;
  }

  void OnTokenEvent(WorkerState* w, TokenEvent e, int64_t now) {
    Request* r = Lookup(w, e.request_id);
    if (r == nullptr) return;  // cancelled, migrated or stale
    if (e.has_token) {
      if (r->first_token == 0) r->first_token = now;
      r->output.push_back(e.token);
      const int64_t left = r->sampling.max_tokens - static_cast<int64_t>(r->output.size());
      w->outstanding_tokens += left - r->outstanding;
      r->outstanding = left;
      if (r->stream) {
        GenerateChunkOut chunk;
        chunk.request_id = r->client_request_id;
        chunk.index = static_cast<int>(r->output.size()) - 1;
        chunk.tokens.push_back(e.token);
        chunk.text = DecodeText({e.token.token});
        SendToClient(r->client, chunk);
      }
    }
    if (!e.finished) return;
    r->cached_prompt_tokens = e.cached_prompt_tokens;
    GenerateFinalOut f;
    f.request_id = r->client_request_id;
    std::vector<int32_t> ids;
    for (const SampleResult& t : r->output) ids.push_back(t.token);
    if (!r->stream) {
      f.tokens = r->output;
      f.text = DecodeText(ids);
    }
    f.finish_reason = e.finish_reason;
    f.usage = {static_cast<int>(r->prompt.size()), static_cast<int>(r->output.size()),
               r->cached_prompt_tokens};
    f.timings = {Millis(r->arrival, r->dispatched), Millis(r->arrival, r->first_token),
                 Millis(r->arrival, now)};
    ++w->requests_served;
    const uint64_t id = r->id;
    const std::string client = r->client;
    w->requests.erase(id);
    w->outstanding_tokens -= r->outstanding;
    r->worker.clear();  // finished on the worker: End() must not cancel it there
    End(id);
    SendToClient(client, f);
  }

  void OnFailed(WorkerState* w, const RequestFailedInfo& f) {
    Request* r = Lookup(w, f.request_id);
    if (r == nullptr) return;
    const uint64_t id = r->id;
    w->requests.erase(id);
    w->outstanding_tokens -= r->outstanding;
    r->worker.clear();
    if (f.error.reason == reason::kDraining) {
      w->draining = true;
      dispatch_to_request_.erase(r->dispatch_id);
      Enqueue(id, r->priority, /*front=*/true);
      return;
    }
    SendError(r->client, r->client_request_id, f.error.code, f.error.reason.c_str(),
              f.error.message);
    End(id);
  }

  // A request whose worker is gone: back to the front of the queue to resume elsewhere from the
  // tokens already produced, or WORKER_LOST past max_migrations.
  void Failover(uint64_t id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    Request& r = it->second;
    dispatch_to_request_.erase(r.dispatch_id);
    r.worker.clear();
    r.outstanding = 0;
    if (r.migrations >= options_.max_migrations) {
      SendError(r.client, r.client_request_id, absl::StatusCode::kUnavailable,
                reason::kWorkerLost,
                absl::StrCat("its worker was lost ", r.migrations + 1, " times"));
      End(id);
      return;
    }
    ++r.migrations;
    ++migrations_total_;
    Enqueue(id, r.priority, /*front=*/true);
  }

  void CheckWorkers(int64_t now) {
    for (const std::string& identity :
         registry_.Silent(now, options_.heartbeat_timeout_ms * 1000)) {
      std::cerr << "carpool-router: worker " << identity << " missed its heartbeats: dead\n";
      for (uint64_t id : registry_.Remove(identity)) Failover(id);
    }
  }

  std::string DecodeText(const std::vector<int32_t>& ids) const {
    return limits_.tokenizer == "byte" ? worker::ByteTokenizer().Decode(ids) : std::string();
  }

  StatsOut BuildStats() const {
    StatsOut s;
    for (const WorkerState* w : registry_.All()) {
      s.workers.push_back({w->info.worker_id, true, w->epoch,
                           static_cast<int>(w->requests.size()), w->info.num_kv_blocks,
                           w->load.kv_used_blocks, w->outstanding_tokens,
                           w->info.max_num_seqs, w->info.model, w->requests_served});
    }
    s.queued = num_queued_;
    s.inflight = static_cast<int>(requests_.size()) - num_queued_;
    s.requests_total = requests_total_;
    for (const auto& [why, n] : rejections_) {
      s.rejections_by_reason[why] = n;
      s.requests_rejected += n;
    }
    return s;
  }

  RouterOptions options_;
  Clock* clock_;
  zmq::context_t context_{1};
  std::unique_ptr<Socket> frontend_;
  std::unique_ptr<Socket> backend_;
  std::string frontend_endpoint_;
  std::string backend_endpoint_;

  ModelLimits limits_;
  WorkerRegistry registry_;
  absl::flat_hash_map<uint64_t, Request> requests_;
  absl::flat_hash_map<std::pair<std::string, std::string>, uint64_t> by_client_;
  absl::flat_hash_map<uint64_t, uint64_t> dispatch_to_request_;
  std::array<std::deque<uint64_t>, kNumPriorities> queues_;
  int num_queued_ = 0;
  uint64_t next_request_id_ = 1;
  uint64_t next_dispatch_id_ = 1;
  std::mt19937_64 rng_{std::random_device{}()};
  int64_t requests_total_ = 0;
  int64_t migrations_total_ = 0;
  std::map<std::string, int64_t> rejections_;
};

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

absl::Status Router::Run() { return impl_->Run(stop_); }

}  // namespace carpool::router
