// The router's text path, in-process against scripted workers: tokenization on the tokenizer
// pool (a huge prompt delays nobody), the models' tokenizers and models by name, streaming
// detokenization, stop strings, Tokenize / Detokenize, and bad text.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/router.h"
#include "router/testing/scripted_router.h"
#include "text/test_tokenizer_json.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

constexpr int kQuietMs = 150;
constexpr size_t kHuge = 100'000;

// Bytes as ids (no special tokens), like ByteTokenizer; a text of kHuge bytes or more blocks
// its Encode until released (bounded, so a failing test cannot hang).
class BlockingTokenizer : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, bool) const override {
    if (text.size() >= kHuge) {
      entered.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(20));
    }
    return std::vector<int32_t>(text.begin(), text.end());
  }
  std::string Decode(absl::Span<const int32_t> ids, bool) const override {
    return std::string(ids.begin(), ids.end());
  }
  mutable absl::Notification entered;
  mutable absl::Notification release;
};

class RouterTextTest : public ScriptedRouterTest {
 protected:
  void StartRouter() {
    RouterOptions o;
    o.heartbeat_timeout_ms = 60'000;
    o.max_request_bytes = 1 << 20;
    o.tokenizer_threads = 2;
    o.max_tokenizing_bytes = max_tokenizing_bytes_;
    o.admission.max_queued_requests = max_queued_requests_;
    o.admission.batch_max_queued = batch_max_queued_;
    if (real_loader_) {
      ScriptedRouterTest::StartRouter(std::move(o));
      return;
    }
    o.load_tokenizer = [this](
                           const std::string&,
                           const std::string&) -> absl::StatusOr<std::shared_ptr<const Tokenizer>> {
      loaded_.Notify();
      load_release_.WaitForNotificationWithTimeout(absl::Seconds(20));
      return std::shared_ptr<const Tokenizer>(tokenizer_);
    };
    ScriptedRouterTest::StartRouter(std::move(o));
  }

  void TearDown() override {
    // Nothing may stay blocked on the pool when the router goes.
    if (!tokenizer_->release.HasBeenNotified()) tokenizer_->release.Notify();
    if (!load_release_.HasBeenNotified()) load_release_.Notify();
    ScriptedRouterTest::TearDown();
  }

  // A worker of model `model` whose tokenizer is handed over ("hf": the injected one).
  FakeWorker StartHfWorker(const std::string& id, const std::string& model = "fake") {
    RegisterInfo r = FakeRegistration(id);
    r.model = model;
    r.tokenizer = TokenizerKind::kHuggingFace;
    r.tokenizer_json = "{}";
    r.max_model_len = 200'000;
    r.num_kv_blocks = 20'000;
    return StartWorker(r);
  }

  static GenerateInput Text(const std::string& id, std::string text, int max_tokens = 2,
                            bool stream = false) {
    GenerateInput g = Request(id, {}, max_tokens, stream);
    g.has_text = true;
    g.text = std::move(text);
    return g;
  }

  StatsOut Stats(Socket* c) {
    SendClient(c, StatsQuery{});
    return RecvClientAs<StatsOut>(c);
  }

  int64_t max_tokenizing_bytes_ = 256 << 20;
  int max_queued_requests_ = 10'000;
  int batch_max_queued_ = 64;
  bool real_loader_ = false;  // text::HfTokenizer::FromJson, not the injected loader
  std::shared_ptr<BlockingTokenizer> tokenizer_ = std::make_shared<BlockingTokenizer>();
  absl::Notification loaded_;
  absl::Notification load_release_;
};

