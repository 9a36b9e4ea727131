// The router's Batch API calls (BatchCall) with a fake handler: authentication, the tenant the
// handler is given, the errors clients get, the frame limit of an upload, and that a slow call
// runs off the event loop.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/router_impl.h"
#include "router/testing/scripted_router.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

TenantTable TwoTenants() {
  auto t = TenantTable::Parse(R"pb(
    tenant { key: "key-alpha" name: "alpha" }
    tenant { key: "key-beta" name: "beta" }
  )pb");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : TenantTable();
}

BatchCallInfo Call(const std::string& id, BatchOp op, const std::string& api_key = "") {
  BatchCallInfo c;
  c.request_id = id;
  c.op = op;
  c.api_key = api_key;
  return c;
}

class RouterBatchTest : public ScriptedRouterTest {
 protected:
  // What the fake handler saw: (tenant, call) per call, in order.
  struct Seen {
    std::string tenant;
    BatchCallInfo call;
  };

  // Starts the router with `handler` (none: a router without a batch store).
  void Start(BatchCallHandler handler, TenantTable tenants = {}, RouterOptions o = {}) {
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    o.tenants = std::move(tenants);
    auto router = Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    if (handler) router_->SetBatchCalls(std::move(handler));
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
  }

  // A handler that records each call and answers with its op's name and the content's size.
  BatchCallHandler Recording() {
    return [this](const std::string& tenant,
                  const BatchCallInfo& call) -> absl::StatusOr<BatchReplyInfo> {
      absl::MutexLock lock(&mu_);
      seen_.push_back({tenant, call});
      return BatchReplyInfo{"", absl::StrCat("{\"op\": \"", BatchOpName(call.op), "\"}"),
                            std::to_string(call.content.size())};
    };
  }

  std::vector<Seen> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

  absl::Mutex mu_;
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
};

TEST_F(RouterBatchTest, AnswersWithTheHandlersReplyUnderTheCallsId) {
  Start(Recording());
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  BatchCallInfo upload = Call("b1", BatchOp::kCreateFile);
  upload.filename = "in.jsonl";
  upload.purpose = "batch";
  upload.content = "{\"custom_id\": \"a\"}\n";
  SendClient(client.get(), upload);
  BatchReplyInfo reply = RecvClientAs<BatchReplyInfo>(client.get());
  EXPECT_EQ(reply.request_id, "b1");
  EXPECT_EQ(reply.json, "{\"op\": \"create_file\"}");
  EXPECT_EQ(reply.content, std::to_string(upload.content.size()));
  // Without tenants the handler gets the anonymous tenant, and the call as it was sent.
  std::vector<Seen> calls = seen();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].tenant, "");
  EXPECT_EQ(calls[0].call, upload);
}

TEST_F(RouterBatchTest, WithTenantsAKnownKeyIsNeededAndItsTenantsNameIsPassed) {
  Start(Recording(), TwoTenants());
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Call("none", BatchOp::kListBatches));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "none");
  EXPECT_EQ(e.code, absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(e.reason, reason::kUnauthenticated);
  EXPECT_THAT(e.message, HasSubstr("API key is required"));
  SendClient(client.get(), Call("wrong", BatchOp::kListBatches, "key-gamma"));
  e = RecvError(client.get());
  EXPECT_EQ(e.code, absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(e.message, HasSubstr("unknown API key"));
  EXPECT_TRUE(seen().empty());  // refused before the handler

  SendClient(client.get(), Call("a", BatchOp::kGetBatch, "key-alpha"));
  EXPECT_EQ(RecvClientAs<BatchReplyInfo>(client.get()).request_id, "a");
  SendClient(client.get(), Call("b", BatchOp::kCancelBatch, "key-beta"));
  EXPECT_EQ(RecvClientAs<BatchReplyInfo>(client.get()).request_id, "b");
  std::vector<Seen> calls = seen();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].tenant, "alpha");
  EXPECT_EQ(calls[0].call.op, BatchOp::kGetBatch);
  EXPECT_EQ(calls[1].tenant, "beta");
  EXPECT_EQ(calls[1].call.op, BatchOp::kCancelBatch);
}

TEST_F(RouterBatchTest, HandlerErrorsKeepTheirCodeAndMessageWithTheCodeAsReason) {
  Start([](const std::string&, const BatchCallInfo& call) -> absl::StatusOr<BatchReplyInfo> {
    if (call.id == "batch_other") return absl::NotFoundError("no batch 'batch_other'");
    if (call.id == "batch_done") {
      return absl::FailedPreconditionError("batch 'batch_done' is completed");
    }
    return absl::OutOfRangeError("the file is 300000000 bytes; --batch-max-file-bytes is 1000");
  });
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  struct Case {
    const char* id;
    absl::StatusCode code;
    const char* reason;
    const char* message;
  };
  const Case cases[] = {
      {"batch_other", absl::StatusCode::kNotFound, "not_found", "no batch 'batch_other'"},
      {"batch_done", absl::StatusCode::kFailedPrecondition, "failed_precondition", "is completed"},
      {"file-big", absl::StatusCode::kOutOfRange, "out_of_range", "--batch-max-file-bytes"},
  };
  for (const Case& c : cases) {
    BatchCallInfo call = Call(std::string("r-") + c.id, BatchOp::kGetBatch);
    call.id = c.id;
    SendClient(client.get(), call);
    ErrorInfo e = RecvError(client.get());
    EXPECT_EQ(e.request_id, call.request_id);
    EXPECT_EQ(e.code, c.code) << c.id;
    EXPECT_EQ(e.reason, c.reason) << c.id;
    EXPECT_THAT(e.message, HasSubstr(c.message));
  }
}

