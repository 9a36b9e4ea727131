// The batch service against a real Router in process (inproc) and a simulated worker: a batch
// runs to completed with each custom_id answered once in input order; bad files fail with every
// line's error; cancel and expiry keep what finished and list the rest; a service stopped
// mid-batch and started again on the same state dir finishes it without answering anything twice;
// tenants cannot see each other's ids; an unusable state dir and a full store are clear errors.
#include "router/batch/batch_service.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/batch/batch_test_util.h"
#include "router/router.h"
#include "router/testing/sim_worker.h"

namespace carpool::router::batch {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

std::string Lines(int n, int max_tokens) {
  std::string out;
  for (int i = 0; i < n; ++i) out += CompletionLine(absl::StrCat("req-", i), max_tokens, i + 1);
  return out;
}

std::vector<json> ParseJsonl(const std::string& text) {
  std::vector<json> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    out.push_back(json::parse(line));
  }
  return out;
}

bool Final(BatchStatus s) {
  return s == BatchStatus::kFailed || s == BatchStatus::kCompleted ||
         s == BatchStatus::kExpired || s == BatchStatus::kCancelled;
}

class BatchServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("carpool_batch_service");
  }
  void TearDown() override {
    service_.reset();
    worker_.reset();
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
    std::filesystem::remove_all(dir_);
  }

  void StartRouter(const std::string& tenants_textproto = "") {
    RouterOptions o;
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    if (!tenants_textproto.empty()) {
      auto t = TenantTable::Parse(tenants_textproto);
      ASSERT_TRUE(t.ok()) << t.status();
      o.tenants = *t;
      tenants_ = *t;
    }
    auto router = Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
  }
  void StartWorker(int step_ms = 2, int max_num_seqs = 4) {
    testing::SimWorkerOptions w;
    w.step_ms = step_ms;
    w.max_num_seqs = max_num_seqs;
    worker_ = std::make_unique<testing::SimWorker>(router_->backend_endpoint(), w);
  }
  BatchServiceOptions Options() const {
    BatchServiceOptions o;
    o.state_dir = (dir_ / "state").string();
    o.router_endpoint = router_->inproc_endpoint();
    o.zmq_context = router_->zmq_context();
    o.max_outstanding = 8;
    o.tenants = tenants_;
    o.retry_ms = 20;
    return o;
  }
  void StartService(BatchServiceOptions o) {
    auto s = BatchService::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    service_ = std::move(*s);
  }
  Batch Submit(const std::string& content, const std::string& window = "24h",
               const std::string& tenant = "") {
    auto file = service_->CreateFile(tenant, "in.jsonl", "batch", content);
    EXPECT_TRUE(file.ok()) << file.status();
    auto b = service_->CreateBatch(tenant, file->id, "/v1/completions", window, "");
    EXPECT_TRUE(b.ok()) << b.status();
    return *b;
  }
  // Polls until the batch is in a final status (or `until` says so) or ~20 s pass.
  Batch Await(const std::string& id, const std::string& tenant = "",
              bool (*until)(const Batch&) = nullptr) {
    Batch b;
    for (int i = 0; i < 400; ++i) {
      auto got = service_->GetBatch(tenant, id);
      EXPECT_TRUE(got.ok()) << got.status();
      b = *got;
      if (until != nullptr ? until(b) : Final(b.status)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return b;
  }
  std::string Content(const std::string& file_id, const std::string& tenant = "") {
    if (file_id.empty()) return "";
    auto c = service_->GetFileContent(tenant, file_id);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : "";
  }

  std::filesystem::path dir_;
  TenantTable tenants_;
  std::unique_ptr<Router> router_;
  std::thread thread_;
  std::unique_ptr<testing::SimWorker> worker_;
  std::unique_ptr<BatchService> service_;
};

TEST_F(BatchServiceTest, RunsEveryRequestOnceInInputOrder) {
  StartRouter();
  StartWorker();
  StartService(Options());
  Batch b = Submit(Lines(30, 3));
  EXPECT_EQ(b.status, BatchStatus::kValidating);
  b = Await(b.id);
  ASSERT_EQ(b.status, BatchStatus::kCompleted);
  EXPECT_EQ(b.request_counts.total, 30);
  EXPECT_EQ(b.request_counts.completed, 30);
  EXPECT_EQ(b.request_counts.failed, 0);
  EXPECT_GT(b.in_progress_at, 0);
  EXPECT_GT(b.completed_at, 0);
  EXPECT_TRUE(b.error_file_id.empty());
  std::vector<json> out = ParseJsonl(Content(b.output_file_id));
  ASSERT_EQ(out.size(), 30u);
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(out[i]["custom_id"], absl::StrCat("req-", i));
    EXPECT_EQ(out[i]["response"]["status_code"], 200);
    EXPECT_TRUE(out[i]["error"].is_null());
    const json& body = out[i]["response"]["body"];
    EXPECT_EQ(body["object"], "text_completion");
    EXPECT_EQ(body["usage"]["completion_tokens"], 3);
    EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  }
  json batch = json::parse(BatchJson(b));
  EXPECT_EQ(batch["object"], "batch");
  EXPECT_EQ(batch["status"], "completed");
  EXPECT_EQ(batch["request_counts"]["completed"], 30);
  EXPECT_EQ(batch["expires_at"], b.created_at + 24 * 3600);
  EXPECT_TRUE(batch["cancelled_at"].is_null());
  BatchServiceStats stats = service_->Stats();
  EXPECT_EQ(stats.requests_done, 30);
  EXPECT_EQ(stats.completion_tokens, 90);
  EXPECT_EQ(stats.requests_pending + stats.requests_running, 0);
  for (int i = 0; i < 40 && stats.batches_by_status[static_cast<int>(BatchStatus::kCompleted)] == 0;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // counted every 500 ms
    stats = service_->Stats();
  }
  EXPECT_EQ(stats.batches_by_status[static_cast<int>(BatchStatus::kCompleted)], 1);
}

