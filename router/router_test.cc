// The router in-process, against fake workers and clients on real ZeroMQ sockets.
#include "router/router.h"

#include <thread>

#include "client/carpool_client.h"
#include "common/codec.h"
#include "common/transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/carpool.pb.h"
#include "router/testing/scripted_router.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

class RouterTest : public ScriptedRouterTest {
 protected:
  void StartRouter(int64_t heartbeat_timeout_ms = 60'000, TenantTable tenants = {}) {
    RouterOptions o;
    o.tenants = std::move(tenants);
    o.admin_api_keys = {"key-admin"};
    o.heartbeat_timeout_ms = heartbeat_timeout_ms;
    o.max_request_bytes = 64 << 10;
    ScriptedRouterTest::StartRouter(std::move(o));
  }

  static GenerateInput TextRequest(const std::string& id, size_t bytes) {
    GenerateInput g = Request(id, {}, 1, false);
    g.has_text = true;
    g.text = std::string(bytes, 'a');
    return g;
  }
};

TEST_F(RouterTest, StreamsTokensInOrderThenFinal) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", {256, 65, 66}, 3, /*stream=*/true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{256, 65, 66}));
  EXPECT_TRUE(d.sampling.has_seed);  // resolved by the router
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'x')}, {}});
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'y')}, {}});
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'z', true)}, {}});
  for (int i = 0; i < 3; ++i) {
    ServerMessage m = RecvClient(client.get());
    ASSERT_TRUE(std::holds_alternative<GenerateChunkOut>(m));
    const auto& c = std::get<GenerateChunkOut>(m);
    EXPECT_EQ(c.request_id, "r1");
    EXPECT_EQ(c.index, i);
    ASSERT_EQ(c.tokens.size(), 1u);
    EXPECT_EQ(c.tokens[0].token, "xyz"[i]);
    EXPECT_EQ(c.text, std::string(1, "xyz"[i]));
  }
  ServerMessage m = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<GenerateFinalOut>(m));
  const auto& f = std::get<GenerateFinalOut>(m);
  EXPECT_EQ(f.finish_reason, "length");
  EXPECT_EQ(f.usage.prompt_tokens, 3);
  EXPECT_EQ(f.usage.completion_tokens, 3);
  EXPECT_TRUE(f.tokens.empty());
}

TEST_F(RouterTest, NonStreamingGetsEverythingInFinalAndTextIsTokenized) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  GenerateInput g = Request("r1", {}, 2, false);
  g.has_text = true;
  g.text = "hi";
  SendClient(client.get(), g);
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{256, 'h', 'i'}));
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'o'), Token(d.dispatch_id, 'k', true)}, {}});
  ServerMessage m = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<GenerateFinalOut>(m));
  EXPECT_EQ(std::get<GenerateFinalOut>(m).text, "ok");
  EXPECT_EQ(std::get<GenerateFinalOut>(m).tokens.size(), 2u);
}

