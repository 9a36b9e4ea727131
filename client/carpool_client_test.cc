// carpool::Client against an in-process fake router (client/fake_router_test_util.h).
#include "client/carpool_client.h"

#include <map>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/fake_router_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool {
namespace {

using ::testing::ElementsAre;
using testing::FakeRouter;
using ::testing::HasSubstr;

std::unique_ptr<Client> ConnectTo(const FakeRouter& router, ClientOptions options = {}) {
  options.router_endpoint = router.endpoint();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  CARPOOL_CHECK(client.ok());
  return std::move(*client);
}

GenerateInput IdsRequest(std::vector<int32_t> ids, int max_tokens = 16) {
  GenerateInput g;
  g.token_ids = std::move(ids);
  g.sampling.max_tokens = max_tokens;
  return g;
}

GenerateInput TextRequest(const std::string& text) {
  GenerateInput g;
  g.has_text = true;
  g.text = text;
  return g;
}

// A handler that records requests but never answers a generate.
void Silent(FakeRouter& r, const std::string& peer, const ClientMessage& m) {}

bool HasGenerate(const std::vector<ClientMessage>& ms, const std::string& request_id) {
  for (const ClientMessage& m : ms) {
    const auto* g = std::get_if<GenerateInput>(&m);
    if (g != nullptr && g->request_id == request_id) return true;
  }
  return false;
}

std::vector<GenerateInput> Generates(const FakeRouter& router) {
  std::vector<GenerateInput> out;
  for (const ClientMessage& m : router.Received()) {
    if (const auto* g = std::get_if<GenerateInput>(&m)) out.push_back(*g);
  }
  return out;
}

TEST(ClientTest, BlockingGenerateReturnsEveryToken) {
  FakeRouter router;
  auto client = ConnectTo(router);
  GenerateInput request = IdsRequest({5, 6, 7});
  request.sampling.logprobs = 2;
  absl::StatusOr<GenerateResult> r = client->Generate(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->TokenIds(), ElementsAre(5, 6, 7));
  EXPECT_FLOAT_EQ(r->tokens[1].logprob, -0.5f);
  ASSERT_EQ(r->tokens[2].top_logprobs.size(), 2u);
  EXPECT_EQ(r->tokens[2].top_logprobs[1].token, 8);
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->usage.prompt_tokens, 3);
  EXPECT_EQ(r->usage.completion_tokens, 3);
  EXPECT_DOUBLE_EQ(r->timings.ttft_ms, 2.0);
  // The SDK assigned a request id and asked for a non-streaming answer.
  std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_FALSE(sent[0].request_id.empty());
  EXPECT_EQ(sent[0].request_id, r->request_id);
  EXPECT_FALSE(sent[0].stream);
}

TEST(ClientTest, KeepsCallerRequestIdAndAddsApiKey) {
  FakeRouter router;
  ClientOptions options;
  options.api_key = "secret";
  auto client = ConnectTo(router, options);
  GenerateInput request = TextRequest("hi");
  request.request_id = "mine-1";
  absl::StatusOr<GenerateResult> r = client->Generate(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request_id, "mine-1");
  EXPECT_EQ(r->text, "hi");
  std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].api_key, "secret");
  EXPECT_TRUE(sent[0].has_text);
}

TEST(ClientTest, AssignedRequestIdsAreUnique) {
  FakeRouter router;
  auto client = ConnectTo(router);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client->Generate(IdsRequest({1})).ok());
  std::set<std::string> ids;
  for (const GenerateInput& g : Generates(router)) ids.insert(g.request_id);
  EXPECT_EQ(ids.size(), 5u);
}

