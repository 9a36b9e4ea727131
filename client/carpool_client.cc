#include "client/carpool_client.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/codec.h"
#include "common/connection_watch.h"
#include "common/endpoint_list.h"
#include "common/status.h"
#include "common/transport.h"
#include "nlohmann/json.hpp"

namespace carpool {
namespace client_internal {

// One generate call, from StartStream to the end of its Stream, across retries.
struct Call {
  explicit Call(std::string id) : request_id(std::move(id)) {}

  const std::string request_id;
  absl::Mutex mu;
  // Chunks, then one final or error, for the consumer (the Stream).
  std::deque<ServerMessage> events ABSL_GUARDED_BY(mu);
  // A request is at the router and has not ended: messages for it are accepted.
  bool attempt_open ABSL_GUARDED_BY(mu) = false;
  // Finished, cancelled or timed out: nothing more is sent for it.
  bool ended ABSL_GUARDED_BY(mu) = false;
  // The connection (Core's count of router switches) its open attempt was queued for.
  uint64_t attempt_connection ABSL_GUARDED_BY(mu) = 0;
};

// One Stats() call. Answers are matched to calls in the order the queries were sent.
struct StatsCall {
  absl::Mutex mu;
  std::optional<absl::StatusOr<StatsOut>> result ABSL_GUARDED_BY(mu);
  bool abandoned ABSL_GUARDED_BY(mu) = false;  // its caller timed out
};

// Everything a Client and its Streams share: the I/O thread, its socket and the call table.
class Core {
 public:
  static absl::StatusOr<std::shared_ptr<Core>> Create(const ClientOptions& options);
  ~Core();

  // Ends every call with CANCELLED, sends what is queued (cancels included) and stops the I/O
  // thread. Idempotent.
  void Shutdown();

  const ClientOptions& options() const { return options_; }
  std::string NextRequestId();
  // Whether there are routers to fail over to (ClientOptions::router_endpoints), and how often
  // one call may.
  bool failover() const { return endpoints_.size() > 1; }
  int max_failovers() const { return static_cast<int>(endpoints_.size()); }

  // ALREADY_EXISTS when another call in flight has the same id; CANCELLED once shut down.
  absl::Status Register(const std::shared_ptr<Call>& call);
  void Unregister(const std::shared_ptr<Call>& call);
  std::shared_ptr<Call> Find(const std::string& request_id);

  // Opens an attempt and sends `frame`. CANCELLED when the call has ended or the client closed.
  absl::Status SendAttempt(const std::shared_ptr<Call>& call, std::string frame);
  // Ends the call here; tells the router to cancel when an attempt is open; queues `event` (if
  // any) for the consumer. False when the call had already ended.
  bool EndCall(Call& call, std::optional<ErrorInfo> event);
  // Waits until the call has an event or `until` passes; true when it has one.
  bool AwaitEvent(Call& call, absl::Time until);
  // Pops the call's next event, waiting until `until`; nullopt when none came.
  std::optional<ServerMessage> WaitEvent(Call& call, absl::Time until);

  absl::StatusOr<StatsOut> Stats(absl::Time deadline);

  // "" when every frame from the router decoded; otherwise how many did not, and the last error
  // (such a frame cannot be matched to its call, which then times out).
  std::string DecodeFailures();

 private:
  struct Outgoing {
    std::string frame;
    std::shared_ptr<Call> call;        // a generate request: send failures go to it
    std::shared_ptr<StatsCall> stats;  // a stats query: answered in send order
  };

  explicit Core(const ClientOptions& options)
      : options_(options), endpoints_(options.Endpoints()) {}
  // Opens socket_ (and monitor_) and connects it to endpoints_[current_].
  absl::Status OpenSocket();
  // With several routers: closes the connection to the current one and connects to the next.
  void SwitchRouter();
  // Poll's timeout: -1, or the ms until the connection being made counts as failed.
  int PollTimeoutMs() const;
  absl::Status Enqueue(Outgoing out);
  void Wake();
  void IoLoop();
  // Sends what the API threads queued. Returns true when the loop should stop.
  bool SendQueued();
  void ReceiveAll();
  void Route(ServerMessage message);
  void DeliverStats(absl::StatusOr<StatsOut> stats);
  // Reads the monitor's events; on a disconnect after a handshake, RouterLost().
  void ReadMonitor();
  // Ends every open attempt and every stats query sent with UNAVAILABLE router_lost: the router
  // answers a connection, so nothing sent before it dropped can be answered any more. With
  // several routers it first switches to the next (`why` says what happened), so the calls'
  // threads send their requests there.
  void RouterLost(const std::string& why);