TEST_F(RouterBatchTest, WithoutAHandlerCallsAreRefusedNamingTheStateDir) {
  Start(nullptr);
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Call("b1", BatchOp::kGetBatch));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "b1");
  EXPECT_EQ(e.code, absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.message, "this router has no batch store (--state-dir)");
}

TEST_F(RouterBatchTest, BadCallsAreRefusedBeforeTheHandler) {
  Start(Recording());
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Call("b1", BatchOp::kUnspecified));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "b1");
  EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.message, HasSubstr("op is unset"));
  SendClient(client.get(), Call("", BatchOp::kGetBatch));
  e = RecvError(client.get());
  EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.message, HasSubstr("request_id"));
  EXPECT_TRUE(seen().empty());
}

TEST_F(RouterBatchTest, AnUploadPassesTheRequestLimitUpToTheBatchCallLimit) {
  RouterOptions o;
  o.max_request_bytes = 64 << 10;
  o.max_batch_call_bytes = 512 << 10;
  Start(Recording(), {}, o);
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  BatchCallInfo upload = Call("big", BatchOp::kCreateFile);
  upload.content = std::string(400 << 10, 'x');
  SendClient(client.get(), upload);
  BatchReplyInfo reply = RecvClientAs<BatchReplyInfo>(client.get());
  EXPECT_EQ(reply.content, std::to_string(400 << 10));

  upload.request_id = "too-big";
  upload.content = std::string(600 << 10, 'x');
  SendClient(client.get(), upload);
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "too-big");
  EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.message, HasSubstr("exceeds the limit of 524288"));
  EXPECT_THAT(e.message, HasSubstr("--batch-max-file-bytes"));

  // Another message as large is held to --max-request-bytes.
  GenerateInput g = Request("gen", {}, 1, false);
  g.has_text = true;
  g.text = std::string(400 << 10, 'a');
  SendClient(client.get(), g);
  e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "gen");
  EXPECT_THAT(e.message, HasSubstr("(--max-request-bytes)"));
  EXPECT_EQ(seen().size(), 1u);
}

TEST_F(RouterBatchTest, ASlowCallDoesNotHoldUpAGenerateOrAnotherClient) {
  absl::Notification release;
  std::atomic<bool> started{false};
  Start([&](const std::string&, const BatchCallInfo&) -> absl::StatusOr<BatchReplyInfo> {
    started = true;
    release.WaitForNotificationWithTimeout(absl::Seconds(20));
    return BatchReplyInfo{"", "{}", ""};
  });
  FakeWorker w = StartWorker("w1");
  auto batch_client = Dealer(router_->frontend_endpoint(), "batch");
  auto client = Dealer(router_->frontend_endpoint(), "gen");
  SendClient(batch_client.get(), Call("slow", BatchOp::kCreateFile));
  while (!started) absl::SleepFor(absl::Milliseconds(1));

  // The handler is blocked; a generate is dispatched, streamed and finished meanwhile.
  SendClient(client.get(), Request("g1", {256, 1}, 2, /*stream=*/true));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'a')}, {}});
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'b', true)}, {}});
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).request_id, "g1");
  EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).request_id, "g1");
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).request_id, "g1");
  // The same id again while the call runs is a duplicate, refused at once.
  SendClient(batch_client.get(), Call("slow", BatchOp::kGetBatch));
  ErrorInfo dup = RecvError(batch_client.get());
  EXPECT_EQ(dup.code, absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(dup.reason, reason::kDuplicateRequestId);
  EXPECT_FALSE(TryRecvClient(batch_client.get(), 50).has_value());

  release.Notify();
  BatchReplyInfo reply = RecvClientAs<BatchReplyInfo>(batch_client.get());
  EXPECT_EQ(reply.request_id, "slow");
  EXPECT_EQ(reply.json, "{}");
}

TEST_F(RouterBatchTest, CallsWaitingForTheBatchThreadAreBounded) {
  absl::Notification release;
  std::atomic<int> started{0};
  RouterOptions o;
  o.max_batch_call_bytes = 256 << 10;
  Start(
      [&](const std::string&, const BatchCallInfo&) -> absl::StatusOr<BatchReplyInfo> {
        ++started;
        release.WaitForNotificationWithTimeout(absl::Seconds(20));
        return BatchReplyInfo{"", "{}", ""};
      },
      {}, o);
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  BatchCallInfo upload = Call("up-1", BatchOp::kCreateFile);
  upload.content = std::string(200 << 10, 'x');
  SendClient(client.get(), upload);
  while (started == 0) absl::SleepFor(absl::Milliseconds(1));
  // A second upload would hold more than max_batch_call_bytes of uploads at once.
  upload.request_id = "up-2";
  SendClient(client.get(), upload);
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "up-2");
  EXPECT_EQ(e.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(e.reason, reason::kQueueFull);
  EXPECT_GT(e.retry_after_ms, 0);
  // Calls without content queue up to the bound, then are refused the same way.
  for (int i = 1; i < kMaxBatchCallsWaiting; ++i) {
    SendClient(client.get(), Call(absl::StrCat("get-", i), BatchOp::kGetBatch));
  }
  SendClient(client.get(), Call("one-too-many", BatchOp::kGetBatch));
  e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "one-too-many");
  EXPECT_EQ(e.reason, reason::kQueueFull);
  release.Notify();
  int replies = 0;
  while (std::optional<ServerMessage> m = TryRecvClient(client.get(), 2000)) {
    ASSERT_TRUE(std::holds_alternative<BatchReplyInfo>(*m));
    if (++replies == kMaxBatchCallsWaiting) break;
  }
  EXPECT_EQ(replies, kMaxBatchCallsWaiting);
  EXPECT_EQ(started.load(), kMaxBatchCallsWaiting);
}

}  // namespace
}  // namespace carpool::router