TEST(ClientTest, StreamingCallbackSeesChunksInOrderOnCallerThread) {
  FakeRouter router;
  auto client = ConnectTo(router);
  std::vector<int> indexes;
  std::string text;
  bool on_caller_thread = true;
  const std::thread::id caller = std::this_thread::get_id();
  absl::StatusOr<GenerateResult> r =
      client->GenerateStream(TextRequest("hello"), [&](const GenerateChunkOut& c) {
        indexes.push_back(c.index);
        text += c.text;
        on_caller_thread = on_caller_thread && std::this_thread::get_id() == caller;
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(indexes, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(text, "hello");
  EXPECT_TRUE(on_caller_thread);
  EXPECT_EQ(r->text, "hello");
  EXPECT_EQ(r->tokens.size(), 5u);
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->usage.completion_tokens, 5);
  ASSERT_EQ(Generates(router).size(), 1u);
  EXPECT_TRUE(Generates(router)[0].stream);
}

TEST(ClientTest, StreamIteratorYieldsChunksThenEnd) {
  FakeRouter router;
  auto client = ConnectTo(router);
  absl::StatusOr<std::unique_ptr<Stream>> stream = client->StartStream(IdsRequest({9, 8, 7}));
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<int32_t> tokens;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<std::optional<GenerateChunkOut>> chunk = (*stream)->Next(5000);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk->has_value()) break;
    EXPECT_EQ((*chunk)->index, static_cast<int>(tokens.size()));
    for (const SampleResult& t : (*chunk)->tokens) tokens.push_back(t.token);
  }
  EXPECT_THAT(tokens, ElementsAre(9, 8, 7));
  EXPECT_TRUE((*stream)->done());
  EXPECT_THAT((*stream)->result().TokenIds(), ElementsAre(9, 8, 7));
  EXPECT_EQ((*stream)->result().finish_reason, "length");
  // After the end, Next says so again.
  absl::StatusOr<std::optional<GenerateChunkOut>> again = (*stream)->Next(0);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
}

TEST(ClientTest, ServerErrorKeepsCodeReasonAndRetryAfter) {
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    if (const auto* g = std::get_if<GenerateInput>(&m)) {
      r.Reply(peer, ErrorInfo{g->request_id, absl::StatusCode::kResourceExhausted,
                              reason::kQueueFull, "queue is full", 250});
    }
  });
  auto client = ConnectTo(router);
  absl::StatusOr<GenerateResult> r = client->Generate(IdsRequest({1, 2}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.status().message(), "queue is full");
  EXPECT_EQ(ErrorReason(r.status()), "queue_full");
  EXPECT_EQ(RetryAfterMs(r.status()), 250);

  absl::StatusOr<std::unique_ptr<Stream>> stream = client->StartStream(IdsRequest({1}));
  ASSERT_TRUE(stream.ok());
  absl::StatusOr<std::optional<GenerateChunkOut>> chunk = (*stream)->Next(5000);
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrorReason(chunk.status()), "queue_full");
  EXPECT_TRUE((*stream)->done());
}

TEST(ClientTest, ErrorHelpersOnPlainStatus) {
  EXPECT_EQ(ErrorReason(absl::InternalError("x")), "");
  EXPECT_EQ(RetryAfterMs(absl::InternalError("x")), 0);
  absl::Status s = StatusFromError(
      ErrorInfo{"r", absl::StatusCode::kUnavailable, reason::kDraining, "draining", 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrorReason(s), "draining");
  EXPECT_EQ(RetryAfterMs(s), 0);
}

TEST(ClientTest, TimeoutReturnsDeadlineExceededAndCancelsAtRouter) {
  FakeRouter router(Silent);
  auto client = ConnectTo(router);
  GenerateInput request = IdsRequest({1});
  request.request_id = "slow";
  const absl::Time start = absl::Now();
  absl::StatusOr<GenerateResult> r = client->Generate(request, CallOptions{200});
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ErrorReason(r.status()), "deadline_exceeded");
  EXPECT_GE(took, absl::Milliseconds(190));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_TRUE(router.WaitFor([](const auto& ms) { return FakeRouter::HasCancel(ms, "slow"); }));
  // The id is free again.
  EXPECT_EQ(client->Cancel("slow").code(), absl::StatusCode::kNotFound);
}

TEST(ClientTest, UndecodableAnswerIsNamedInTheTimeout) {
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    r.ReplyRaw(peer, "\xff\xff not a ServerMessage");
  });
  auto client = ConnectTo(router);
  absl::StatusOr<GenerateResult> r = client->Generate(IdsRequest({1}), CallOptions{200});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("could not be decoded"));
}

