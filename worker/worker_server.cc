#include "worker/worker_server.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/connection_watch.h"
#include "common/endpoint_list.h"
#include "common/status.h"
#include "worker/echo_backend.h"
#include "worker/engine_loop.h"

namespace carpool::worker {
namespace {

using internal::EngineLoop;
using internal::EngineLoopOptions;
using internal::kMaxFramesPerWake;
using internal::kPairEndpoint;
using internal::kPairHighWaterMark;
using internal::kTagDone;
using internal::kTagDrain;
using internal::kTagEpoch;
using internal::kTagEpochSeen;
using internal::kTagRouter;
using internal::kTagSend;
using internal::Log;
using internal::SharedLoad;
using internal::ShouldLogCount;

int64_t NowMillis() { return Clock::Real()->NowMicros() / 1000; }

std::string DefaultWorkerId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host[0] != '\0' ? host : "worker", ":", getpid());
}

// ShouldLogCount from the second failure on: the first send after start usually finds the
// connection still being made.
bool ShouldLogRouterFailure(int64_t n) { return n > 1 && ShouldLogCount(n); }

// Owns the DEALER to the router; see worker_server.h.
class IoLoop {
 public:
  // `dealer_options` are those of every DEALER it opens to a router, in `context`.
  IoLoop(const WorkerServerOptions& options, const RegisterInfo& reg, zmq::context_t* context,
         SocketOptions dealer_options, Socket* pair, const SharedLoad* load,
         const std::atomic<bool>* drain_requested)
      : options_(options),
        register_(reg),
        context_(context),
        dealer_options_(std::move(dealer_options)),
        routers_(WorkerServer::RouterEndpoints(options.router_endpoint)),
        pair_(pair),
        load_(load),
        drain_requested_(drain_requested) {}

  // Connects to the first router. Errors only when a socket cannot be set up.
  absl::Status Connect();
  // Returns once the engine thread has drained and `deregister` is queued.
  void Run();

 private:
  // Opens the DEALER and its monitor to routers_[current_].
  absl::Status ConnectCurrent();
  // The current router is lost (`why`): registers with the next (the same one again when
  // there is one), under a new epoch.
  void NextRouter(const std::string& why);
  void ReadMonitor();
  void PollOnce(int timeout_ms);
  void ReadRouter();
  void ReadEngine();
  void OnRouterFrame(const std::string& frame);
  void OnRegistered(uint64_t epoch);
  void OnEngineFrames(const Frames& f);
  void Tick();
  // Once draining, dispatches are answered here: everything that reached the engine before the
  // drain finishes, nothing after it starts.
  void StartDrain(const char* why);
  void RefuseDraining(uint64_t dispatch_id);
  void SendRegister();
  void ToEngine(Frames frames);
  // False when the router cannot take it now (not connected, queue full); logged rarely.
  bool ToRouter(const std::string& frame);

  const WorkerServerOptions& options_;
  const RegisterInfo& register_;
  zmq::context_t* const context_;
  const SocketOptions dealer_options_;
  const std::vector<std::string> routers_;
  size_t current_ = 0;  // the router served: routers_[current_]
  // Destroyed monitor first, then the DEALER it watches.
  std::unique_ptr<Socket> dealer_;
  std::unique_ptr<SocketMonitor> monitor_;
  bool handshaken_ = false;                 // the connection to the current router is up
  // Epoch 0 was sent to the engine and it has not said it took it: what it sends until then
  // was stamped for the registration given up, whose epoch number the next one may reuse.
  bool awaiting_epoch_zero_ = false;
  int64_t router_since_ms_ = 0;             // when the current router was chosen
  Socket* const pair_;
  const SharedLoad* const load_;
  const std::atomic<bool>* const drain_requested_;

  uint64_t epoch_ = 0;             // 0 until the router's `registered` names one
  bool register_pending_ = false;  // a register is on its way and not answered yet
  int64_t register_sent_ms_ = 0;
  int64_t next_heartbeat_ms_ = 0;
  bool draining_ = false;
  bool engine_done_ = false;
  int64_t send_failures_ = 0;
};

