// carpool-router's core: one event loop over the client-facing frontend socket and the
// worker-facing backend socket. It validates requests, queues them by priority, dispatches them
// to workers with free capacity (least outstanding tokens first), relays each engine step's
// tokens to the clients, and moves the requests of a dead worker to another one.
//
// Thread-compatible except Stop(), which any thread (or a signal handler) may call.
#ifndef CARPOOL_ROUTER_ROUTER_H_
#define CARPOOL_ROUTER_ROUTER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "router/request_validator.h"

namespace carpool::router {

struct RouterOptions {
  // Where clients connect. "tcp://127.0.0.1:*" picks a free port. Default: tcp://127.0.0.1:5555.
  std::string frontend = "tcp://127.0.0.1:5555";
  // Where workers connect. Default: tcp://127.0.0.1:5556.
  std::string backend = "tcp://127.0.0.1:5556";
  // A worker silent this long is dead. Default: 1000 ms.
  int64_t heartbeat_timeout_ms = 1000;
  // Client messages larger than this get an INVALID_ARGUMENT error. Default: 1 MiB.
  int64_t max_request_bytes = 1 << 20;
  // Frames larger than this drop the connection (ZMQ_MAXMSGSIZE). Default: 64 MiB.
  int64_t max_frame_bytes = 64 << 20;
  // Requests waiting for a worker; more are refused with queue_full. Default: 10000.
  int max_queued_requests = 10000;
  // Times a request may move to another worker after its worker died. Default: 3.
  int max_migrations = 3;
  RequestLimits request_limits;
  // Not owned; defaults to Clock::Real().
  Clock* clock = nullptr;

  absl::Status Validate() const;
};

class Router {
 public:
  // Binds both sockets.
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterOptions& options);
  ~Router();

  // The endpoints actually bound (with the chosen ports).
  const std::string& frontend_endpoint() const;
  const std::string& backend_endpoint() const;

  // Serves until Stop(). Returns OK on a requested stop, an error if a socket fails.
  absl::Status Run();
  // Makes Run() return within one poll interval. Async-signal-safe.
  void Stop() { stop_.store(true, std::memory_order_relaxed); }

 private:
  class Impl;
  explicit Router(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_ROUTER_H_