TEST(ClientTest, DefaultTimeoutAppliesWhenCallGivesNone) {
  FakeRouter router(Silent);
  ClientOptions options;
  options.default_timeout_ms = 150;
  auto client = ConnectTo(router, options);
  EXPECT_EQ(client->Generate(IdsRequest({1})).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(client->Stats().status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(ClientTest, NextWaitTimeoutKeepsStreamUntilCancel) {
  FakeRouter router(Silent);
  auto client = ConnectTo(router);
  GenerateInput request = IdsRequest({1});
  request.request_id = "waiting";
  absl::StatusOr<std::unique_ptr<Stream>> stream = client->StartStream(request);
  ASSERT_TRUE(stream.ok());
  absl::StatusOr<std::optional<GenerateChunkOut>> chunk = (*stream)->Next(50);
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE((*stream)->done());
  (*stream)->Cancel();
  chunk = (*stream)->Next(5000);
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ErrorReason(chunk.status()), "cancelled");
  EXPECT_TRUE((*stream)->done());
  EXPECT_TRUE(router.WaitFor([](const auto& ms) { return FakeRouter::HasCancel(ms, "waiting"); }));
}

TEST(ClientTest, CancelFromAnotherThreadEndsBlockingCall) {
  FakeRouter router(Silent);
  auto client = ConnectTo(router);
  absl::StatusOr<GenerateResult> result = absl::InternalError("not run");
  std::thread caller([&] {
    GenerateInput request = IdsRequest({1});
    request.request_id = "victim";
    result = client->Generate(request, CallOptions{10000});
  });
  ASSERT_TRUE(router.WaitFor([](const auto& ms) { return HasGenerate(ms, "victim"); }));
  const absl::Time start = absl::Now();
  EXPECT_TRUE(client->Cancel("victim").ok());
  caller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(router.WaitFor([](const auto& ms) { return FakeRouter::HasCancel(ms, "victim"); }));
  EXPECT_EQ(client->Cancel("victim").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Cancel("never-sent").code(), absl::StatusCode::kNotFound);
}

TEST(ClientTest, DuplicateRequestIdInFlightIsRefused) {
  FakeRouter router(Silent);
  auto client = ConnectTo(router);
  GenerateInput request = IdsRequest({1});
  request.request_id = "dup";
  absl::StatusOr<std::unique_ptr<Stream>> first = client->StartStream(request);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(client->Generate(request).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(ClientTest, StatsComeBack) {
  FakeRouter router;
  auto client = ConnectTo(router);
  absl::StatusOr<StatsOut> stats = client->Stats(5000);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->workers.size(), 2u);
  EXPECT_EQ(stats->workers[0].worker_id, "worker-1");
  EXPECT_TRUE(stats->workers[0].healthy);
  EXPECT_EQ(stats->workers[0].kv_used_blocks, 250);
  EXPECT_FALSE(stats->workers[1].healthy);
  EXPECT_EQ(stats->queued, 4);
  EXPECT_EQ(stats->rejections_by_reason.at("queue_full"), 2);
}

TEST(ClientTest, ConcurrentCallsFromManyThreadsAllGetTheirOwnAnswers) {
  FakeRouter router;
  auto client = ConnectTo(router);
  constexpr int kThreads = 16;
  constexpr int kCalls = 20;
  std::atomic<int> correct{0};
  std::atomic<int> stats_answered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const std::vector<int32_t> ids = {t, i, t * 100 + i};
        absl::StatusOr<GenerateResult> r =
            i % 2 == 0 ? client->Generate(IdsRequest(ids), CallOptions{20000})
                       : client->GenerateStream(IdsRequest(ids), nullptr, CallOptions{20000});
        if (r.ok() && r->TokenIds() == ids) correct.fetch_add(1);
        if (t == 0 && i % 5 == 0 && client->Stats(20000).ok()) stats_answered.fetch_add(1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(correct.load(), kThreads * kCalls);
  EXPECT_EQ(stats_answered.load(), kCalls / 5);
}

// Answers UNAVAILABLE to the first `failures` attempts of every request id, then echoes.
FakeRouter::Handler FlakyHandler(int failures, std::map<std::string, int>* attempts) {
  return [failures, attempts](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    const auto* g = std::get_if<GenerateInput>(&m);
    if (g == nullptr) return;
    if ((*attempts)[g->request_id]++ < failures) {
      r.Reply(peer, ErrorInfo{g->request_id, absl::StatusCode::kUnavailable, reason::kDraining,
                              "draining", 0});
    } else {
      FakeRouter::AnswerEcho(r, peer, *g);
    }
  };
}

TEST(ClientTest, RetriesUnavailableWithBackoff) {
  std::map<std::string, int> attempts;  // router thread only until the router stops
  {
    FakeRouter router(FlakyHandler(2, &attempts));
    ClientOptions options;
    options.max_retries = 3;
    options.initial_backoff_ms = 5;
    options.max_backoff_ms = 20;
    auto client = ConnectTo(router, options);
    GenerateInput request = IdsRequest({4, 2});
    request.request_id = "flaky";
    absl::StatusOr<GenerateResult> r = client->Generate(request, CallOptions{10000});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->TokenIds(), ElementsAre(4, 2));
  }
  EXPECT_EQ(attempts["flaky"], 3);
}

TEST(ClientTest, GivesUpAfterMaxRetries) {
  std::map<std::string, int> attempts;
  {
    FakeRouter router(FlakyHandler(5, &attempts));
    ClientOptions options;
    options.max_retries = 1;
    options.initial_backoff_ms = 5;
    auto client = ConnectTo(router, options);
    GenerateInput request = IdsRequest({1});
    request.request_id = "down";
    absl::StatusOr<GenerateResult> r = client->Generate(request, CallOptions{10000});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(ErrorReason(r.status()), "draining");
  }
  EXPECT_EQ(attempts["down"], 2);
}

TEST(ClientTest, NoRetriesByDefault) {
  std::map<std::string, int> attempts;
  {
    FakeRouter router(FlakyHandler(1, &attempts));
    auto client = ConnectTo(router);
    GenerateInput request = IdsRequest({1});
    request.request_id = "once";
    EXPECT_EQ(client->Generate(request).status().code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(attempts["once"], 1);
}

TEST(ClientTest, StreamOutlivingClientEndsCancelled) {
  FakeRouter router(Silent);
  auto client = ConnectTo(router);
  absl::StatusOr<std::unique_ptr<Stream>> stream = client->StartStream(IdsRequest({1}));
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(router.WaitFor([](const auto& ms) { return !ms.empty(); }));
  client.reset();
  absl::StatusOr<std::optional<GenerateChunkOut>> chunk = (*stream)->Next(5000);
  EXPECT_EQ(chunk.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(chunk.status().message(), HasSubstr("closed"));
}

TEST(ClientTest, CurveEncryptedConnection) {
  absl::StatusOr<CurveServerKeys> keys = GenerateCurveKeyPair();
  if (!keys.ok()) GTEST_SKIP() << "libzmq without CURVE";
  SocketOptions server;
  server.curve_server = *keys;
  FakeRouter router(FakeRouter::Echo, server);
  ClientOptions options;
  options.curve_server_public_key = keys->public_key;
  auto client = ConnectTo(router, options);
  absl::StatusOr<GenerateResult> r = client->Generate(IdsRequest({3, 1}), CallOptions{10000});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->TokenIds(), ElementsAre(3, 1));
}

// Answers a streaming generate with its first chunk, then nothing; nothing else is answered.
void FirstChunkOnly(FakeRouter& r, const std::string& peer, const ClientMessage& m) {
  const auto* g = std::get_if<GenerateInput>(&m);
  if (g == nullptr || !g->stream) return;
  r.Reply(peer, GenerateChunkOut{g->request_id, 0, FakeRouter::EchoTokens(*g), ""});
}

bool IsRouterLost(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable && ErrorReason(s) == "router_lost";
}

// Every kind of call open on a connection, each on its own thread, all waiting for answers.
struct OpenCalls {
  static constexpr int64_t kTimeoutMs = 30000;

  explicit OpenCalls(Client* client) {
    threads.emplace_back([this, client] {
      GenerateInput g = IdsRequest({1});
      g.request_id = "blocking";
      generate = client->Generate(g, CallOptions{kTimeoutMs}).status();
    });
    threads.emplace_back([this, client] {
      GenerateInput g = IdsRequest({2});
      g.request_id = "callback";
      generate_stream =
          client
              ->GenerateStream(
                  g, [this](const GenerateChunkOut&) { ++chunks; }, CallOptions{kTimeoutMs})
              .status();
    });
    threads.emplace_back([this, client] {
      EmbedInput e;
      e.request_id = "embed";
      e.inputs.push_back(EmbedItem{});
      e.inputs.back().token_ids = {3};
      embed = client->Embed(e, CallOptions{kTimeoutMs}).status();
    });
    threads.emplace_back([this, client] { stats = client->Stats(kTimeoutMs).status(); });
    GenerateInput g = IdsRequest({4});
    g.request_id = "iterated";
    stream = std::move(*client->StartStream(g, CallOptions{kTimeoutMs}));
  }
  // Sent: the router has them all.
  static bool AllArrived(const std::vector<ClientMessage>& ms) {
    int stats_queries = 0;
    for (const ClientMessage& m : ms) stats_queries += std::holds_alternative<StatsQuery>(m);
    return HasGenerate(ms, "blocking") && HasGenerate(ms, "callback") &&
           HasGenerate(ms, "iterated") && stats_queries > 0 &&
           std::any_of(ms.begin(), ms.end(), [](const ClientMessage& m) {
             return std::holds_alternative<EmbedInput>(m);
           });
  }
  // Joins the threads and reads the stream to its end; how long that took.
  absl::Duration End() {
    const absl::Time start = absl::Now();
    for (;;) {
      absl::StatusOr<std::optional<GenerateChunkOut>> next = stream->Next();
      if (!next.ok()) {
        streamed = next.status();
        break;
      }
      if (!next->has_value()) break;
    }
    for (std::thread& t : threads) t.join();
    return absl::Now() - start;
  }

  std::vector<std::thread> threads;
  std::unique_ptr<Stream> stream;
  std::atomic<int> chunks{0};
  absl::Status generate, generate_stream, embed, stats, streamed;
};

TEST(ClientTest, RouterClosingEndsEveryOpenCallWithRouterLost) {
  auto router = std::make_unique<FakeRouter>(FirstChunkOnly);
  auto client = ConnectTo(*router);
  OpenCalls calls(client.get());
  ASSERT_TRUE(router->WaitFor(OpenCalls::AllArrived));
  ASSERT_TRUE(calls.stream->Next(5000).ok());  // mid-stream: a chunk has arrived
  router.reset();  // closes its socket: TCP FIN, as when a router process dies
  const absl::Duration took = calls.End();
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_TRUE(IsRouterLost(calls.generate)) << calls.generate;
  EXPECT_TRUE(IsRouterLost(calls.generate_stream)) << calls.generate_stream;
  EXPECT_EQ(calls.chunks.load(), 1);
  EXPECT_TRUE(IsRouterLost(calls.embed)) << calls.embed;
  EXPECT_TRUE(IsRouterLost(calls.stats)) << calls.stats;
  EXPECT_TRUE(IsRouterLost(calls.streamed)) << calls.streamed;
  EXPECT_THAT(calls.streamed.message(), HasSubstr("lost the connection to the router"));
  EXPECT_TRUE(calls.stream->done());
  // The ids are free again.
  EXPECT_EQ(client->Cancel("blocking").code(), absl::StatusCode::kNotFound);
}

TEST(ClientTest, SilentRouterIsLostAfterMissedHeartbeats) {
  testing::SilentZmtpPeer peer;
  ClientOptions options;
  options.router_endpoint = peer.endpoint();
  options.zmtp_heartbeat_ms = 100;
  auto client = std::move(*Client::Connect(options));
  const absl::Time start = absl::Now();
  absl::Status s = client->Generate(IdsRequest({1}), CallOptions{20000}).status();
  EXPECT_TRUE(IsRouterLost(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));  // 3 intervals after the handshake, and slack
  EXPECT_GE(peer.accepted(), 1);
}

TEST(ClientTest, WithoutHeartbeatsASilentRouterEndsCallsAtTheirDeadline) {
  testing::SilentZmtpPeer peer;
  ClientOptions options;
  options.router_endpoint = peer.endpoint();
  options.zmtp_heartbeat_ms = 0;
  auto client = std::move(*Client::Connect(options));
  absl::Status s = client->Generate(IdsRequest({1}), CallOptions{600}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

TEST(ClientTest, BusyRouterAnsweringLateIsNotLost) {
  // The router's thread is stuck for 20 heartbeat intervals; its ZeroMQ I/O thread still
  // answers the PINGs, so the connection stays up and the answer arrives.
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    absl::SleepFor(absl::Milliseconds(1000));
    FakeRouter::Echo(r, peer, m);
  });
  ClientOptions options;
  options.zmtp_heartbeat_ms = 50;
  auto client = ConnectTo(router, options);
  absl::StatusOr<GenerateResult> r = client->Generate(IdsRequest({7, 8}), CallOptions{20000});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->TokenIds(), ElementsAre(7, 8));
}

TEST(ClientTest, ClientWorksWithTheNextRouterAfterALoss) {
  auto router = std::make_unique<FakeRouter>(Silent);
  const std::string endpoint = router->endpoint();
  ClientOptions options;
  options.initial_backoff_ms = 10;
  auto client = ConnectTo(*router, options);
  for (int round = 0; round < 2; ++round) {  // a second loss is noticed as the first was
    absl::Status lost;
    std::thread caller(
        [&] { lost = client->Generate(IdsRequest({1}), CallOptions{20000}).status(); });
    ASSERT_TRUE(router->WaitFor([](const auto& ms) { return !ms.empty(); }));
    router.reset();
    caller.join();
    EXPECT_TRUE(IsRouterLost(lost)) << lost;
    router = std::make_unique<FakeRouter>(round == 0 ? Silent : FakeRouter::Echo, SocketOptions{},
                                          endpoint);
  }
  // The client redialled the same endpoint by itself.
  absl::StatusOr<GenerateResult> r = client->Generate(IdsRequest({5}), CallOptions{20000});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->TokenIds(), ElementsAre(5));
}

TEST(ClientTest, RetriesResendARequestLostWithItsRouter) {
  auto router = std::make_unique<FakeRouter>(Silent);
  const std::string endpoint = router->endpoint();
  ClientOptions options;
  options.max_retries = 5;
  options.initial_backoff_ms = 20;
  options.max_backoff_ms = 100;
  auto client = ConnectTo(*router, options);
  absl::StatusOr<GenerateResult> r = absl::InternalError("not run");
  std::thread caller([&] {
    GenerateInput g = IdsRequest({6, 1});
    g.request_id = "resent";
    r = client->Generate(g, CallOptions{20000});
  });
  ASSERT_TRUE(router->WaitFor([](const auto& ms) { return HasGenerate(ms, "resent"); }));
  router.reset();
  router = std::make_unique<FakeRouter>(FakeRouter::Echo, SocketOptions{}, endpoint);
  caller.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->TokenIds(), ElementsAre(6, 1));
}

TEST(ClientTest, ConnectRejectsBadOptions) {
  ClientOptions options;
  options.router_endpoint = "";
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = ClientOptions();
  options.max_retries = -1;
  EXPECT_THAT(Client::Connect(options).status().message(), HasSubstr("max_retries"));
  options = ClientOptions();
  options.curve_server_public_key = "short";
  EXPECT_THAT(Client::Connect(options).status().message(), HasSubstr("CURVE"));
  options = ClientOptions();
  options.router_endpoint = "nonsense://x";
  EXPECT_FALSE(Client::Connect(options).ok());
}

// ---- text: tokenize / detokenize, models, stop strings

TEST(ClientTextTest, TokenizeAndDetokenizeGoToTheRouter) {
  FakeRouter router;
  auto client = ConnectTo(router);
  absl::StatusOr<TokenizeResult> t = client->Tokenize("hi");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->token_ids, ElementsAre(ByteTokenizer::kBos, 'h', 'i'));
  EXPECT_EQ(t->max_model_len, 2048);
  EXPECT_FALSE(t->request_id.empty());
  TokenizeOptions plain;
  plain.add_special_tokens = false;
  plain.model = "llama";
  plain.request_id = "tok-1";
  t = client->Tokenize("hi", plain);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->token_ids, ElementsAre('h', 'i'));
  EXPECT_EQ(t->request_id, "tok-1");

  absl::StatusOr<std::string> text = client->Detokenize({ByteTokenizer::kBos, 'o', 'k'});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<|256|>ok");  // Hugging Face decode keeps special tokens by default
  DetokenizeOptions skip;
  skip.skip_special_tokens = true;
  skip.model = "llama";
  text = client->Detokenize({ByteTokenizer::kBos, 'o', 'k'}, skip);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "ok");

  // What went on the wire.
  std::vector<TokenizeInput> tokenizes;
  std::vector<DetokenizeInput> detokenizes;
  for (const ClientMessage& m : router.Received()) {
    if (const auto* x = std::get_if<TokenizeInput>(&m)) tokenizes.push_back(*x);
    if (const auto* x = std::get_if<DetokenizeInput>(&m)) detokenizes.push_back(*x);
  }
  ASSERT_EQ(tokenizes.size(), 2u);
  EXPECT_TRUE(tokenizes[0].add_special_tokens);
  EXPECT_EQ(tokenizes[0].model, "");
  EXPECT_FALSE(tokenizes[1].add_special_tokens);
  EXPECT_EQ(tokenizes[1].model, "llama");
  ASSERT_EQ(detokenizes.size(), 2u);
  EXPECT_FALSE(detokenizes[0].skip_special_tokens);
  EXPECT_TRUE(detokenizes[1].skip_special_tokens);
  EXPECT_EQ(detokenizes[1].model, "llama");
}