TEST_F(RouterTextTest, AHugeTextPromptBeingTokenizedDelaysNoOtherRequest) {
  StartRouter();
  load_release_.Notify();
  FakeWorker w = StartHfWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Text("huge", std::string(kHuge, 'a')));
  ASSERT_TRUE(tokenizer_->entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // While the pool holds it: its id is taken, and a token-id request is admitted and answered.
  SendClient(client.get(), Request("huge", {1}, 1, false));
  ErrorInfo dup = RecvError(client.get());
  EXPECT_EQ(dup.reason, reason::kDuplicateRequestId);
  SendClient(client.get(), Request("ids", {1, 2}, 1, false));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{1, 2}));
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'k', true)}, {}});
  GenerateFinalOut ids = RecvClientAs<GenerateFinalOut>(client.get());
  EXPECT_EQ(ids.request_id, "ids");
  // A small text prompt goes through the pool's other thread meanwhile.
  SendClient(client.get(), Text("small", "hi"));
  DispatchInfo small = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(small.prompt_tokens, (std::vector<int32_t>{'h', 'i'}));
  // Released: admitted with its real token count.
  tokenizer_->release.Notify();
  DispatchInfo huge = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(huge.prompt_tokens.size(), kHuge);
  w.Send(StepTokensInfo{w.epoch, {Token(huge.dispatch_id, 'k', true)}, {}});
  GenerateFinalOut f = RecvClientAs<GenerateFinalOut>(client.get());
  EXPECT_EQ(f.request_id, "huge");
  EXPECT_EQ(f.usage.prompt_tokens, static_cast<int>(kHuge));
}

TEST_F(RouterTextTest, ARequestCancelledWhileTokenizingNeverReachesAWorker) {
  StartRouter();
  load_release_.Notify();
  FakeWorker w = StartHfWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Text("huge", std::string(kHuge, 'a')));
  ASSERT_TRUE(tokenizer_->entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  SendClient(client.get(), CancelInput{"huge"});
  EXPECT_EQ(RecvError(client.get()).reason, reason::kCancelled);
  tokenizer_->release.Notify();
  EXPECT_FALSE(w.Recv(kQuietMs).has_value());
  StatsOut s = Stats(client.get());
  EXPECT_EQ(s.queued + s.inflight, 0);
  EXPECT_EQ(s.queued_tokens + s.inflight_tokens, 0);
}

// Text on the pool is not admitted yet, so the pool bounds it: past max_tokenizing_bytes a text
// request is refused queue_full at once, and served again once the pool has room.
TEST_F(RouterTextTest, TextBeyondWhatThePoolMayHoldIsRefusedQueueFull) {
  max_tokenizing_bytes_ = 1 << 20;
  StartRouter();
  load_release_.Notify();
  FakeWorker w = StartHfWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Text("huge", std::string(kHuge, 'a')));
  ASSERT_TRUE(tokenizer_->entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  SendClient(client.get(), Text("more", std::string((1 << 20) - kHuge + 1, 'b')));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "more");
  EXPECT_EQ(e.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(e.reason, reason::kQueueFull);
  EXPECT_GT(e.retry_after_ms, 0);
  tokenizer_->release.Notify();
  EXPECT_EQ(w.RecvAs<DispatchInfo>().prompt_tokens.size(), kHuge);
  SendClient(client.get(), Text("more", std::string(1000, 'b')));
  EXPECT_EQ(w.RecvAs<DispatchInfo>().prompt_tokens.size(), 1000u);
}

TEST_F(RouterTextTest, TextWaitsForItsModelsTokenizerWhileTokenIdsGoOn) {
  StartRouter();
  FakeWorker w = StartHfWorker("w1");
  ASSERT_TRUE(loaded_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Text("text", "hi"));
  SendClient(client.get(), TokenizeInput{"tok", "", "ok", true, ""});
  SendClient(client.get(), Request("ids", {1, 2}, 1, false));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(w.Recv(kQuietMs).has_value());  // the text waits, and so does the tokenize call
  EXPECT_FALSE(TryRecvClient(client.get(), 0).has_value());
  SendClient(client.get(), TokenizeInput{"tok", "", "ok", true, ""});
  EXPECT_EQ(RecvError(client.get()).reason, reason::kDuplicateRequestId);
  load_release_.Notify();
  DispatchInfo t = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(t.prompt_tokens, (std::vector<int32_t>{'h', 'i'}));
  TokenizeResultOut tok = RecvClientAs<TokenizeResultOut>(client.get());
  EXPECT_EQ(tok.token_ids, (std::vector<int32_t>{'o', 'k'}));
}