TEST_F(RouterTest, BadInputGetsTypedErrorsWhileAnotherClientIsServed) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto bad = Dealer(router_->frontend_endpoint(), "bad");
  auto good = Dealer(router_->frontend_endpoint(), "good");
  SendClient(good.get(), Request("g1", {256, 1}, 2, true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 5)}, {}});

  ASSERT_TRUE(bad->Send({"definitely not protobuf \xff\xff"}).ok());
  EXPECT_THAT(RecvError(bad.get()).message, HasSubstr("not a carpool.v1.ClientMessage"));

  v1::ClientMessage wrong_version;
  wrong_version.set_protocol_version(99);
  wrong_version.mutable_stats();
  ASSERT_TRUE(bad->Send({wrong_version.SerializeAsString()}).ok());
  EXPECT_THAT(RecvError(bad.get()).message, HasSubstr("protocol version 99"));

  v1::ClientMessage no_body;
  no_body.set_protocol_version(kProtocolVersion);
  ASSERT_TRUE(bad->Send({no_body.SerializeAsString()}).ok());
  EXPECT_THAT(RecvError(bad.get()).message, HasSubstr("unknown client message type"));

  ASSERT_TRUE(bad->Send({std::string(100 << 10, 'x')}).ok());
  ErrorInfo big = RecvError(bad.get());
  EXPECT_EQ(big.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message, HasSubstr("exceeds the limit"));

  struct Case {
    GenerateInput input;
    const char* reason;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({Request("", {1}, 1, false), reason::kInvalidArgument, "request_id"});
  cases.push_back({Request("b1", {}, 1, false), reason::kInvalidArgument, "empty"});
  cases.push_back({Request("b2", {1, 300}, 1, false), reason::kInvalidArgument, "vocabulary"});
  cases.push_back({Request("b3", {1}, 0, false), reason::kInvalidArgument, "max_tokens"});
  cases.push_back(
      {Request("b4", std::vector<int32_t>(64, 1), 1, false), reason::kPromptTooLong, "prompt"});
  cases.push_back({Request("b5", {1, 2}, 63, false), reason::kInvalidArgument, "max_model_len"});
  Case top_p{Request("b6", {1}, 1, false), reason::kInvalidArgument, "top_p"};
  top_p.input.sampling.top_p = 0;
  cases.push_back(top_p);
  Case stops{Request("b7", {1}, 1, false), reason::kInvalidArgument, "stop_token_ids"};
  stops.input.sampling.stop_token_ids.assign(65, 1);
  cases.push_back(stops);
  cases.push_back({Request("g1", {1}, 1, false), reason::kInvalidArgument, ""});  // not a dup:
  for (const Case& c : cases) {
    if (c.input.request_id == "g1") continue;
    SendClient(bad.get(), c.input);
    ErrorInfo e = RecvError(bad.get());
    EXPECT_EQ(e.reason, c.reason) << c.message;
    EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(e.message, HasSubstr(c.message));
    EXPECT_EQ(e.request_id, c.input.request_id);
  }
  // Duplicate request id from the same client.
  SendClient(good.get(), Request("g1", {256}, 1, false));

  // The good client was served throughout: its first chunk, then the duplicate's error.
  ServerMessage first = RecvClient(good.get());
  ASSERT_TRUE(std::holds_alternative<GenerateChunkOut>(first));
  ErrorInfo dup = RecvError(good.get());
  EXPECT_THAT(dup.message, HasSubstr("already in flight"));
  EXPECT_EQ(dup.reason, reason::kDuplicateRequestId);
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 6, true)}, {}});
  EXPECT_TRUE(std::holds_alternative<GenerateChunkOut>(RecvClient(good.get())));
  EXPECT_TRUE(std::holds_alternative<GenerateFinalOut>(RecvClient(good.get())));
}

TEST_F(RouterTest, CancelMidStreamReachesTheWorkerAndDropsLateTokens) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", {1, 2}, 10, true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 7)}, {}});
  EXPECT_TRUE(std::holds_alternative<GenerateChunkOut>(RecvClient(client.get())));
  SendClient(client.get(), CancelInput{"r1"});
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.reason, reason::kCancelled);
  EXPECT_EQ(w.RecvAs<WorkerCancelInfo>().dispatch_id, d.dispatch_id);
  // A token already in flight from the worker is not delivered.
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 8)}, {}});
  SendClient(client.get(), StatsQuery{});
  ServerMessage m = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<StatsOut>(m));
  EXPECT_EQ(std::get<StatsOut>(m).inflight, 0);
  EXPECT_EQ(std::get<StatsOut>(m).workers.at(0).running, 0);
}

// A worker's answer of another request kind's shape (here: an embed answer, with no vectors,
// for a generate request) is the worker's bug: the request ends INTERNAL, and the worker is
// told to drop it.
TEST_F(RouterTest, AnAnswerOfTheWrongKindEndsTheRequestAsInternal) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", {1, 2}, 4, true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  w.Send(EmbedDoneInfo{w.epoch, d.dispatch_id, {}});
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "r1");
  EXPECT_EQ(e.code, absl::StatusCode::kInternal);
  EXPECT_EQ(e.reason, reason::kInternal);
  EXPECT_THAT(e.message, HasSubstr("embeddings"));
  EXPECT_EQ(w.RecvAs<WorkerCancelInfo>().dispatch_id, d.dispatch_id);
  SendClient(client.get(), StatsQuery{});
  ServerMessage m = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<StatsOut>(m));
  EXPECT_EQ(std::get<StatsOut>(m).inflight, 0);
  EXPECT_EQ(std::get<StatsOut>(m).workers.at(0).outstanding_tokens, 0);
}