TEST(ClientTextTest, TokenizeErrorsAndTimeoutsAreStatuses) {
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    if (const auto* t = std::get_if<TokenizeInput>(&m); t != nullptr && t->model == "nope") {
      r.Reply(peer, ErrorInfo{t->request_id, absl::StatusCode::kNotFound, reason::kUnknownModel,
                              "model 'nope' is not served", 0});
    }
    // Detokenize: never answered.
  });
  ClientOptions options;
  options.api_key = "k";
  auto client = ConnectTo(router, options);
  TokenizeOptions unknown;
  unknown.model = "nope";
  absl::StatusOr<TokenizeResult> t = client->Tokenize("x", unknown);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrorReason(t.status()), reason::kUnknownModel);

  DetokenizeOptions quick;
  quick.timeout_ms = 100;
  quick.request_id = "slow";
  absl::StatusOr<std::string> text = client->Detokenize({1}, quick);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kDeadlineExceeded);
  // The router is told to forget it, and the api_key default was applied.
  EXPECT_TRUE(router.WaitFor(
      [](const std::vector<ClientMessage>& ms) { return FakeRouter::HasCancel(ms, "slow"); }));
  for (const ClientMessage& m : router.Received()) {
    if (const auto* d = std::get_if<DetokenizeInput>(&m)) {
      EXPECT_EQ(d->api_key, "k");
    }
  }
}

