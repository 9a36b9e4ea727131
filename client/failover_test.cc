// The C++ SDK with two routers (ClientOptions::router_endpoints; docs/cluster.md, "Two
// routers"): against fake routers, a call open when its router is lost goes to the other one, a
// stream resuming after the tokens it received (resume_tokens), a call not yet answered as it
// was; a router that is down from the start is skipped after connect_timeout_ms.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/carpool_client.h"
#include "client/fake_router_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::FakeRouter;

constexpr int kSentBeforeLoss = 3;

// A router that streams the first kSentBeforeLoss tokens of every streamed generate and then
// goes silent (the test closes it), and never answers a non-streamed one.
void AnswerPartly(FakeRouter& r, const std::string& peer, const ClientMessage& m) {
  const auto* g = std::get_if<GenerateInput>(&m);
  if (g == nullptr || !g->stream) return;
  std::vector<SampleResult> tokens = FakeRouter::EchoTokens(*g);
  for (int k = 0; k < kSentBeforeLoss && k < static_cast<int>(tokens.size()); ++k) {
    r.Reply(peer, GenerateChunkOut{g->request_id, k, {tokens[k]}, ""});
  }
}

// A router that answers as Echo does, continuing a resumed stream after its resume_tokens.
void AnswerResumed(FakeRouter& r, const std::string& peer, const ClientMessage& m) {
  const auto* g = std::get_if<GenerateInput>(&m);
  if (g == nullptr) return FakeRouter::Echo(r, peer, m);
  std::vector<SampleResult> tokens = FakeRouter::EchoTokens(*g);
  const size_t from = g->resume_tokens.size();
  GenerateFinalOut f;
  f.request_id = g->request_id;
  f.finish_reason = "length";
  f.usage = {static_cast<int>(g->token_ids.size()), static_cast<int>(tokens.size()), 0};
  if (g->stream) {
    for (size_t k = from; k < tokens.size(); ++k) {
      r.Reply(peer, GenerateChunkOut{g->request_id, static_cast<int>(k), {tokens[k]}, ""});
    }
  } else {
    f.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(from), tokens.end());
  }
  r.Reply(peer, f);
}

std::unique_ptr<Client> Connect(std::vector<std::string> endpoints) {
  ClientOptions o;
  o.router_endpoints = std::move(endpoints);
  o.default_timeout_ms = 10000;
  o.connect_timeout_ms = 300;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

GenerateInput Prompt(const std::string& id, int n) {
  GenerateInput g;
  g.request_id = id;
  for (int i = 0; i < n; ++i) g.token_ids.push_back(10 + i);
  g.sampling.max_tokens = n;
  return g;
}

// The GenerateInputs `router` received with `request_id`.
std::vector<GenerateInput> GeneratesOf(const FakeRouter& router, const std::string& request_id) {
  std::vector<GenerateInput> out;
  for (const ClientMessage& m : router.Received()) {
    const auto* g = std::get_if<GenerateInput>(&m);
    if (g != nullptr && g->request_id == request_id) out.push_back(*g);
  }
  return out;
}

TEST(ClientFailoverTest, StreamsContinueOnTheOtherRouterAfterTheTokensReceived) {
  auto first = std::make_unique<FakeRouter>(AnswerPartly);
  FakeRouter second(AnswerResumed);
  std::unique_ptr<Client> client = Connect({first->endpoint(), second.endpoint()});
  ASSERT_NE(client, nullptr);
  constexpr int kStreams = 8;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    absl::StatusOr<std::unique_ptr<Stream>> s =
        client->StartStream(Prompt("s" + std::to_string(i), 10 + i));
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(std::move(*s));
  }
  // Every stream has what the first router sent before it dies.
  for (auto& s : streams) {
    for (int k = 0; k < kSentBeforeLoss; ++k) {
      absl::StatusOr<std::optional<GenerateChunkOut>> c = s->Next(5000);
      ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
    }
  }
  first.reset();  // as kill -9: the connection drops
  for (int i = 0; i < kStreams; ++i) {
    Stream& s = *streams[i];
    for (;;) {
      absl::StatusOr<std::optional<GenerateChunkOut>> c = s.Next();
      ASSERT_TRUE(c.ok()) << s.request_id() << ": " << c.status();
      if (!c->has_value()) break;
    }
    // No gap, no duplicate: the prompt echoed once, in order.
    GenerateInput p = Prompt(s.request_id(), 10 + i);
    EXPECT_THAT(s.result().TokenIds(), ElementsAreArray(p.token_ids)) << s.request_id();
    EXPECT_EQ(s.result().usage.completion_tokens, 10 + i);
    // The second router got the request once, resuming after the tokens received, with the
    // seed the first one got (drawn by the client: none was given).
    std::vector<GenerateInput> resent = GeneratesOf(second, s.request_id());
    ASSERT_EQ(resent.size(), 1u);
    EXPECT_THAT(resent[0].resume_tokens,
                ElementsAreArray(p.token_ids.begin(), p.token_ids.begin() + kSentBeforeLoss));
    EXPECT_TRUE(resent[0].sampling.has_seed);
    EXPECT_EQ(resent[0].token_ids, p.token_ids);
  }
}