// Issue 16: text waiting for its tokenizer is bounded per lane. A batch's texts never take the
// room other requests wait in (--max-queued-requests), nor they theirs (--batch-max-queued).
TEST_F(RouterTextTest, BatchJobsTextsWaitWithinTheBatchLanesBound) {
  max_queued_requests_ = 2;
  batch_max_queued_ = 1;
  StartRouter();
  FakeWorker w = StartHfWorker("w1");
  ASSERT_TRUE(loaded_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  auto runner = Dealer(router_->inproc_endpoint(), "runner", router_->zmq_context());
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  GenerateInput job = Text("job1", "batch");
  job.batch_job = true;
  SendClient(runner.get(), job);
  job.request_id = "job2";
  SendClient(runner.get(), job);
  ErrorInfo e = RecvError(runner.get());
  EXPECT_EQ(e.request_id, "job2");
  EXPECT_EQ(e.reason, reason::kQueueFull);
  EXPECT_THAT(e.message, HasSubstr("--batch-max-queued"));
  // The batch job's text waiting takes none of the two places of the others.
  SendClient(client.get(), Text("a", "one"));
  SendClient(client.get(), Text("b", "two"));
  EXPECT_FALSE(TryRecvClient(client.get(), kQuietMs).has_value());
  SendClient(client.get(), Text("c", "three"));
  e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "c");
  EXPECT_THAT(e.message, HasSubstr("--max-queued-requests"));
  load_release_.Notify();
  std::multiset<size_t> lengths;
  for (int i = 0; i < 3; ++i) lengths.insert(w.RecvAs<DispatchInfo>().prompt_tokens.size());
  EXPECT_EQ(lengths, (std::multiset<size_t>{3, 3, 5}));
}

TEST_F(RouterTextTest, ARequestsModelPicksItsWorkers) {
  StartRouter();
  RegisterInfo a = FakeRegistration("wa");
  a.model = "model-a";
  RegisterInfo b = FakeRegistration("wb");
  b.model = "model-b";
  FakeWorker wa = StartWorker(a);
  FakeWorker wb = StartWorker(b);
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("none", {1}, 1, false));
  ErrorInfo none = RecvError(client.get());
  EXPECT_EQ(none.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message, HasSubstr("model-a, model-b"));
  GenerateInput unknown = Text("unknown", "hi");
  unknown.model = "model-c";
  SendClient(client.get(), unknown);
  ErrorInfo u = RecvError(client.get());
  EXPECT_EQ(u.code, absl::StatusCode::kNotFound);
  EXPECT_EQ(u.reason, reason::kUnknownModel);
  EXPECT_THAT(u.message, HasSubstr("model-c"));
  for (int i = 0; i < 3; ++i) {
    GenerateInput g = Text("b" + std::to_string(i), "hi");
    g.model = "model-b";
    SendClient(client.get(), g);
    DispatchInfo d = wb.RecvAs<DispatchInfo>();
    EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{256, 'h', 'i'}));
  }
  EXPECT_FALSE(wa.Recv(kQuietMs).has_value());
  // Tokenize and Detokenize with a model's tokenizer.
  SendClient(client.get(), TokenizeInput{"tok", "model-a", "hi", true, ""});
  TokenizeResultOut t = RecvClientAs<TokenizeResultOut>(client.get());
  EXPECT_EQ(t.request_id, "tok");
  EXPECT_EQ(t.token_ids, (std::vector<int32_t>{256, 'h', 'i'}));
  EXPECT_EQ(t.max_model_len, 64);
  SendClient(client.get(), DetokenizeInput{"detok", "model-a", {256, 'o', 'k'}, true, ""});
  DetokenizeResultOut dt = RecvClientAs<DetokenizeResultOut>(client.get());
  EXPECT_EQ(dt.request_id, "detok");
  EXPECT_EQ(dt.text, "ok");
  SendClient(client.get(), DetokenizeInput{"bad", "model-a", {1, 999}, false, ""});
  EXPECT_THAT(RecvError(client.get()).message, HasSubstr("token_ids[1]"));
}