TEST(ClientTextTest, GenerateCarriesModelStopOptionsAndReturnsTheStopString) {
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    const auto* g = std::get_if<GenerateInput>(&m);
    if (g == nullptr) return;
    GenerateFinalOut f;
    f.request_id = g->request_id;
    f.text = "one two";
    f.finish_reason = "stop";
    f.stop_string = g->stop.empty() ? "" : g->stop.back();
    r.Reply(peer, f);
  });
  auto client = ConnectTo(router);
  GenerateInput request = TextRequest("count:");
  request.model = "llama";
  request.stop = {"\n", " three"};
  request.include_stop_str_in_output = true;
  request.skip_special_tokens = false;
  absl::StatusOr<GenerateResult> r = client->Generate(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->finish_reason, "stop");
  EXPECT_EQ(r->stop_string, " three");
  EXPECT_EQ(r->text, "one two");
  r = client->GenerateStream(request, nullptr);  // streams end with the same final
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stop_string, " three");
  std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].model, "llama");
  EXPECT_THAT(sent[0].stop, ElementsAre("\n", " three"));
  EXPECT_TRUE(sent[0].include_stop_str_in_output);
  EXPECT_FALSE(sent[0].skip_special_tokens);
}

// ---- chat: conversations for the model's chat template

ChatInput Conversation() {
  ChatInput chat;
  chat.messages_json = R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])";
  chat.tools_json = R"([{"type":"function","function":{"name":"f"}}])";
  chat.add_generation_prompt = false;
  chat.chat_template_kwargs_json = R"({"enable_thinking":false})";
  return chat;
}

