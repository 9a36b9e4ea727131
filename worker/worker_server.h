// The carpool-worker process: connects one Backend (an Engine, or echo) to the router over the
// worker <-> router protocol (docs/protocol.md).
//
//   auto server = WorkerServer::Create(options);   // loads the model
//   std::thread t([&] { (*server)->Run(); });       // serves until drained
//   (*server)->RequestDrain();                      // or a `drain` from the router
//
// Two threads, one socket each side, no locks:
//   I/O thread (the caller of Run): owns the DEALER to the router (routing id = worker id). It
//     sends `register` and re-sends it when the router answers `registered` with epoch 0 (or no
//     answer comes), sends `heartbeat`s with the latest load every heartbeat_ms, hands router
//     messages to the engine thread and engine messages to the router. Once draining it refuses
//     dispatches itself, so whatever reached the engine before the drain finishes.
//   engine thread: owns the Backend. It takes dispatch / cancel / drain, runs one step at a time
//     and sends one `step` message per step carrying every request's events, stamped with the
//     current epoch, and publishes its load through atomics for the heartbeats. Embed dispatches
//     go through a dynamic batcher whose batches run on this thread, at most one between two
//     steps (docs/dynamic_batching.md, "Embeddings in the worker").
// The two talk over an inproc PAIR. A new registration epoch cancels the requests taken under
// the previous one: a router that does not know this worker's epoch has already given them up.
// With a list of routers the I/O thread owns one DEALER at a time, to the router it serves; when
// that router is lost it closes it, tells the engine epoch 0 (every request of the lost router
// is dropped: their clients resume them through the other router) and registers with the next.
// Undecodable frames from the router are logged to stderr and dropped.
#ifndef CARPOOL_WORKER_WORKER_SERVER_H_
#define CARPOOL_WORKER_WORKER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/messages.h"
#include "common/transport.h"
#include "worker/backend.h"
#include "worker/batching/batch_queue.h"
#include "worker/engine.h"

namespace carpool::worker {

struct WorkerServerOptions {
  // The router's backend endpoint, e.g. "tcp://127.0.0.1:5556", or several separated by commas
  // (a pair of routers, docs/cluster.md "Two routers"): the worker registers with the first
  // that answers and, once that one is lost, with the next, under a new epoch. Required.
  std::string router_endpoint;
  // With several routers: a router is lost when its connection drops after the handshake, when
  // it answers no ZMTP heartbeat for this long, or when a register it was sent goes unanswered
  // for this long; the worker then registers with the next one. One router: unused (the worker
  // waits for it). Default: 2000.
  int router_lost_ms = 2000;
  // Routing id and register.worker_id; empty means "<hostname>:<pid>". Default: empty.
  std::string worker_id;
  // engine.model is "echo" (worker/echo_backend.h) or anything Engine accepts.
  EngineOptions engine;
  // Interval between heartbeats. Default: 200.
  int heartbeat_ms = 200;
  // A register the router has not answered in this long is sent again. Default: 1000.
  int register_retry_ms = 1000;
  // Longest the loops sleep without work; bounds how late RequestDrain is noticed. Default: 50.
  int idle_wait_ms = 50;
  // How long exit waits to flush `deregister` to the router. Default: 1000.
  int linger_ms = 1000;
  // Embedding batches (--embed-*). max_concurrent_batches must be 1: batches run on the engine
  // thread, one at a time. max_queue_size is what `register` advertises as embed_queue_size
  // (0 there when the backend cannot embed).
  // Default: 32 inputs a batch, 2 ms max wait, one batch at a time, 1024 inputs queued.
  DynamicBatcherOptions embed = DefaultEmbedOptions();
  // The DEALER's options (message size, queue, ...). routing_id is replaced by worker_id.
  // Default: reconnect every 100 ms at first, backing off to 2000 ms.
  SocketOptions socket = DefaultSocketOptions();

  absl::Status Validate() const;
  // The embed options alone, with errors naming the --embed-* flags.
  absl::Status ValidateEmbed() const;
  static SocketOptions DefaultSocketOptions();
  static DynamicBatcherOptions DefaultEmbedOptions();
};

class WorkerServer {
 public:
  // Loads the model (or sets up echo). Errors: invalid options, a model that cannot be loaded.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerServerOptions& options);
  ~WorkerServer();
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // Serves until drained: then running requests have finished, `deregister` has been sent and
  // Run returns OK. Errors only when a socket cannot be set up. Call once.
  absl::Status Run();

  // Starts draining: new dispatches are refused (`failed`, UNAVAILABLE / draining), running ones
  // finish. Thread-safe and async-signal-safe (one lock-free atomic store).
  void RequestDrain();

  // What `register` carries.
  const RegisterInfo& register_info() const { return register_; }

  // The endpoints of options.router_endpoint, in order (split at commas, blanks trimmed).
  static std::vector<std::string> RouterEndpoints(const std::string& router_endpoint);

 private:
  WorkerServer() = default;

  WorkerServerOptions options_;
  RegisterInfo register_;
  std::unique_ptr<Backend> backend_;
  std::atomic<bool> drain_requested_{false};
  static_assert(std::atomic<bool>::is_always_lock_free);
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_WORKER_SERVER_H_
