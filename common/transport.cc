#include "common/transport.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace carpool {
namespace {

absl::Status FromErrno(int num, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", zmq_strerror(num));
  switch (num) {
    case EHOSTUNREACH:
      return absl::UnavailableError(message);
    case EAGAIN:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
    case EPROTONOSUPPORT:
    case ENOCOMPATPROTO:
      return absl::InvalidArgumentError(message);
    case EADDRINUSE:
      return absl::AlreadyExistsError(message);
    case ETERM:
      return absl::CancelledError(message);
    case EINTR:
      return absl::AbortedError(message);
    case ENOTSOCK:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status FromZmq(const zmq::error_t& e, const std::string& what) {
  return FromErrno(e.num(), what);
}

absl::Status Closed(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": the socket is closed"));
}

}  // namespace

absl::StatusOr<PollResult> Poll(absl::Span<const PollItem> items, int timeout_ms) {
  absl::InlinedVector<zmq_pollitem_t, 4> raw;
  for (const PollItem& item : items) {
    if (item.socket != nullptr && item.socket->socket_.handle() == nullptr) return Closed("poll");
    raw.push_back(zmq_pollitem_t{item.socket != nullptr ? item.socket->socket_.handle() : nullptr,
                                 item.socket != nullptr ? 0 : item.fd, ZMQ_POLLIN, 0});
  }
  PollResult readable(items.size(), false);
  if (zmq_poll(raw.data(), static_cast<int>(raw.size()), timeout_ms) < 0) {
    const int num = zmq_errno();
    if (num == EINTR) return readable;
    return FromErrno(num, "poll");
  }
  for (size_t i = 0; i < raw.size(); ++i) readable[i] = (raw[i].revents & ZMQ_POLLIN) != 0;
  return readable;
}

absl::StatusOr<std::unique_ptr<Socket>> Socket::Create(zmq::context_t* context,
                                                       zmq::socket_type type,
                                                       const SocketOptions& o) {
  try {
    zmq::socket_t s(*context, type);
    s.set(zmq::sockopt::linger, o.linger_ms);
    s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
    s.set(zmq::sockopt::sndhwm, o.high_water_mark);
    s.set(zmq::sockopt::rcvhwm, o.high_water_mark);
    if (type == zmq::socket_type::router) {
      s.set(zmq::sockopt::router_mandatory, 1);
      if (o.router_handover) s.set(zmq::sockopt::router_handover, 1);
    }
    s.set(zmq::sockopt::reconnect_ivl, o.reconnect_ivl_ms);
    s.set(zmq::sockopt::reconnect_ivl_max, o.reconnect_ivl_max_ms);
    if (!o.routing_id.empty()) s.set(zmq::sockopt::routing_id, o.routing_id);
    if (o.zmtp_heartbeat_ms > 0) {
      s.set(zmq::sockopt::heartbeat_ivl, o.zmtp_heartbeat_ms);
      s.set(zmq::sockopt::heartbeat_timeout, o.zmtp_heartbeat_timeout_ms > 0
                                                 ? o.zmtp_heartbeat_timeout_ms
                                                 : o.zmtp_heartbeat_ms * 3);
    }
    if (o.immediate) s.set(zmq::sockopt::immediate, 1);
    if (o.curve_server.has_value()) {
      s.set(zmq::sockopt::curve_server, 1);
      s.set(zmq::sockopt::curve_secretkey, o.curve_server->secret_key);
      s.set(zmq::sockopt::zap_domain, "carpool");
    } else if (!o.curve_server_public_key.empty()) {
      s.set(zmq::sockopt::curve_serverkey, o.curve_server_public_key);
      s.set(zmq::sockopt::curve_publickey, o.curve_public_key);
      s.set(zmq::sockopt::curve_secretkey, o.curve_secret_key);
    }
    return std::unique_ptr<Socket>(new Socket(std::move(s)));
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "creating socket");
  }
}

Socket::~Socket() = default;

absl::Status Socket::Bind(const std::string& endpoint) {
  if (socket_.handle() == nullptr) return Closed(absl::StrCat("bind ", endpoint));
  try {
    socket_.bind(endpoint);
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, absl::StrCat("bind ", endpoint));
  }
}

