#include "router/batch/batch_store.h"

#include <sqlite3.h>

#include <filesystem>
#include <mutex>
#include <random>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace carpool::router::batch {
namespace {

constexpr BatchStatus kAllStatuses[] = {
    BatchStatus::kValidating, BatchStatus::kFailed,    BatchStatus::kInProgress,
    BatchStatus::kFinalizing, BatchStatus::kCompleted, BatchStatus::kExpired,
    BatchStatus::kCancelling, BatchStatus::kCancelled};

// The schema. Files keep their content as a blob in the same database, so that a file and the
// batch that names it are committed by the same mechanism.
constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS files (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  purpose TEXT NOT NULL,
  filename TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  tenant TEXT NOT NULL,
  input_file_id TEXT NOT NULL,
  endpoint TEXT NOT NULL,
  completion_window TEXT NOT NULL,
  metadata TEXT NOT NULL,
  status TEXT NOT NULL,
  total INTEGER NOT NULL DEFAULT 0,
  completed INTEGER NOT NULL DEFAULT 0,
  failed INTEGER NOT NULL DEFAULT 0,
  errors TEXT NOT NULL DEFAULT 'null',
  output_file_id TEXT NOT NULL DEFAULT '',
  error_file_id TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,
  in_progress_at INTEGER NOT NULL DEFAULT 0,
  finalizing_at INTEGER NOT NULL DEFAULT 0,
  completed_at INTEGER NOT NULL DEFAULT 0,
  failed_at INTEGER NOT NULL DEFAULT 0,
  expired_at INTEGER NOT NULL DEFAULT 0,
  cancelling_at INTEGER NOT NULL DEFAULT 0,
  cancelled_at INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant, seq);
CREATE TABLE IF NOT EXISTS results (
  batch_id TEXT NOT NULL,
  line_index INTEGER NOT NULL,
  custom_id TEXT NOT NULL,
  id TEXT NOT NULL,
  response TEXT NOT NULL,
  error TEXT NOT NULL,
  PRIMARY KEY (batch_id, custom_id));
CREATE INDEX IF NOT EXISTS results_in_order ON results (batch_id, line_index);
)sql";

constexpr char kBatchColumns[] =
    "id, tenant, input_file_id, endpoint, completion_window, metadata, status, total, completed, "
    "failed, errors, output_file_id, error_file_id, created_at, in_progress_at, finalizing_at, "
    "completed_at, failed_at, expired_at, cancelling_at, cancelled_at";

const char* TimestampColumn(BatchStatus status) {
  switch (status) {
    case BatchStatus::kValidating: return "created_at";
    case BatchStatus::kFailed: return "failed_at";
    case BatchStatus::kInProgress: return "in_progress_at";
    case BatchStatus::kFinalizing: return "finalizing_at";
    case BatchStatus::kCompleted: return "completed_at";
    case BatchStatus::kExpired: return "expired_at";
    case BatchStatus::kCancelling: return "cancelling_at";
    case BatchStatus::kCancelled: return "cancelled_at";
  }
  return "created_at";
}

// A SQLite result code as a Status about `path`. SQLITE_FULL is the disk (or max_pages) being
// full; NOTADB and CORRUPT a file that is not an intact database.
absl::Status SqliteError(sqlite3* db, int rc, const std::string& path, std::string_view what) {
  std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string message = absl::StrCat("batch store ", path, ": ", std::string(what), ": ", detail);
  switch (rc & 0xff) {
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(absl::StrCat(message, " (disk full)"));
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
      return absl::DataLossError(
          absl::StrCat(message, " (not a carpool batch database, or corrupt)"));
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_IOERR:
      return absl::FailedPreconditionError(message);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// One prepared statement, finalized on destruction.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& path) : db_(db), path_(path) {}
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status Prepare(const std::string& sql) {
    int rc = sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt_, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, path_, "prepare");
    return absl::OkStatus();
  }
  void Bind(int i, std::string_view text) {
    sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int i, std::string_view blob) {
    sqlite3_bind_blob64(stmt_, i, blob.data(), blob.size(), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  // Binds `values` (text or integers) to parameters 1, 2, ... in order.
  template <typename... Values>
  void BindAll(const Values&... values) {
    int i = 0;
    (Bind(++i, values), ...);
  }
  // True while there is a row; an error for anything but ROW or DONE.
  absl::StatusOr<bool> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, path_, "step");
  }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p == nullptr ? std::string()
                        : std::string(static_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }

 private:
  sqlite3* db_;
  const std::string& path_;
  sqlite3_stmt* stmt_ = nullptr;
};

