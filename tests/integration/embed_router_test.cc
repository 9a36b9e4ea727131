// Embeddings through the router, in process, against scripted workers on real ZeroMQ sockets and
// the C++ SDK: validation, admission, embed credit, cancel, failures and failover.
#include <chrono>
#include <future>
#include <thread>

#include "client/carpool_client.h"
#include "common/codec.h"
#include "common/transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/router.h"

namespace carpool {
namespace {

using ::testing::HasSubstr;

constexpr int kWaitMs = 5000;

// A scripted worker: registers, then the test reads what the router sends and answers by hand.
struct FakeWorker {
  std::unique_ptr<Socket> socket;
  uint64_t epoch = 0;

  void Send(const WorkerMessage& m) { ASSERT_TRUE(socket->Send({Encode(m)}).ok()); }
  void Heartbeat() { Send(HeartbeatInfo{epoch, {}}); }
  // The next message of the router, or nullopt after wait_ms.
  std::optional<RouterMessage> Recv(int wait_ms = kWaitMs) {
    auto frames = socket->Recv(wait_ms);
    if (!frames.ok() || !frames->has_value()) return std::nullopt;
    auto m = DecodeRouterMessage((**frames)[0]);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return std::nullopt;
    return *m;
  }
  template <typename T>
  T RecvAs() {
    std::optional<RouterMessage> m = Recv();
    EXPECT_TRUE(m.has_value()) << "the worker got nothing";
    if (!m.has_value()) return T{};
    EXPECT_TRUE(std::holds_alternative<T>(*m)) << "got message index " << m->index();
    return std::holds_alternative<T>(*m) ? std::get<T>(*m) : T{};
  }
};

class EmbedRouterTest : public ::testing::Test {
 protected:
  void StartRouter(int64_t heartbeat_timeout_ms = 60'000) {
    router::RouterOptions o;
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    o.heartbeat_timeout_ms = heartbeat_timeout_ms;
    o.request_limits.max_embed_inputs = 16;
    auto router = router::Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
    ClientOptions c;
    c.router_endpoint = router_->frontend_endpoint();
    c.default_timeout_ms = 10'000;
    c.max_retries = 0;
    auto client = Client::Connect(c);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  void TearDown() override {
    client_.reset();
    workers_.clear();
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  // Registers a worker that embeds `embed_queue_size` inputs at once (0: cannot embed).
  FakeWorker* StartWorker(const std::string& id, int embed_queue_size) {
    auto w = std::make_unique<FakeWorker>();
    SocketOptions so;
    so.routing_id = id;
    auto s = Socket::Create(&context_, zmq::socket_type::dealer, so);
    EXPECT_TRUE(s.ok());
    w->socket = std::move(*s);
    EXPECT_TRUE(w->socket->Connect(router_->backend_endpoint()).ok());
    RegisterInfo r;
    r.worker_id = id;
    r.model = "fake";
    r.max_num_seqs = 8;
    r.num_kv_blocks = 100;
    r.block_size = 16;
    r.max_model_len = 64;
    r.vocab_size = 300;
    r.tokenizer = TokenizerKind::kByte;
    r.bos_token_id = 256;
    r.embed_queue_size = embed_queue_size;
    r.hidden_size = 4;
    w->Send(r);
    w->epoch = w->RecvAs<RegisterAckInfo>().epoch;
    EXPECT_GT(w->epoch, 0u);
    workers_.push_back(std::move(w));
    return workers_.back().get();
  }

  static EmbedInput Texts(std::vector<std::string> texts) {
    EmbedInput in;
    for (std::string& t : texts) in.inputs.push_back({true, std::move(t), {}});
    return in;
  }

  std::future<absl::StatusOr<EmbedResult>> EmbedAsync(EmbedInput in) {
    return std::async(std::launch::async,
                      [this, in = std::move(in)] { return client_->Embed(in); });
  }

  // Waits (bounded) until the router holds nothing: no request queued or in flight and no
  // reserved tokens.
  void ExpectCountersBackToZero() {
    StatsOut s;
    for (int i = 0; i < 100; ++i) {
      auto stats = client_->Stats(kWaitMs);
      ASSERT_TRUE(stats.ok()) << stats.status();
      s = *stats;
      if (s.queued == 0 && s.inflight == 0 && s.queued_tokens == 0 && s.inflight_tokens == 0) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << "queued " << s.queued << ", inflight " << s.inflight << ", queued_tokens "
           << s.queued_tokens << ", inflight_tokens " << s.inflight_tokens;
  }

  static std::vector<std::vector<float>> Vectors(size_t n) {
    std::vector<std::vector<float>> v;
    for (size_t i = 0; i < n; ++i) v.push_back({float(i), 1, 2, 3});
    return v;
  }

  zmq::context_t context_{1};
  std::unique_ptr<router::Router> router_;
  std::thread thread_;
  std::unique_ptr<Client> client_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

TEST_F(EmbedRouterTest, TokenizesDispatchesAndAnswersInOrder) {
  StartRouter();
  FakeWorker* w = StartWorker("w1", 64);
  EmbedInput in = Texts({"hi", "abc"});
  in.inputs.push_back({false, "", {7, 8}});
  in.normalize = false;
  in.pooling = Pooling::kLast;
  in.priority = Priority::kInteractive;
  auto result = EmbedAsync(in);
  EmbedDispatchInfo d = w->RecvAs<EmbedDispatchInfo>();
  ASSERT_EQ(d.inputs.size(), 3u);
  EXPECT_EQ(d.inputs[0], (std::vector<int32_t>{256, 'h', 'i'}));
  EXPECT_EQ(d.inputs[1], (std::vector<int32_t>{256, 'a', 'b', 'c'}));
  EXPECT_EQ(d.inputs[2], (std::vector<int32_t>{7, 8}));
  EXPECT_FALSE(d.normalize);
  EXPECT_EQ(d.pooling, Pooling::kLast);
  EXPECT_EQ(d.priority, Priority::kInteractive);
  w->Send(EmbedDoneInfo{w->epoch, d.dispatch_id, Vectors(3)});
  absl::StatusOr<EmbedResult> r = result.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->embeddings, Vectors(3));
  EXPECT_EQ(r->usage.prompt_tokens, 3 + 4 + 2);
  EXPECT_GE(r->timings.total_ms, r->timings.queue_ms);
  EXPECT_FALSE(r->request_id.empty());
  ExpectCountersBackToZero();
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->requests_total, 1);
  ASSERT_EQ(stats->workers.size(), 1u);
  EXPECT_EQ(stats->workers[0].requests_served, 1);
}

TEST_F(EmbedRouterTest, InvalidInputsGetTypedErrorsNamingTheInput) {
  StartRouter();
  FakeWorker* w = StartWorker("w1", 64);
  struct Case {
    EmbedInput input;
    const char* reason;
    const char* text;
  };
  EmbedInput too_many = Texts(std::vector<std::string>(17, "x"));
  EmbedInput out_of_vocab = Texts({"ok"});
  out_of_vocab.inputs.push_back({false, "", {1, 300}});
  EmbedInput empty_ids = Texts({"ok", "ok"});
  empty_ids.inputs.push_back({false, "", {}});
  std::vector<Case> cases = {
      {EmbedInput{}, "invalid_argument", "inputs is empty"},
      {too_many, "invalid_argument", "the limit is 16"},
      {Texts({"ok", ""}), "invalid_argument", "inputs[1]: text is empty"},
      {empty_ids, "invalid_argument", "inputs[2] is empty"},
      {out_of_vocab, "invalid_argument", "inputs[1] token 1 has id 300"},
      {Texts({"ok", std::string(64, 'x')}), "prompt_too_long", "inputs[1] is 65 tokens"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<EmbedResult> r = client_->Embed(c.input);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_EQ(ErrorReason(r.status()), c.reason) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.text));
  }
  // 63 bytes + BOS = 64 = max_model_len: an embedding may fill the context.
  auto ok = EmbedAsync(Texts({std::string(63, 'y')}));
  EmbedDispatchInfo d = w->RecvAs<EmbedDispatchInfo>();
  EXPECT_EQ(d.inputs[0].size(), 64u);
  w->Send(EmbedDoneInfo{w->epoch, d.dispatch_id, Vectors(1)});
  EXPECT_TRUE(ok.get().ok());
  EXPECT_FALSE(w->Recv(100).has_value()) << "an invalid request reached the worker";
  ExpectCountersBackToZero();
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->rejections_by_reason["invalid_argument"], 5);
  EXPECT_EQ(stats->rejections_by_reason["prompt_too_long"], 1);
}

TEST_F(EmbedRouterTest, NoWorkerThatEmbedsIsFailedPrecondition) {
  StartRouter();
  FakeWorker* w = StartWorker("gen-only", 0);
  absl::StatusOr<EmbedResult> r = client_->Embed(Texts({"hello"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_EQ(ErrorReason(r.status()), "unsupported");
  EXPECT_FALSE(w->Recv(100).has_value());
  ExpectCountersBackToZero();
}

TEST_F(EmbedRouterTest, QueuedBeforeAnyWorkerThenFailedWhenNoneCanEmbed) {
  StartRouter();
  auto r = EmbedAsync(Texts({"hello"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // queued: no worker yet
  StartWorker("gen-only", 0);
  absl::StatusOr<EmbedResult> result = r.get();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectCountersBackToZero();
}

TEST_F(EmbedRouterTest, EmbedCreditLimitsInputsInFlightPerWorker) {
  StartRouter();
  FakeWorker* w = StartWorker("w1", 4);
  auto first = EmbedAsync(Texts({"a", "b", "c"}));
  EmbedDispatchInfo d1 = w->RecvAs<EmbedDispatchInfo>();
  auto second = EmbedAsync(Texts({"d", "e"}));
  // 3 + 2 > 4: the second waits for the first.
  EXPECT_FALSE(w->Recv(300).has_value());
  w->Send(EmbedDoneInfo{w->epoch, d1.dispatch_id, Vectors(3)});
  EmbedDispatchInfo d2 = w->RecvAs<EmbedDispatchInfo>();
  EXPECT_EQ(d2.inputs.size(), 2u);
  w->Send(EmbedDoneInfo{w->epoch, d2.dispatch_id, Vectors(2)});
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());
  // Larger than any worker's whole embed queue: refused, naming the limit.
  absl::StatusOr<EmbedResult> big = client_->Embed(Texts({"1", "2", "3", "4", "5", "6"}));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("embed at most 4 at once"));
  EXPECT_FALSE(w->Recv(100).has_value());
  ExpectCountersBackToZero();
}

TEST_F(EmbedRouterTest, EmbedsDoNotTakeSequenceSlotsAndGenerateStillFlows) {
  StartRouter();
  FakeWorker* w = StartWorker("w1", 64);
  auto e = EmbedAsync(Texts({"a"}));
  EmbedDispatchInfo d = w->RecvAs<EmbedDispatchInfo>();
  GenerateInput g;
  g.token_ids = {256, 1};
  g.sampling.max_tokens = 1;
  auto gen = std::async(std::launch::async, [&] { return client_->Generate(g); });
  DispatchInfo gd = w->RecvAs<DispatchInfo>();
  TokenEvent t;
  t.dispatch_id = gd.dispatch_id;
  t.has_token = true;
  t.token.token = 'k';
  t.finished = true;
  t.finish_reason = "length";
  w->Send(StepTokensInfo{w->epoch, {t}, {}});
  EXPECT_TRUE(gen.get().ok());
  w->Send(EmbedDoneInfo{w->epoch, d.dispatch_id, Vectors(1)});
  EXPECT_TRUE(e.get().ok());
  ExpectCountersBackToZero();
}

TEST_F(EmbedRouterTest, WorkerFailureReachesTheClient) {
  StartRouter();
  FakeWorker* w = StartWorker("w1", 64);
  auto r = EmbedAsync(Texts({"a"}));
  EmbedDispatchInfo d = w->RecvAs<EmbedDispatchInfo>();
  RequestFailedInfo f;
  f.epoch = w->epoch;
  f.dispatch_id = d.dispatch_id;
  f.error = ErrorInfo{"", absl::StatusCode::kResourceExhausted, "queue_full",
                      "the embed queue is full", 0};
  w->Send(f);
  absl::StatusOr<EmbedResult> result = r.get();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrorReason(result.status()), "queue_full");
  ExpectCountersBackToZero();
}

TEST_F(EmbedRouterTest, WrongNumberOfEmbeddingsIsInternal) {
  StartRouter();
  FakeWorker* w = StartWorker("w1", 64);
  auto r = EmbedAsync(Texts({"a", "b"}));
  EmbedDispatchInfo d = w->RecvAs<EmbedDispatchInfo>();
  w->Send(EmbedDoneInfo{w->epoch, d.dispatch_id, Vectors(1)});
  absl::StatusOr<EmbedResult> result = r.get();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  ExpectCountersBackToZero();
}

// Every vector must have the width the worker registered (hidden_size 4 here): an empty or
// short one is the worker's bug, not an answer to pass on.
TEST_F(EmbedRouterTest, EmptyOrWrongWidthEmbeddingIsInternal) {
  StartRouter();
  FakeWorker* w = StartWorker("w1", 64);
  // The next dispatch, past the cancels the router sends for the requests it failed.
  const auto next_dispatch = [w] {
    for (std::optional<RouterMessage> m = w->Recv(); m.has_value(); m = w->Recv()) {
      if (std::holds_alternative<EmbedDispatchInfo>(*m)) return std::get<EmbedDispatchInfo>(*m);
      EXPECT_TRUE(std::holds_alternative<WorkerCancelInfo>(*m)) << "message " << m->index();
    }
    ADD_FAILURE() << "no dispatch";
    return EmbedDispatchInfo{};
  };
  const std::vector<std::vector<std::vector<float>>> answers = {
      {{1, 2, 3, 4}, {}}, {{1, 2, 3}, {1, 2, 3, 4}}, {{1, 2, 3, 4, 5}}};
  for (const auto& answer : answers) {
    auto r = EmbedAsync(Texts(std::vector<std::string>(answer.size(), "x")));
    EmbedDispatchInfo d = next_dispatch();
    w->Send(EmbedDoneInfo{w->epoch, d.dispatch_id, answer});
    absl::StatusOr<EmbedResult> result = r.get();
    ASSERT_FALSE(result.ok()) << "a vector of the wrong width reached the client";
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
    EXPECT_THAT(result.status().message(), HasSubstr("hidden_size 4"));
  }
  ExpectCountersBackToZero();
  // The worker's embed credit came back: a request of its whole queue still goes out.
  auto big = EmbedAsync(Texts(std::vector<std::string>(16, "y")));
  EmbedDispatchInfo d = next_dispatch();
  ASSERT_EQ(d.inputs.size(), 16u);
  w->Send(EmbedDoneInfo{w->epoch, d.dispatch_id, Vectors(16)});
  EXPECT_TRUE(big.get().ok());
  ExpectCountersBackToZero();
}

// A worker that refuses an embed because it is draining still serves embeddings: the request
// waits for a worker with credit instead of failing "unsupported".
TEST_F(EmbedRouterTest, DrainingWorkersRefusalWaitsForAnotherWorker) {
  StartRouter();
  FakeWorker* w1 = StartWorker("w1", 64);
  auto r = EmbedAsync(Texts({"a", "b"}));
  EmbedDispatchInfo d1 = w1->RecvAs<EmbedDispatchInfo>();
  RequestFailedInfo f;
  f.epoch = w1->epoch;
  f.dispatch_id = d1.dispatch_id;
  f.error = ErrorInfo{"", absl::StatusCode::kUnavailable, "draining", "worker is draining", 0};
  w1->Send(f);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  FakeWorker* w2 = StartWorker("w2", 64);
  std::optional<RouterMessage> m = w2->Recv();
  ASSERT_TRUE(m.has_value() && std::holds_alternative<EmbedDispatchInfo>(*m))
      << "the refused embed did not go to the new worker";
  EmbedDispatchInfo d2 = std::get<EmbedDispatchInfo>(*m);
  EXPECT_EQ(d2.inputs, d1.inputs);
  w2->Send(EmbedDoneInfo{w2->epoch, d2.dispatch_id, Vectors(2)});
  absl::StatusOr<EmbedResult> result = r.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->embeddings, Vectors(2));
  ExpectCountersBackToZero();
}

TEST_F(EmbedRouterTest, CancelTellsTheWorkerAndReleasesAdmission) {
  StartRouter();
  FakeWorker* w = StartWorker("w1", 64);
  EmbedInput in = Texts({"a", "b"});
  in.request_id = "to-cancel";
  auto r = EmbedAsync(in);
  EmbedDispatchInfo d = w->RecvAs<EmbedDispatchInfo>();
  ASSERT_TRUE(client_->Cancel("to-cancel").ok());
  absl::StatusOr<EmbedResult> result = r.get();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  WorkerCancelInfo c = w->RecvAs<WorkerCancelInfo>();
  EXPECT_EQ(c.dispatch_id, d.dispatch_id);
  // A late answer for the cancelled dispatch is dropped.
  w->Send(EmbedDoneInfo{w->epoch, d.dispatch_id, Vectors(2)});
  ExpectCountersBackToZero();
}

TEST_F(EmbedRouterTest, DeadWorkersEmbedIsRedispatchedElsewhere) {
  StartRouter(/*heartbeat_timeout_ms=*/400);
  FakeWorker* w1 = StartWorker("w1", 64);
  auto r = EmbedAsync(Texts({"a", "bc"}));
  EmbedDispatchInfo d1 = w1->RecvAs<EmbedDispatchInfo>();
  FakeWorker* w2 = StartWorker("w2", 64);
  // w1 goes silent; w2 keeps beating until the embed comes to it.
  std::optional<EmbedDispatchInfo> d2;
  for (int i = 0; i < 50 && !d2; ++i) {
    w2->Heartbeat();
    std::optional<RouterMessage> m = w2->Recv(100);
    if (m && std::holds_alternative<EmbedDispatchInfo>(*m)) d2 = std::get<EmbedDispatchInfo>(*m);
  }
  ASSERT_TRUE(d2.has_value()) << "the embed was not re-dispatched";
  EXPECT_EQ(d2->inputs, d1.inputs);
  EXPECT_NE(d2->dispatch_id, d1.dispatch_id);
  // The dead worker's late answer is stale (old epoch or unknown worker) and ignored.
  w1->Send(EmbedDoneInfo{w1->epoch, d1.dispatch_id, {{9, 9, 9, 9}, {9, 9, 9, 9}}});
  w2->Send(EmbedDoneInfo{w2->epoch, d2->dispatch_id, Vectors(2)});
  absl::StatusOr<EmbedResult> result = r.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->embeddings, Vectors(2));
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->migrations, 1);
  ExpectCountersBackToZero();
}

}  // namespace
}  // namespace carpool