TEST_F(RouterTest, DeadWorkersStreamResumesOnAnotherWorker) {
  StartRouter(/*heartbeat_timeout_ms=*/300);
  FakeWorker w1 = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", {1, 2}, 5, true));
  DispatchInfo d1 = w1.RecvAs<DispatchInfo>();
  w1.Send(StepTokensInfo{w1.epoch, {Token(d1.dispatch_id, 10), Token(d1.dispatch_id, 11)}, {}});
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::holds_alternative<GenerateChunkOut>(RecvClient(client.get())));
  }
  FakeWorker w2 = StartWorker("w2");
  // w1 goes silent; w2 keeps beating. Within the timeout the request moves to w2.
  DispatchInfo d2;
  for (int i = 0; i < 40; ++i) {
    w2.Send(HeartbeatInfo{w2.epoch, {}});
    auto frames = w2.socket->Recv(50);
    ASSERT_TRUE(frames.ok());
    if (frames->has_value()) {
      auto m = DecodeRouterMessage((**frames)[0]);
      ASSERT_TRUE(m.ok() && std::holds_alternative<DispatchInfo>(*m));
      d2 = std::get<DispatchInfo>(*m);
      break;
    }
  }
  EXPECT_EQ(d2.prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(d2.output_tokens, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(d2.sampling.seed, d1.sampling.seed);
  // A stale step from w1's old epoch is ignored; w1 is told to register again.
  w1.Send(StepTokensInfo{w1.epoch, {Token(d1.dispatch_id, 99)}, {}});
  EXPECT_EQ(w1.RecvAs<RegisterAckInfo>().epoch, 0u);
  w2.Send(StepTokensInfo{w2.epoch, {Token(d2.dispatch_id, 12)}, {}});
  w2.Send(StepTokensInfo{w2.epoch, {Token(d2.dispatch_id, 13)}, {}});
  w2.Send(StepTokensInfo{w2.epoch, {Token(d2.dispatch_id, 14, true)}, {}});
  std::vector<int32_t> tokens;
  for (int i = 0; i < 3; ++i) {
    ServerMessage m = RecvClient(client.get());
    ASSERT_TRUE(std::holds_alternative<GenerateChunkOut>(m));
    EXPECT_EQ(std::get<GenerateChunkOut>(m).index, 2 + i);
    tokens.push_back(std::get<GenerateChunkOut>(m).tokens[0].token);
  }
  EXPECT_EQ(tokens, (std::vector<int32_t>{12, 13, 14}));
  ServerMessage m = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<GenerateFinalOut>(m));
  EXPECT_EQ(std::get<GenerateFinalOut>(m).usage.completion_tokens, 5);
}

TEST_F(RouterTest, QueuedRequestsWaitForAWorkerAndUnknownWorkersAreAskedToRegister) {
  StartRouter();
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", {1}, 1, false));
  FakeWorker stranger;
  stranger.socket = Dealer(router_->backend_endpoint(), "stranger");
  stranger.Send(HeartbeatInfo{42, {}});
  EXPECT_EQ(stranger.RecvAs<RegisterAckInfo>().epoch, 0u);
  FakeWorker w = StartWorker("w1");
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 3, true)}, {}});
  EXPECT_TRUE(std::holds_alternative<GenerateFinalOut>(RecvClient(client.get())));
}

TEST_F(RouterTest, RefusalsOfFramesThatDoNotDecodeNameTheirRequest) {
  StartRouter();
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  // Over --max-request-bytes (64 KiB here).
  SendClient(client.get(), TextRequest("big-1", 100 << 10));
  ErrorInfo big = RecvError(client.get());
  EXPECT_EQ(big.request_id, "big-1");
  EXPECT_EQ(big.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message, HasSubstr("exceeds the limit of 65536"));
  // Truncated: the prompt is cut off, the id is whole.
  const std::string frame = Encode(ClientMessage(TextRequest("cut-1", 500)));
  ASSERT_TRUE(client->Send({frame.substr(0, 100)}).ok());
  ErrorInfo cut = RecvError(client.get());
  EXPECT_EQ(cut.request_id, "cut-1");
  EXPECT_THAT(cut.message, HasSubstr("not a carpool.v1.ClientMessage"));
  // Two frames in one message.
  ASSERT_TRUE(client->Send({Encode(ClientMessage(CancelInput{"two-1"})), "x"}).ok());
  ErrorInfo two = RecvError(client.get());
  EXPECT_EQ(two.request_id, "two-1");
  EXPECT_THAT(two.message, HasSubstr("exactly one frame"));
  // An id longer than the request_id limit is not echoed.
  SendClient(client.get(), TextRequest(std::string(200, 'i'), 100 << 10));
  EXPECT_EQ(RecvError(client.get()).request_id, "");
}

