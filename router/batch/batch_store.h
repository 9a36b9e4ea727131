// The durable state of batch jobs (issue 16): uploaded files, batch objects and each request's
// result, in one SQLite database (WAL mode) under a state directory created on first use.
//
// Every write is one transaction committed (synchronous=FULL) before the call returns: what a
// call acknowledged survives a crash of the process or the machine. A result is keyed on
// (batch, custom_id): recording it again after a restart keeps the first copy, so the output has
// each custom_id once.
//
// Errors name the database path: an unwritable state dir or a file that is not a database at
// Open, RESOURCE_EXHAUSTED when the disk (or max_pages) is full, NOT_FOUND for an id the tenant
// does not own (another tenant's id reads as unknown), FAILED_PRECONDITION for a status change
// the batch lifecycle does not allow.
//
// Thread-safe: one connection behind a mutex.
#ifndef CARPOOL_ROUTER_BATCH_BATCH_STORE_H_
#define CARPOOL_ROUTER_BATCH_BATCH_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct sqlite3;

namespace carpool::router::batch {

struct BatchStoreOptions {
  // The directory of the database; created (with its parents) on first use. Required.
  std::string state_dir;
  // The database file inside state_dir. Default: "batches.db".
  std::string file_name = "batches.db";
  // A cap on the database size in pages (SQLite's max_page_count); a write past it fails as a
  // full disk does. 0: no cap beyond the disk. Default: 0.
  int64_t max_pages = 0;
};

struct StoredFile {
  std::string id;        // "file-..."; assigned by PutFile
  std::string tenant;
  std::string purpose;   // "batch", "batch_output"
  std::string filename;
  int64_t bytes = 0;     // size of the content; set by PutFile
  int64_t created_at = 0;  // unix seconds
};

// OpenAI's batch statuses.
enum class BatchStatus {
  kValidating, kFailed, kInProgress, kFinalizing, kCompleted, kExpired, kCancelling, kCancelled
};
std::string_view BatchStatusName(BatchStatus status);  // "in_progress", ...
std::optional<BatchStatus> BatchStatusFromName(std::string_view name);
// Whether the lifecycle allows `from` -> `to`:
//   validating  -> in_progress, failed, cancelling
//   in_progress -> finalizing, failed, expired, cancelling
//   finalizing  -> completed, failed, expired
//   cancelling  -> cancelled
// failed, completed, expired and cancelled are final.
bool TransitionAllowed(BatchStatus from, BatchStatus to);

struct RequestCounts {
  int64_t total = 0;
  int64_t completed = 0;
  int64_t failed = 0;
};

struct Batch {
  std::string id;  // "batch_..."; assigned by CreateBatch
  std::string tenant;
  std::string input_file_id;
  std::string endpoint;           // "/v1/chat/completions", ...
  std::string completion_window;  // "24h"
  std::string metadata_json = "null";  // an object or null
  BatchStatus status = BatchStatus::kValidating;
  RequestCounts request_counts;
  std::string errors_json = "null";    // OpenAI's {"object": "list", "data": [...]} or null
  std::string output_file_id;  // "" until finalized
  std::string error_file_id;
  // Unix seconds; 0 while the batch has not reached the state.
  int64_t created_at = 0;
  int64_t in_progress_at = 0;
  int64_t finalizing_at = 0;
  int64_t completed_at = 0;
  int64_t failed_at = 0;
  int64_t expired_at = 0;
  int64_t cancelling_at = 0;
  int64_t cancelled_at = 0;
};

struct BatchPage {
  std::vector<Batch> data;  // newest first
  bool has_more = false;
};

// One request's answer. Exactly one of response_json ({"status_code", "request_id", "body"}) and
// error_json ({"code", "message"}) is set (a JSON object); the other is empty.
struct BatchResult {
  int64_t line_index = 0;  // 0-based position in the input file: the output's order
  std::string custom_id;
  std::string response_json;
  std::string error_json;
};

// The output and error files' contents: one line per result in input order,
// {"id", "custom_id", "response", "error"}. A result goes to the error file when it has an error or
// its response's status_code is not 2xx.
struct BatchOutput {
  std::string output_jsonl;
  std::string error_jsonl;
};

class BatchStore {
 public:
  static absl::StatusOr<std::unique_ptr<BatchStore>> Open(const BatchStoreOptions& options);
  ~BatchStore();
  BatchStore(const BatchStore&) = delete;
  BatchStore& operator=(const BatchStore&) = delete;

  const std::string& path() const { return path_; }

  // ---- files
  // Stores `content` with `meta` (id and bytes are assigned); returns the stored metadata.
  absl::StatusOr<StoredFile> PutFile(StoredFile meta, std::string_view content);
  absl::StatusOr<StoredFile> GetFile(const std::string& tenant, const std::string& id);
  absl::StatusOr<std::string> GetFileContent(const std::string& tenant, const std::string& id);
  absl::Status DeleteFile(const std::string& tenant, const std::string& id);

  // ---- batches
  // Stores a new batch in `validating` (id assigned; created_at as given). The input file must
  // be the tenant's (NOT_FOUND otherwise).
  absl::StatusOr<Batch> CreateBatch(Batch batch);
  absl::StatusOr<Batch> GetBatch(const std::string& tenant, const std::string& id);
  // The tenant's batches, newest first, `limit` (1..100) of them after the batch `after` ("" for
  // the first page; NOT_FOUND when it is not one of the tenant's).
  absl::StatusOr<BatchPage> ListBatches(const std::string& tenant, const std::string& after,
                                        int limit);
  // Batches not in a final status, any tenant, oldest first: what to resume after a restart.
  absl::StatusOr<std::vector<Batch>> ListUnfinishedBatches();
  // How many batches of every tenant are in each status (statuses with none left out).
  absl::StatusOr<std::vector<std::pair<BatchStatus, int64_t>>> CountBatches();
  // Moves the batch to `to`, stamping its timestamp with `now`; `errors_json` (when not empty)
  // replaces the batch's errors. FAILED_PRECONDITION when the lifecycle forbids the move.
  absl::StatusOr<Batch> Transition(const std::string& tenant, const std::string& id,
                                   BatchStatus to, int64_t now,
                                   const std::string& errors_json = "");
  absl::Status SetTotal(const std::string& batch_id, int64_t total);
  absl::Status SetOutputFiles(const std::string& batch_id, const std::string& output_file_id,
                              const std::string& error_file_id);

  // ---- results
  // Records one request's result and counts it: failed when it has an error or its response's
  // status_code is not 2xx (as OpenAI counts), else completed. Returns false when the batch
  // already has a result for this custom_id (kept as it was, not counted again).
  absl::StatusOr<bool> RecordResult(const std::string& batch_id, const BatchResult& result);
  // RecordResult for many results in one transaction (one sync to disk); returns how many were
  // new.
  absl::StatusOr<int64_t> RecordResults(const std::string& batch_id,
                                        std::span<const BatchResult> results);
  // The custom_ids the batch already has results for: the requests not to run again.
  absl::StatusOr<std::vector<std::string>> AnsweredCustomIds(const std::string& batch_id);
  absl::StatusOr<BatchOutput> BuildOutput(const std::string& batch_id);

 private:
  BatchStore(sqlite3* db, std::string path);

  sqlite3* db_;
  std::string path_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace carpool::router::batch

#endif  // CARPOOL_ROUTER_BATCH_BATCH_STORE_H_