TEST_F(BatchServiceTest, BadLinesFailTheBatchWithEveryErrorAndRunNothing) {
  StartRouter();
  StartWorker();
  StartService(Options());
  std::string content = CompletionLine("a", 2) + "not json\n" + CompletionLine("a", 2) +
                        R"({"custom_id": "c", "method": "POST", "url": "/v1/embeddings", )"
                        R"("body": {"model": "sim", "input": "x"}})" "\n";
  Batch b = Await(Submit(content).id);
  ASSERT_EQ(b.status, BatchStatus::kFailed);
  json errors = json::parse(b.errors_json);
  ASSERT_EQ(errors["data"].size(), 3u);
  EXPECT_EQ(errors["data"][0]["line"], 2);
  EXPECT_EQ(errors["data"][1]["line"], 3);
  EXPECT_EQ(errors["data"][1]["code"], "duplicate_custom_id");
  EXPECT_EQ(errors["data"][2]["line"], 4);
  EXPECT_EQ(b.request_counts.completed, 0);
  EXPECT_EQ(worker_->dispatches(), 0);
}

TEST_F(BatchServiceTest, RequestErrorsAreResultsInTheErrorFile) {
  StartRouter();
  StartWorker();
  StartService(Options());
  // max_tokens past the simulated worker's max_model_len: the router refuses it (4xx).
  Batch b = Await(Submit(CompletionLine("ok", 2) + CompletionLine("too-long", 100000)).id);
  ASSERT_EQ(b.status, BatchStatus::kCompleted);
  EXPECT_EQ(b.request_counts.completed, 1);
  EXPECT_EQ(b.request_counts.failed, 1);
  std::vector<json> out = ParseJsonl(Content(b.output_file_id));
  std::vector<json> err = ParseJsonl(Content(b.error_file_id));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(err.size(), 1u);
  EXPECT_EQ(err[0]["custom_id"], "too-long");
  EXPECT_GE(err[0]["response"]["status_code"].get<int>(), 400);
  EXPECT_TRUE(err[0]["response"]["body"].contains("error"));
}

