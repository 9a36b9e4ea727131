#include "router/batch/batch_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace carpool::router::batch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class BatchStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           (std::string("carpool_batch_store_") + info->name() + "_" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  BatchStoreOptions Options() const {
    BatchStoreOptions o;
    o.state_dir = (dir_ / "state").string();
    return o;
  }
  std::unique_ptr<BatchStore> OpenStore() {
    auto store = BatchStore::Open(Options());
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  static StoredFile PutInput(BatchStore& store, const std::string& tenant,
                             const std::string& content = "{}\n") {
    auto f = store.PutFile({"", tenant, "batch", "in.jsonl", 0, 100}, content);
    EXPECT_TRUE(f.ok()) << f.status();
    return *f;
  }
  static Batch NewBatch(BatchStore& store, const std::string& tenant, int64_t created_at) {
    StoredFile f = PutInput(store, tenant);
    Batch b;
    b.tenant = tenant;
    b.input_file_id = f.id;
    b.endpoint = "/v1/chat/completions";
    b.completion_window = "24h";
    b.metadata_json = R"({"job":"eval"})";
    b.created_at = created_at;
    auto created = store.CreateBatch(b);
    EXPECT_TRUE(created.ok()) << created.status();
    return *created;
  }
  static BatchResult Ok(int64_t line, const std::string& custom_id, const std::string& text) {
    return {line, custom_id,
            R"({"status_code":200,"request_id":"r)" + std::to_string(line) +
                R"(","body":{"text":")" + text + R"("}})",
            ""};
  }

  std::filesystem::path dir_;
};

TEST_F(BatchStoreTest, CreatesTheStateDirAndUsesWal) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(std::filesystem::is_directory(dir_ / "state"));
  EXPECT_EQ(store->path(), (dir_ / "state" / "batches.db").string());
  // The mode is persistent in the file: a plain connection sees it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(store->path().c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST_F(BatchStoreTest, FilesSurviveReopening) {
  std::string content = std::string("line one\n") + std::string(1, '\0') + "binary\xff\n";
  std::string id;
  {
    auto store = OpenStore();
    StoredFile f = PutInput(*store, "alice", content);
    EXPECT_EQ(f.bytes, static_cast<int64_t>(content.size()));
    EXPECT_EQ(f.id.rfind("file-", 0), 0u);
    id = f.id;
  }
  auto store = OpenStore();
  auto f = store->GetFile("alice", id);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->filename, "in.jsonl");
  EXPECT_EQ(f->purpose, "batch");
  EXPECT_EQ(f->created_at, 100);
  EXPECT_EQ(f->bytes, static_cast<int64_t>(content.size()));
  auto c = store->GetFileContent("alice", id);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, content);

  ASSERT_TRUE(store->DeleteFile("alice", id).ok());
  EXPECT_EQ(store->GetFile("alice", id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->DeleteFile("alice", id).code(), absl::StatusCode::kNotFound);
}