absl::Status IoLoop::Connect() {
  if (routers_.empty()) return absl::InvalidArgumentError("--router names no endpoint");
  return ConnectCurrent();
}

absl::Status IoLoop::ConnectCurrent() {
  monitor_.reset();
  dealer_.reset();
  handshaken_ = false;
  router_since_ms_ = NowMillis();
  ASSIGN_OR_RETURN(dealer_, Socket::Create(context_, zmq::socket_type::dealer, dealer_options_));
  // Before Connect: no event is missed. With one router too: a dropped TCP connection loses
  // what was in flight on it, which only a new registration (the router resumes the old
  // epoch's requests) recovers.
  ASSIGN_OR_RETURN(monitor_, SocketMonitor::Start(context_, dealer_.get()));
  return dealer_->Connect(routers_[current_]);
}

void IoLoop::NextRouter(const std::string& why) {
  const std::string& lost = routers_[current_];
  current_ = (current_ + 1) % routers_.size();
  Log("router ", lost, " lost (", why, "); registering with ", routers_[current_]);
  if (epoch_ != 0) {
    // The lost router's requests are its clients' to resume elsewhere: drop them all.
    epoch_ = 0;
    ToEngine({kTagEpoch, "0"});
    awaiting_epoch_zero_ = true;
  }
  register_pending_ = false;
  if (absl::Status s = ConnectCurrent(); !s.ok()) {
    Log("cannot connect to router ", routers_[current_], ": ", s.ToString());
    return;  // dealer_ may be null: Tick tries the next one after router_lost_ms
  }
  SendRegister();
}

void IoLoop::ReadMonitor() {
  // An established connection dropped: the router died, closed it, or stopped answering ZMTP
  // heartbeats. A connection that never came up is left to the register timeout.
  if (EstablishedConnectionDropped(monitor_.get(), &handshaken_)) {
    NextRouter("its connection dropped");  // replaces the monitor
  }
}

void IoLoop::Run() {
  SendRegister();
  while (!engine_done_) {
    const int64_t now = NowMillis();
    int64_t wait = options_.idle_wait_ms;
    if (epoch_ > 0) wait = std::min(wait, next_heartbeat_ms_ - now);
    PollOnce(static_cast<int>(std::max<int64_t>(wait, 0)));
    Tick();
  }
  if (epoch_ == 0) {
    Log("drained; not registered, so no deregister sent");
    return;
  }
  if (ToRouter(Encode(WorkerMessage(DeregisterInfo{epoch_})))) {
    Log("drained; deregister sent (epoch ", epoch_, ")");
  } else {
    Log("drained; could not send deregister (router unreachable)");
  }
}

void IoLoop::PollOnce(int timeout_ms) {
  const PollItem items[] = {
      {dealer_.get()}, {pair_}, {monitor_ != nullptr ? monitor_->socket() : nullptr}};
  const size_t n = monitor_ != nullptr ? 3 : dealer_ != nullptr ? 2 : 0;
  if (n == 0) {
    // No DEALER (a connect failed): only the engine is read until the next router is tried.
    const PollItem engine_only[] = {{pair_}};
    absl::StatusOr<PollResult> readable = Poll(engine_only, timeout_ms);
    if (readable.ok() && (*readable)[0]) ReadEngine();
    return;
  }
  // EINTR: nothing readable.
  absl::StatusOr<PollResult> readable = Poll(absl::MakeConstSpan(items, n), timeout_ms);
  if (!readable.ok()) {
    Log(readable.status().message());
    return;
  }
  if ((*readable)[0]) ReadRouter();
  if ((*readable)[1]) ReadEngine();
  if (n == 3 && (*readable)[2]) ReadMonitor();
}