TEST(ClientChatTest, ChatSendsTheConversationAsThePrompt) {
  FakeRouter router;
  auto client = ConnectTo(router);
  const ChatInput chat = Conversation();
  GenerateInput request;
  request.model = "llama";
  request.request_id = "chat-1";
  request.sampling.max_tokens = 1000;
  request.stop = {"END"};
  absl::StatusOr<GenerateResult> r = client->Chat(chat, request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request_id, "chat-1");
  EXPECT_EQ(r->text, chat.messages_json);  // the fake router echoes the messages' JSON
  EXPECT_EQ(r->usage.prompt_tokens, static_cast<int>(chat.messages_json.size()));

  // With the defaults: no tools, no kwargs, the generation prompt on.
  ChatInput plain;
  plain.messages_json = R"([{"role":"user","content":"é"}])";
  r = client->Chat(plain);
  ASSERT_TRUE(r.ok()) << r.status();

  std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 2u);
  ASSERT_TRUE(sent[0].chat.has_value());
  EXPECT_EQ(*sent[0].chat, chat);  // every field, through the codec
  EXPECT_FALSE(sent[0].has_text);
  EXPECT_TRUE(sent[0].token_ids.empty());
  EXPECT_FALSE(sent[0].stream);
  EXPECT_EQ(sent[0].model, "llama");
  EXPECT_THAT(sent[0].stop, ElementsAre("END"));
  ASSERT_TRUE(sent[1].chat.has_value());
  EXPECT_EQ(sent[1].chat->messages_json, plain.messages_json);
  EXPECT_TRUE(sent[1].chat->add_generation_prompt);
  EXPECT_EQ(sent[1].chat->tools_json, "");
  EXPECT_EQ(sent[1].chat->chat_template_kwargs_json, "");
}