absl::Status Exec(sqlite3* db, const std::string& path, const std::string& sql) {
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db, rc, path, sql.substr(0, sql.find_first_of(" (")));
  return absl::OkStatus();
}

// A write transaction: BEGIN IMMEDIATE (so that two connections never both read then write),
// rolled back unless committed.
class Transaction {
 public:
  Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {}
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  absl::Status Begin() {
    RETURN_IF_ERROR(Exec(db_, path_, "BEGIN IMMEDIATE"));
    open_ = true;
    return absl::OkStatus();
  }
  absl::Status Commit() {
    RETURN_IF_ERROR(Exec(db_, path_, "COMMIT"));
    open_ = false;
    return absl::OkStatus();
  }

 private:
  sqlite3* db_;
  const std::string& path_;
  bool open_ = false;
};

Batch ReadBatch(const Statement& s) {
  Batch b;
  b.id = s.Text(0);
  b.tenant = s.Text(1);
  b.input_file_id = s.Text(2);
  b.endpoint = s.Text(3);
  b.completion_window = s.Text(4);
  b.metadata_json = s.Text(5);
  b.status = BatchStatusFromName(s.Text(6)).value_or(BatchStatus::kFailed);
  b.request_counts = {s.Int(7), s.Int(8), s.Int(9)};
  b.errors_json = s.Text(10);
  b.output_file_id = s.Text(11);
  b.error_file_id = s.Text(12);
  b.created_at = s.Int(13);
  b.in_progress_at = s.Int(14);
  b.finalizing_at = s.Int(15);
  b.completed_at = s.Int(16);
  b.failed_at = s.Int(17);
  b.expired_at = s.Int(18);
  b.cancelling_at = s.Int(19);
  b.cancelled_at = s.Int(20);
  return b;
}

// A JSON object given as text, or INVALID_ARGUMENT naming `what`.
absl::StatusOr<nlohmann::ordered_json> ParseObject(const std::string& text, std::string_view what) {
  nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is not a JSON object"));
  }
  return j;
}

}  // namespace

std::string_view BatchStatusName(BatchStatus status) {
  switch (status) {
    case BatchStatus::kValidating: return "validating";
    case BatchStatus::kFailed: return "failed";
    case BatchStatus::kInProgress: return "in_progress";
    case BatchStatus::kFinalizing: return "finalizing";
    case BatchStatus::kCompleted: return "completed";
    case BatchStatus::kExpired: return "expired";
    case BatchStatus::kCancelling: return "cancelling";
    case BatchStatus::kCancelled: return "cancelled";
  }
  return "failed";
}

std::optional<BatchStatus> BatchStatusFromName(std::string_view name) {
  for (BatchStatus s : kAllStatuses) {
    if (BatchStatusName(s) == name) return s;
  }
  return std::nullopt;
}

bool TransitionAllowed(BatchStatus from, BatchStatus to) {
  using S = BatchStatus;
  switch (from) {
    case S::kValidating: return to == S::kInProgress || to == S::kFailed || to == S::kCancelling;
    case S::kInProgress:
      return to == S::kFinalizing || to == S::kFailed || to == S::kExpired || to == S::kCancelling;
    case S::kFinalizing: return to == S::kCompleted || to == S::kFailed || to == S::kExpired;
    case S::kCancelling: return to == S::kCancelled;
    default: return false;
  }
}

struct BatchStore::Impl {
  std::mutex mu;
  std::mt19937_64 rng{std::random_device{}()};

  std::string NewId(std::string_view prefix) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string id(prefix);
    uint64_t a = rng(), b = rng();
    for (int i = 0; i < 16; ++i) id += kDigits[(a >> (4 * i)) & 0xf];
    for (int i = 0; i < 8; ++i) id += kDigits[(b >> (4 * i)) & 0xf];
    return id;
  }
};