TEST_F(RouterTextTest, ChunksCarryTheTextTheirTokensComplete) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", {1}, 6, /*stream=*/true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  // "世" is E4 B8 96: no chunk ends inside it.
  const std::vector<int32_t> tokens = {'a', 0xE4, 0xB8, 0x96, '!'};
  const std::vector<std::string> texts = {"a", "", "", "\xE4\xB8\x96", "!"};
  for (size_t i = 0; i < tokens.size(); ++i) {
    w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, tokens[i])}, {}});
    GenerateChunkOut c = RecvClientAs<GenerateChunkOut>(client.get());
    EXPECT_EQ(c.text, texts[i]) << i;
  }
  // The last token leaves half a character: the last chunk carries what the whole decode has.
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 0xC3, true)}, {}});
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, "\xC3");
  EXPECT_TRUE(RecvClientAs<GenerateFinalOut>(client.get()).text.empty());
  // Non-streamed: the final's text is the whole decode; special tokens skipped unless asked.
  GenerateInput g = Request("r2", {1}, 3, false);
  g.skip_special_tokens = false;
  SendClient(client.get(), g);
  d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{
      w.epoch,
      {Token(d.dispatch_id, 'o'), Token(d.dispatch_id, 'k'), Token(d.dispatch_id, 257, true)},
      {}});
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).text, "ok<|257|>");
}

// A stream that moves to another dispatch (here: its worker registered afresh, which orphans
// what it held) keeps its decoder: the character begun before the move completes after it.
TEST_F(RouterTextTest, AResumedStreamContinuesItsTextExactly) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", {1}, 4, /*stream=*/true));
  DispatchInfo d1 = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d1.dispatch_id, 'a'), Token(d1.dispatch_id, 0xE4)}, {}});
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, "a");
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, "");
  w.Send(FakeRegistration("w1"));
  w.epoch = w.RecvAs<RegisterAckInfo>().epoch;
  DispatchInfo d2 = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(d2.output_tokens, (std::vector<int32_t>{'a', 0xE4}));
  w.Send(StepTokensInfo{
      w.epoch, {Token(d2.dispatch_id, 0xB8), Token(d2.dispatch_id, 0x96, true)}, {}});
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, "");
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, "\xE4\xB8\x96");
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).usage.completion_tokens, 4);
}

