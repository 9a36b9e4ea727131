// ZeroMQ sockets for carpool processes: RAII, bounded messages, errors as absl::Status.
//
// Every socket that faces another process sets ZMQ_MAXMSGSIZE (an oversized message drops the
// connection, never allocates it), linger 0 (no hang at shutdown) and, for ROUTER sockets,
// ZMQ_ROUTER_MANDATORY (a send to a vanished peer is an error, not a silent drop). This file is
// the one adapter from ZeroMQ errors to Status.
//
// Thread-compatible: a Socket belongs to one thread, as ZeroMQ sockets do.
#ifndef CARPOOL_COMMON_TRANSPORT_H_
#define CARPOOL_COMMON_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "zmq.hpp"

namespace carpool {

struct CurveServerKeys {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;
};

struct SocketOptions {
  // Largest message accepted from a peer. Default: 16 MiB.
  int64_t max_message_bytes = 16 << 20;
  // Identity a DEALER presents to a ROUTER; empty lets ZeroMQ pick one. Default: empty.
  std::string routing_id;
  // Messages queued per peer before sends fail with RESOURCE_EXHAUSTED. Default: 10000.
  int high_water_mark = 10000;
  // Reconnect backoff of a connecting socket whose peer is gone or not up yet: the first retry
  // after reconnect_ivl_ms, then doubling up to reconnect_ivl_max_ms (0: no doubling).
  // Defaults: 100 and 0 (ZeroMQ's own).
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 0;
  // Heartbeats on the connection itself (ZMTP PING), so dead TCP peers are noticed.
  // 0 disables. Default: 0.
  int zmtp_heartbeat_ms = 0;
  // Server side of CURVE: set to require encryption and authentication. Default: off.
  std::optional<CurveServerKeys> curve_server;
  // Client side of CURVE: the server's public key and this client's key pair. Default: off.
  std::string curve_server_public_key;
  std::string curve_public_key;
  std::string curve_secret_key;
};

using Frames = std::vector<std::string>;

class Socket {
 public:
  static absl::StatusOr<std::unique_ptr<Socket>> Create(zmq::context_t* context,
                                                        zmq::socket_type type,
                                                        const SocketOptions& options);
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  [[nodiscard]] absl::Status Bind(const std::string& endpoint);
  [[nodiscard]] absl::Status Connect(const std::string& endpoint);
  // The endpoint actually bound (with the port chosen for "tcp://127.0.0.1:*").
  std::string LastEndpoint() const;

  // Sends one multi-part message without blocking. A ROUTER's first frame names the peer.
  // UNAVAILABLE: no such peer (ROUTER); RESOURCE_EXHAUSTED: the peer's queue is full.
  [[nodiscard]] absl::Status Send(const Frames& frames);
  // Receives one multi-part message, waiting at most timeout_ms (0: don't wait, -1: forever).
  // nullopt when nothing arrived in time.
  [[nodiscard]] absl::StatusOr<std::optional<Frames>> Recv(int timeout_ms);

  // For zmq::poll.
  zmq::socket_t& raw() { return socket_; }

 private:
  explicit Socket(zmq::socket_t socket) : socket_(std::move(socket)) {}
  zmq::socket_t socket_;
};

// A fresh CURVE key pair (Z85). INTERNAL when libzmq was built without CURVE.
absl::StatusOr<CurveServerKeys> GenerateCurveKeyPair();

}  // namespace carpool

#endif  // CARPOOL_COMMON_TRANSPORT_H_