absl::StatusOr<std::unique_ptr<BatchStore>> BatchStore::Open(const BatchStoreOptions& options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("batch store: no state dir");
  std::filesystem::path dir(options.state_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "batch store: cannot create the state dir ", options.state_dir, ": ", ec.message()));
  }
  std::string path = (dir / options.file_name).string();
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteError(db, rc, path, "open");
    sqlite3_close(db);
    return status;
  }
  std::unique_ptr<BatchStore> store(new BatchStore(db, path));
  sqlite3_extended_result_codes(db, 1);
  // Another connection (a second router on the same dir, a CLI reading it) waits for the write
  // lock rather than failing at once.
  sqlite3_busy_timeout(db, 5000);
  // WAL: readers do not block the writer. synchronous=FULL: a commit is on disk (the WAL synced)
  // before it returns, the guarantee every acknowledged write relies on.
  {
    Statement s(db, path);
    RETURN_IF_ERROR(s.Prepare("PRAGMA journal_mode=WAL"));
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row || s.Text(0) != "wal") {
      return absl::FailedPreconditionError(
          absl::StrCat("batch store ", path, ": cannot switch to WAL mode"));
    }
  }
  RETURN_IF_ERROR(Exec(db, path, "PRAGMA synchronous=FULL"));
  if (options.max_pages > 0) {
    RETURN_IF_ERROR(Exec(db, path, absl::StrCat("PRAGMA max_page_count=", options.max_pages)));
  }
  RETURN_IF_ERROR(Exec(db, path, kSchema));
  return store;
}

BatchStore::BatchStore(sqlite3* db, std::string path)
    : db_(db), path_(std::move(path)), impl_(std::make_unique<Impl>()) {}

BatchStore::~BatchStore() { sqlite3_close(db_); }

absl::StatusOr<StoredFile> BatchStore::PutFile(StoredFile meta, std::string_view content) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  meta.id = impl_->NewId("file-");
  meta.bytes = static_cast<int64_t>(content.size());
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare(
      "INSERT INTO files (id, tenant, purpose, filename, bytes, created_at, content) "
      "VALUES (?, ?, ?, ?, ?, ?, ?)"));
  s.BindAll(meta.id, meta.tenant, meta.purpose, meta.filename, meta.bytes, meta.created_at);
  s.BindBlob(7, content);
  RETURN_IF_ERROR(s.Step().status());
  return meta;
}

absl::StatusOr<StoredFile> BatchStore::GetFile(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare(
      "SELECT id, tenant, purpose, filename, bytes, created_at FROM files "
      "WHERE id = ? AND tenant = ?"));
  s.BindAll(id, tenant);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no such file: ", id));
  return StoredFile{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4), s.Int(5)};
}

absl::StatusOr<std::string> BatchStore::GetFileContent(const std::string& tenant,
                                                       const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare("SELECT content FROM files WHERE id = ? AND tenant = ?"));
  s.BindAll(id, tenant);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no such file: ", id));
  return s.Blob(0);
}

absl::Status BatchStore::DeleteFile(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare("DELETE FROM files WHERE id = ? AND tenant = ?"));
  s.BindAll(id, tenant);
  RETURN_IF_ERROR(s.Step().status());
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no such file: ", id));
  return absl::OkStatus();
}

absl::StatusOr<Batch> BatchStore::CreateBatch(Batch batch) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (batch.metadata_json.empty()) batch.metadata_json = "null";
  Transaction txn(db_, path_);
  RETURN_IF_ERROR(txn.Begin());
  {
    Statement s(db_, path_);
    RETURN_IF_ERROR(s.Prepare("SELECT 1 FROM files WHERE id = ? AND tenant = ?"));
    s.BindAll(batch.input_file_id, batch.tenant);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("no such file: ", batch.input_file_id));
  }
  batch.id = impl_->NewId("batch_");
  batch.status = BatchStatus::kValidating;
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare(
      "INSERT INTO batches (id, tenant, input_file_id, endpoint, completion_window, metadata, "
      "status, total, errors, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
  s.BindAll(batch.id, batch.tenant, batch.input_file_id, batch.endpoint, batch.completion_window,
            batch.metadata_json, BatchStatusName(batch.status), batch.request_counts.total,
            batch.errors_json, batch.created_at);
  RETURN_IF_ERROR(s.Step().status());
  RETURN_IF_ERROR(txn.Commit());
  return batch;
}

absl::StatusOr<Batch> BatchStore::GetBatch(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare(
      absl::StrCat("SELECT ", kBatchColumns, " FROM batches WHERE id = ? AND tenant = ?")));
  s.BindAll(id, tenant);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no such batch: ", id));
  return ReadBatch(s);
}