TEST_F(BatchServiceTest, CancelKeepsWhatFinishedAndListsTheRest) {
  StartRouter();
  StartWorker(/*step_ms=*/20, /*max_num_seqs=*/2);
  StartService(Options());
  Batch b = Submit(Lines(40, 10));
  Await(b.id, "", [](const Batch& x) { return x.request_counts.completed >= 2; });
  auto cancelling = service_->CancelBatch("", b.id);
  ASSERT_TRUE(cancelling.ok()) << cancelling.status();
  EXPECT_EQ(cancelling->status, BatchStatus::kCancelling);
  b = Await(b.id);
  ASSERT_EQ(b.status, BatchStatus::kCancelled);
  EXPECT_EQ(b.request_counts.completed + b.request_counts.failed, 40);
  EXPECT_GE(b.request_counts.completed, 2);
  EXPECT_LT(b.request_counts.completed, 40);
  std::vector<json> err = ParseJsonl(Content(b.error_file_id));
  ASSERT_EQ(static_cast<int64_t>(err.size()), b.request_counts.failed);
  EXPECT_EQ(err[0]["error"]["code"], "batch_cancelled");
  EXPECT_TRUE(err[0]["response"].is_null());
  // Cancelling again is no change; a completed batch cannot be cancelled.
  EXPECT_EQ(service_->CancelBatch("", b.id)->status, BatchStatus::kCancelled);
  Batch done = Await(Submit(Lines(1, 1)).id);
  ASSERT_EQ(done.status, BatchStatus::kCompleted);
  auto late = service_->CancelBatch("", done.id);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("completed"));
}

TEST_F(BatchServiceTest, ExpiresAtTheEndOfItsWindow) {
  StartRouter();
  StartWorker(/*step_ms=*/20, /*max_num_seqs=*/1);
  StartService(Options());
  // 30 requests of 20 tokens one at a time: ~12 s of work in a 1 s window.
  Batch b = Await(Submit(Lines(30, 20), "1s").id);
  ASSERT_EQ(b.status, BatchStatus::kExpired);
  EXPECT_GT(b.expired_at, 0);
  EXPECT_EQ(b.request_counts.completed + b.request_counts.failed, 30);
  EXPECT_LT(b.request_counts.completed, 30);
  std::vector<json> err = ParseJsonl(Content(b.error_file_id));
  ASSERT_FALSE(err.empty());
  EXPECT_EQ(err.back()["error"]["code"], "batch_expired");
}

TEST_F(BatchServiceTest, ResumesAfterARestartWithoutAnsweringTwice) {
  StartRouter();
  StartWorker(/*step_ms=*/5, /*max_num_seqs=*/2);
  StartService(Options());
  Batch b = Submit(Lines(40, 5));
  Await(b.id, "", [](const Batch& x) { return x.request_counts.completed >= 5; });
  service_.reset();  // as a router stopping: what is in flight runs again after the start
  StartService(Options());
  b = Await(b.id);
  ASSERT_EQ(b.status, BatchStatus::kCompleted);
  EXPECT_EQ(b.request_counts.completed, 40);
  std::vector<json> out = ParseJsonl(Content(b.output_file_id));
  ASSERT_EQ(out.size(), 40u);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(out[i]["custom_id"], absl::StrCat("req-", i));
}