TEST_F(RouterTextTest, AStopStringEndsTheStreamAtItAndTheWorkerDropsTheSequence) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  GenerateInput g = Request("r1", {1}, 20, /*stream=*/true);
  g.stop = {"zz", "xy"};
  SendClient(client.get(), g);
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  const std::vector<int32_t> tokens = {'a', 'x', 'y'};
  const std::vector<std::string> texts = {"a", "", ""};  // "x" is held: "xy" may be forming
  for (size_t i = 0; i < tokens.size(); ++i) {
    w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, tokens[i])}, {}});
    GenerateChunkOut c = RecvClientAs<GenerateChunkOut>(client.get());
    EXPECT_EQ(c.text, texts[i]) << i;
  }
  GenerateFinalOut f = RecvClientAs<GenerateFinalOut>(client.get());
  EXPECT_EQ(f.finish_reason, "stop");
  EXPECT_EQ(f.stop_string, "xy");
  EXPECT_EQ(f.usage.completion_tokens, 3);
  // The worker is told at once, so its blocks free; what it sent meanwhile is dropped.
  EXPECT_EQ(w.RecvAs<WorkerCancelInfo>().dispatch_id, d.dispatch_id);
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'z')}, {}});
  StatsOut s = Stats(client.get());
  EXPECT_EQ(s.inflight, 0);
  EXPECT_EQ(s.workers.at(0).outstanding_tokens, 0);
  // Kept with include_stop_str_in_output; a held prefix that never completes comes at the end.
  GenerateInput keep = Request("r2", {1}, 4, false);
  keep.stop = {"xy"};
  keep.include_stop_str_in_output = true;
  SendClient(client.get(), keep);
  d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{
      w.epoch,
      {Token(d.dispatch_id, 'a'), Token(d.dispatch_id, 'x'), Token(d.dispatch_id, 'y')},
      {}});
  f = RecvClientAs<GenerateFinalOut>(client.get());
  EXPECT_EQ(f.text, "axy");
  EXPECT_EQ(f.tokens.size(), 3u);
  EXPECT_EQ(w.RecvAs<WorkerCancelInfo>().dispatch_id, d.dispatch_id);
  GenerateInput held = Request("r3", {1}, 2, true);
  held.stop = {"xy"};
  SendClient(client.get(), held);
  d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'a'), Token(d.dispatch_id, 'x', true)}, {}});
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, "a");
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, "x");
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).finish_reason, "length");
}

TEST_F(RouterTextTest, BadTextIsRefusedNamingTheByteAndTheRealTokenCount) {
  StartRouter();
  FakeWorker w = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Text("utf8",
                                "ab\xFF"
                                "c"));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.reason, reason::kInvalidArgument);
  EXPECT_THAT(e.message, HasSubstr("not valid UTF-8 at byte 2"));
  SendClient(client.get(), Text("long", std::string(70, 'a')));
  ErrorInfo l = RecvError(client.get());
  EXPECT_EQ(l.reason, reason::kPromptTooLong);
  EXPECT_THAT(l.message, HasSubstr("prompt is 71 tokens"));
  SendClient(client.get(), TokenizeInput{"tok", "", "\xC3(", true, ""});
  EXPECT_THAT(RecvError(client.get()).message, HasSubstr("at byte 0"));
}

// The files a worker hands over are built into the model's tokenizer (HfTokenizer::FromJson,
// on the pool): its ids for the prompt, its decode for the output; a file that does not load
// refuses that model's text, naming the error, while token ids go on.
TEST_F(RouterTextTest, AHandedOverTokenizerJsonTokenizesAndDecodes) {
  real_loader_ = true;
  StartRouter();
  RegisterInfo good = FakeRegistration("w1");
  good.model = "bpe";
  good.tokenizer = TokenizerKind::kHuggingFace;
  good.tokenizer_json = text::TestTokenizerJson().dump();
  FakeWorker w = StartWorker(good);
  RegisterInfo bad = FakeRegistration("w2");
  bad.model = "broken";
  bad.tokenizer = TokenizerKind::kHuggingFace;
  bad.tokenizer_json = "{not json";
  FakeWorker wb = StartWorker(bad);
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  GenerateInput g = Text("r1", "hi hi", 3, /*stream=*/true);
  g.model = "bpe";
  SendClient(client.get(), g);
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{258, 'h', 'i', 257}));  // <|bos|> h i Ġhi
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 257), Token(d.dispatch_id, 259, true)}, {}});
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, " hi");
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).text, "");  // <|eos|> skipped
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).finish_reason, "length");
  GenerateInput text = Text("r2", "hi");
  text.model = "broken";
  SendClient(client.get(), text);
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.code, absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(e.message, HasSubstr("tokenizer of model 'broken' did not load"));
  GenerateInput ids = Request("r3", {1, 2}, 1, false);
  ids.model = "broken";
  SendClient(client.get(), ids);
  EXPECT_EQ(wb.RecvAs<DispatchInfo>().prompt_tokens, (std::vector<int32_t>{1, 2}));
}

}  // namespace
}  // namespace carpool::router