  const ClientOptions options_;
  const std::vector<std::string> endpoints_;
  size_t current_ = 0;  // I/O thread only (set before it starts): the router in use
  zmq::context_t* zmq_context_ = nullptr;  // options_.zmq_context or &context_
  SocketOptions socket_options_;
  absl::Time connecting_since_;  // I/O thread only: when socket_ was connected
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{0};
  zmq::context_t context_;          // unless options_.zmq_context; declared before socket_
  std::unique_ptr<Socket> socket_;  // used by the I/O thread only
  // Watches socket_'s connection (tcp:// and ipc:// endpoints; nothing to watch in-process);
  // I/O thread only. Declared after socket_: closed first.
  std::unique_ptr<SocketMonitor> monitor_;
  bool handshaken_ = false;  // I/O thread only: the connection is up (ZMTP handshake done)
  int wake_fd_ = -1;
  std::thread io_thread_;
  std::deque<std::shared_ptr<StatsCall>> stats_sent_;  // I/O thread only

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<Outgoing> outbox_ ABSL_GUARDED_BY(mu_);
  // Router switches so far (several routers): an attempt queued before the latest one went to
  // a lost router, or nowhere.
  uint64_t connection_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;   // no new calls
  bool io_stop_ ABSL_GUARDED_BY(mu_) = false;  // the I/O thread sends the outbox and exits
  int64_t undecodable_frames_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_decode_error_ ABSL_GUARDED_BY(mu_);
};

namespace {

ErrorInfo LocalError(const std::string& request_id, absl::StatusCode code, const char* reason,
                     std::string message) {
  return ErrorInfo{request_id, code, reason, std::move(message), 0};
}

}  // namespace

absl::StatusOr<std::shared_ptr<Core>> Core::Create(const ClientOptions& options) {
  std::shared_ptr<Core> core(new Core(options));
  absl::BitGen gen;
  core->id_prefix_ = absl::StrFormat("c%012x-", absl::Uniform<uint64_t>(gen) >> 16);

  SocketOptions so;
  so.max_message_bytes = options.max_message_bytes;
  // Cancels queued just before the Client closes still leave (best effort, bounded).
  so.linger_ms = 200;
  // A dead peer that does not close TCP (host down, network cut, process stopped) is dropped
  // when a PING gets no traffic back within 1.5 intervals: within 2.5 intervals of its last word
  // (2.5 s by default, inside the 3 s the SDK promises).
  // PINGs are answered by the router's ZeroMQ I/O thread, never by its busy event loop.
  so.zmtp_heartbeat_ms = options.zmtp_heartbeat_ms;
  so.zmtp_heartbeat_timeout_ms = options.zmtp_heartbeat_ms * 3 / 2;
  if (!options.curve_server_public_key.empty()) {
    so.curve_server_public_key = options.curve_server_public_key;
    so.curve_public_key = options.curve_public_key;
    so.curve_secret_key = options.curve_secret_key;
    if (so.curve_public_key.empty()) {
      ASSIGN_OR_RETURN(CurveServerKeys pair, GenerateCurveKeyPair());
      so.curve_public_key = pair.public_key;
      so.curve_secret_key = pair.secret_key;
    }
  }
  core->zmq_context_ =
      options.zmq_context != nullptr ? options.zmq_context : &core->context_;
  core->socket_options_ = so;
  RETURN_IF_ERROR(core->OpenSocket());
  core->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (core->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  core->io_thread_ = std::thread([c = core.get()] { c->IoLoop(); });
  return core;
}

absl::Status Core::OpenSocket() {
  monitor_.reset();  // before the socket it watches
  socket_.reset();
  handshaken_ = false;
  connecting_since_ = absl::Now();
  const std::string& endpoint = endpoints_[current_];
  ASSIGN_OR_RETURN(socket_, Socket::Create(zmq_context_, zmq::socket_type::dealer,
                                           socket_options_));
  if (!absl::StartsWith(endpoint, "inproc://")) {
    // Before Connect: no event is missed.
    ASSIGN_OR_RETURN(monitor_, SocketMonitor::Start(zmq_context_, socket_.get()));
  }
  return socket_->Connect(endpoint);
}

void Core::SwitchRouter() {
  current_ = (current_ + 1) % endpoints_.size();
  // Connect errors leave a socket that never connects: connect_timeout_ms then moves on. Only
  // a socket that cannot be made at all (no file descriptors left) leaves none, and the I/O
  // thread stops: the calls end at their deadlines.
  (void)OpenSocket();
}

int Core::PollTimeoutMs() const {
  if (!failover() || handshaken_ || monitor_ == nullptr) return -1;
  const int64_t left = absl::ToInt64Milliseconds(
      connecting_since_ + absl::Milliseconds(options_.connect_timeout_ms) - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(left, 0, options_.connect_timeout_ms));
}

Core::~Core() {
  Shutdown();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Core::Shutdown() {
  std::vector<std::shared_ptr<Call>> calls;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  for (const auto& call : calls) {
    EndCall(*call, LocalError(call->request_id, absl::StatusCode::kCancelled, reason::kCancelled,
                              "the client was closed"));
  }
  {
    absl::MutexLock lock(&mu_);
    io_stop_ = true;
  }
  if (io_thread_.joinable()) {
    Wake();
    io_thread_.join();
  }
  // The I/O thread is gone: answer the stats queries it left.
  while (!stats_sent_.empty()) DeliverStats(absl::CancelledError("the client was closed"));
}

std::string Core::NextRequestId() {
  return absl::StrCat(id_prefix_, next_id_.fetch_add(1, std::memory_order_relaxed));
}

absl::Status Core::Register(const std::shared_ptr<Call>& call) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::CancelledError("the client was closed");
  if (!calls_.emplace(call->request_id, call).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id '", call->request_id, "' is already in flight on this client"));
  }
  return absl::OkStatus();
}

void Core::Unregister(const std::shared_ptr<Call>& call) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(call->request_id);
  if (it != calls_.end() && it->second == call) calls_.erase(it);
}

std::shared_ptr<Call> Core::Find(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(request_id);
  return it == calls_.end() ? nullptr : it->second;
}

absl::Status Core::SendAttempt(const std::shared_ptr<Call>& call, std::string frame) {
  // Opened and queued under both locks (call->mu first, the only order in which they nest):
  // RouterLost sees an attempt either queued for the lost connection (it ends it, and drops its
  // frame if not sent yet) or for the next one, never half of each.
  {
    absl::MutexLock call_lock(&call->mu);
    if (call->ended) return absl::CancelledError("the request was cancelled");
    absl::MutexLock lock(&mu_);
    if (closed_ || io_stop_) return absl::CancelledError("the client was closed");
    call->attempt_open = true;
    call->attempt_connection = connection_;
    outbox_.push_back(Outgoing{std::move(frame), call, nullptr});
  }
  Wake();
  return absl::OkStatus();
}

bool Core::EndCall(Call& call, std::optional<ErrorInfo> event) {
  bool was_open;
  {
    absl::MutexLock lock(&call.mu);
    if (call.ended) return false;
    call.ended = true;
    was_open = call.attempt_open;
    call.attempt_open = false;
    if (event.has_value()) call.events.push_back(std::move(*event));
  }
  if (was_open) (void)Enqueue(Outgoing{Encode(CancelInput{call.request_id}), nullptr, nullptr});
  return true;
}

bool Core::AwaitEvent(Call& call, absl::Time until) {
  absl::MutexLock lock(&call.mu);
  call.mu.AwaitWithDeadline(
      absl::Condition(
          +[](std::deque<ServerMessage>* q) { return !q->empty(); }, &call.events),
      until);
  return !call.events.empty();
}

std::optional<ServerMessage> Core::WaitEvent(Call& call, absl::Time until) {
  if (!AwaitEvent(call, until)) return std::nullopt;
  absl::MutexLock lock(&call.mu);
  ServerMessage m = std::move(call.events.front());  // only the consumer pops
  call.events.pop_front();
  return m;
}

absl::StatusOr<StatsOut> Core::Stats(absl::Time deadline) {
  auto stats = std::make_shared<StatsCall>();
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::CancelledError("the client was closed");
  }
  // A router with tenants answers stats only to a key (docs/protocol.md).
  RETURN_IF_ERROR(Enqueue(Outgoing{Encode(StatsQuery{options_.api_key}), nullptr, stats}));
  {
    absl::MutexLock lock(&stats->mu);
    stats->mu.AwaitWithDeadline(
        absl::Condition(
            +[](std::optional<absl::StatusOr<StatsOut>>* r) { return r->has_value(); },
            &stats->result),
        deadline);
    if (stats->result.has_value()) return std::move(*stats->result);
    stats->abandoned = true;
  }
  absl::Status status = absl::DeadlineExceededError(
      absl::StrCat("no stats answer from the router in time", DecodeFailures()));
  status.SetPayload(kReasonPayloadUrl, absl::Cord(reason::kDeadlineExceeded));
  return status;
}

absl::Status Core::Enqueue(Outgoing out) {
  {
    absl::MutexLock lock(&mu_);
    if (io_stop_) return absl::CancelledError("the client was closed");
    outbox_.push_back(std::move(out));
  }
  Wake();
  return absl::OkStatus();
}

void Core::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void Core::IoLoop() {
  while (socket_ != nullptr) {
    // Rebuilt each time: SwitchRouter replaces the socket and its monitor.
    const PollItem items[3] = {{socket_.get()},
                               {nullptr, wake_fd_},
                               {monitor_ != nullptr ? monitor_->socket() : nullptr}};
    const size_t n = monitor_ != nullptr ? 3 : 2;
    absl::StatusOr<PollResult> readable = Poll(absl::MakeConstSpan(items, n), PollTimeoutMs());
    if (!readable.ok()) break;
    if ((*readable)[1]) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }
    if (SendQueued()) break;
    // Answers that arrived before a disconnect are delivered before the calls are ended.
    ReceiveAll();
    if (n == 3 && (*readable)[2]) ReadMonitor();
    if (PollTimeoutMs() == 0) {
      RouterLost(absl::StrCat("no connection to the router at ", endpoints_[current_],
                              " within ", options_.connect_timeout_ms,
                              " ms (connect_timeout_ms)"));
    }
  }
}

