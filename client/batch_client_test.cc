// carpool::Client's batch calls (files and batches) against a fake router with an in-memory
// batch store (client/fake_batch_store_test_util.h).
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/carpool_client.h"
#include "client/fake_batch_store_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace carpool {
namespace {

using ::testing::ElementsAre;
using testing::FakeBatchStore;
using testing::FakeRouter;
using ::testing::HasSubstr;

std::unique_ptr<Client> ConnectTo(const FakeRouter& router, ClientOptions options = {}) {
  options.router_endpoint = router.endpoint();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  CARPOOL_CHECK(client.ok());
  return std::move(*client);
}

std::vector<BatchCallInfo> BatchCalls(const FakeRouter& router) {
  std::vector<BatchCallInfo> out;
  for (const ClientMessage& m : router.Received()) {
    if (const auto* b = std::get_if<BatchCallInfo>(&m)) out.push_back(*b);
  }
  return out;
}

std::string Line(const std::string& custom_id, const std::string& url = "/v1/chat/completions") {
  return nlohmann::json({{"custom_id", custom_id},
                         {"method", "POST"},
                         {"url", url},
                         {"body", {{"model", "m"}, {"messages", nlohmann::json::array()}}}})
             .dump() +
         "\n";
}

TEST(ClientBatchTest, UploadFileSendsABatchFileAndReadsTheFileObject) {
  FakeBatchStore store;
  FakeRouter router(store.Handler());
  ClientOptions options;
  options.api_key = "key-1";
  auto client = ConnectTo(router, options);
  const std::string content = Line("a") + Line("b");
  absl::StatusOr<FileInfo> file = client->UploadFile("in.jsonl", content);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file->id, HasSubstr("file-"));
  EXPECT_EQ(file->bytes, static_cast<int64_t>(content.size()));
  EXPECT_EQ(file->filename, "in.jsonl");
  EXPECT_EQ(file->purpose, "batch");
  EXPECT_GT(file->created_at, 0);
  std::vector<BatchCallInfo> sent = BatchCalls(router);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].op, BatchOp::kCreateFile);
  EXPECT_EQ(sent[0].purpose, "batch");
  EXPECT_EQ(sent[0].content, content);
  EXPECT_EQ(sent[0].api_key, "key-1");
  EXPECT_FALSE(sent[0].request_id.empty());

  BatchCallOptions other_key;
  other_key.api_key = "key-2";
  absl::StatusOr<FileInfo> got = client->GetFile(file->id, other_key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, file->bytes);
  EXPECT_EQ(BatchCalls(router).back().api_key, "key-2");  // the call's key wins
  absl::StatusOr<std::string> back = client->FileContent(file->id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, content);
  ASSERT_TRUE(client->DeleteFile(file->id).ok());
  absl::Status gone = client->GetFile(file->id).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  EXPECT_EQ(ErrorReason(gone), "not_found");
}

TEST(ClientBatchTest, SubmitBatchFileTakesTheEndpointFromTheFirstLine) {
  FakeBatchStore store;
  FakeRouter router(store.Handler());
  auto client = ConnectTo(router);
  SubmitBatchOptions submit;
  submit.metadata = {{"project", "eval"}, {"run", "7"}};
  submit.completion_window = "2h";
  absl::StatusOr<BatchInfo> batch =
      client->SubmitBatchFile(Line("a", "/v1/completions") + Line("b", "/v1/completions"), submit);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(batch->id, HasSubstr("batch_"));
  EXPECT_EQ(batch->status, "in_progress");
  EXPECT_FALSE(batch->finished());
  EXPECT_EQ(batch->endpoint, "/v1/completions");
  EXPECT_EQ(batch->completion_window, "2h");
  EXPECT_EQ(batch->request_counts.total, 2);
  EXPECT_EQ(batch->metadata, submit.metadata);
  EXPECT_GT(batch->created_at, 0);
  EXPECT_GT(batch->expires_at, batch->created_at);
  EXPECT_EQ(batch->completed_at, 0);  // null: not reached
  EXPECT_EQ(batch->output_file_id, "");
  std::vector<BatchCallInfo> sent = BatchCalls(router);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].op, BatchOp::kCreateFile);
  EXPECT_EQ(sent[0].filename, "batch.jsonl");
  EXPECT_EQ(sent[1].op, BatchOp::kCreateBatch);
  EXPECT_EQ(sent[1].endpoint, "/v1/completions");
  EXPECT_EQ(sent[1].completion_window, "2h");
  EXPECT_EQ(nlohmann::json::parse(sent[1].metadata_json),
            nlohmann::json({{"project", "eval"}, {"run", "7"}}));
  EXPECT_EQ(store.Content(sent[1].input_file_id),
            Line("a", "/v1/completions") + Line("b", "/v1/completions"));

  // A first line without a url names no endpoint: refused before anything is sent.
  absl::Status s = client->SubmitBatchFile("not json\n", {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("first line"));
  EXPECT_EQ(BatchCalls(router).size(), 2u);
}