absl::StatusOr<BatchPage> BatchStore::ListBatches(const std::string& tenant,
                                                  const std::string& after, int limit) {
  if (limit < 1 || limit > 100) {
    return absl::InvalidArgumentError(absl::StrCat("limit must be 1..100, got ", limit));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  int64_t before_seq = INT64_MAX;
  if (!after.empty()) {
    Statement s(db_, path_);
    RETURN_IF_ERROR(s.Prepare("SELECT seq FROM batches WHERE id = ? AND tenant = ?"));
    s.BindAll(after, tenant);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("no such batch: ", after));
    before_seq = s.Int(0);
  }
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare(absl::StrCat(
      "SELECT ", kBatchColumns,
      " FROM batches WHERE tenant = ? AND seq < ? ORDER BY seq DESC LIMIT ?")));
  s.BindAll(tenant, before_seq);
  s.Bind(3, static_cast<int64_t>(limit) + 1);  // one more tells whether there is a next page
  BatchPage page;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    if (static_cast<int>(page.data.size()) == limit) {
      page.has_more = true;
      break;
    }
    page.data.push_back(ReadBatch(s));
  }
  return page;
}

absl::StatusOr<std::vector<Batch>> BatchStore::ListUnfinishedBatches() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare(absl::StrCat(
      "SELECT ", kBatchColumns,
      " FROM batches WHERE status NOT IN ('failed', 'completed', 'expired', 'cancelled') "
      "ORDER BY seq")));
  std::vector<Batch> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(ReadBatch(s));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<BatchStatus, int64_t>>> BatchStore::CountBatches() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare("SELECT status, COUNT(*) FROM batches GROUP BY status"));
  std::vector<std::pair<BatchStatus, int64_t>> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    if (std::optional<BatchStatus> status = BatchStatusFromName(s.Text(0))) {
      out.emplace_back(*status, s.Int(1));
    }
  }
  return out;
}

absl::StatusOr<Batch> BatchStore::Transition(const std::string& tenant, const std::string& id,
                                             BatchStatus to, int64_t now,
                                             const std::string& errors_json) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Transaction txn(db_, path_);
  RETURN_IF_ERROR(txn.Begin());
  Batch batch;
  {
    Statement s(db_, path_);
    RETURN_IF_ERROR(s.Prepare(
        absl::StrCat("SELECT ", kBatchColumns, " FROM batches WHERE id = ? AND tenant = ?")));
    s.BindAll(id, tenant);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("no such batch: ", id));
    batch = ReadBatch(s);
  }
  if (!TransitionAllowed(batch.status, to)) {
    return absl::FailedPreconditionError(absl::StrCat("batch ", id, " is ",
                                                      std::string(BatchStatusName(batch.status)),
                                                      ": cannot become ",
                                                      std::string(BatchStatusName(to))));
  }
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare(absl::StrCat("UPDATE batches SET status = ?, ", TimestampColumn(to),
                                         " = ?, errors = ? WHERE id = ?")));
  batch.status = to;
  if (!errors_json.empty()) batch.errors_json = errors_json;
  s.BindAll(BatchStatusName(to), now, batch.errors_json, id);
  RETURN_IF_ERROR(s.Step().status());
  RETURN_IF_ERROR(txn.Commit());
  switch (to) {
    case BatchStatus::kFailed: batch.failed_at = now; break;
    case BatchStatus::kInProgress: batch.in_progress_at = now; break;
    case BatchStatus::kFinalizing: batch.finalizing_at = now; break;
    case BatchStatus::kCompleted: batch.completed_at = now; break;
    case BatchStatus::kExpired: batch.expired_at = now; break;
    case BatchStatus::kCancelling: batch.cancelling_at = now; break;
    case BatchStatus::kCancelled: batch.cancelled_at = now; break;
    case BatchStatus::kValidating: break;
  }
  return batch;
}

absl::Status BatchStore::SetTotal(const std::string& batch_id, int64_t total) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare("UPDATE batches SET total = ? WHERE id = ?"));
  s.BindAll(total, batch_id);
  RETURN_IF_ERROR(s.Step().status());
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("no such batch: ", batch_id));
  }
  return absl::OkStatus();
}