TEST_F(RouterTest, InprocPathTakesMessagesOverTheTcpLimitAndKeepsItsClientsApart) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  // The same routing id on both client sockets: two different clients.
  auto tcp = Dealer(router_->frontend_endpoint(), "same");
  auto inproc = Dealer(router_->inproc_endpoint(), "same", router_->zmq_context());
  SendClient(tcp.get(), TextRequest("r1", 100 << 10));
  SendClient(inproc.get(), TextRequest("r2", 100 << 10));
  ErrorInfo over_tcp = RecvError(tcp.get());
  EXPECT_EQ(over_tcp.request_id, "r1");
  EXPECT_THAT(over_tcp.message, HasSubstr("exceeds the limit"));
  // In-process it passes the size limits (frame and prompt bytes) and meets the model's.
  ErrorInfo over_inproc = RecvError(inproc.get());
  EXPECT_EQ(over_inproc.request_id, "r2");
  EXPECT_EQ(over_inproc.reason, reason::kPromptTooLong);
  EXPECT_THAT(over_inproc.message, HasSubstr("max_model_len"));
  // Each got its own answer only.
  SendClient(inproc.get(), Request("r3", {1}, 1, false));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 9, true)}, {}});
  ServerMessage m = RecvClient(inproc.get());
  ASSERT_TRUE(std::holds_alternative<GenerateFinalOut>(m));
  EXPECT_EQ(std::get<GenerateFinalOut>(m).request_id, "r3");
  auto nothing = tcp->Recv(100);
  ASSERT_TRUE(nothing.ok());
  EXPECT_FALSE(nothing->has_value());
  inproc.reset();  // before the router's context goes
}

TEST_F(RouterTest, SdkGetsTheRealErrorOfAnOversizedRequest) {
  StartRouter();
  ClientOptions co;
  co.router_endpoint = router_->frontend_endpoint();
  auto client = Client::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status();
  CallOptions call;
  call.timeout_ms = 10'000;
  const int64_t start = Clock::Real()->NowMicros();
  absl::StatusOr<GenerateResult> r = (*client)->Generate(TextRequest("", 100 << 10), call);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("exceeds the limit"));
  EXPECT_LT(Clock::Real()->NowMicros() - start, 5'000'000);
}

TEST_F(RouterTest, DuplicateRequestIdIsRefusedAndTheLiveRequestGoesOn) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("live", {1, 2}, 3, /*stream=*/true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 7)}, {}});
  ASSERT_TRUE(std::holds_alternative<GenerateChunkOut>(RecvClient(client.get())));
  // A duplicate that is fine, one that is invalid, one too large, one that does not decode:
  // each refused as a duplicate, never as the live request's end.
  SendClient(client.get(), Request("live", {1}, 1, false));
  SendClient(client.get(), Request("live", {1}, 0, false));
  GenerateInput big = TextRequest("live", 100 << 10);
  SendClient(client.get(), big);
  const std::string frame = Encode(ClientMessage(TextRequest("live", 300)));
  ASSERT_TRUE(client->Send({frame.substr(0, 60)}).ok());
  for (int i = 0; i < 4; ++i) {
    ErrorInfo e = RecvError(client.get());
    EXPECT_EQ(e.request_id, "live") << i;
    EXPECT_EQ(e.reason, reason::kDuplicateRequestId) << i << ": " << e.message;
    EXPECT_EQ(e.code, absl::StatusCode::kAlreadyExists) << i;
  }
  // The live one was not cancelled: its tokens still come, then its final.
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 8)}, {}});
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 9, true)}, {}});
  for (int i = 1; i < 3; ++i) {
    ServerMessage m = RecvClient(client.get());
    ASSERT_TRUE(std::holds_alternative<GenerateChunkOut>(m)) << m.index();
    EXPECT_EQ(std::get<GenerateChunkOut>(m).index, i);
  }
  ServerMessage end = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<GenerateFinalOut>(end));
  EXPECT_EQ(std::get<GenerateFinalOut>(end).usage.completion_tokens, 3);
  // Another client may use the same id.
  auto other = Dealer(router_->frontend_endpoint(), "c2");
  SendClient(other.get(), Request("live", {1}, 1, false));
  EXPECT_GT(w.RecvAs<DispatchInfo>().dispatch_id, d.dispatch_id);
}

TenantTable TwoTenants() {
  auto t = TenantTable::Parse(R"pb(
    tenant { key: "key-alpha" name: "alpha" }
    tenant { key: "key-beta" name: "beta" max_priority: PRIORITY_BATCH }
  )pb");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : TenantTable();
}

