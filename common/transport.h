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

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
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
  // With heartbeats on: how long after a PING with no traffic back the connection is dropped.
  // 0: three heartbeat intervals. Default: 0.
  int zmtp_heartbeat_timeout_ms = 0;
  // How long closing the socket (or its context) waits to send what is still queued; 0: drop it.
  // Default: 0.
  int linger_ms = 0;
  // Queue messages only on completed connections (ZMQ_IMMEDIATE): with no live peer a send
  // fails with RESOURCE_EXHAUSTED instead of queueing for a later connection. Default: false.
  bool immediate = false;
  // ROUTER only: a peer that connects under a routing id another live connection holds takes
  // that id over (ZMQ_ROUTER_HANDOVER), and messages to the id go to it; without this the newer
  // connection is refused. A worker reconnecting after a network cut presents its old id while
  // the router may not yet have seen the old TCP connection die. Default: false.
  bool router_handover = false;
  // Server side of CURVE: set to require encryption and authentication. Default: off.
  std::optional<CurveServerKeys> curve_server;
  // Client side of CURVE: the server's public key and this client's key pair. Default: off.
  std::string curve_server_public_key;
  std::string curve_public_key;
  std::string curve_secret_key;
};

using Frames = std::vector<std::string>;

class Socket;

// One thing Poll watches for readability: a socket, or a file descriptor (e.g. an eventfd) when
// socket is null.
struct PollItem {
  Socket* socket = nullptr;  // not owned
  int fd = -1;
};
// readable[i]: items[i] has something to read.
using PollResult = absl::InlinedVector<bool, 4>;

// Waits until one of `items` is readable or timeout_ms passes (0: don't wait, -1: forever).
// An interrupted wait (EINTR) reports nothing readable; CANCELLED: the context was terminated.
absl::StatusOr<PollResult> Poll(absl::Span<const PollItem> items, int timeout_ms);

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

  // Changes SocketOptions::linger_ms of a live socket (e.g. to flush the last answers at exit).
  [[nodiscard]] absl::Status SetLinger(int linger_ms);

  // Closes the socket now (the destructor does otherwise). Every later call fails with
  // FAILED_PRECONDITION; Poll must not be given it.
  void Close();

 private:
  friend class SocketMonitor;
  friend absl::StatusOr<PollResult> Poll(absl::Span<const PollItem> items, int timeout_ms);
  explicit Socket(zmq::socket_t socket) : socket_(std::move(socket)) {}
  zmq::socket_t socket_;
};

// Watches the connections of one socket (ZeroMQ's socket monitor) for the two events a client
// needs to notice a lost peer. Belongs to the thread of the socket it watches; start it before
// that socket connects, so no event is missed. Destroy it before the watched socket.
class SocketMonitor {
 public:
  enum class Event {
    kHandshakeSucceeded,  // a connection is up (ZMTP handshake, CURVE included, done)
    kDisconnected,        // a connection dropped (after a handshake or not)
  };

  static absl::StatusOr<std::unique_ptr<SocketMonitor>> Start(zmq::context_t* context,
                                                              Socket* watched);
  // The next event, without waiting; nullopt when none is queued.
  [[nodiscard]] absl::StatusOr<std::optional<Event>> Next();
  // The socket the events arrive on: for Poll only.
  Socket* socket() { return socket_.get(); }

 private:
  explicit SocketMonitor(std::unique_ptr<Socket> socket) : socket_(std::move(socket)) {}
  std::unique_ptr<Socket> socket_;  // PAIR, connected to the monitor's inproc endpoint
};

// A fresh CURVE key pair (Z85). INTERNAL when libzmq was built without CURVE.
absl::StatusOr<CurveServerKeys> GenerateCurveKeyPair();

}  // namespace carpool

#endif  // CARPOOL_COMMON_TRANSPORT_H_