TEST(ClientChatTest, ChatStreamsLikeGenerate) {
  FakeRouter router;
  auto client = ConnectTo(router);
  const ChatInput chat = Conversation();
  GenerateInput request;
  request.sampling.max_tokens = 1000;
  std::string streamed;
  int chunks = 0;
  absl::StatusOr<GenerateResult> r =
      client->ChatStream(chat, request, [&](const GenerateChunkOut& c) {
        streamed += c.text;
        ++chunks;
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(streamed, chat.messages_json);
  EXPECT_EQ(r->text, chat.messages_json);
  EXPECT_EQ(chunks, static_cast<int>(chat.messages_json.size()));

  absl::StatusOr<std::unique_ptr<Stream>> stream = client->StartChatStream(chat, request);
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (;;) {
    absl::StatusOr<std::optional<GenerateChunkOut>> next = (*stream)->Next();
    ASSERT_TRUE(next.ok()) << next.status();
    if (!next->has_value()) break;
  }
  EXPECT_EQ((*stream)->result().text, chat.messages_json);
  std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 2u);
  for (const GenerateInput& g : sent) {
    EXPECT_TRUE(g.stream);
    ASSERT_TRUE(g.chat.has_value());
    EXPECT_EQ(*g.chat, chat);
  }
}

TEST(ClientChatTest, ARequestWithItsOwnPromptIsRefusedBeforeSending) {
  FakeRouter router;
  auto client = ConnectTo(router);
  std::vector<GenerateInput> bad(3);
  bad[0] = TextRequest("hi");
  bad[1] = IdsRequest({1, 2});
  bad[2].chat = Conversation();
  for (const GenerateInput& request : bad) {
    absl::StatusOr<GenerateResult> r = client->Chat(Conversation(), request);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("no text, token_ids or chat of its own"));
    EXPECT_EQ(client->ChatStream(Conversation(), request, nullptr).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(client->StartChatStream(Conversation(), request).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Nothing reached the router: a stats round trip after the refusals shows only itself.
  ASSERT_TRUE(client->Stats().ok());
  EXPECT_TRUE(Generates(router).empty());
}

TEST(ClientChatTest, TheRoutersRefusalIsAStatus) {
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    if (const auto* g = std::get_if<GenerateInput>(&m)) {
      r.Reply(peer, ErrorInfo{g->request_id, absl::StatusCode::kInvalidArgument,
                              "invalid_argument", "chat template: unknown role 'bot'", 0});
    }
  });
  auto client = ConnectTo(router);
  ChatInput chat;
  chat.messages_json = R"([{"role":"bot","content":"x"}])";
  absl::StatusOr<GenerateResult> r = client->Chat(chat);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("unknown role 'bot'"));
  EXPECT_EQ(ErrorReason(r.status()), "invalid_argument");
  r = client->ChatStream(chat, {}, nullptr);
  EXPECT_THAT(r.status().message(), HasSubstr("unknown role 'bot'"));
}