void IoLoop::ReadRouter() {
  for (int i = 0; i < kMaxFramesPerWake; ++i) {
    absl::StatusOr<std::optional<Frames>> frames = dealer_->Recv(0);
    if (!frames.ok()) {
      Log("recv from router: ", frames.status().ToString());
      return;
    }
    if (!frames->has_value()) return;
    if ((*frames)->size() != 1) {
      Log("dropped a ", (*frames)->size(), "-frame message from the router (expected 1 frame)");
      continue;
    }
    OnRouterFrame((**frames)[0]);
  }
}

void IoLoop::ReadEngine() {
  for (int i = 0; i < kMaxFramesPerWake && !engine_done_; ++i) {
    absl::StatusOr<std::optional<Frames>> frames = pair_->Recv(0);
    if (!frames.ok()) {
      Log("recv from engine: ", frames.status().ToString());
      return;
    }
    if (!frames->has_value()) return;
    OnEngineFrames(**frames);
  }
}

void IoLoop::OnRouterFrame(const std::string& frame) {
  absl::StatusOr<RouterMessage> m = DecodeRouterMessage(frame);
  if (!m.ok()) {
    Log("dropped an undecodable frame from the router (", frame.size(),
        " bytes): ", m.status().message());
    return;
  }
  if (const auto* ack = std::get_if<RegisterAckInfo>(&*m)) {
    OnRegistered(ack->epoch);
    return;
  }
  if (std::holds_alternative<DrainInfo>(*m)) {
    StartDrain("the router asked");
    return;
  }
  if (const auto* d = std::get_if<DispatchInfo>(&*m); d != nullptr && draining_) {
    RefuseDraining(d->dispatch_id);
    return;
  }
  if (const auto* e = std::get_if<EmbedDispatchInfo>(&*m); e != nullptr && draining_) {
    RefuseDraining(e->dispatch_id);
    return;
  }
  ToEngine({kTagRouter, frame});
}

void IoLoop::OnRegistered(uint64_t epoch) {
  if (epoch == 0) {
    // The router does not know this registration (it restarted, or declared us dead). Answers
    // to messages sent before the new register come first; one re-register is enough.
    if (epoch_ == 0 && register_pending_) return;
    Log("router does not know epoch ", epoch_, "; registering again");
    epoch_ = 0;
    awaiting_epoch_zero_ = true;
    router_since_ms_ = NowMillis();  // its router_lost_ms to answer starts now
    ToEngine({kTagEpoch, "0"});
    SendRegister();
    return;
  }
  if (epoch == epoch_) return;
  epoch_ = epoch;
  register_pending_ = false;
  next_heartbeat_ms_ = NowMillis() + options_.heartbeat_ms;
  ToEngine({kTagEpoch, absl::StrCat(epoch)});
  Log("registered as ", register_.worker_id, ", epoch ", epoch);
}

void IoLoop::OnEngineFrames(const Frames& f) {
  if (f.size() == 1 && f[0] == kTagDone) {
    engine_done_ = true;
    return;
  }
  if (f.size() == 2 && f[0] == kTagEpochSeen) {
    if (f[1] == "0") awaiting_epoch_zero_ = false;
    return;
  }
  if (f.size() != 3 || f[0] != kTagSend || awaiting_epoch_zero_) return;
  // Stamped under an epoch the router no longer knows: it would only be dropped there.
  if (epoch_ == 0 || f[1] != absl::StrCat(epoch_)) return;
  ToRouter(f[2]);
}

void IoLoop::Tick() {
  if (!draining_ && drain_requested_->load(std::memory_order_relaxed)) StartDrain("signal");
  const int64_t now = NowMillis();
  if (epoch_ == 0 && now - router_since_ms_ >= options_.router_lost_ms) {
    // Not registered with this router within router_lost_ms: down, or not answering.
    NextRouter(absl::StrCat("no registration within ", options_.router_lost_ms, " ms"));
    return;
  }
  if (epoch_ > 0) {
    if (now < next_heartbeat_ms_) return;
    next_heartbeat_ms_ = now + options_.heartbeat_ms;
    ToRouter(
        Encode(WorkerMessage(HeartbeatInfo(epoch_, load_->Read(), load_->ReadEmbedBatcher()))));
  } else if (!register_pending_ || now - register_sent_ms_ >= options_.register_retry_ms) {
    SendRegister();
  }
}