void Core::ReadMonitor() {
  // Only an established connection counts: a failed handshake (a wrong CURVE key, not a carpool
  // router) never carried a request, and those calls end at their deadline.
  if (EstablishedConnectionDropped(monitor_.get(), &handshaken_)) {
    // With several routers this replaces the monitor.
    RouterLost(absl::StrCat("lost the connection to the router at ", endpoints_[current_],
                            " with the request open (the router closed it, died or stopped "
                            "answering ZMTP heartbeats)"));
  }
}

void Core::RouterLost(const std::string& why) {
  std::vector<std::shared_ptr<Call>> calls;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  std::string message = why;
  uint64_t connection = 0;
  if (failover()) {
    // Before the calls hear of it: what they send again goes to the next router.
    SwitchRouter();
    absl::StrAppend(&message, "; failing over to ", endpoints_[current_]);
    // A request queued but not sent yet belongs to an attempt of the old connection, which
    // ends below and is sent again: sent now as well, the next router would see its
    // request_id twice.
    absl::MutexLock lock(&mu_);
    connection = ++connection_;
    outbox_.erase(std::remove_if(outbox_.begin(), outbox_.end(),
                                 [](const Outgoing& out) { return out.call != nullptr; }),
                  outbox_.end());
  }
  for (const std::shared_ptr<Call>& call : calls) {
    absl::MutexLock lock(&call->mu);
    if (!call->attempt_open) continue;  // ended, or between retries: its next attempt may land
    if (call->attempt_connection >= connection && connection > 0) continue;  // for the new one
    call->attempt_open = false;
    call->events.push_back(
        LocalError(call->request_id, absl::StatusCode::kUnavailable, reason::kRouterLost, message));
  }
  // Queries sent over the lost connection are never answered; later ones are, in order.
  absl::Status lost = absl::UnavailableError(absl::StrCat("stats: ", message));
  lost.SetPayload(kReasonPayloadUrl, absl::Cord(reason::kRouterLost));
  while (!stats_sent_.empty()) DeliverStats(lost);
}

bool Core::SendQueued() {
  std::vector<Outgoing> batch;
  bool stop;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(outbox_);
    stop = io_stop_;
  }
  for (Outgoing& out : batch) {
    absl::Status sent = socket_->Send({out.frame});
    if (out.stats != nullptr) {
      if (sent.ok()) {
        stats_sent_.push_back(std::move(out.stats));
      } else {
        absl::MutexLock lock(&out.stats->mu);
        out.stats->result =
            absl::UnavailableError(absl::StrCat("cannot send to the router: ", sent.message()));
      }
    } else if (out.call != nullptr && !sent.ok()) {
      Route(LocalError(out.call->request_id, absl::StatusCode::kUnavailable, "",
                       absl::StrCat("cannot send to the router: ", sent.message())));
    }
  }
  return stop;
}

void Core::ReceiveAll() {
  for (;;) {
    absl::StatusOr<std::optional<Frames>> frames = socket_->Recv(0);
    if (!frames.ok() || !frames->has_value()) return;
    if ((*frames)->empty()) continue;
    // A malformed frame cannot be matched to a call; the call it belonged to times out, and
    // its DEADLINE_EXCEEDED says so (DecodeFailures).
    absl::StatusOr<ServerMessage> message = DecodeServerMessage((*frames)->back());
    if (message.ok()) {
      Route(std::move(*message));
    } else {
      absl::MutexLock lock(&mu_);
      ++undecodable_frames_;
      last_decode_error_ = std::string(message.status().message());
    }
  }
}

