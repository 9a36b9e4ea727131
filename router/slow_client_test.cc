// A client that sends many streaming requests and does not read: the router keeps a bounded
// backlog for it; when that overflows it cancels the client's requests (the worker is told, so
// their KV goes at once) and ends each with exactly one client_too_slow error, delivered when the
// client reads again. Another client, reading normally meanwhile, is not affected.
#include <map>
#include <thread>

#include "common/clock.h"
#include "common/codec.h"
#include "gtest/gtest.h"
#include "router/router.h"
#include "router/testing/sim_worker.h"
#include "zmq.hpp"

namespace carpool::router {
namespace {

constexpr int kSlowRequests = 2000;
constexpr int kFastRequests = 100;
constexpr int kMaxTokens = 16;

int64_t NowMs() { return Clock::Real()->NowMicros() / 1000; }

GenerateInput Streaming(const std::string& id, int tag) {
  GenerateInput g;
  g.request_id = id;
  g.token_ids = testing::TaggedPrompt(tag);
  g.sampling.max_tokens = kMaxTokens;
  g.stream = true;
  return g;
}

// What one client saw of one request.
struct Seen {
  int terminals = 0;
  int chunks = 0;
  bool chunk_after_end = false;
  bool in_order = true;
  std::optional<GenerateFinalOut> final;
  std::optional<ErrorInfo> error;
};

void Note(const ServerMessage& m, std::map<std::string, Seen>* seen) {
  if (auto* c = std::get_if<GenerateChunkOut>(&m)) {
    Seen& s = (*seen)[c->request_id];
    if (s.terminals > 0) s.chunk_after_end = true;
    if (c->index != s.chunks) s.in_order = false;
    ++s.chunks;
  } else if (auto* f = std::get_if<GenerateFinalOut>(&m)) {
    Seen& s = (*seen)[f->request_id];
    ++s.terminals;
    s.final = *f;
  } else if (auto* e = std::get_if<ErrorInfo>(&m)) {
    Seen& s = (*seen)[e->request_id];
    ++s.terminals;
    s.error = *e;
  }
}

class SlowClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RouterOptions o;
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    // ZeroMQ's own queue small, so that the router's backlog (default limits) fills soon.
    o.client_send_hwm = 100;
    auto router = Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
    testing::SimWorkerOptions w;
    w.max_num_seqs = 256;
    w.step_ms = 1;
    worker_ = std::make_unique<testing::SimWorker>(router_->backend_endpoint(), w);
    const int64_t give_up = NowMs() + 5000;
    while (testing::QueryStats(router_->frontend_endpoint()).workers.empty()) {
      ASSERT_LT(NowMs(), give_up) << "the worker did not register";
    }
  }