absl::Status BatchStore::SetOutputFiles(const std::string& batch_id,
                                        const std::string& output_file_id,
                                        const std::string& error_file_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(
      s.Prepare("UPDATE batches SET output_file_id = ?, error_file_id = ? WHERE id = ?"));
  s.BindAll(output_file_id, error_file_id, batch_id);
  RETURN_IF_ERROR(s.Step().status());
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("no such batch: ", batch_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> BatchStore::RecordResult(const std::string& batch_id,
                                              const BatchResult& result) {
  ASSIGN_OR_RETURN(int64_t recorded, RecordResults(batch_id, {&result, 1}));
  return recorded == 1;
}

absl::StatusOr<int64_t> BatchStore::RecordResults(const std::string& batch_id,
                                                  std::span<const BatchResult> results) {
  std::vector<bool> failed;
  failed.reserve(results.size());
  for (const BatchResult& result : results) {
    if (result.response_json.empty() == result.error_json.empty()) {
      return absl::InvalidArgumentError("a result has exactly one of a response and an error");
    }
    const bool error = !result.error_json.empty();
    ASSIGN_OR_RETURN(nlohmann::ordered_json object,
                     ParseObject(error ? result.error_json : result.response_json,
                                 error ? "the error" : "the response"));
    auto code = object.find("status_code");
    failed.push_back(error || code == object.end() || !code->is_number_integer() ||
                     code->get<int64_t>() < 200 || code->get<int64_t>() > 299);
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  {
    Statement s(db_, path_);
    RETURN_IF_ERROR(s.Prepare("SELECT 1 FROM batches WHERE id = ?"));
    s.Bind(1, batch_id);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return absl::NotFoundError(absl::StrCat("no such batch: ", batch_id));
  }
  Transaction txn(db_, path_);
  RETURN_IF_ERROR(txn.Begin());
  int64_t completed = 0, failures = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const BatchResult& result = results[i];
    Statement s(db_, path_);
    RETURN_IF_ERROR(s.Prepare(
        "INSERT OR IGNORE INTO results (batch_id, line_index, custom_id, id, response, error) "
        "VALUES (?, ?, ?, ?, ?, ?)"));
    s.BindAll(batch_id, result.line_index, result.custom_id, impl_->NewId("batch_req_"),
              result.response_json, result.error_json);
    RETURN_IF_ERROR(s.Step().status());
    // Already answered (a restart ran it again): the first copy stays and is not counted twice.
    if (sqlite3_changes(db_) == 0) continue;
    ++(failed[i] ? failures : completed);
  }
  if (completed + failures == 0) return 0;  // the transaction rolls back having changed nothing
  Statement s(db_, path_);
  RETURN_IF_ERROR(
      s.Prepare("UPDATE batches SET completed = completed + ?, failed = failed + ? WHERE id = ?"));
  s.BindAll(completed, failures, batch_id);
  RETURN_IF_ERROR(s.Step().status());
  RETURN_IF_ERROR(txn.Commit());
  return completed + failures;
}

absl::StatusOr<std::vector<std::string>> BatchStore::AnsweredCustomIds(
    const std::string& batch_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(
      s.Prepare("SELECT custom_id FROM results WHERE batch_id = ? ORDER BY line_index"));
  s.Bind(1, batch_id);
  std::vector<std::string> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(s.Text(0));
  }
  return out;
}

absl::StatusOr<BatchOutput> BatchStore::BuildOutput(const std::string& batch_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Statement s(db_, path_);
  RETURN_IF_ERROR(s.Prepare(
      "SELECT id, custom_id, response, error FROM results WHERE batch_id = ? "
      "ORDER BY line_index"));
  s.Bind(1, batch_id);
  BatchOutput out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    nlohmann::ordered_json line;
    line["id"] = s.Text(0);
    line["custom_id"] = s.Text(1);
    std::string response = s.Text(2), error = s.Text(3);
    bool to_errors = !error.empty();
    if (response.empty()) {
      line["response"] = nullptr;
    } else {
      ASSIGN_OR_RETURN(line["response"], ParseObject(response, "a stored response"));
      auto code = line["response"].find("status_code");
      if (code == line["response"].end() || !code->is_number_integer() ||
          code->get<int64_t>() < 200 || code->get<int64_t>() > 299) {
        to_errors = true;
      }
    }
    if (error.empty()) {
      line["error"] = nullptr;
    } else {
      ASSIGN_OR_RETURN(line["error"], ParseObject(error, "a stored error"));
    }
    (to_errors ? out.error_jsonl : out.output_jsonl) += line.dump() + "\n";
  }
  return out;
}

}  // namespace carpool::router::batch