TEST(ClientChatTest, TokenizeChatAddsNoSpecialTokensUnlessAsked) {
  FakeRouter router;
  auto client = ConnectTo(router);
  const ChatInput chat = Conversation();
  absl::StatusOr<TokenizeResult> t = client->TokenizeChat(chat);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<int32_t> want(chat.messages_json.begin(), chat.messages_json.end());
  EXPECT_EQ(t->token_ids, want);  // the fake router tokenizes the messages' JSON
  TokenizeOptions with_bos;
  with_bos.add_special_tokens = true;
  with_bos.model = "llama";
  t = client->TokenizeChat(chat, with_bos);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->token_ids.front(), ByteTokenizer::kBos);

  std::vector<TokenizeInput> sent;
  for (const ClientMessage& m : router.Received()) {
    if (const auto* x = std::get_if<TokenizeInput>(&m)) sent.push_back(*x);
  }
  ASSERT_EQ(sent.size(), 2u);
  ASSERT_TRUE(sent[0].chat.has_value());
  EXPECT_EQ(*sent[0].chat, chat);
  EXPECT_EQ(sent[0].text, "");
  EXPECT_FALSE(sent[0].add_special_tokens);
  EXPECT_TRUE(sent[1].add_special_tokens);
  EXPECT_EQ(sent[1].model, "llama");
}

}  // namespace
}  // namespace carpool
