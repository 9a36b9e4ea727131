// A test fixture for driving the router's protocol frame by frame: a Router in-process on
// ephemeral loopback ports, scripted workers (FakeWorker: the test reads what the router sends
// and answers by hand) and raw client DEALER sockets. Used by router_test and liveness_test.
#ifndef CARPOOL_ROUTER_TESTING_SCRIPTED_ROUTER_H_
#define CARPOOL_ROUTER_TESTING_SCRIPTED_ROUTER_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "common/codec.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "router/router.h"

namespace carpool::router {

class ScriptedRouterTest : public ::testing::Test {
 protected:
  // How long a receive waits for a message that must come.
  static constexpr int kWaitMs = 5000;

  // Starts the router with `o`, its frontend and backend on ephemeral 127.0.0.1 ports.
  void StartRouter(RouterOptions o) {
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    auto router = Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
  }

  void TearDown() override {
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  std::unique_ptr<Socket> Dealer(const std::string& endpoint, const std::string& id,
                                 zmq::context_t* context = nullptr) {
    SocketOptions so;
    so.routing_id = id;
    auto s = Socket::Create(context ? context : &context_, zmq::socket_type::dealer, so);
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE((*s)->Connect(endpoint).ok());
    return std::move(*s);
  }

  struct FakeWorker {
    std::unique_ptr<Socket> socket;
    uint64_t epoch = 0;
    void Send(const WorkerMessage& m) { ASSERT_TRUE(socket->Send({Encode(m)}).ok()); }
    void Heartbeat(int kv_used_blocks = 0) {
      WorkerLoad load;
      load.kv_used_blocks = kv_used_blocks;
      Send(HeartbeatInfo{epoch, load});
    }
    // The next message within wait_ms; nullopt when none came.
    std::optional<RouterMessage> Recv(int wait_ms = kWaitMs) {
      auto frames = socket->Recv(wait_ms);
      if (!frames.ok() || !frames->has_value()) return std::nullopt;
      auto m = DecodeRouterMessage((**frames)[0]);
      EXPECT_TRUE(m.ok());
      if (!m.ok()) return std::nullopt;
      return *m;
    }
    // The next message, which must come and be a T.
    template <typename T>
    T RecvAs() {
      std::optional<RouterMessage> m = Recv();
      EXPECT_TRUE(m.has_value()) << "the worker got nothing";
      if (!m.has_value()) return T{};
      EXPECT_TRUE(std::holds_alternative<T>(*m)) << "got message index " << m->index();
      return std::holds_alternative<T>(*m) ? std::get<T>(*m) : T{};
    }
  };

  // A worker of model "fake" (byte tokenizer, 100 blocks of 16, max_model_len 64), registered.
  FakeWorker StartWorker(const std::string& id, int max_seqs = 8) {
    return StartWorker(FakeRegistration(id, max_seqs));
  }
  // A worker registered with `r`.
  FakeWorker StartWorker(const RegisterInfo& r) {
    FakeWorker w;
    w.socket = Dealer(router_->backend_endpoint(), r.worker_id);
    w.Send(r);
    w.epoch = w.RecvAs<RegisterAckInfo>().epoch;
    EXPECT_GT(w.epoch, 0u);
    return w;
  }
  // What StartWorker(id, max_seqs) registers.
  static RegisterInfo FakeRegistration(const std::string& id, int max_seqs = 8) {
    RegisterInfo r;
    r.worker_id = id;
    r.model = "fake";
    r.max_num_seqs = max_seqs;
    r.num_kv_blocks = 100;
    r.block_size = 16;
    r.max_model_len = 64;
    r.vocab_size = 300;
    r.tokenizer = TokenizerKind::kByte;
    r.bos_token_id = 256;
    return r;
  }

  static TokenEvent Token(uint64_t dispatch_id, int32_t token, bool finished = false) {
    TokenEvent e;
    e.dispatch_id = dispatch_id;
    e.has_token = true;
    e.token.token = token;
    e.token.logprob = -0.5f;
    e.finished = finished;
    e.finish_reason = finished ? "length" : "";
    return e;
  }

  static GenerateInput Request(const std::string& id, std::vector<int32_t> ids, int max_tokens,
                               bool stream) {
    GenerateInput g;
    g.request_id = id;
    g.token_ids = std::move(ids);
    g.sampling.max_tokens = max_tokens;
    g.stream = stream;
    return g;
  }

  static void SendClient(Socket* c, const ClientMessage& m) {
    ASSERT_TRUE(c->Send({Encode(m)}).ok());
  }
  // The next message within wait_ms; nullopt when none came.
  static std::optional<ServerMessage> TryRecvClient(Socket* c, int wait_ms = kWaitMs) {
    auto frames = c->Recv(wait_ms);
    if (!frames.ok() || !frames->has_value()) return std::nullopt;
    auto m = DecodeServerMessage((**frames)[0]);
    EXPECT_TRUE(m.ok());
    if (!m.ok()) return std::nullopt;
    return *m;
  }
  // The next message, which must come (an empty ErrorInfo when it did not).
  static ServerMessage RecvClient(Socket* c) {
    std::optional<ServerMessage> m = TryRecvClient(c);
    EXPECT_TRUE(m.has_value()) << "the client got nothing";
    return m.has_value() ? *std::move(m) : ServerMessage(ErrorInfo{});
  }
  template <typename T>
  static T RecvClientAs(Socket* c) {
    ServerMessage m = RecvClient(c);
    EXPECT_TRUE(std::holds_alternative<T>(m)) << "got message index " << m.index();
    return std::holds_alternative<T>(m) ? std::get<T>(m) : T{};
  }
  static ErrorInfo RecvError(Socket* c) { return RecvClientAs<ErrorInfo>(c); }

  zmq::context_t context_{1};
  std::unique_ptr<Router> router_;
  std::thread thread_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_TESTING_SCRIPTED_ROUTER_H_