TEST(ClientFailoverTest, CallsNotAnsweredYetAreSentAgainAsTheyWere) {
  auto first = std::make_unique<FakeRouter>(AnswerPartly);  // never answers these
  FakeRouter second(AnswerResumed);
  std::unique_ptr<Client> client = Connect({first->endpoint(), second.endpoint()});
  ASSERT_NE(client, nullptr);
  GenerateInput g = Prompt("g1", 5);
  g.sampling.has_seed = true;
  g.sampling.seed = 42;
  absl::Status result;
  std::vector<int32_t> tokens;
  std::thread call([&] {
    absl::StatusOr<GenerateResult> r = client->Generate(g);
    result = r.status();
    if (r.ok()) tokens = r->TokenIds();
  });
  ASSERT_TRUE(first->WaitFor([](const std::vector<ClientMessage>& ms) { return !ms.empty(); }));
  first.reset();
  call.join();
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_THAT(tokens, ElementsAreArray(g.token_ids));
  std::vector<GenerateInput> resent = GeneratesOf(second, "g1");
  ASSERT_EQ(resent.size(), 1u);
  EXPECT_TRUE(resent[0].resume_tokens.empty());
  EXPECT_EQ(resent[0].sampling.seed, 42u);  // the caller's seed is kept
}

TEST(ClientFailoverTest, ARouterDownFromTheStartIsSkippedAfterTheConnectTimeout) {
  std::string down;
  {
    FakeRouter probe;  // a port nobody listens on once it closes
    down = probe.endpoint();
  }
  FakeRouter up(AnswerResumed);
  std::unique_ptr<Client> client = Connect({down, up.endpoint()});
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<GenerateResult> r = client->Generate(Prompt("g1", 4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->TokenIds().size(), 4u);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));  // connect_timeout_ms 300
}

TEST(ClientFailoverTest, BothRoutersLostEndsTheCallWithRouterLost) {
  auto first = std::make_unique<FakeRouter>(AnswerPartly);
  auto second = std::make_unique<FakeRouter>(AnswerPartly);
  std::unique_ptr<Client> client = Connect({first->endpoint(), second->endpoint()});
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::unique_ptr<Stream>> s = client->StartStream(Prompt("s", 10));
  ASSERT_TRUE(s.ok());
  for (int k = 0; k < kSentBeforeLoss; ++k) ASSERT_TRUE((*s)->Next(5000).ok());
  first.reset();
  // The stream goes on through the second router (reading it sends it there)...
  for (int k = 0; k < kSentBeforeLoss; ++k) {
    absl::StatusOr<std::optional<GenerateChunkOut>> c = (*s)->Next(5000);
    ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  }
  // ... until that one is lost too: back to the first, which is down, and that is the end.
  second.reset();
  absl::Status end;
  for (;;) {
    absl::StatusOr<std::optional<GenerateChunkOut>> c = (*s)->Next();
    if (!c.ok()) {
      end = c.status();
      break;
    }
    ASSERT_TRUE(c->has_value()) << "finished with both routers gone";
  }
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
  EXPECT_EQ(ErrorReason(end), "router_lost") << end;
}

TEST(ClientFailoverTest, EndpointListsAreValidated) {
  ClientOptions o;
  o.router_endpoint = "tcp://127.0.0.1:1, tcp://127.0.0.1:2";
  EXPECT_EQ(o.Endpoints(), (std::vector<std::string>{"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"}));
  EXPECT_TRUE(o.Validate().ok());
  o.router_endpoint = "tcp://127.0.0.1:1,";
  EXPECT_THAT(o.Validate().message(), HasSubstr("empty entry"));
  o.router_endpoint = "x";
  o.router_endpoints = {"tcp://127.0.0.1:1", ""};
  EXPECT_THAT(o.Validate().message(), HasSubstr("router_endpoints"));
  o.router_endpoints = {"tcp://127.0.0.1:1"};
  o.connect_timeout_ms = 0;
  EXPECT_THAT(o.Validate().message(), HasSubstr("connect_timeout_ms"));
}

}  // namespace
}  // namespace carpool
