#include "router/zap_handler.h"

#include <sys/stat.h>

#include <fstream>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/transport.h"

namespace carpool::router {
namespace {

constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr int kPollMillis = 100;

absl::StatusOr<std::vector<std::string>> ReadKeyLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the key file ", path));
  std::vector<std::string> keys;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string key(absl::StripAsciiWhitespace(line));
    if (key.empty() || key[0] == '#') continue;
    uint8_t binary[32];
    if (key.size() != 40 || zmq_z85_decode(binary, key.c_str()) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": expected a 40-character Z85 CURVE key"));
    }
    keys.push_back(key);
  }
  return keys;
}

}  // namespace

absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> keys = ReadKeyLines(path);
  if (!keys.ok()) return keys.status();
  if (keys->empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no key"));
  return keys->front();
}

absl::StatusOr<std::vector<std::string>> ReadCurveAllowList(const std::string& path) {
  return ReadKeyLines(path);
}

absl::StatusOr<std::string> CurvePublicKey(const std::string& secret_z85) {
  char pub[41] = {};
  if (secret_z85.size() != 40 || zmq_curve_public(pub, secret_z85.c_str()) != 0) {
    return absl::InvalidArgumentError("not a CURVE secret key (or libzmq lacks CURVE)");
  }
  return std::string(pub);
}

absl::StatusOr<std::string> WriteCurveKeyPair(const std::string& secret_path) {
  absl::StatusOr<CurveServerKeys> pair = GenerateCurveKeyPair();
  if (!pair.ok()) return pair.status();
  {
    std::ofstream out(secret_path, std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", secret_path));
    out << "# carpool CURVE secret key; keep private\n" << pair->secret_key << "\n";
  }
  chmod(secret_path.c_str(), 0600);
  std::ofstream pub(secret_path + ".pub", std::ios::trunc);
  if (!pub) return absl::PermissionDeniedError(absl::StrCat("cannot write ", secret_path, ".pub"));
  pub << pair->public_key << "\n";
  return pair->public_key;
}

absl::StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Start(
    zmq::context_t* context, const std::vector<std::string>& allowed) {
  absl::flat_hash_set<std::string> keys;
  for (const std::string& z85 : allowed) {
    uint8_t binary[32];
    if (z85.size() != 40 || zmq_z85_decode(binary, z85.c_str()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("'", z85, "' is not a Z85 CURVE key"));
    }
    keys.insert(std::string(reinterpret_cast<const char*>(binary), 32));
  }
  absl::StatusOr<std::unique_ptr<Socket>> socket =
      Socket::Create(context, zmq::socket_type::rep, SocketOptions());
  if (!socket.ok()) return socket.status();
  if (absl::Status s = (*socket)->Bind(kZapEndpoint); !s.ok()) return s;
  return std::unique_ptr<ZapHandler>(new ZapHandler(std::move(*socket), std::move(keys)));
}

ZapHandler::ZapHandler(std::unique_ptr<Socket> socket, absl::flat_hash_set<std::string> keys)
    : socket_(std::move(socket)), keys_(std::move(keys)) {
  thread_ = std::thread([this] { Run(); });
}

ZapHandler::~ZapHandler() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

Frames ZapHandler::Answer(const Frames& frames) {
  const bool well_formed = frames.size() >= 6 && frames[0] == "1.0";
  const bool ok =
      well_formed && frames[5] == "CURVE" && frames.size() >= 7 && keys_.contains(frames[6]);
  (ok ? allowed_count_ : denied_count_).fetch_add(1, std::memory_order_relaxed);
  if (!ok) std::cerr << "carpool-router: refused a client whose CURVE key is not allowed\n";
  const std::string request_id = frames.size() >= 2 ? frames[1] : "";
  return {"1.0", request_id, ok ? "200" : "400", ok ? "OK" : "key not allowed", "", ""};
}

void ZapHandler::Run() {
  auto report = [](const absl::Status& s) {
    std::cerr << "carpool-router: ZAP handler: " << s.message() << "\n";
  };
  // CANCELLED: the context is being terminated, so the socket must close now (below).
  // ABORTED: interrupted (EINTR); nothing to report.
  while (!stop_.load(std::memory_order_relaxed)) {
    const PollItem items[] = {{socket_.get()}};
    absl::StatusOr<PollResult> readable = Poll(items, kPollMillis);  // EINTR: nothing readable
    if (!readable.ok()) {
      if (absl::IsCancelled(readable.status())) break;
      report(readable.status());
      continue;
    }
    if (!(*readable)[0]) continue;
    absl::StatusOr<std::optional<Frames>> request = socket_->Recv(0);
    if (!request.ok()) {
      if (absl::IsCancelled(request.status())) break;
      if (!absl::IsAborted(request.status())) report(request.status());
      continue;
    }
    if (!request->has_value()) continue;
    if (absl::Status s = socket_->Send(Answer(**request)); !s.ok()) {
      if (absl::IsCancelled(s)) break;
      if (!absl::IsAborted(s)) report(s);
    }
  }
  socket_->Close();
}

}  // namespace carpool::router
