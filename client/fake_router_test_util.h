// Test only: a stand-in carpool router for SDK and CLI tests. A ROUTER socket bound to
// tcp://127.0.0.1:<free port>, served by one thread that decodes every ClientMessage, records it
// and hands it to a handler, which answers with Reply().
#ifndef CARPOOL_CLIENT_FAKE_ROUTER_TEST_UTIL_H_
#define CARPOOL_CLIENT_FAKE_ROUTER_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/codec.h"
#include "common/messages.h"
#include "common/status.h"
#include "common/transport.h"

namespace carpool::testing {

class FakeRouter {
 public:
  // Runs on the router thread for every decoded message.
  using Handler =
      std::function<void(FakeRouter& router, const std::string& peer, const ClientMessage& m)>;

  // Binds `bind` (an ephemeral port by default; another router's endpoint() to stand in for it
  // after it closed). Closing (the destructor) drops every client's connection.
  explicit FakeRouter(Handler handler = Echo, SocketOptions options = {},
                      const std::string& bind = "tcp://127.0.0.1:*")
      : handler_(std::move(handler)) {
    auto socket = Socket::Create(&context_, zmq::socket_type::router, options);
    CARPOOL_CHECK(socket.ok());
    socket_ = std::move(*socket);
    CARPOOL_CHECK(socket_->Bind(bind).ok());
    endpoint_ = socket_->LastEndpoint();
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeRouter() {
    stop_ = true;
    thread_.join();
  }

  const std::string& endpoint() const { return endpoint_; }

  // Router thread only (from the handler).
  void Reply(const std::string& peer, const ServerMessage& m) {
    (void)socket_->Send({peer, Encode(m)});
  }

  // Router thread only: a frame as is (for malformed answers).
  void ReplyRaw(const std::string& peer, const std::string& frame) {
    (void)socket_->Send({peer, frame});
  }

  std::vector<ClientMessage> Received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }

  // Waits at most `timeout` for `pred` to hold over the messages received so far.
  bool WaitFor(const std::function<bool(const std::vector<ClientMessage>&)>& pred,
               absl::Duration timeout = absl::Seconds(10)) const {
    absl::MutexLock lock(&mu_);
    const auto ready = [&] { return pred(received_); };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  }

  // True when a Cancel for `request_id` arrived.
  static bool HasCancel(const std::vector<ClientMessage>& ms, const std::string& request_id) {
    for (const ClientMessage& m : ms) {
      const auto* c = std::get_if<CancelInput>(&m);
      if (c != nullptr && c->request_id == request_id) return true;
    }
    return false;
  }

  // A chat prompt's "rendering" here: its messages' JSON, as is.
  static bool HasTextPrompt(const GenerateInput& g) { return g.has_text || g.chat.has_value(); }
  static const std::string& TextPrompt(const GenerateInput& g) {
    return g.chat.has_value() ? g.chat->messages_json : g.text;
  }

  // The tokens Echo answers with: the prompt (text bytes, a chat's messages JSON, or ids), at
  // most max_tokens of them, with logprob -0.25 * (k + 1) and `logprobs` made-up alternatives
  // each.
  static std::vector<SampleResult> EchoTokens(const GenerateInput& g) {
    std::vector<int32_t> ids = g.token_ids;
    if (HasTextPrompt(g)) {
      const std::string& text = TextPrompt(g);
      ids.clear();
      for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    }
    if (static_cast<int>(ids.size()) > g.sampling.max_tokens) ids.resize(g.sampling.max_tokens);
    std::vector<SampleResult> tokens;
    for (size_t k = 0; k < ids.size(); ++k) {
      SampleResult s;
      s.token = ids[k];
      s.logprob = -0.25f * static_cast<float>(k + 1);
      for (int j = 0; j < g.sampling.logprobs; ++j) {
        s.top_logprobs.push_back({ids[k] + j, s.logprob - static_cast<float>(j)});
      }
      tokens.push_back(std::move(s));
    }
    return tokens;
  }

  // Answers a generate like a router over an echo model: chunks (one per token) and an empty
  // final when streaming, else one final holding everything.
  static void AnswerEcho(FakeRouter& r, const std::string& peer, const GenerateInput& g) {
    std::vector<SampleResult> tokens = EchoTokens(g);
    const auto text_of = [&](size_t begin, size_t end) {
      std::string text;
      if (!HasTextPrompt(g)) return text;
      for (size_t k = begin; k < end; ++k) text.push_back(static_cast<char>(tokens[k].token));
      return text;
    };
    GenerateFinalOut final_out;
    final_out.request_id = g.request_id;
    final_out.finish_reason = "length";
    final_out.usage = {static_cast<int>(HasTextPrompt(g) ? TextPrompt(g).size()
                                                         : g.token_ids.size()),
                       static_cast<int>(tokens.size()), 0};
    final_out.timings = {1.0, 2.0, 3.0};
    if (g.stream) {
      for (size_t k = 0; k < tokens.size(); ++k) {
        r.Reply(peer, GenerateChunkOut{
                          g.request_id, static_cast<int>(k), {tokens[k]}, text_of(k, k + 1)});
      }
    } else {
      final_out.text = text_of(0, tokens.size());
      final_out.tokens = std::move(tokens);
    }
    r.Reply(peer, final_out);
  }