std::string Core::DecodeFailures() {
  absl::MutexLock lock(&mu_);
  if (undecodable_frames_ == 0) return "";
  return absl::StrCat(
      "; ", undecodable_frames_,
      " message(s) from the router could not be decoded (last: ", last_decode_error_, ")");
}

void Core::Route(ServerMessage message) {
  if (auto* stats = std::get_if<StatsOut>(&message)) {
    DeliverStats(std::move(*stats));
    return;
  }
  // A refusal that names no request answers a stats query (one without a key, say).
  if (auto* error = std::get_if<ErrorInfo>(&message); error != nullptr && error->request_id.empty()) {
    DeliverStats(StatusFromError(*error));
    return;
  }
  std::shared_ptr<Call> call = Find(RequestIdOf(message));
  if (call == nullptr) return;  // ended here already (cancelled, timed out)
  const bool terminal = !std::holds_alternative<GenerateChunkOut>(message);
  absl::MutexLock lock(&call->mu);
  if (!call->attempt_open) return;
  if (terminal) call->attempt_open = false;
  call->events.push_back(std::move(message));
}

void Core::DeliverStats(absl::StatusOr<StatsOut> stats) {
  // Any answer is as good as another, so it goes to the oldest caller still waiting.
  while (!stats_sent_.empty()) {
    std::shared_ptr<StatsCall> call = std::move(stats_sent_.front());
    stats_sent_.pop_front();
    absl::MutexLock lock(&call->mu);
    if (call->abandoned || call->result.has_value()) continue;
    call->result = std::move(stats);
    return;
  }
}

}  // namespace client_internal

using client_internal::Call;
using client_internal::Core;

// ---- options, results, errors

absl::Status ClientOptions::Validate() const {
  const auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  const std::vector<std::string> endpoints = Endpoints();
  if (endpoints.empty() || std::find(endpoints.begin(), endpoints.end(), "") != endpoints.end()) {
    return bad(router_endpoints.empty()
                   ? "router_endpoint is empty or has an empty entry between commas"
                   : "router_endpoints has an empty entry");
  }
  if (connect_timeout_ms <= 0) return bad("connect_timeout_ms must be > 0");
  if (default_timeout_ms <= 0) return bad("default_timeout_ms must be > 0");
  if (max_retries < 0) return bad("max_retries must be >= 0");
  if (initial_backoff_ms <= 0 || max_backoff_ms < initial_backoff_ms) {
    return bad("backoff needs 0 < initial_backoff_ms <= max_backoff_ms");
  }
  if (zmtp_heartbeat_ms < 0 || zmtp_heartbeat_ms > 3600000) {
    return bad("zmtp_heartbeat_ms must be in [0, 3600000]");
  }
  if (max_message_bytes <= 0) return bad("max_message_bytes must be > 0");
  const auto z85 = [](const std::string& key) { return key.empty() || key.size() == 40; };
  if (!z85(curve_server_public_key) || !z85(curve_public_key) || !z85(curve_secret_key)) {
    return bad("CURVE keys must be Z85 text of 40 characters");
  }
  if (curve_public_key.empty() != curve_secret_key.empty()) {
    return bad("curve_public_key and curve_secret_key go together");
  }
  if (curve_server_public_key.empty() && !curve_public_key.empty()) {
    return bad("a CURVE key pair needs curve_server_public_key");
  }
  return absl::OkStatus();
}

std::vector<std::string> ClientOptions::Endpoints() const {
  if (!router_endpoints.empty()) return router_endpoints;
  return SplitEndpointList(router_endpoint);
}

std::vector<int32_t> GenerateResult::TokenIds() const {
  std::vector<int32_t> ids;
  ids.reserve(tokens.size());
  for (const SampleResult& t : tokens) ids.push_back(t.token);
  return ids;
}

absl::Status StatusFromError(const ErrorInfo& error) {
  absl::StatusCode code = error.code;
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;  // an error is never OK
  absl::Status status(code, error.message);
  if (!error.reason.empty()) status.SetPayload(kReasonPayloadUrl, absl::Cord(error.reason));
  if (error.retry_after_ms > 0) {
    status.SetPayload(kRetryAfterPayloadUrl, absl::Cord(absl::StrCat(error.retry_after_ms)));
  }
  return status;
}

std::string ErrorReason(const absl::Status& status) {
  const auto reason = status.GetPayload(kReasonPayloadUrl);
  return reason.has_value() ? std::string(*reason) : std::string();
}

int64_t RetryAfterMs(const absl::Status& status) {
  const auto value = status.GetPayload(kRetryAfterPayloadUrl);
  int64_t ms = 0;
  if (!value.has_value() || !absl::SimpleAtoi(std::string(*value), &ms)) return 0;
  return ms;
}

// ---- Stream

Stream::Stream(std::shared_ptr<Core> core, std::shared_ptr<Call> call, std::string frame,
               absl::Time deadline, int64_t timeout_ms)
    : core_(std::move(core)),
      call_(std::move(call)),
      frame_(std::move(frame)),
      deadline_(deadline),
      timeout_ms_(timeout_ms) {
  result_.request_id = call_->request_id;
}

Stream::~Stream() {
  if (!done_) (void)Finish(absl::CancelledError("the stream was dropped"));
}

void Stream::Cancel() {
  core_->EndCall(*call_, ErrorInfo{call_->request_id, absl::StatusCode::kCancelled,
                                   reason::kCancelled, "cancelled by the client", 0});
}

absl::Status Stream::Finish(absl::Status status) {
  core_->EndCall(*call_, std::nullopt);
  core_->Unregister(call_);
  done_ = true;
  end_status_ = status;
  return status;
}