TEST(ClientBatchTest, WaitBatchPollsToTheEndAndResultsHoldBothFiles) {
  FakeBatchStore store;
  FakeRouter router(store.Handler());
  auto client = ConnectTo(router);
  absl::StatusOr<BatchInfo> batch =
      client->SubmitBatchFile(Line("a") + Line("bad-1") + Line("c"), {});
  ASSERT_TRUE(batch.ok()) << batch.status();

  absl::Status early = client->BatchResults(batch->id).status();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_THAT(early.message(), HasSubstr("in_progress"));

  std::vector<int64_t> progress;
  absl::StatusOr<BatchInfo> done =
      client->WaitBatch(batch->id, /*poll_ms=*/5, [&](const BatchInfo& b) {
        progress.push_back(b.request_counts.completed + b.request_counts.failed);
      });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status, "completed");
  EXPECT_TRUE(done->finished());
  EXPECT_EQ(done->request_counts.completed, 2);
  EXPECT_EQ(done->request_counts.failed, 1);
  EXPECT_GT(done->completed_at, 0);
  // Each poll of the fake answers one more request (the refused BatchResults polled once).
  EXPECT_THAT(progress, ElementsAre(2, 3, 3));

  absl::StatusOr<BatchResultFiles> results = client->BatchResults(batch->id);
  ASSERT_TRUE(results.ok()) << results.status();
  std::vector<std::string> output = absl::StrSplit(results->output_jsonl, '\n', absl::SkipEmpty());
  ASSERT_EQ(output.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(output[0])["custom_id"], "a");
  EXPECT_EQ(nlohmann::json::parse(output[1])["custom_id"], "c");
  EXPECT_EQ(nlohmann::json::parse(results->error_jsonl)["custom_id"], "bad-1");
}

TEST(ClientBatchTest, WaitBatchEndsAtItsTimeout) {
  FakeBatchStore store;
  FakeRouter router(store.Handler());
  auto client = ConnectTo(router);
  absl::StatusOr<BatchInfo> batch = client->SubmitBatchFile(Line("a"), {});
  ASSERT_TRUE(batch.ok()) << batch.status();
  store.SetStatus(batch->id, "validating");  // never moves on
  BatchCallOptions briefly;
  briefly.timeout_ms = 200;
  absl::Status s = client->WaitBatch(batch->id, 20, {}, briefly).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("validating"));
}

TEST(ClientBatchTest, AFailedValidationListsEveryBadLine) {
  FakeBatchStore store;
  FakeRouter router(store.Handler());
  auto client = ConnectTo(router);
  SubmitBatchOptions submit;
  submit.endpoint = "/v1/chat/completions";
  absl::StatusOr<BatchInfo> batch =
      client->SubmitBatchFile(Line("a") + "{oops\n" + Line("b") + "nope\n", submit);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->status, "failed");
  EXPECT_TRUE(batch->finished());
  ASSERT_EQ(batch->errors.size(), 2u);
  EXPECT_EQ(batch->errors[0].code, "invalid_json");
  EXPECT_EQ(batch->errors[0].line, 2);
  EXPECT_EQ(batch->errors[1].line, 4);
  EXPECT_GT(batch->failed_at, 0);
  // Nothing ran: no files to read.
  absl::StatusOr<BatchResultFiles> results = client->BatchResults(batch->id);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->output_jsonl, "");
  EXPECT_EQ(results->error_jsonl, "");
}