void IoLoop::StartDrain(const char* why) {
  if (draining_) return;
  draining_ = true;
  Log("draining (", why, "): refusing new requests, finishing running ones");
  ToEngine({kTagDrain});
}

void IoLoop::RefuseDraining(uint64_t dispatch_id) {
  if (epoch_ == 0) return;
  RequestFailedInfo f;
  f.epoch = epoch_;
  f.dispatch_id = dispatch_id;
  f.error.code = absl::StatusCode::kUnavailable;
  f.error.reason = reason::kDraining;
  f.error.message = "worker is draining";
  ToRouter(Encode(WorkerMessage(f)));
}

void IoLoop::SendRegister() {
  // Until the connection is up the send fails; Tick tries again on the next wake-up.
  register_pending_ = ToRouter(Encode(WorkerMessage(register_)));
  register_sent_ms_ = NowMillis();
}

void IoLoop::ToEngine(Frames frames) {
  if (absl::Status s = pair_->Send(frames); !s.ok()) Log("to engine: ", s.ToString());
}

bool IoLoop::ToRouter(const std::string& frame) {
  if (dealer_ == nullptr) return false;
  const absl::Status s = dealer_->Send({frame});
  if (s.ok()) {
    send_failures_ = 0;
    return true;
  }
  if (ShouldLogRouterFailure(++send_failures_)) {
    Log("cannot send to router ", routers_[current_],
        " (not connected, or its queue is full); ", send_failures_, " message(s) not sent");
  }
  return false;
}

}  // namespace

SocketOptions WorkerServerOptions::DefaultSocketOptions() {
  SocketOptions o;
  o.reconnect_ivl_ms = 100;
  o.reconnect_ivl_max_ms = 2000;
  return o;
}

DynamicBatcherOptions WorkerServerOptions::DefaultEmbedOptions() {
  return EngineLoopOptions::DefaultEmbedOptions();
}