namespace {

// Handles an UNAVAILABLE error of a call not yet answered in part: waits (exponential backoff
// with jitter, at least the server's retry_after_ms) and sends `frame` again. False when the
// call should end with `error` instead (another code, retries used up, or past the deadline).
bool RetryCall(Core& core, const std::shared_ptr<Call>& call, const std::string& frame,
               const ErrorInfo& error, absl::Time deadline, int* retries) {
  const ClientOptions& o = core.options();
  if (error.code != absl::StatusCode::kUnavailable || *retries >= o.max_retries) return false;
  int64_t base = o.initial_backoff_ms;
  for (int k = 0; k < *retries && base < o.max_backoff_ms; ++k) base *= 2;
  base = std::min(base, o.max_backoff_ms);
  absl::BitGen gen;
  int64_t wait_ms = absl::Uniform<int64_t>(absl::IntervalClosed, gen, base / 2, base);
  wait_ms = std::max(wait_ms, error.retry_after_ms);
  const absl::Time resume = absl::Now() + absl::Milliseconds(wait_ms);
  if (resume >= deadline) return false;
  ++*retries;
  // While no attempt is open, only a Cancel() or the client closing can add an event.
  if (core.AwaitEvent(*call, resume)) return true;
  return core.SendAttempt(call, frame).ok();  // on failure: end with `error`
}

absl::Status CallTimedOut(Core& core, const std::string& request_id, int64_t timeout_ms) {
  absl::Status status = absl::DeadlineExceededError(
      absl::StrCat("request ", request_id, " got no answer within ", timeout_ms, " ms",
                   core.DecodeFailures()));
  status.SetPayload(kReasonPayloadUrl, absl::Cord(reason::kDeadlineExceeded));
  return status;
}

}  // namespace

bool Stream::Retry(const ErrorInfo& error) {
  if (received_chunk_) return false;
  return RetryCall(*core_, call_, frame_, error, deadline_, &retries_);
}

bool Stream::FailOver(const ErrorInfo& error) {
  if (error.reason != reason::kRouterLost || !core_->failover() || !input_.has_value() ||
      failovers_ >= core_->max_failovers() || absl::Now() >= deadline_ ||
      static_cast<int64_t>(result_.tokens.size()) >= input_->sampling.max_tokens) {
    // (Every token came, and only the final was lost: nothing is left to resume.)
    return false;
  }
  ++failovers_;
  if (!result_.tokens.empty()) {
    // Every chunk before the loss has been read (the error came after them): the stream
    // continues after exactly these tokens.
    input_->resume_tokens = result_.TokenIds();
    frame_ = Encode(ClientMessage(*input_));
  }
  return core_->SendAttempt(call_, frame_).ok();
}

absl::StatusOr<std::optional<GenerateChunkOut>> Stream::Next(int64_t wait_ms) {
  if (done_) {
    if (end_status_.ok()) return std::optional<GenerateChunkOut>();
    return end_status_;
  }
  const absl::Time until =
      wait_ms < 0 ? deadline_ : std::min(deadline_, absl::Now() + absl::Milliseconds(wait_ms));
  for (;;) {
    std::optional<ServerMessage> event = core_->WaitEvent(*call_, until);
    if (!event.has_value()) {
      if (absl::Now() < deadline_) {
        return absl::DeadlineExceededError(absl::StrCat("no chunk within ", wait_ms, " ms"));
      }
      // Tells the router to cancel.
      return Finish(CallTimedOut(*core_, call_->request_id, timeout_ms_));
    }
    if (auto* chunk = std::get_if<GenerateChunkOut>(&*event)) {
      received_chunk_ = true;
      result_.tokens.insert(result_.tokens.end(), chunk->tokens.begin(), chunk->tokens.end());
      result_.text += chunk->text;
      return std::optional<GenerateChunkOut>(std::move(*chunk));
    }
    if (auto* last = std::get_if<GenerateFinalOut>(&*event)) {
      result_.tokens.insert(result_.tokens.end(), std::make_move_iterator(last->tokens.begin()),
                            std::make_move_iterator(last->tokens.end()));
      result_.text += last->text;
      result_.finish_reason = std::move(last->finish_reason);
      result_.stop_string = std::move(last->stop_string);
      result_.usage = last->usage;
      result_.timings = last->timings;
      (void)Finish(absl::OkStatus());
      return std::optional<GenerateChunkOut>();
    }
    if (auto* error = std::get_if<ErrorInfo>(&*event)) {
      if (!FailOver(*error) && !Retry(*error)) return Finish(StatusFromError(*error));
    }
  }
}

// ---- Client

Client::Client(std::shared_ptr<Core> core) : core_(std::move(core)) {}

Client::~Client() { core_->Shutdown(); }

const ClientOptions& Client::options() const { return core_->options(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(std::shared_ptr<Core> core, Core::Create(options));
  return std::unique_ptr<Client>(new Client(std::move(core)));
}

absl::StatusOr<std::unique_ptr<Stream>> Client::Start(GenerateInput request,
                                                      const CallOptions& call) {
  if (request.request_id.empty()) request.request_id = core_->NextRequestId();
  if (request.api_key.empty()) request.api_key = core_->options().api_key;
  const int64_t timeout_ms =
      call.timeout_ms > 0 ? call.timeout_ms : core_->options().default_timeout_ms;
  if (core_->failover() && !request.sampling.has_seed) {
    // The router would draw one; the other router would draw another, and a resumed stream
    // would not be the one the lost router was producing.
    request.sampling.has_seed = true;
    request.sampling.seed = absl::Uniform<uint64_t>(absl::BitGen());
  }
  auto state = std::make_shared<Call>(request.request_id);
  RETURN_IF_ERROR(core_->Register(state));
  std::optional<GenerateInput> kept;
  if (core_->failover()) kept = request;
  std::string frame = Encode(ClientMessage(std::move(request)));
  std::unique_ptr<Stream> stream(
      new Stream(core_, state, frame, absl::Now() + absl::Milliseconds(timeout_ms), timeout_ms));
  stream->input_ = std::move(kept);
  if (absl::Status s = core_->SendAttempt(state, std::move(frame)); !s.ok()) {
    return stream->Finish(s);
  }
  return stream;
}

absl::StatusOr<GenerateResult> Client::Generate(GenerateInput request, const CallOptions& call) {
  request.stream = false;
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, Start(std::move(request), call));
  for (;;) {
    ASSIGN_OR_RETURN(std::optional<GenerateChunkOut> chunk, stream->Next());
    if (!chunk.has_value()) return std::move(stream->result_);
  }
}