TEST_F(BatchStoreTest, BatchesAndResultsSurviveReopeningAndAResultIsKeptOnce) {
  std::string id;
  {
    auto store = OpenStore();
    Batch b = NewBatch(*store, "alice", 1000);
    id = b.id;
    EXPECT_EQ(b.status, BatchStatus::kValidating);
    ASSERT_TRUE(store->SetTotal(id, 3).ok());
    ASSERT_TRUE(store->Transition("alice", id, BatchStatus::kInProgress, 1001).ok());
    auto first = store->RecordResult(id, Ok(2, "c", "third"));
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_TRUE(*first);
    ASSERT_TRUE(*store->RecordResult(id, Ok(0, "a", "first")));
  }
  // As after a crash: a new store on the same dir, the runner records "a" again, then the rest.
  auto store = OpenStore();
  auto unfinished = store->ListUnfinishedBatches();
  ASSERT_TRUE(unfinished.ok());
  ASSERT_EQ(unfinished->size(), 1u);
  EXPECT_EQ((*unfinished)[0].id, id);
  auto answered = store->AnsweredCustomIds(id);
  ASSERT_TRUE(answered.ok());
  EXPECT_THAT(*answered, ElementsAre("a", "c"));

  auto again = store->RecordResult(id, Ok(0, "a", "a different answer"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  ASSERT_TRUE(*store->RecordResult(
      id, {1, "b", "", R"({"code":"invalid_argument","message":"too long"})"}));

  auto b = store->GetBatch("alice", id);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->status, BatchStatus::kInProgress);
  EXPECT_EQ(b->request_counts.total, 3);
  EXPECT_EQ(b->request_counts.completed, 2);  // "a" counted once
  EXPECT_EQ(b->request_counts.failed, 1);
  EXPECT_EQ(b->created_at, 1000);
  EXPECT_EQ(b->in_progress_at, 1001);
  EXPECT_EQ(b->metadata_json, R"({"job":"eval"})");
  EXPECT_EQ(b->endpoint, "/v1/chat/completions");
  EXPECT_EQ(b->completion_window, "24h");

  auto out = store->BuildOutput(id);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<nlohmann::json> lines;
  for (const std::string& file : {out->output_jsonl, out->error_jsonl}) {
    size_t start = 0;
    while (start < file.size()) {
      size_t end = file.find('\n', start);
      lines.push_back(nlohmann::json::parse(file.substr(start, end - start)));
      start = end + 1;
    }
  }
  ASSERT_EQ(lines.size(), 3u);
  // Output in input order: a (line 0) then c (line 2); the error file has b.
  EXPECT_EQ(lines[0]["custom_id"], "a");
  EXPECT_EQ(lines[0]["response"]["body"]["text"], "first");
  EXPECT_TRUE(lines[0]["error"].is_null());
  EXPECT_EQ(lines[0]["id"].get<std::string>().rfind("batch_req_", 0), 0u);
  EXPECT_EQ(lines[1]["custom_id"], "c");
  EXPECT_EQ(lines[1]["response"]["status_code"], 200);
  EXPECT_EQ(lines[2]["custom_id"], "b");
  EXPECT_TRUE(lines[2]["response"].is_null());
  EXPECT_EQ(lines[2]["error"]["message"], "too long");

  ASSERT_TRUE(store->Transition("alice", id, BatchStatus::kFinalizing, 1002).ok());
  ASSERT_TRUE(store->SetOutputFiles(id, "file-out", "file-err").ok());
  auto done = store->Transition("alice", id, BatchStatus::kCompleted, 1003);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->completed_at, 1003);
  store.reset();
  store = OpenStore();
  b = store->GetBatch("alice", id);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->status, BatchStatus::kCompleted);
  EXPECT_EQ(b->finalizing_at, 1002);
  EXPECT_EQ(b->completed_at, 1003);
  EXPECT_EQ(b->output_file_id, "file-out");
  EXPECT_EQ(b->error_file_id, "file-err");
  EXPECT_TRUE(store->ListUnfinishedBatches()->empty());
}

TEST_F(BatchStoreTest, ANonSuccessResponseGoesToTheErrorFile) {
  auto store = OpenStore();
  Batch b = NewBatch(*store, "alice", 1);
  ASSERT_TRUE(*store->RecordResult(
      b.id, {0, "x", R"({"status_code":400,"request_id":"r","body":{"error":{}}})", ""}));
  auto out = store->BuildOutput(b.id);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->output_jsonl, "");
  EXPECT_THAT(out->error_jsonl, HasSubstr(R"("custom_id":"x")"));
}