TEST_F(BatchServiceTest, TenantsSeeOnlyTheirOwnBatches) {
  StartRouter(R"(tenant { key: "ka" name: "alice" } tenant { key: "kb" name: "bob" })");
  StartWorker();
  StartService(Options());
  EXPECT_EQ(*service_->TenantOf("ka"), "alice");
  EXPECT_EQ(service_->TenantOf("nope").status().code(), absl::StatusCode::kUnauthenticated);
  Batch b = Await(Submit(Lines(3, 2), "24h", "alice").id, "alice");
  ASSERT_EQ(b.status, BatchStatus::kCompleted);  // run with alice's key
  EXPECT_EQ(service_->GetBatch("bob", b.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->CancelBatch("bob", b.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->GetFileContent("bob", b.output_file_id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->ListBatches("bob", "", 20)->data.size(), 0u);
  EXPECT_EQ(service_->ListBatches("alice", "", 20)->data.size(), 1u);
}

TEST_F(BatchServiceTest, RefusesBadCallsByName) {
  StartRouter();
  StartService(Options());
  EXPECT_EQ(service_->CreateFile("", "f", "fine-tune", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_->CreateFile("", "f", "batch", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_->CreateBatch("", "file-nope", "/v1/completions", "24h", "").status().code(),
            absl::StatusCode::kNotFound);
  auto file = service_->CreateFile("", "f", "batch", CompletionLine("a", 1));
  ASSERT_TRUE(file.ok());
  auto bad_url = service_->CreateBatch("", file->id, "/v1/images", "24h", "");
  EXPECT_THAT(bad_url.status().message(), HasSubstr("endpoint"));
  auto bad_window = service_->CreateBatch("", file->id, "/v1/completions", "2d", "");
  EXPECT_THAT(bad_window.status().message(), HasSubstr("completion_window"));
  auto bad_meta = service_->CreateBatch("", file->id, "/v1/completions", "24h", "[1]");
  EXPECT_THAT(bad_meta.status().message(), HasSubstr("metadata"));
  auto ok = service_->CreateBatch("", file->id, "/v1/completions", "24h", R"({"k": "v"})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(json::parse(BatchJson(*ok))["metadata"]["k"], "v");
}

TEST_F(BatchServiceTest, OversizedFileIsOutOfRange) {
  StartRouter();
  BatchServiceOptions o = Options();
  o.input.max_bytes = 100;
  StartService(o);
  auto file = service_->CreateFile("", "f", "batch", Lines(5, 1));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(file.status().message(), HasSubstr("--batch-max-file-bytes"));
}

TEST_F(BatchServiceTest, TooManyLinesIsRefusedAtUpload) {
  StartRouter();
  BatchServiceOptions o = Options();
  o.input.max_lines = 3;
  StartService(o);
  EXPECT_TRUE(service_->CreateFile("", "f", "batch", Lines(3, 1)).ok());
  auto file = service_->CreateFile("", "f", "batch", Lines(4, 1));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(file.status().message(), HasSubstr("--batch-max-lines"));
}

TEST_F(BatchServiceTest, UnusableStateDirFailsTheStartNamingIt) {
  StartRouter();
  std::filesystem::create_directories(dir_);
  const std::filesystem::path blocker = dir_ / "a-file";
  std::ofstream(blocker) << "x";
  BatchServiceOptions o = Options();
  o.state_dir = (blocker / "state").string();
  auto s = BatchService::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr(blocker.string()));
  o.state_dir = blocker.string();
  s = BatchService::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("not a directory"));
  // A good one is probed, not created, until first use.
  o.state_dir = (dir_ / "later" / "state").string();
  s = BatchService::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(std::filesystem::exists(dir_ / "later"));
}

TEST_F(BatchServiceTest, AFullStoreFailsTheBatchWithAReason) {
  StartRouter();
  StartWorker();
  BatchServiceOptions o = Options();
  o.max_store_pages = 16;  // pages of 4 KiB: room for the schema and a little more
  StartService(o);
  // Answers of ~2 KB each outgrow the cap while the batch runs.
  std::string content;
  for (int i = 0; i < 60; ++i) content += CompletionLine(absl::StrCat("r", i), 400, i + 1);
  auto file = service_->CreateFile("", "in.jsonl", "batch", content);
  ASSERT_TRUE(file.ok()) << file.status();
  auto created = service_->CreateBatch("", file->id, "/v1/completions", "24h", "");
  ASSERT_TRUE(created.ok()) << created.status();
  Batch b = Await(created->id);
  ASSERT_EQ(b.status, BatchStatus::kFailed);
  EXPECT_THAT(b.errors_json, HasSubstr("storage_error"));
}

}  // namespace
}  // namespace carpool::router::batch