absl::StatusOr<GenerateResult> Client::GenerateStream(
    GenerateInput request, const std::function<void(const GenerateChunkOut&)>& on_chunk,
    const CallOptions& call) {
  request.stream = true;
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, Start(std::move(request), call));
  for (;;) {
    ASSIGN_OR_RETURN(std::optional<GenerateChunkOut> chunk, stream->Next());
    if (!chunk.has_value()) return std::move(stream->result_);
    if (on_chunk) on_chunk(*chunk);
  }
}

absl::StatusOr<std::unique_ptr<Stream>> Client::StartStream(GenerateInput request,
                                                            const CallOptions& call) {
  request.stream = true;
  return Start(std::move(request), call);
}

namespace {

// `request` with `chat` as its prompt; INVALID_ARGUMENT when it has a prompt of its own.
absl::StatusOr<GenerateInput> WithChat(ChatInput chat, GenerateInput request) {
  if (request.has_text || !request.token_ids.empty() || request.chat.has_value()) {
    return absl::InvalidArgumentError(
        "a chat call takes its prompt from the ChatInput: the GenerateInput must have no text, "
        "token_ids or chat of its own");
  }
  request.chat = std::move(chat);
  return request;
}

}  // namespace

absl::StatusOr<GenerateResult> Client::Chat(ChatInput chat, GenerateInput request,
                                            const CallOptions& call) {
  ASSIGN_OR_RETURN(request, WithChat(std::move(chat), std::move(request)));
  return Generate(std::move(request), call);
}

absl::StatusOr<GenerateResult> Client::ChatStream(
    ChatInput chat, GenerateInput request,
    const std::function<void(const GenerateChunkOut&)>& on_chunk, const CallOptions& call) {
  ASSIGN_OR_RETURN(request, WithChat(std::move(chat), std::move(request)));
  return GenerateStream(std::move(request), on_chunk, call);
}

absl::StatusOr<std::unique_ptr<Stream>> Client::StartChatStream(ChatInput chat,
                                                                GenerateInput request,
                                                                const CallOptions& call) {
  ASSIGN_OR_RETURN(request, WithChat(std::move(chat), std::move(request)));
  return StartStream(std::move(request), call);
}

namespace {

// A one-shot call (embed, tokenize, detokenize, a batch call): sends `message`, which names
// `request_id`, and waits for its answer of type Out or an error, retrying UNAVAILABLE as
// Generate does; with resend_after_loss false, not after router_lost (the router may have done
// what the message asked).
template <typename Out>
absl::StatusOr<Out> OneShot(Core& core, const std::string& request_id,
                            const ClientMessage& message, int64_t timeout_ms,
                            bool resend_after_loss = true) {
  if (timeout_ms <= 0) timeout_ms = core.options().default_timeout_ms;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  auto call = std::make_shared<Call>(request_id);
  RETURN_IF_ERROR(core.Register(call));
  const auto finish = [&](absl::StatusOr<Out> result) {
    core.EndCall(*call, std::nullopt);  // tells the router to cancel if still open
    core.Unregister(call);
    return result;
  };
  const std::string frame = Encode(message);
  if (absl::Status s = core.SendAttempt(call, frame); !s.ok()) return finish(s);
  int retries = 0;
  int failovers = 0;
  for (;;) {
    std::optional<ServerMessage> event = core.WaitEvent(*call, deadline);
    if (!event.has_value()) return finish(CallTimedOut(core, call->request_id, timeout_ms));
    if (auto* out = std::get_if<Out>(&*event)) return finish(std::move(*out));
    if (auto* error = std::get_if<ErrorInfo>(&*event)) {
      const bool lost = error->reason == reason::kRouterLost;
      if (lost && !resend_after_loss) return finish(StatusFromError(*error));
      // The I/O thread has switched to the next router: the call goes there, at once.
      if (lost && core.failover() && failovers < core.max_failovers() &&
          absl::Now() < deadline) {
        ++failovers;
        if (core.SendAttempt(call, frame).ok()) continue;
      }
      if (!RetryCall(core, call, frame, *error, deadline, &retries)) {
        return finish(StatusFromError(*error));
      }
    }
    // Anything else (another kind's answer under this id) cannot be ours: ignored.
  }
}

}  // namespace

absl::StatusOr<EmbedResult> Client::Embed(EmbedInput request, const CallOptions& options) {
  if (request.request_id.empty()) request.request_id = core_->NextRequestId();
  if (request.api_key.empty()) request.api_key = core_->options().api_key;
  const std::string id = request.request_id;
  ASSIGN_OR_RETURN(EmbedResultOut out,
                   OneShot<EmbedResultOut>(*core_, id, ClientMessage(std::move(request)),
                                           options.timeout_ms));
  EmbedResult result;
  result.request_id = std::move(out.request_id);
  result.embeddings = std::move(out.embeddings);
  result.usage = out.usage;
  result.timings = out.timings;
  return result;
}

namespace {

absl::StatusOr<TokenizeResult> SendTokenize(Core& core, TokenizeInput request,
                                            const TokenizeOptions& options) {
  request.request_id = options.request_id.empty() ? core.NextRequestId() : options.request_id;
  request.model = options.model;
  request.api_key = options.api_key.empty() ? core.options().api_key : options.api_key;
  const std::string id = request.request_id;
  ASSIGN_OR_RETURN(TokenizeResultOut out,
                   OneShot<TokenizeResultOut>(core, id, ClientMessage(std::move(request)),
                                              options.timeout_ms));
  return TokenizeResult{std::move(out.request_id), std::move(out.token_ids), out.max_model_len};
}

}  // namespace

absl::StatusOr<TokenizeResult> Client::Tokenize(std::string text,
                                                const TokenizeOptions& options) {
  TokenizeInput request;
  request.text = std::move(text);
  request.add_special_tokens = options.add_special_tokens.value_or(true);
  return SendTokenize(*core_, std::move(request), options);
}

absl::StatusOr<TokenizeResult> Client::TokenizeChat(ChatInput chat,
                                                    const TokenizeOptions& options) {
  TokenizeInput request;
  request.chat = std::move(chat);
  request.add_special_tokens = options.add_special_tokens.value_or(false);
  return SendTokenize(*core_, std::move(request), options);
}