TEST(ClientBatchTest, CancelAndListAndTheRoutersErrors) {
  FakeBatchStore store;
  FakeRouter router(store.Handler());
  auto client = ConnectTo(router);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<BatchInfo> b = client->SubmitBatchFile(Line("a"), {});
    ASSERT_TRUE(b.ok()) << b.status();
    ids.push_back(b->id);
  }
  absl::StatusOr<BatchInfo> cancelled = client->CancelBatch(ids[0]);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->status, "cancelling");
  EXPECT_EQ(BatchCalls(router).back().op, BatchOp::kCancelBatch);
  EXPECT_EQ(BatchCalls(router).back().id, ids[0]);
  absl::StatusOr<BatchInfo> after = client->WaitBatch(ids[0], 5);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->status, "cancelled");
  absl::Status again = client->CancelBatch(ids[0]).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_EQ(ErrorReason(again), "failed_precondition");

  absl::StatusOr<BatchList> page = client->ListBatches("", 2);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->data.size(), 2u);
  EXPECT_EQ(page->data[0].id, ids[2]);  // newest first
  EXPECT_EQ(page->data[1].id, ids[1]);
  EXPECT_TRUE(page->has_more);
  EXPECT_EQ(BatchCalls(router).back().limit, 2);
  page = client->ListBatches(page->data.back().id);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->data.size(), 1u);
  EXPECT_EQ(page->data[0].id, ids[0]);
  EXPECT_FALSE(page->has_more);
  EXPECT_EQ(BatchCalls(router).back().after, ids[1]);

  absl::Status missing = client->GetBatch("batch_nope").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("batch_nope"));
}

TEST(ClientBatchTest, AFileTooLargeForTheClientIsRefusedBeforeItIsSent) {
  FakeBatchStore store;
  FakeRouter router(store.Handler());
  ClientOptions options;
  options.max_message_bytes = 256 << 10;
  auto client = ConnectTo(router, options);
  absl::StatusOr<FileInfo> file = client->UploadFile("big.jsonl", std::string(300 << 10, 'x'));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::Status s = client->FileContent(file->id).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("max_message_bytes"));
  for (const BatchCallInfo& call : BatchCalls(router)) EXPECT_NE(call.op, BatchOp::kFileContent);
  // The connection is still good.
  EXPECT_TRUE(client->GetFile(file->id).ok());
}

// Records calls and answers none.
void Silent(FakeRouter&, const std::string&, const ClientMessage&) {}

TEST(ClientBatchTest, OnlyCallsThatChangeNothingAreResentAfterTheRouterWasLost) {
  auto router = std::make_unique<FakeRouter>(Silent);
  const std::string endpoint = router->endpoint();
  ClientOptions options;
  options.max_retries = 5;
  options.initial_backoff_ms = 10;
  auto client = ConnectTo(*router, options);
  absl::Status upload, get;
  std::thread uploader([&] { upload = client->UploadFile("in.jsonl", Line("a")).status(); });
  std::thread getter([&] { get = client->GetBatch("batch_1").status(); });
  ASSERT_TRUE(router->WaitFor([](const auto& ms) { return ms.size() == 2; }));
  router.reset();  // the connection drops with both calls open
  FakeBatchStore store;
  router = std::make_unique<FakeRouter>(store.Handler(), SocketOptions{}, endpoint);
  uploader.join();
  getter.join();
  // The upload may have been stored: it ends with router_lost, for the caller to check.
  EXPECT_EQ(upload.code(), absl::StatusCode::kUnavailable) << upload;
  EXPECT_EQ(ErrorReason(upload), "router_lost");
  // The read was sent again and answered by the next router.
  EXPECT_EQ(get.code(), absl::StatusCode::kNotFound) << get;
  for (const BatchCallInfo& call : BatchCalls(*router)) EXPECT_NE(call.op, BatchOp::kCreateFile);
}

}  // namespace
}  // namespace carpool
