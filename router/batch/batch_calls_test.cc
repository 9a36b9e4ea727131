// The Batch API over ZeroMQ end to end: carpool::Client's batch calls over TCP to a Router whose
// batch calls run HandleBatchCall on a BatchService (as carpool-router wires them), with a
// simulated worker answering the batch's requests.
#include "router/batch/batch_calls.h"

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/carpool_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/batch/batch_test_util.h"
#include "router/router.h"
#include "router/testing/sim_worker.h"

namespace carpool::router::batch {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

class BatchCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("carpool_batch_calls");
  }
  void TearDown() override {
    clients_.clear();
    service_.reset();  // before the router: its client socket lives in the router's context
    worker_.reset();
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
    std::filesystem::remove_all(dir_);
  }

  // A router whose batch calls go to a fresh service (max_file_bytes: its upload limit), and a
  // simulated worker.
  void Start(const std::string& tenants_textproto = "", int64_t max_file_bytes = 1 << 20) {
    RouterOptions o;
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    o.max_request_bytes = 64 << 10;
    o.max_batch_call_bytes = max_file_bytes + kBatchCallEnvelopeBytes;
    TenantTable tenants;
    if (!tenants_textproto.empty()) {
      auto t = TenantTable::Parse(tenants_textproto);
      ASSERT_TRUE(t.ok()) << t.status();
      tenants = *t;
    }
    o.tenants = tenants;
    auto router = Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    BatchServiceOptions b;
    b.state_dir = (dir_ / "state").string();
    b.router_endpoint = router_->inproc_endpoint();
    b.zmq_context = router_->zmq_context();
    b.tenants = tenants;
    b.max_outstanding = 8;
    b.retry_ms = 20;
    b.input.max_bytes = max_file_bytes;
    auto service = BatchService::Start(b);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    // Held weakly, as carpool-router does: a call after the service ended is refused.
    router_->SetBatchCalls([weak = std::weak_ptr<BatchService>(service_)](
                               const std::string& tenant,
                               const BatchCallInfo& call) -> absl::StatusOr<BatchReplyInfo> {
      std::shared_ptr<BatchService> service = weak.lock();
      if (service == nullptr) return absl::UnavailableError("the batch service has stopped");
      return HandleBatchCall(*service, tenant, call);
    });
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
    testing::SimWorkerOptions w;
    w.step_ms = 2;
    worker_ = std::make_unique<testing::SimWorker>(router_->backend_endpoint(), w);
  }

  Client& Connect(const std::string& api_key = "") {
    ClientOptions o;
    o.router_endpoint = router_->frontend_endpoint();
    o.api_key = api_key;
    o.default_timeout_ms = 20000;
    auto client = Client::Connect(o);
    EXPECT_TRUE(client.ok()) << client.status();
    clients_.push_back(std::move(*client));
    return *clients_.back();
  }

  std::filesystem::path dir_;
  std::unique_ptr<Router> router_;
  std::thread thread_;
  std::shared_ptr<BatchService> service_;
  std::unique_ptr<testing::SimWorker> worker_;
  std::vector<std::unique_ptr<Client>> clients_;
};