absl::Status Socket::Connect(const std::string& endpoint) {
  if (socket_.handle() == nullptr) return Closed(absl::StrCat("connect ", endpoint));
  try {
    socket_.connect(endpoint);
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, absl::StrCat("connect ", endpoint));
  }
}

std::string Socket::LastEndpoint() const {
  if (socket_.handle() == nullptr) return "";
  try {
    return socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t&) {
    return "";
  }
}

absl::Status Socket::Send(const Frames& frames) {
  if (socket_.handle() == nullptr) return Closed("send");
  try {
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::send_flags flags = zmq::send_flags::dontwait;
      if (i + 1 < frames.size()) flags = flags | zmq::send_flags::sndmore;
      if (!socket_.send(zmq::buffer(frames[i]), flags).has_value()) {
        return absl::ResourceExhaustedError("send: peer queue full");
      }
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "send");
  }
}

absl::StatusOr<std::optional<Frames>> Socket::Recv(int timeout_ms) {
  if (socket_.handle() == nullptr) return Closed("recv");
  try {
    if (timeout_ms != 0) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) == 0) {
        return std::optional<Frames>();
      }
    }
    Frames frames;
    for (;;) {
      zmq::message_t msg;
      if (!socket_.recv(msg, zmq::recv_flags::dontwait).has_value()) {
        if (frames.empty()) return std::optional<Frames>();
        continue;  // the rest of a multi-part message is already queued
      }
      frames.emplace_back(static_cast<const char*>(msg.data()), msg.size());
      if (!msg.more()) break;
    }
    return std::optional<Frames>(std::move(frames));
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "recv");
  }
}

absl::Status Socket::SetLinger(int linger_ms) {
  if (socket_.handle() == nullptr) return Closed("setting linger");
  try {
    socket_.set(zmq::sockopt::linger, linger_ms);
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "setting linger");
  }
}

void Socket::Close() { socket_.close(); }

absl::StatusOr<std::unique_ptr<SocketMonitor>> SocketMonitor::Start(zmq::context_t* context,
                                                                    Socket* watched) {
  if (watched->socket_.handle() == nullptr) return Closed("socket monitor");
  // inproc endpoints are per context; a process-wide counter keeps them apart within one.
  static std::atomic<uint64_t> next{0};
  const std::string endpoint = absl::StrCat("inproc://carpool-monitor-", next.fetch_add(1));
  if (zmq_socket_monitor(watched->socket_.handle(), endpoint.c_str(),
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) != 0) {
    return FromErrno(zmq_errno(), "socket monitor");
  }
  absl::StatusOr<std::unique_ptr<Socket>> pair =
      Socket::Create(context, zmq::socket_type::pair, SocketOptions());
  if (!pair.ok()) return pair.status();
  // inproc: connected at once, so no event is dropped.
  if (absl::Status s = (*pair)->Connect(endpoint); !s.ok()) return s;
  return std::unique_ptr<SocketMonitor>(new SocketMonitor(std::move(*pair)));
}

absl::StatusOr<std::optional<SocketMonitor::Event>> SocketMonitor::Next() {
  for (;;) {
    absl::StatusOr<std::optional<Frames>> frames = socket_->Recv(0);
    if (!frames.ok()) return frames.status();
    if (!frames->has_value()) return std::optional<Event>();
    // Each event is two frames: 6 bytes (uint16 event, uint32 value), then the endpoint.
    const std::string& head = (*frames)->front();
    if (head.size() < sizeof(uint16_t)) continue;
    uint16_t event;
    std::memcpy(&event, head.data(), sizeof(event));
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) return std::optional<Event>(Event::kHandshakeSucceeded);
    if (event == ZMQ_EVENT_DISCONNECTED) return std::optional<Event>(Event::kDisconnected);
  }
}

absl::StatusOr<CurveServerKeys> GenerateCurveKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::InternalError("libzmq was built without CURVE support");
  }
  return CurveServerKeys{pub, sec};
}

}  // namespace carpool