absl::StatusOr<std::string> Client::Detokenize(std::vector<int32_t> token_ids,
                                               const DetokenizeOptions& options) {
  DetokenizeInput request;
  request.request_id =
      options.request_id.empty() ? core_->NextRequestId() : options.request_id;
  request.model = options.model;
  request.token_ids = std::move(token_ids);
  request.skip_special_tokens = options.skip_special_tokens;
  request.api_key = options.api_key.empty() ? core_->options().api_key : options.api_key;
  const std::string id = request.request_id;
  ASSIGN_OR_RETURN(DetokenizeResultOut out,
                   OneShot<DetokenizeResultOut>(*core_, id, ClientMessage(std::move(request)),
                                                options.timeout_ms));
  return std::move(out.text);
}

absl::Status Client::Cancel(const std::string& request_id) {
  std::shared_ptr<Call> call = core_->Find(request_id);
  if (call == nullptr ||
      !core_->EndCall(*call, ErrorInfo{request_id, absl::StatusCode::kCancelled, reason::kCancelled,
                                       "cancelled by the client", 0})) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not in flight"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StatsOut> Client::Stats(int64_t timeout_ms) {
  if (timeout_ms <= 0) timeout_ms = core_->options().default_timeout_ms;
  return core_->Stats(absl::Now() + absl::Milliseconds(timeout_ms));
}

// ---- batch jobs

namespace {

using Json = nlohmann::json;

// What a file's FILE_CONTENT answer adds to its bytes: the file object and the envelope.
constexpr int64_t kContentReplyOverheadBytes = 64 << 10;

bool IsFinalBatchStatus(const std::string& status) {
  return status == "failed" || status == "completed" || status == "expired" ||
         status == "cancelled";
}

std::string StringAt(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// An integer field; 0 when absent or null (a timestamp not reached yet).
int64_t IntAt(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

absl::StatusOr<Json> ParseObject(const BatchReplyInfo& reply, const char* what) {
  Json j = Json::parse(reply.json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError(absl::StrCat("the router's answer to ", what,
                                            " is not a JSON object: ", reply.json.substr(0, 200)));
  }
  return j;
}

FileInfo FileFromJson(const Json& j) {
  return FileInfo{StringAt(j, "id"), IntAt(j, "bytes"), IntAt(j, "created_at"),
                  StringAt(j, "filename"), StringAt(j, "purpose")};
}

BatchInfo BatchFromJson(const Json& j) {
  BatchInfo b;
  b.id = StringAt(j, "id");
  b.status = StringAt(j, "status");
  b.endpoint = StringAt(j, "endpoint");
  b.input_file_id = StringAt(j, "input_file_id");
  b.output_file_id = StringAt(j, "output_file_id");
  b.error_file_id = StringAt(j, "error_file_id");
  b.completion_window = StringAt(j, "completion_window");
  if (auto it = j.find("request_counts"); it != j.end() && it->is_object()) {
    b.request_counts = {IntAt(*it, "total"), IntAt(*it, "completed"), IntAt(*it, "failed")};
  }
  if (auto it = j.find("errors"); it != j.end() && it->is_object()) {
    if (auto data = it->find("data"); data != it->end() && data->is_array()) {
      for (const Json& e : *data) {
        if (e.is_object()) b.errors.push_back({StringAt(e, "code"), StringAt(e, "message"),
                                               IntAt(e, "line")});
      }
    }
  }
  if (auto it = j.find("metadata"); it != j.end() && it->is_object()) {
    for (const auto& [key, value] : it->items()) {
      if (value.is_string()) b.metadata[key] = value.get<std::string>();
    }
  }
  b.created_at = IntAt(j, "created_at");
  b.in_progress_at = IntAt(j, "in_progress_at");
  b.expires_at = IntAt(j, "expires_at");
  b.finalizing_at = IntAt(j, "finalizing_at");
  b.completed_at = IntAt(j, "completed_at");
  b.failed_at = IntAt(j, "failed_at");
  b.expired_at = IntAt(j, "expired_at");
  b.cancelling_at = IntAt(j, "cancelling_at");
  b.cancelled_at = IntAt(j, "cancelled_at");
  return b;
}

// Sends `call` and waits for its BatchReply. Only the calls that change nothing are sent again
// after the connection dropped.
absl::StatusOr<BatchReplyInfo> SendBatchCall(Core& core, BatchCallInfo call,
                                             const BatchCallOptions& options) {
  call.request_id = core.NextRequestId();
  if (call.api_key.empty()) {
    call.api_key = options.api_key.empty() ? core.options().api_key : options.api_key;
  }
  const bool read_only = call.op == BatchOp::kGetFile || call.op == BatchOp::kFileContent ||
                         call.op == BatchOp::kGetBatch || call.op == BatchOp::kListBatches;
  const std::string id = call.request_id;
  return OneShot<BatchReplyInfo>(core, id, ClientMessage(std::move(call)), options.timeout_ms,
                                 /*resend_after_loss=*/read_only);
}

BatchCallInfo OnId(BatchOp op, const std::string& id) {
  BatchCallInfo call;
  call.op = op;
  call.id = id;
  return call;
}

absl::StatusOr<BatchInfo> BatchCallForBatch(Core& core, BatchCallInfo call,
                                            const BatchCallOptions& options) {
  const char* what = BatchOpName(call.op);
  ASSIGN_OR_RETURN(BatchReplyInfo reply, SendBatchCall(core, std::move(call), options));
  ASSIGN_OR_RETURN(Json j, ParseObject(reply, what));
  return BatchFromJson(j);
}

// The url of the first line of a batch input file.
absl::StatusOr<std::string> FirstLineUrl(const std::string& jsonl) {
  const std::string_view line = std::string_view(jsonl).substr(0, jsonl.find('\n'));
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("url") || !j["url"].is_string()) {
    return absl::InvalidArgumentError(
        "the batch file's first line is not a JSON object with a string url: name the endpoint");
  }
  return j["url"].get<std::string>();
}

}  // namespace

bool BatchInfo::finished() const { return IsFinalBatchStatus(status); }

absl::StatusOr<FileInfo> Client::UploadFile(std::string filename, std::string content,
                                            const BatchCallOptions& options) {
  BatchCallInfo call;
  call.op = BatchOp::kCreateFile;
  call.filename = std::move(filename);
  call.purpose = "batch";
  call.content = std::move(content);
  ASSIGN_OR_RETURN(BatchReplyInfo reply, SendBatchCall(*core_, std::move(call), options));
  ASSIGN_OR_RETURN(Json j, ParseObject(reply, "create_file"));
  return FileFromJson(j);
}

absl::StatusOr<FileInfo> Client::GetFile(const std::string& file_id,
                                         const BatchCallOptions& options) {
  ASSIGN_OR_RETURN(BatchReplyInfo reply,
                   SendBatchCall(*core_, OnId(BatchOp::kGetFile, file_id), options));
  ASSIGN_OR_RETURN(Json j, ParseObject(reply, "get_file"));
  return FileFromJson(j);
}

absl::StatusOr<std::string> Client::FileContent(const std::string& file_id,
                                                const BatchCallOptions& options) {
  // A message past max_message_bytes would drop the connection: refuse it here, by its size.
  ASSIGN_OR_RETURN(FileInfo file, GetFile(file_id, options));
  const int64_t limit = core_->options().max_message_bytes;
  if (file.bytes + kContentReplyOverheadBytes > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "file ", file_id, " is ", file.bytes, " bytes; this client takes messages of at most ",
        limit, " bytes (ClientOptions::max_message_bytes, with ", kContentReplyOverheadBytes,
        " for the envelope)"));
  }
  ASSIGN_OR_RETURN(BatchReplyInfo reply,
                   SendBatchCall(*core_, OnId(BatchOp::kFileContent, file_id), options));
  return std::move(reply.content);
}