TEST_F(BatchStoreTest, RefusesMalformedResults) {
  auto store = OpenStore();
  Batch b = NewBatch(*store, "alice", 1);
  EXPECT_EQ(store->RecordResult(b.id, {0, "x", "not json", ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->RecordResult(b.id, {0, "x", "", ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->RecordResult("batch_unknown", Ok(0, "x", "t")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(store->AnsweredCustomIds(b.id)->empty());
}

TEST_F(BatchStoreTest, TenantsSeeOnlyTheirOwn) {
  auto store = OpenStore();
  Batch b = NewBatch(*store, "alice", 1);
  EXPECT_EQ(store->GetBatch("bob", b.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Transition("bob", b.id, BatchStatus::kCancelling, 2).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetFile("bob", b.input_file_id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetFileContent("bob", b.input_file_id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->DeleteFile("bob", b.input_file_id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store->ListBatches("bob", "", 20)->data.empty());
  EXPECT_EQ(store->ListBatches("bob", b.id, 20).status().code(), absl::StatusCode::kNotFound);
  // Bob cannot start a batch over Alice's file.
  Batch theft = b;
  theft.tenant = "bob";
  EXPECT_EQ(store->CreateBatch(theft).status().code(), absl::StatusCode::kNotFound);
  // Alice still has everything.
  EXPECT_TRUE(store->GetBatch("alice", b.id).ok());
  EXPECT_TRUE(store->GetFile("alice", b.input_file_id).ok());
  EXPECT_EQ(store->GetBatch("alice", b.id)->status, BatchStatus::kValidating);
}

TEST_F(BatchStoreTest, ListsNewestFirstInPages) {
  auto store = OpenStore();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(NewBatch(*store, "alice", 100 + i).id);
    NewBatch(*store, "bob", 100 + i);  // interleaved, never listed for alice
  }
  auto p1 = store->ListBatches("alice", "", 2);
  ASSERT_TRUE(p1.ok()) << p1.status();
  ASSERT_EQ(p1->data.size(), 2u);
  EXPECT_EQ(p1->data[0].id, ids[4]);
  EXPECT_EQ(p1->data[1].id, ids[3]);
  EXPECT_TRUE(p1->has_more);
  auto p2 = store->ListBatches("alice", p1->data[1].id, 2);
  ASSERT_TRUE(p2.ok());
  ASSERT_EQ(p2->data.size(), 2u);
  EXPECT_EQ(p2->data[0].id, ids[2]);
  EXPECT_EQ(p2->data[1].id, ids[1]);
  EXPECT_TRUE(p2->has_more);
  auto p3 = store->ListBatches("alice", p2->data[1].id, 2);
  ASSERT_TRUE(p3.ok());
  ASSERT_EQ(p3->data.size(), 1u);
  EXPECT_EQ(p3->data[0].id, ids[0]);
  EXPECT_FALSE(p3->has_more);
  auto all = store->ListBatches("alice", "", 5);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->data.size(), 5u);
  EXPECT_FALSE(all->has_more);
  EXPECT_EQ(store->ListBatches("alice", "", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ListBatches("alice", "", 101).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BatchStoreTest, TransitionsFollowTheLifecycle) {
  auto store = OpenStore();
  Batch b = NewBatch(*store, "alice", 1);
  // validating cannot jump to completed.
  auto bad = store->Transition("alice", b.id, BatchStatus::kCompleted, 2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad.status().message(), HasSubstr("validating"));
  ASSERT_TRUE(store->Transition("alice", b.id, BatchStatus::kInProgress, 2).ok());
  ASSERT_TRUE(store->Transition("alice", b.id, BatchStatus::kFinalizing, 3).ok());
  ASSERT_TRUE(store->Transition("alice", b.id, BatchStatus::kCompleted, 4).ok());
  // A completed batch cannot be cancelled, nor go anywhere else.
  auto cancel = store->Transition("alice", b.id, BatchStatus::kCancelling, 5);
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cancel.status().message(), HasSubstr("completed"));
  EXPECT_EQ(store->GetBatch("alice", b.id)->status, BatchStatus::kCompleted);
  EXPECT_EQ(store->GetBatch("alice", b.id)->cancelling_at, 0);

  // A failed batch carries its errors.
  Batch f = NewBatch(*store, "alice", 1);
  const std::string errors = R"({"object":"list","data":[{"code":"invalid_json","line":2}]})";
  auto failed = store->Transition("alice", f.id, BatchStatus::kFailed, 7, errors);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(store->GetBatch("alice", f.id)->errors_json, errors);
  EXPECT_EQ(store->GetBatch("alice", f.id)->failed_at, 7);
  EXPECT_EQ(store->Transition("alice", f.id, BatchStatus::kInProgress, 8).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Cancelling ends cancelled and stays there.
  Batch c = NewBatch(*store, "alice", 1);
  ASSERT_TRUE(store->Transition("alice", c.id, BatchStatus::kInProgress, 2).ok());
  ASSERT_TRUE(store->Transition("alice", c.id, BatchStatus::kCancelling, 3).ok());
  EXPECT_EQ(store->Transition("alice", c.id, BatchStatus::kCompleted, 4).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->Transition("alice", c.id, BatchStatus::kCancelled, 4).ok());
  EXPECT_EQ(store->Transition("alice", c.id, BatchStatus::kCancelling, 5).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // The table in full: the final states go nowhere.
  for (BatchStatus to : {BatchStatus::kValidating, BatchStatus::kInProgress,
                         BatchStatus::kCancelling, BatchStatus::kCompleted}) {
    for (BatchStatus from : {BatchStatus::kFailed, BatchStatus::kCompleted,
                             BatchStatus::kExpired, BatchStatus::kCancelled}) {
      EXPECT_FALSE(TransitionAllowed(from, to));
    }
  }
  EXPECT_TRUE(TransitionAllowed(BatchStatus::kInProgress, BatchStatus::kExpired));
  EXPECT_FALSE(TransitionAllowed(BatchStatus::kCancelling, BatchStatus::kExpired));
}

TEST_F(BatchStoreTest, StatusNamesRoundTrip) {
  for (const char* name : {"validating", "failed", "in_progress", "finalizing", "completed",
                           "expired", "cancelling", "cancelled"}) {
    auto s = BatchStatusFromName(name);
    ASSERT_TRUE(s.has_value()) << name;
    EXPECT_EQ(BatchStatusName(*s), name);
  }
  EXPECT_FALSE(BatchStatusFromName("done").has_value());
}

TEST_F(BatchStoreTest, TwoConnectionsShareTheDatabase) {
  auto a = OpenStore();
  Batch b = NewBatch(*a, "alice", 1);
  // A second connection on the same file, the first still open (WAL: no exclusive lock).
  auto second = OpenStore();
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->GetBatch("alice", b.id).ok());
  ASSERT_TRUE(*second->RecordResult(b.id, Ok(0, "x", "from the second")));
  // What one wrote the other reads at once, and the key holds across them.
  EXPECT_THAT(*a->AnsweredCustomIds(b.id), ElementsAre("x"));
  EXPECT_FALSE(*a->RecordResult(b.id, Ok(0, "x", "from the first")));
  EXPECT_EQ(a->GetBatch("alice", b.id)->request_counts.completed, 1);
  // A reader holding a read transaction open does not block the writer.
  sqlite3* reader = nullptr;
  ASSERT_EQ(sqlite3_open(a->path().c_str(), &reader), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(reader, "BEGIN; SELECT count(*) FROM batches;", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  EXPECT_TRUE(*a->RecordResult(b.id, Ok(1, "y", "while read")));
  sqlite3_exec(reader, "COMMIT", nullptr, nullptr, nullptr);
  sqlite3_close(reader);
}

TEST_F(BatchStoreTest, UnwritableStateDirIsAClearError) {
  // Under a regular file no directory can be made (root can write anywhere chmod allows).
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ / "a_file") << "x";
  BatchStoreOptions o;
  o.state_dir = (dir_ / "a_file" / "state").string();
  auto store = BatchStore::Open(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr(o.state_dir));

  BatchStoreOptions none;
  EXPECT_EQ(BatchStore::Open(none).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BatchStoreTest, ACorruptFileIsAClearError) {
  std::filesystem::create_directories(dir_ / "state");
  std::ofstream(dir_ / "state" / "batches.db") << std::string(8192, 'z');
  auto store = BatchStore::Open(Options());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr((dir_ / "state" / "batches.db").string()));
}

TEST_F(BatchStoreTest, AFullDiskIsAnErrorAndLosesNothingAcknowledged) {
  BatchStoreOptions o = Options();
  o.max_pages = 64;  // 64 pages of 4 KiB: full after a few files of 32 KiB
  auto opened = BatchStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto& store = *opened;
  const std::string content(32 * 1024, 'q');
  std::vector<std::string> stored;
  absl::Status last;
  for (int i = 0; i < 100; ++i) {
    auto f = store->PutFile({"", "alice", "batch", "f", 0, 1}, content);
    if (!f.ok()) {
      last = f.status();
      break;
    }
    stored.push_back(f->id);
  }
  ASSERT_FALSE(last.ok()) << "the cap never filled";
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(last.message(), HasSubstr("disk full"));
  EXPECT_THAT(last.message(), HasSubstr(store->path()));
  ASSERT_FALSE(stored.empty());
  // Every file acknowledged before the failure is intact after reopening.
  store.reset();
  auto reopened = OpenStore();
  for (const std::string& id : stored) {
    auto c = reopened->GetFileContent("alice", id);
    ASSERT_TRUE(c.ok()) << id << ": " << c.status();
    EXPECT_EQ(*c, content);
  }
}

}  // namespace
}  // namespace carpool::router::batch