TEST_F(BatchCallsTest, ABatchRunsToCompletedThroughTheSdk) {
  Start();
  Client& client = Connect();
  std::string content;
  for (int i = 0; i < 12; ++i) content += CompletionLine(absl::StrCat("req-", i), 3, i + 1);
  SubmitBatchOptions submit;
  submit.metadata = {{"run", "e2e"}};
  absl::StatusOr<BatchInfo> batch = client.SubmitBatchFile(content, submit);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->endpoint, "/v1/completions");  // from the first line
  EXPECT_EQ(batch->metadata, submit.metadata);
  EXPECT_EQ(batch->completion_window, "24h");

  BatchCallOptions wait;
  wait.timeout_ms = 20000;
  absl::StatusOr<BatchInfo> done = client.WaitBatch(batch->id, 20, {}, wait);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->status, "completed");
  EXPECT_EQ(done->request_counts.total, 12);
  EXPECT_EQ(done->request_counts.completed, 12);
  EXPECT_GT(done->completed_at, 0);
  EXPECT_EQ(done->error_file_id, "");

  absl::StatusOr<BatchResultFiles> results = client.BatchResults(batch->id);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->error_jsonl, "");
  std::set<std::string> answered;
  for (absl::string_view line : absl::StrSplit(results->output_jsonl, '\n', absl::SkipEmpty())) {
    json j = json::parse(line);
    EXPECT_EQ(j["response"]["status_code"], 200);
    EXPECT_EQ(j["response"]["body"]["usage"]["completion_tokens"], 3);
    EXPECT_TRUE(answered.insert(j["custom_id"].get<std::string>()).second);
  }
  EXPECT_EQ(answered.size(), 12u);

  absl::StatusOr<FileInfo> output = client.GetFile(done->output_file_id);
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(output->purpose, "batch_output");
  EXPECT_EQ(output->bytes, static_cast<int64_t>(results->output_jsonl.size()));
  absl::StatusOr<BatchList> list = client.ListBatches();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->data.size(), 1u);
  EXPECT_EQ(list->data[0].id, batch->id);
  EXPECT_FALSE(list->has_more);

  ASSERT_TRUE(client.DeleteFile(batch->input_file_id).ok());
  absl::Status gone = client.GetFile(batch->input_file_id).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  EXPECT_EQ(ErrorReason(gone), "not_found");
}

TEST_F(BatchCallsTest, TenantsSeeOnlyTheirOwnBatchesAndNeedAKey) {
  Start(R"pb(
    tenant { key: "key-alpha" name: "alpha" }
    tenant { key: "key-beta" name: "beta" }
  )pb");
  Client& alpha = Connect("key-alpha");
  Client& beta = Connect("key-beta");
  Client& anonymous = Connect();
  absl::StatusOr<BatchInfo> batch = alpha.SubmitBatchFile(CompletionLine("a", 2, 1), {});
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE(alpha.GetBatch(batch->id).ok());
  absl::Status other = beta.GetBatch(batch->id).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound) << other;
  EXPECT_EQ(beta.CancelBatch(batch->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(beta.GetFile(batch->input_file_id).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<BatchList> beta_list = beta.ListBatches();
  ASSERT_TRUE(beta_list.ok()) << beta_list.status();
  EXPECT_TRUE(beta_list->data.empty());
  absl::Status no_key = anonymous.ListBatches().status();
  EXPECT_EQ(no_key.code(), absl::StatusCode::kUnauthenticated) << no_key;
}

TEST_F(BatchCallsTest, BadCallsGetTheServicesErrors) {
  Start("", /*max_file_bytes=*/100 << 10);
  Client& client = Connect();
  SubmitBatchOptions submit;
  submit.endpoint = "/v1/images";
  absl::Status s = client.SubmitBatchFile(CompletionLine("a", 2, 1), submit).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(ErrorReason(s), "invalid_argument");

  submit.endpoint = "/v1/completions";
  submit.completion_window = "48h";
  s = client.SubmitBatchFile(CompletionLine("a", 2, 1), submit).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  s = client.GetBatch("").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("needs the id of a batch"));
  s = client.ListBatches("", 101).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("limit is 101"));

  // Past the router's request limit, within the upload limit: stored. Past the upload limit:
  // OUT_OF_RANGE from the service, the frame having been let through.
  std::string big;
  while (big.size() < (80 << 10)) big += CompletionLine(absl::StrCat("r", big.size()), 2, 1);
  EXPECT_TRUE(client.UploadFile("big.jsonl", big).ok());
  while (big.size() < (120 << 10)) big += CompletionLine(absl::StrCat("r", big.size()), 2, 1);
  s = client.UploadFile("bigger.jsonl", big).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(ErrorReason(s), "out_of_range");
}

}  // namespace
}  // namespace carpool::router::batch
