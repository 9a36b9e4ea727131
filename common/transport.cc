#include "common/transport.h"

#include "absl/strings/str_cat.h"

namespace carpool {
namespace {

absl::Status FromZmq(const zmq::error_t& e, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", e.what());
  switch (e.num()) {
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
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Socket>> Socket::Create(zmq::context_t* context,
                                                       zmq::socket_type type,
                                                       const SocketOptions& o) {
  try {
    zmq::socket_t s(*context, type);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
    s.set(zmq::sockopt::sndhwm, o.high_water_mark);
    s.set(zmq::sockopt::rcvhwm, o.high_water_mark);
    if (type == zmq::socket_type::router) s.set(zmq::sockopt::router_mandatory, 1);
    s.set(zmq::sockopt::reconnect_ivl, o.reconnect_ivl_ms);
    s.set(zmq::sockopt::reconnect_ivl_max, o.reconnect_ivl_max_ms);
    if (!o.routing_id.empty()) s.set(zmq::sockopt::routing_id, o.routing_id);
    if (o.zmtp_heartbeat_ms > 0) {
      s.set(zmq::sockopt::heartbeat_ivl, o.zmtp_heartbeat_ms);
      s.set(zmq::sockopt::heartbeat_timeout, o.zmtp_heartbeat_ms * 3);
    }
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
  try {
    socket_.bind(endpoint);
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, absl::StrCat("bind ", endpoint));
  }
}

absl::Status Socket::Connect(const std::string& endpoint) {
  try {
    socket_.connect(endpoint);
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return FromZmq(e, absl::StrCat("connect ", endpoint));
  }
}

std::string Socket::LastEndpoint() const { return socket_.get(zmq::sockopt::last_endpoint); }

absl::Status Socket::Send(const Frames& frames) {
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

absl::StatusOr<CurveServerKeys> GenerateCurveKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::InternalError("libzmq was built without CURVE support");
  }
  return CurveServerKeys{pub, sec};
}

}  // namespace carpool