TEST_F(RouterTest, StatsNeedAKeyWithTenantsAndShowTheTenantsOwnView) {
  StartRouter(60'000, TwoTenants());
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  for (const char* key : {"", "wrong"}) {
    SendClient(client.get(), StatsQuery{key});
    ErrorInfo e = RecvError(client.get());
    EXPECT_EQ(e.code, absl::StatusCode::kUnauthenticated) << key;
    EXPECT_THAT(e.message, ::testing::Not(HasSubstr("alpha")));
  }
  SendClient(client.get(), StatsQuery{"key-alpha"});
  ServerMessage m = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<StatsOut>(m));
  ASSERT_EQ(std::get<StatsOut>(m).tenants.size(), 1u);
  EXPECT_EQ(std::get<StatsOut>(m).tenants[0].name, "alpha");
  // An admin key sees every tenant.
  SendClient(client.get(), StatsQuery{"key-admin"});
  m = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<StatsOut>(m));
  EXPECT_EQ(std::get<StatsOut>(m).tenants.size(), 2u);
  // It is no tenant's key: requests with it are refused.
  GenerateInput g = Request("r1", {1}, 1, false);
  g.api_key = "key-admin";
  SendClient(client.get(), g);
  EXPECT_EQ(RecvError(client.get()).code, absl::StatusCode::kUnauthenticated);
  // The in-process client (the HTTP gateway: /metrics, /ready, /v1/models) needs none.
  auto inproc = Dealer(router_->inproc_endpoint(), "gw", router_->zmq_context());
  SendClient(inproc.get(), StatsQuery{});
  m = RecvClient(inproc.get());
  ASSERT_TRUE(std::holds_alternative<StatsOut>(m));
  EXPECT_EQ(std::get<StatsOut>(m).tenants.size(), 2u);
  inproc.reset();
}

TEST_F(RouterTest, SdkStatsSendTheClientsKeyAndGetTheRefusalAtOnce) {
  StartRouter(60'000, TwoTenants());
  ClientOptions co;
  co.router_endpoint = router_->frontend_endpoint();
  auto anonymous = Client::Connect(co);
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  const int64_t start = Clock::Real()->NowMicros();
  absl::StatusOr<StatsOut> refused = (*anonymous)->Stats(10'000);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  EXPECT_LT(Clock::Real()->NowMicros() - start, 5'000'000);  // the refusal, not the timeout
  co.api_key = "key-alpha";
  auto alpha = Client::Connect(co);
  ASSERT_TRUE(alpha.ok()) << alpha.status();
  absl::StatusOr<StatsOut> stats = (*alpha)->Stats(10'000);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->tenants.size(), 1u);
  EXPECT_EQ(stats->tenants[0].name, "alpha");
}

TEST_F(RouterTest, ABatchOnlyTenantsRequestNamingNoClassRunsAsBatch) {
  StartRouter(60'000, TwoTenants());
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  GenerateInput g = Request("r1", {1}, 1, false);  // priority: default, i.e. none named
  g.api_key = "key-beta";
  SendClient(client.get(), g);
  EXPECT_EQ(w.RecvAs<DispatchInfo>().priority, Priority::kBatch);
  // Asking for more than it may still is refused.
  g.request_id = "r2";
  g.priority = Priority::kInteractive;
  SendClient(client.get(), g);
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "r2");
  EXPECT_THAT(e.message, HasSubstr("batch"));
}

// --io-threads: outside [1, 64] is refused naming the flag; with 4 the router serves as with one.
TEST(RouterOptionsTest, IoThreadsAreCheckedAndServe) {
  for (int bad : {0, -1, 65}) {
    RouterOptions o;
    o.io_threads = bad;
    EXPECT_THAT(o.Validate().message(), HasSubstr("--io-threads")) << bad;
  }
}

TEST_F(RouterTest, SeveralIoThreadsServeAsOne) {
  RouterOptions o;
  o.io_threads = 4;
  ScriptedRouterTest::StartRouter(std::move(o));
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", {256, 65}, 1, /*stream=*/false));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{256, 65}));
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'x', true)}, {}});
  ServerMessage m = RecvClient(client.get());
  ASSERT_TRUE(std::holds_alternative<GenerateFinalOut>(m));
  EXPECT_EQ(std::get<GenerateFinalOut>(m).request_id, "r1");
}

}  // namespace
}  // namespace carpool::router
