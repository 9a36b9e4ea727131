// A stream resumed from the tokens its client received (GenerateInput::resume_tokens): what the
// SDKs send to the other router when theirs was lost (docs/cluster.md, "Two routers").
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/testing/scripted_router.h"

namespace carpool::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ResumeTest : public ScriptedRouterTest {
 protected:
  void SetUp() override {
    RouterOptions o;
    o.heartbeat_timeout_ms = 60'000;
    StartRouter(std::move(o));
  }

  static GenerateInput Resumed(const std::string& id, std::vector<int32_t> resume,
                               int max_tokens, bool stream) {
    GenerateInput g = Request(id, {256, 'a', 'b'}, max_tokens, stream);
    g.resume_tokens = std::move(resume);
    return g;
  }
};

TEST_F(ResumeTest, StreamContinuesAfterTheResumeTokensAndUsageCountsThem) {
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Resumed("r1", {'x', 'y'}, 4, /*stream=*/true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  // The worker recomputes them as context, as after a worker failover.
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{256, 'a', 'b'}));
  EXPECT_THAT(d.output_tokens, ElementsAre('x', 'y'));
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'z')}, {}});
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, '!', true)}, {}});
  for (int i = 0; i < 2; ++i) {
    GenerateChunkOut c = RecvClientAs<GenerateChunkOut>(client.get());
    EXPECT_EQ(c.index, 2 + i);  // after the two the client has
    ASSERT_EQ(c.tokens.size(), 1u);
    EXPECT_EQ(c.tokens[0].token, "z!"[i]);
    EXPECT_EQ(c.text, std::string(1, "z!"[i]));  // only the new text
  }
  GenerateFinalOut f = RecvClientAs<GenerateFinalOut>(client.get());
  EXPECT_EQ(f.finish_reason, "length");
  EXPECT_EQ(f.usage.prompt_tokens, 3);
  EXPECT_EQ(f.usage.completion_tokens, 4);  // as the stream that was never interrupted
  EXPECT_TRUE(f.tokens.empty());
}

TEST_F(ResumeTest, TextHeldBackAtTheCutContinuesExactly) {
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  // "é" is 0xC3 0xA9: the lost router had the first byte and no text for it yet.
  SendClient(client.get(), Resumed("r1", {'x', 0xC3}, 3, /*stream=*/true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 0xA9, true)}, {}});
  GenerateChunkOut c = RecvClientAs<GenerateChunkOut>(client.get());
  EXPECT_EQ(c.index, 2);
  EXPECT_EQ(c.text, "\xC3\xA9");
  RecvClientAs<GenerateFinalOut>(client.get());
}

TEST_F(ResumeTest, NonStreamedFinalHoldsEveryToken) {
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Resumed("r1", {'o'}, 2, /*stream=*/false));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_THAT(d.output_tokens, ElementsAre('o'));
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'k', true)}, {}});
  GenerateFinalOut f = RecvClientAs<GenerateFinalOut>(client.get());
  ASSERT_EQ(f.tokens.size(), 2u);
  EXPECT_EQ(f.tokens[0].token, 'o');
  EXPECT_EQ(f.tokens[1].token, 'k');
  EXPECT_EQ(f.text, "ok");
  EXPECT_EQ(f.usage.completion_tokens, 2);
}

// The standby of a pair gets the resumed streams before the workers have moved to it: it holds
// them (and checks them once a worker says what the model is).
TEST_F(ResumeTest, ARouterWithNoWorkerYetHoldsAResumedStreamUntilOneRegisters) {
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Resumed("r1", {'x', 'y'}, 4, /*stream=*/true));
  SendClient(client.get(), Resumed("bad", {'x', 300}, 4, /*stream=*/true));
  EXPECT_FALSE(TryRecvClient(client.get(), 200).has_value());  // nothing refused meanwhile
  FakeWorker w = StartWorker("w1");
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_THAT(d.output_tokens, ElementsAre('x', 'y'));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "bad");
  EXPECT_THAT(e.message, HasSubstr("resume_tokens[1]"));
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'z')}, {}});
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).index, 2);
}

TEST_F(ResumeTest, BadResumeTokensAreInvalidArgumentNamingTheField) {
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  struct Case {
    GenerateInput input;
    const char* message;
  };
  const std::vector<Case> cases = {
      {Resumed("b1", {'x', 'y'}, 2, true), "fewer than max_tokens (2)"},
      {Resumed("b2", {'x', 300}, 4, true), "resume_tokens[1] has id 300, outside the vocabulary"},
      {Resumed("b3", {-1}, 4, true), "resume_tokens[0] has id -1"},
      // Prompt 3 + max_tokens 62 > 64: the resumed tokens are inside max_tokens.
      {Resumed("b4", {'x'}, 62, true), "exceeds max_model_len 64"},
  };
  for (const Case& c : cases) {
    SendClient(client.get(), c.input);
    ErrorInfo e = RecvError(client.get());
    EXPECT_EQ(e.request_id, c.input.request_id);
    EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(e.reason, reason::kInvalidArgument);
    EXPECT_THAT(e.message, HasSubstr(c.message));
  }
  // None of them reached the worker.
  EXPECT_FALSE(w.Recv(100).has_value());
}

}  // namespace
}  // namespace carpool::router