absl::Status Client::DeleteFile(const std::string& file_id, const BatchCallOptions& options) {
  return SendBatchCall(*core_, OnId(BatchOp::kDeleteFile, file_id), options).status();
}

absl::StatusOr<BatchInfo> Client::SubmitBatch(const std::string& input_file_id,
                                              const SubmitBatchOptions& options) {
  BatchCallInfo call;
  call.op = BatchOp::kCreateBatch;
  call.input_file_id = input_file_id;
  call.endpoint = options.endpoint;
  call.completion_window = options.completion_window;
  if (!options.metadata.empty()) call.metadata_json = Json(options.metadata).dump();
  return BatchCallForBatch(*core_, std::move(call), options.call);
}

absl::StatusOr<BatchInfo> Client::SubmitBatchFile(std::string jsonl,
                                                  const SubmitBatchOptions& options) {
  SubmitBatchOptions submit = options;
  if (submit.endpoint.empty()) {
    ASSIGN_OR_RETURN(submit.endpoint, FirstLineUrl(jsonl));
  }
  ASSIGN_OR_RETURN(FileInfo file, UploadFile(options.filename, std::move(jsonl), options.call));
  return SubmitBatch(file.id, submit);
}

absl::StatusOr<BatchInfo> Client::GetBatch(const std::string& batch_id,
                                           const BatchCallOptions& options) {
  return BatchCallForBatch(*core_, OnId(BatchOp::kGetBatch, batch_id), options);
}

absl::StatusOr<BatchList> Client::ListBatches(const std::string& after, int limit,
                                              const BatchCallOptions& options) {
  BatchCallInfo call;
  call.op = BatchOp::kListBatches;
  call.after = after;
  call.limit = limit;
  ASSIGN_OR_RETURN(BatchReplyInfo reply, SendBatchCall(*core_, std::move(call), options));
  ASSIGN_OR_RETURN(Json j, ParseObject(reply, "list_batches"));
  BatchList list;
  if (auto it = j.find("data"); it != j.end() && it->is_array()) {
    for (const Json& b : *it) {
      if (b.is_object()) list.data.push_back(BatchFromJson(b));
    }
  }
  list.has_more = j.value("has_more", false);
  return list;
}

absl::StatusOr<BatchInfo> Client::CancelBatch(const std::string& batch_id,
                                              const BatchCallOptions& options) {
  return BatchCallForBatch(*core_, OnId(BatchOp::kCancelBatch, batch_id), options);
}

absl::StatusOr<BatchInfo> Client::WaitBatch(const std::string& batch_id, int64_t poll_ms,
                                            const std::function<void(const BatchInfo&)>& on_poll,
                                            const BatchCallOptions& options) {
  if (poll_ms <= 0) return absl::InvalidArgumentError("poll_ms must be > 0");
  const absl::Time deadline = options.timeout_ms > 0
                                  ? absl::Now() + absl::Milliseconds(options.timeout_ms)
                                  : absl::InfiniteFuture();
  BatchCallOptions each = options;
  each.timeout_ms = 0;  // each poll: the default timeout
  for (;;) {
    ASSIGN_OR_RETURN(BatchInfo batch, GetBatch(batch_id, each));
    if (on_poll) on_poll(batch);
    if (batch.finished()) return batch;
    if (absl::Now() + absl::Milliseconds(poll_ms) >= deadline) {
      absl::Status status = absl::DeadlineExceededError(
          absl::StrCat("batch ", batch_id, " is still ", batch.status, " after ",
                       options.timeout_ms, " ms"));
      status.SetPayload(kReasonPayloadUrl, absl::Cord(reason::kDeadlineExceeded));
      return status;
    }
    absl::SleepFor(absl::Milliseconds(poll_ms));
  }
}

absl::StatusOr<BatchResultFiles> Client::BatchResults(const std::string& batch_id,
                                                      const BatchCallOptions& options) {
  ASSIGN_OR_RETURN(BatchInfo batch, GetBatch(batch_id, options));
  if (!batch.finished()) {
    return absl::FailedPreconditionError(
        absl::StrCat("batch ", batch_id, " is ", batch.status,
                     ": its results are written once it ends (completed, expired, cancelled)"));
  }
  BatchResultFiles files;
  if (!batch.output_file_id.empty()) {
    ASSIGN_OR_RETURN(files.output_jsonl, FileContent(batch.output_file_id, options));
  }
  if (!batch.error_file_id.empty()) {
    ASSIGN_OR_RETURN(files.error_jsonl, FileContent(batch.error_file_id, options));
  }
  return files;
}

}  // namespace carpool