  static StatsOut CannedStats() {
    StatsOut s;
    s.workers.push_back({"worker-1", true, 3, 2, 1000, 250, 640, 64, "synthetic:tiny", 17});
    s.workers.push_back({"worker-2", false, 1, 0, 1000, 0, 0, 64, "synthetic:tiny", 5});
    s.queued = 4;
    s.inflight = 2;
    s.requests_total = 30;
    s.requests_rejected = 3;
    s.rejections_by_reason = {{"queue_full", 2}, {"token_budget", 1}};
    return s;
  }

  // The default handler: echo generates, canned stats, `cancelled` errors for cancels, and the
  // byte tokenizer's answers to tokenize (max_model_len 2048; a chat: of its messages JSON) and
  // detokenize.
  static void Echo(FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    if (const auto* g = std::get_if<GenerateInput>(&m)) {
      AnswerEcho(r, peer, *g);
    } else if (const auto* t = std::get_if<TokenizeInput>(&m)) {
      absl::StatusOr<std::vector<int32_t>> ids = ByteTokenizer().Encode(
          t->chat.has_value() ? t->chat->messages_json : t->text, t->add_special_tokens);
      r.Reply(peer, TokenizeResultOut{t->request_id, *ids, 2048});
    } else if (const auto* d = std::get_if<DetokenizeInput>(&m)) {
      r.Reply(peer, DetokenizeResultOut{
                        d->request_id, ByteTokenizer().Decode(d->token_ids, d->skip_special_tokens)});
    } else if (std::holds_alternative<StatsQuery>(m)) {
      r.Reply(peer, CannedStats());
    } else if (const auto* c = std::get_if<CancelInput>(&m)) {
      r.Reply(peer, ErrorInfo{c->request_id, absl::StatusCode::kCancelled, reason::kCancelled,
                              "cancelled", 0});
    }
  }

 private:
  void Loop() {
    while (!stop_) {
      auto frames = socket_->Recv(20);
      if (!frames.ok() || !frames->has_value() || (*frames)->size() != 2) continue;
      const std::string peer = (**frames)[0];
      absl::StatusOr<ClientMessage> m = DecodeClientMessage((**frames)[1]);
      if (!m.ok()) continue;
      {
        absl::MutexLock lock(&mu_);
        received_.push_back(*m);
      }
      handler_(*this, peer, *m);
    }
  }

  Handler handler_;
  zmq::context_t context_;
  std::unique_ptr<Socket> socket_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::vector<ClientMessage> received_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// A peer that completes a ZMTP 3.1 handshake as a ROUTER (NULL mechanism) and then reads and
// drops everything, answering nothing, not even heartbeat PINGs: a router whose host froze or
// whose network went away without closing the TCP connection.
class SilentZmtpPeer {
 public:
  SilentZmtpPeer() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    CARPOOL_CHECK(listen_fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CARPOOL_CHECK(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    CARPOOL_CHECK(listen(listen_fd_, 8) == 0);
    socklen_t len = sizeof(addr);
    CARPOOL_CHECK(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    endpoint_ = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    thread_ = std::thread([this] { Loop(); });
  }
  ~SilentZmtpPeer() {
    stop_ = true;
    thread_.join();
    for (int fd : peers_) close(fd);
    close(listen_fd_);
  }

  const std::string& endpoint() const { return endpoint_; }
  // Connections accepted so far.
  int accepted() const { return accepted_.load(); }

 private:
  static std::string Handshake() {
    std::string greeting(64, '\0');
    greeting[0] = '\xff';
    greeting[9] = '\x7f';
    greeting[10] = 3;  // ZMTP 3.1: the version with PING/PONG
    greeting[11] = 1;
    greeting.replace(12, 4, "NULL");
    const std::string body = std::string("\x05READY\x0bSocket-Type\0\0\0\x06ROUTER", 28);
    return greeting + std::string("\x04") + static_cast<char>(body.size()) + body;
  }

  void Loop() {
    const std::string hello = Handshake();
    char buf[4096];
    while (!stop_) {
      std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}};
      for (int fd : peers_) fds.push_back({fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd >= 0) {
          CARPOOL_CHECK(write(fd, hello.data(), hello.size()) ==
                        static_cast<ssize_t>(hello.size()));
          peers_.push_back(fd);
          accepted_.fetch_add(1);
        }
      }
      for (size_t k = 1; k < fds.size(); ++k) {
        if ((fds[k].revents & (POLLIN | POLLHUP)) && read(fds[k].fd, buf, sizeof(buf)) <= 0) {
          close(fds[k].fd);  // the client hung up
          peers_.erase(std::find(peers_.begin(), peers_.end(), fds[k].fd));
        }
      }
    }
  }

  int listen_fd_ = -1;
  std::string endpoint_;
  std::vector<int> peers_;  // peer thread only until it stops
  std::atomic<int> accepted_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace carpool::testing

#endif  // CARPOOL_CLIENT_FAKE_ROUTER_TEST_UTIL_H_
