// CURVE on the router's frontend: key files and the ZAP handler that checks client keys
// against an allow-list (ZeroMQ RFC 27, on inproc://zeromq.zap.01).
//
//   zmq::context_t context;
//   auto zap = ZapHandler::Start(&context, allowed_public_keys);   // before binding
//   ... frontend socket with SocketOptions::curve_server, bound in `context` ...
//
// The handler owns one REP socket on its own thread; the allow-list is fixed at Start.
// Connections whose CURVE handshake names a key not on the list are refused (status 400) and
// never reach the router's event loop.
#ifndef CARPOOL_ROUTER_ZAP_HANDLER_H_
#define CARPOOL_ROUTER_ZAP_HANDLER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/transport.h"

namespace carpool::router {

// The key in a key file: the first line that is neither empty nor a '#' comment, which must be
// 40 characters of Z85. NOT_FOUND when unreadable, INVALID_ARGUMENT when malformed.
absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path);
// Every key of an allow-list file (one Z85 public key per line, '#' comments), as Z85.
absl::StatusOr<std::vector<std::string>> ReadCurveAllowList(const std::string& path);
// The public key (Z85) of a CURVE secret key (Z85).
absl::StatusOr<std::string> CurvePublicKey(const std::string& secret_z85);
// Writes a fresh key pair: the secret key to `secret_path` (mode 0600) and the public key to
// `secret_path` + ".pub". Returns the public key.
absl::StatusOr<std::string> WriteCurveKeyPair(const std::string& secret_path);

class ZapHandler {
 public:
  // Binds the ZAP endpoint in `context` and starts answering. `allowed` are Z85 public keys.
  static absl::StatusOr<std::unique_ptr<ZapHandler>> Start(zmq::context_t* context,
                                                           const std::vector<std::string>& allowed);
  // Stops the thread (within ~100 ms) and closes the socket.
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  int64_t allowed() const { return allowed_count_.load(std::memory_order_relaxed); }
  int64_t denied() const { return denied_count_.load(std::memory_order_relaxed); }

 private:
  ZapHandler(std::unique_ptr<Socket> socket, absl::flat_hash_set<std::string> keys);
  void Run();
  // Answers one ZAP request (version, request id, domain, address, identity, mechanism,
  // credentials...).
  Frames Answer(const Frames& request);

  std::unique_ptr<Socket> socket_;  // REP; used by thread_ only once it runs
  const absl::flat_hash_set<std::string> keys_;  // 32-byte binary public keys
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> allowed_count_{0};
  std::atomic<int64_t> denied_count_{0};
  std::thread thread_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_ZAP_HANDLER_H_