absl::Status WorkerServerOptions::ValidateEmbed() const {
  if (embed.max_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--embed-max-batch-size must be >= 1, got ", embed.max_batch_size));
  }
  if (embed.max_wait_micros < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--embed-max-wait-ms must be >= 0, got ",
                                                   embed.max_wait_micros / 1000.0));
  }
  if (embed.max_concurrent_batches != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--embed-max-concurrent-batches must be 1 (embedding batches run on the engine thread, "
        "one at a time), got ",
        embed.max_concurrent_batches));
  }
  if (embed.max_queue_size < embed.max_batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--embed-queue-size (", embed.max_queue_size,
                     ") must be >= --embed-max-batch-size (", embed.max_batch_size, ")"));
  }
  if (absl::Status s = embed.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--embed-* flags: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status WorkerServerOptions::Validate() const {
  if (router_endpoint.empty()) return absl::InvalidArgumentError("--router is required");
  const std::vector<std::string> routers = WorkerServer::RouterEndpoints(router_endpoint);
  if (routers.empty() || std::find(routers.begin(), routers.end(), "") != routers.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--router '", router_endpoint, "' has an empty endpoint; give ENDPOINT[,ENDPOINT...]"));
  }
  if (router_lost_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--router-lost-ms must be >= 1, got ", router_lost_ms));
  }
  if (heartbeat_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat-ms must be >= 1, got ", heartbeat_ms));
  }
  if (register_retry_ms < 1 || idle_wait_ms < 1 || linger_ms < 0) {
    return absl::InvalidArgumentError(
        "register_retry_ms and idle_wait_ms must be >= 1, linger_ms >= 0");
  }
  if (engine.scheduler.max_num_seqs < 1 || engine.scheduler.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("--max-num-seqs and --max-num-batched-tokens must be >= 1");
  }
  RETURN_IF_ERROR(ValidateEmbed());
  return engine.Validate();
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(
    const WorkerServerOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<WorkerServer> server(new WorkerServer());
  server->options_ = options;
  if (server->options_.worker_id.empty()) server->options_.worker_id = DefaultWorkerId();
  if (options.engine.model == kEchoModel) {
    server->backend_ = CreateEchoBackend(options.engine);
  } else {
    ASSIGN_OR_RETURN(server->backend_, CreateEngineBackend(options.engine));
  }
  server->register_ = server->backend_->Describe();
  server->register_.worker_id = server->options_.worker_id;
  server->register_.model = options.engine.model;
  const int embed_dim = server->backend_->embed_dim();
  server->register_.embed_queue_size = embed_dim > 0 ? options.embed.max_queue_size : 0;
  if (embed_dim > 0) server->register_.hidden_size = embed_dim;
  return server;
}

WorkerServer::~WorkerServer() = default;

std::vector<std::string> WorkerServer::RouterEndpoints(const std::string& router_endpoint) {
  return SplitEndpointList(router_endpoint);
}

void WorkerServer::RequestDrain() { drain_requested_.store(true, std::memory_order_relaxed); }

absl::Status WorkerServer::Run() {
  zmq::context_t context;  // declared first: outlives the sockets, flushes at destruction
  SocketOptions dealer_options = options_.socket;
  dealer_options.routing_id = options_.worker_id;
  // Queue messages only on a live connection (so an unreachable router does not collect stale
  // heartbeats), and flush `deregister` at exit.
  dealer_options.immediate = true;
  dealer_options.linger_ms = options_.linger_ms;
  // A router that stops answering (its host gone, a network cut) is noticed without waiting
  // for TCP: no traffic for router_lost_ms after a PING drops the connection.
  dealer_options.zmtp_heartbeat_ms = std::max(1, options_.router_lost_ms / 3);
  dealer_options.zmtp_heartbeat_timeout_ms = options_.router_lost_ms;
  SocketOptions pair_options;
  pair_options.high_water_mark = kPairHighWaterMark;
  ASSIGN_OR_RETURN(std::unique_ptr<Socket> io_pair,
                   Socket::Create(&context, zmq::socket_type::pair, pair_options));
  ASSIGN_OR_RETURN(std::unique_ptr<Socket> engine_pair,
                   Socket::Create(&context, zmq::socket_type::pair, pair_options));
  RETURN_IF_ERROR(io_pair->Bind(kPairEndpoint));
  RETURN_IF_ERROR(engine_pair->Connect(kPairEndpoint));

  const RegisterInfo& r = register_;
  Log("worker ", r.worker_id, " -> router ", options_.router_endpoint, "; model ", r.model,
      "; max_num_seqs ", r.max_num_seqs, ", kv ", r.num_kv_blocks, " blocks x ", r.block_size,
      " tokens, max_model_len ", r.max_model_len, ", vocab ", r.vocab_size,
      ", max_num_batched_tokens ", r.max_num_batched_tokens, ", embed_queue_size ",
      r.embed_queue_size, " (hidden_size ", r.hidden_size, ")");
  SharedLoad load;
  load.Publish(backend_->Load());
  IoLoop io(options_, register_, &context, dealer_options, io_pair.get(), &load,
            &drain_requested_);
  RETURN_IF_ERROR(io.Connect());
  // The engine thread takes over engine_pair and the backend until it reports done.
  EngineLoopOptions loop_options;
  loop_options.idle_wait_ms = options_.idle_wait_ms;
  loop_options.embed = options_.embed;
  std::thread engine_thread(
      [&] { EngineLoop(backend_.get(), engine_pair.get(), &load, loop_options).Run(); });
  io.Run();
  engine_thread.join();
  Log("exit");
  return absl::OkStatus();
}

}  // namespace carpool::worker