  void TearDown() override {
    worker_.reset();
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  std::unique_ptr<Router> router_;
  std::thread thread_;
  std::unique_ptr<testing::SimWorker> worker_;
};

TEST_F(SlowClientTest, OverflowEndsEveryRequestExactlyOnceAndSparesOthers) {
  const std::string frontend = router_->frontend_endpoint();
  // The reading client: streams spread over the slow client's flood.
  std::vector<testing::Scripted> script;
  for (int i = 0; i < kFastRequests; ++i) {
    script.push_back({i * 10, Streaming("fast-" + std::to_string(i), 30000 + i)});
  }
  std::map<std::string, testing::Outcome> fast;
  std::thread fast_thread([&] { fast = testing::Drive(frontend, script, 30'000); });

  // The slow one: a raw DEALER that takes 10 messages and a small kernel buffer, then stops.
  zmq::context_t context;
  zmq::socket_t slow(context, zmq::socket_type::dealer);
  slow.set(zmq::sockopt::rcvhwm, 10);
  slow.set(zmq::sockopt::rcvbuf, 4096);
  slow.set(zmq::sockopt::linger, 0);
  slow.connect(frontend);
  const int64_t start = NowMs();
  for (int i = 0; i < kSlowRequests; ++i) {
    const std::string frame = Encode(ClientMessage(Streaming("slow-" + std::to_string(i), i)));
    ASSERT_TRUE(slow.send(zmq::buffer(frame), zmq::send_flags::none).has_value());
  }
  // Everything ends on the router's side (finished or cancelled) while nobody reads.
  const int64_t give_up = NowMs() + 30'000;
  for (;;) {
    StatsOut s = testing::QueryStats(frontend);
    if (s.requests_total >= kSlowRequests + kFastRequests && s.inflight == 0 && s.queued == 0) {
      break;
    }
    ASSERT_LT(NowMs(), give_up) << "requests still open: " << s.inflight << " + " << s.queued;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t all_ended = NowMs();
  fast_thread.join();

  // Now read: exactly one final or error per request, none lost.
  std::map<std::string, Seen> seen;
  int ended = 0;
  while (ended < kSlowRequests) {
    zmq::pollitem_t item{slow.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(5000)) == 0) break;
    zmq::message_t msg;
    ASSERT_TRUE(slow.recv(msg, zmq::recv_flags::none).has_value());
    absl::StatusOr<ServerMessage> m = DecodeServerMessage(msg.to_string_view());
    ASSERT_TRUE(m.ok()) << m.status();
    const bool terminal = !std::holds_alternative<GenerateChunkOut>(*m);
    Note(*m, &seen);
    ended += terminal ? 1 : 0;
  }
  int finals = 0, too_slow = 0;
  for (int i = 0; i < kSlowRequests; ++i) {
    const std::string id = "slow-" + std::to_string(i);
    const Seen& s = seen[id];
    ASSERT_EQ(s.terminals, 1) << id;
    EXPECT_FALSE(s.chunk_after_end) << id;
    EXPECT_TRUE(s.in_order) << id;
    if (s.final.has_value()) {
      ++finals;
      // A final means the whole stream came.
      EXPECT_EQ(s.chunks, kMaxTokens) << id;
      EXPECT_EQ(s.final->usage.completion_tokens, kMaxTokens) << id;
    } else {
      EXPECT_EQ(s.error->reason, reason::kClientTooSlow) << id << ": " << s.error->message;
      EXPECT_EQ(s.error->code, absl::StatusCode::kResourceExhausted) << id;
      ++too_slow;
    }
  }
  EXPECT_GT(too_slow, 0) << "the backlog never overflowed: the test proves nothing";
  EXPECT_EQ(seen.size(), static_cast<size_t>(kSlowRequests));
  std::cerr << "slow client: " << finals << " finals, " << too_slow << " client_too_slow; "
            << "router done " << all_ended - start << " ms after the first send, "
            << "read in " << NowMs() - all_ended << " ms\n";

  // The reading client got every stream whole.
  ASSERT_EQ(fast.size(), static_cast<size_t>(kFastRequests));
  for (const auto& [id, o] : fast) {
    EXPECT_TRUE(o.ended && o.ok) << id << ": " << o.error.reason << " " << o.error.message;
    EXPECT_EQ(o.final.usage.completion_tokens, kMaxTokens) << id;
  }

  // Having read everything, the slow client is served normally again.
  const std::string again = Encode(ClientMessage(Streaming("again", 42)));
  ASSERT_TRUE(slow.send(zmq::buffer(again), zmq::send_flags::none).has_value());
  std::map<std::string, Seen> after;
  while (after["again"].terminals == 0) {
    zmq::pollitem_t item{slow.handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(5000)), 1);
    zmq::message_t msg;
    ASSERT_TRUE(slow.recv(msg, zmq::recv_flags::none).has_value());
    absl::StatusOr<ServerMessage> m = DecodeServerMessage(msg.to_string_view());
    ASSERT_TRUE(m.ok());
    Note(*m, &after);
  }
  EXPECT_TRUE(after["again"].final.has_value());
  EXPECT_EQ(after["again"].chunks, kMaxTokens);
}

}  // namespace
}  // namespace carpool::router
