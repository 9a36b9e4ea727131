#include "router/batch/batch_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/carpool_client.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "router/openai_json.h"
#include "router/text_stream.h"

namespace carpool::router::batch {
namespace {

using Json = nlohmann::ordered_json;

// OpenAI's limits on a batch's metadata.
constexpr int kMaxMetadataKeys = 16;
constexpr size_t kMaxMetadataKeyBytes = 64;
constexpr size_t kMaxMetadataValueBytes = 512;
constexpr int64_t kMaxWindowSeconds = 24 * 3600;
// How often the control thread looks for expired batches when nothing wakes it.
constexpr absl::Duration kControlTick = absl::Milliseconds(250);
// How often the batches' statuses are counted for Stats().
constexpr absl::Duration kCountEvery = absl::Milliseconds(500);
// How often a request's executor looks up from its stream (to stop with the service).
constexpr int64_t kPollMs = 100;

int64_t RealNowSeconds() { return absl::ToUnixSeconds(absl::Now()); }

// "24h", "90m", "30s": seconds, 1 s to 24 h.
absl::StatusOr<int64_t> WindowSeconds(const std::string& window) {
  int64_t n = 0;
  const char unit = window.empty() ? '\0' : window.back();
  const int64_t scale = unit == 'h' ? 3600 : unit == 'm' ? 60 : unit == 's' ? 1 : 0;
  if (scale == 0 || !absl::SimpleAtoi(window.substr(0, window.size() - 1), &n) ||
      n < 1 || n > kMaxWindowSeconds / scale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "completion_window must be \"24h\" (or a duration such as \"30m\" up to 24h), got \"",
        window, "\""));
  }
  return n * scale;
}

// "" for none; else the metadata as stored: a JSON object of at most 16 string values.
absl::StatusOr<std::string> CheckMetadata(const std::string& text) {
  if (text.empty() || text == "null") return std::string("null");
  Json m = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object()) return absl::InvalidArgumentError("metadata must be a JSON object");
  if (m.size() > kMaxMetadataKeys) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata has ", m.size(), " keys; at most ", kMaxMetadataKeys));
  }
  for (const auto& [key, value] : m.items()) {
    if (key.size() > kMaxMetadataKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat("metadata key '", key.substr(0, 16),
                                                     "...' is longer than 64 characters"));
    }
    if (!value.is_string() || value.get_ref<const std::string&>().size() >
                                  kMaxMetadataValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata['", key, "'] must be a string of at most 512 characters"));
    }
  }
  return m.dump();
}

// Whether a refusal means "not now" rather than an answer to record: the batch lane is full,
// the tenant is over its rate, the cluster is draining or lost the worker, the router is gone.
bool Retryable(const absl::Status& status) {
  const std::string why = ErrorReason(status);
  for (const char* r : {reason::kQueueFull, reason::kTokenBudget, reason::kTenantQuota,
                        reason::kDraining, reason::kWorkerLost, reason::kRouterLost,
                        reason::kNoWorkers, reason::kClientTooSlow}) {
    if (why == r) return true;
  }
  return why.empty() && (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status));
}

std::string OrNull(const std::string& s) { return s.empty() ? "null" : Json(s).dump(); }

Json Stamp(int64_t t) { return t == 0 ? Json(nullptr) : Json(t); }

// The state dir can be used: it is a directory, or one can be created there. The probe creates
// the missing directories and removes them again, so nothing is left behind until first use.
absl::Status CheckStateDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path path = fs::absolute(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--state-dir ", dir, ": ", ec.message()));
  if (fs::exists(path, ec)) {
    if (!fs::is_directory(path, ec)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--state-dir ", path.string(), " exists and is not a directory"));
    }
    return absl::OkStatus();
  }
  std::vector<fs::path> missing;
  for (fs::path p = path; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  // Another router starting beside this one may create it at the same moment: fine.
  fs::create_directories(path, ec);
  if (ec || !fs::is_directory(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", path.string(), " cannot be created: ",
                     ec ? ec.message() : std::string("not a directory")));
  }
  // Writable too: a directory on a read-only mount can exist yet refuse files.
  const fs::path probe = path / ".carpool-probe";
  FILE* f = std::fopen(probe.c_str(), "w");
  const bool writable = f != nullptr;
  if (f != nullptr) std::fclose(f);
  fs::remove(probe, ec);
  for (const fs::path& p : missing) fs::remove(p, ec);  // deepest first
  if (!writable) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", path.string(), " is not writable"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BatchServiceOptions::Validate() const {
  if (state_dir.empty()) return absl::InvalidArgumentError("--state-dir must not be empty");
  if (router_endpoint.empty()) {
    return absl::InvalidArgumentError("the batch service needs a router endpoint");
  }
  if (max_outstanding < 1 || max_outstanding > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the batch lane's in-flight + queued requests must be 1..4096, got ", max_outstanding));
  }
  if (input.max_lines < 1) return absl::InvalidArgumentError("--batch-max-lines must be >= 1");
  if (input.max_bytes < 1) {
    return absl::InvalidArgumentError("--batch-max-file-bytes must be >= 1");
  }
  if (request_timeout_ms < 1 || retry_ms < 1) {
    return absl::InvalidArgumentError("batch request timeout and retry wait must be >= 1 ms");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- Impl

class BatchService::Impl {
 public:
  explicit Impl(BatchServiceOptions options)
      : options_(std::move(options)),
        now_(options_.now_seconds != nullptr ? options_.now_seconds : &RealNowSeconds) {}
  ~Impl();

  absl::Status Start();
  absl::StatusOr<std::string> TenantOf(const std::string& api_key) const;
  absl::StatusOr<StoredFile> CreateFile(const std::string& tenant, const std::string& filename,
                                        const std::string& purpose, std::string_view content);
  absl::StatusOr<StoredFile> GetFile(const std::string& tenant, const std::string& id);
  absl::StatusOr<std::string> GetFileContent(const std::string& tenant, const std::string& id);
  absl::Status DeleteFile(const std::string& tenant, const std::string& id);
  absl::StatusOr<Batch> CreateBatch(const std::string& tenant, const std::string& input_file_id,
                                    const std::string& endpoint, const std::string& window,
                                    const std::string& metadata_json);
  absl::StatusOr<Batch> GetBatch(const std::string& tenant, const std::string& id);
  absl::StatusOr<BatchPage> ListBatches(const std::string& tenant, const std::string& after,
                                        int limit);
  absl::StatusOr<Batch> CancelBatch(const std::string& tenant, const std::string& id);
  BatchServiceStats Stats();

 private:
  // How a running batch ends when its requests stop: all answered, or cut short.
  enum class End { kNone, kCancelled, kExpired, kFailed };

  // A batch the runner holds: in_progress, or cut short and waiting for its requests in flight.
  struct Active {
    Batch batch;
    std::string api_key;  // its tenant's
    int64_t expires_at = 0;
    std::vector<BatchInputRequest> requests;  // the input file, in order
    std::deque<int> pending;                  // indices into requests not sent yet
    absl::flat_hash_set<std::string> in_flight;  // request_ids at the router now
    int working = 0;  // executors holding one of its requests
    End end = End::kNone;
    std::string failure;  // End::kFailed: why
  };

  // The store, opened on first use (CheckStateDir made sure it can be).
  absl::StatusOr<BatchStore*> Store();
  std::string KeyOf(const std::string& tenant) const;
  void Wake();

  // ---- the control thread: validation, expiry, finalization
  void ControlLoop();
  // A validating or in_progress batch from the store becomes Active (or fails validation).
  void Load(const Batch& batch);
  // Ends `a` (no request of it in flight any more): the unrun lines of a batch cut short go to
  // the error file, the output files are written, the batch reaches its final status.
  void Finalize(Active a);
  // A batch in `cancelling` or `finalizing` that no thread holds (found at start, or cancelled
  // while validating): finalized from the store and its input file.
  void FinishOrphan(const Batch& batch);
  void FailBatch(const Batch& batch, const std::string& code, const std::string& message);
  // Refreshes batches_by_status_ from the store.
  void CountBatches();

  // ---- executor threads: one request at a time
  void ExecutorLoop();
  // Runs one request until it has an answer to record; nullopt when its batch ended (or the
  // service stops) first.
  std::optional<BatchResult> Execute(const std::string& batch_id, const BatchInputRequest& req);
  // The body the gateway would answer the request with, or its error.
  absl::StatusOr<std::string> Call(const std::string& endpoint, const BatchInputRequest& req,
                                   const std::string& api_key, const std::string& request_id);
  // Whether requests of `batch_id` should still run.
  bool Running(const std::string& batch_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BatchServiceOptions options_;
  int64_t (*const now_)();
  std::unique_ptr<Client> client_;

  absl::Mutex store_mu_;
  std::unique_ptr<BatchStore> store_ ABSL_GUARDED_BY(store_mu_);

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Batch ids to validate (or to resume, or to finish), in order.
  std::deque<std::string> to_load_ ABSL_GUARDED_BY(mu_);
  // Running batches by id; `order_` is oldest first, the order requests are taken in.
  std::map<std::string, Active> active_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  // The store's batches by status, counted by the control thread (Stats() never waits for the
  // store, whose lock a large upload may hold for seconds).
  std::array<int64_t, 8> batches_by_status_ ABSL_GUARDED_BY(mu_) = {};
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> next_attempt_{0};

  std::thread control_;
  std::vector<std::thread> executors_;
};

absl::Status BatchService::Impl::Start() {
  RETURN_IF_ERROR(options_.Validate());
  RETURN_IF_ERROR(CheckStateDir(options_.state_dir));
  ClientOptions co;
  co.router_endpoint = options_.router_endpoint;
  co.zmq_context = options_.zmq_context;
  co.default_timeout_ms = options_.request_timeout_ms;
  co.zmtp_heartbeat_ms = 0;  // inproc
  co.max_message_bytes = 256 << 20;
  ASSIGN_OR_RETURN(client_, Client::Connect(co));
  // A store that exists may hold batches to resume: open it now (a broken one fails the start).
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(options_.state_dir) / "batches.db", ec)) {
    ASSIGN_OR_RETURN(BatchStore * store, Store());
    ASSIGN_OR_RETURN(std::vector<Batch> unfinished, store->ListUnfinishedBatches());
    CountBatches();  // /metrics right after a restart counts the batches already there
    absl::MutexLock lock(&mu_);
    for (const Batch& b : unfinished) to_load_.push_back(b.id);
  }
  control_ = std::thread([this] { ControlLoop(); });
  for (int i = 0; i < options_.max_outstanding; ++i) {
    executors_.emplace_back([this] { ExecutorLoop(); });
  }
  return absl::OkStatus();
}

BatchService::Impl::~Impl() {
  std::vector<std::string> in_flight;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [id, a] : active_) in_flight.insert(in_flight.end(), a.in_flight.begin(),
                                                         a.in_flight.end());
    cv_.SignalAll();
  }
  // Unanswered, they run again after the next start.
  for (const std::string& id : in_flight) (void)client_->Cancel(id);
  for (std::thread& t : executors_) t.join();
  if (control_.joinable()) control_.join();
}

absl::StatusOr<BatchStore*> BatchService::Impl::Store() {
  absl::MutexLock lock(&store_mu_);
  if (store_ == nullptr) {
    BatchStoreOptions so;
    so.state_dir = options_.state_dir;
    so.max_pages = options_.max_store_pages;
    ASSIGN_OR_RETURN(store_, BatchStore::Open(so));
  }
  return store_.get();
}

absl::StatusOr<std::string> BatchService::Impl::TenantOf(const std::string& api_key) const {
  if (!options_.tenants.enabled()) return std::string();
  const int t = options_.tenants.Authenticate(api_key);
  if (t < 0) {
    return absl::UnauthenticatedError(
        api_key.empty() ? "this router has tenants: send an API key" : "unknown API key");
  }
  return options_.tenants.at(t).name;
}

std::string BatchService::Impl::KeyOf(const std::string& tenant) const {
  for (int i = 0; i < options_.tenants.size(); ++i) {
    if (options_.tenants.at(i).name == tenant) return options_.tenants.at(i).key;
  }
  return "";  // anonymous, or a tenant no longer in the file (its requests are refused)
}

void BatchService::Impl::Wake() {
  absl::MutexLock lock(&mu_);
  cv_.SignalAll();
}

// ---- files

absl::StatusOr<StoredFile> BatchService::Impl::CreateFile(const std::string& tenant,
                                                          const std::string& filename,
                                                          const std::string& purpose,
                                                          std::string_view content) {
  if (purpose != "batch") {
    return absl::InvalidArgumentError(
        absl::StrCat("purpose must be \"batch\", got \"", purpose, "\""));
  }
  if (content.empty()) return absl::InvalidArgumentError("the file is empty");
  if (static_cast<int64_t>(content.size()) > options_.input.max_bytes) {
    return absl::OutOfRangeError(absl::StrCat("the file is ", content.size(),
                                              " bytes, more than the limit of ",
                                              options_.input.max_bytes,
                                              " (--batch-max-file-bytes)"));
  }
  // Lines are counted here too, so an oversized file is refused at upload, not only when a
  // batch validates it.
  const int64_t lines = std::count(content.begin(), content.end(), '\n') +
                        (content.back() == '\n' ? 0 : 1);
  if (lines > options_.input.max_lines) {
    return absl::InvalidArgumentError(absl::StrCat("the file has ", lines,
                                                   " lines, more than the limit of ",
                                                   options_.input.max_lines,
                                                   " (--batch-max-lines)"));
  }
  ASSIGN_OR_RETURN(BatchStore * store, Store());
  StoredFile meta;
  meta.tenant = tenant;
  meta.purpose = purpose;
  meta.filename = filename.empty() ? "input.jsonl" : filename;
  meta.created_at = now_();
  return store->PutFile(std::move(meta), content);
}

absl::StatusOr<StoredFile> BatchService::Impl::GetFile(const std::string& tenant,
                                                       const std::string& id) {
  ASSIGN_OR_RETURN(BatchStore * store, Store());
  return store->GetFile(tenant, id);
}

absl::StatusOr<std::string> BatchService::Impl::GetFileContent(const std::string& tenant,
                                                               const std::string& id) {
  ASSIGN_OR_RETURN(BatchStore * store, Store());
  return store->GetFileContent(tenant, id);
}

absl::Status BatchService::Impl::DeleteFile(const std::string& tenant, const std::string& id) {
  ASSIGN_OR_RETURN(BatchStore * store, Store());
  return store->DeleteFile(tenant, id);
}

// ---- batches

absl::StatusOr<Batch> BatchService::Impl::CreateBatch(const std::string& tenant,
                                                      const std::string& input_file_id,
                                                      const std::string& endpoint,
                                                      const std::string& window,
                                                      const std::string& metadata_json) {
  if (!IsBatchEndpoint(endpoint)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint must be /v1/chat/completions, /v1/completions or /v1/embeddings, got \"",
        endpoint, "\""));
  }
  RETURN_IF_ERROR(WindowSeconds(window).status());
  ASSIGN_OR_RETURN(std::string metadata, CheckMetadata(metadata_json));
  if (input_file_id.empty()) return absl::InvalidArgumentError("input_file_id is required");
  ASSIGN_OR_RETURN(BatchStore * store, Store());
  ASSIGN_OR_RETURN(StoredFile file, store->GetFile(tenant, input_file_id));
  if (file.purpose != "batch") {
    return absl::InvalidArgumentError(absl::StrCat("the file ", input_file_id,
                                                   " has purpose \"", file.purpose,
                                                   "\", not \"batch\""));
  }
  Batch b;
  b.tenant = tenant;
  b.input_file_id = input_file_id;
  b.endpoint = endpoint;
  b.completion_window = window;
  b.metadata_json = metadata;
  b.created_at = now_();
  ASSIGN_OR_RETURN(Batch created, store->CreateBatch(std::move(b)));
  absl::MutexLock lock(&mu_);
  to_load_.push_back(created.id);
  cv_.SignalAll();
  return created;
}

absl::StatusOr<Batch> BatchService::Impl::GetBatch(const std::string& tenant,
                                                   const std::string& id) {
  ASSIGN_OR_RETURN(BatchStore * store, Store());
  return store->GetBatch(tenant, id);
}

absl::StatusOr<BatchPage> BatchService::Impl::ListBatches(const std::string& tenant,
                                                          const std::string& after, int limit) {
  ASSIGN_OR_RETURN(BatchStore * store, Store());
  return store->ListBatches(tenant, after, limit);
}

absl::StatusOr<Batch> BatchService::Impl::CancelBatch(const std::string& tenant,
                                                      const std::string& id) {
  ASSIGN_OR_RETURN(BatchStore * store, Store());
  ASSIGN_OR_RETURN(Batch b, store->GetBatch(tenant, id));
  if (b.status == BatchStatus::kCancelling || b.status == BatchStatus::kCancelled) return b;
  if (b.status != BatchStatus::kValidating && b.status != BatchStatus::kInProgress) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the batch ", id, " is ", std::string(BatchStatusName(b.status)),
        " and can no longer be cancelled"));
  }
  ASSIGN_OR_RETURN(Batch cancelling, store->Transition(tenant, id, BatchStatus::kCancelling,
                                                       now_()));
  std::vector<std::string> in_flight;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(id);
    if (it != active_.end()) {
      if (it->second.end == End::kNone) it->second.end = End::kCancelled;
      in_flight.assign(it->second.in_flight.begin(), it->second.in_flight.end());
    } else if (std::find(to_load_.begin(), to_load_.end(), id) == to_load_.end()) {
      to_load_.push_back(id);  // validating on the control thread now: it rereads the status
    }
    cv_.SignalAll();
  }
  for (const std::string& rid : in_flight) (void)client_->Cancel(rid);
  return cancelling;
}

void BatchService::Impl::CountBatches() {
  BatchStore* store;
  {
    absl::MutexLock lock(&store_mu_);
    store = store_.get();
  }
  if (store == nullptr) return;  // never used: nothing to count
  absl::StatusOr<std::vector<std::pair<BatchStatus, int64_t>>> counts = store->CountBatches();
  if (!counts.ok()) return;
  std::array<int64_t, 8> by_status = {};
  for (const auto& [status, n] : *counts) by_status[static_cast<int>(status)] = n;
  absl::MutexLock lock(&mu_);
  batches_by_status_ = by_status;
}

BatchServiceStats BatchService::Impl::Stats() {
  BatchServiceStats s;
  absl::MutexLock lock(&mu_);
  s.batches_by_status = batches_by_status_;
  for (const auto& [id, a] : active_) {
    if (a.end == End::kNone) s.requests_pending += static_cast<int64_t>(a.pending.size());
    s.requests_running += static_cast<int64_t>(a.in_flight.size());
  }
  s.requests_done = done_;
  s.prompt_tokens = prompt_tokens_;
  s.completion_tokens = completion_tokens_;
  return s;
}

// ---- control

void BatchService::Impl::ControlLoop() {
  absl::Time next_count = absl::InfinitePast();
  for (;;) {
    std::optional<std::string> load;
    std::vector<Active> finished;
    std::vector<std::string> cancel;
    {
      absl::MutexLock lock(&mu_);
      if (to_load_.empty()) cv_.WaitWithTimeout(&mu_, kControlTick);
      if (stopping_) return;
      if (!to_load_.empty()) {
        load = std::move(to_load_.front());
        to_load_.pop_front();
      }
      const int64_t now = now_();
      for (auto it = active_.begin(); it != active_.end();) {
        Active& a = it->second;
        if (a.end == End::kNone && now >= a.expires_at) {
          a.end = End::kExpired;
          cancel.insert(cancel.end(), a.in_flight.begin(), a.in_flight.end());
        }
        if (a.working == 0 && (a.end != End::kNone || a.pending.empty())) {
          order_.erase(std::find(order_.begin(), order_.end(), it->first));
          finished.push_back(std::move(a));
          it = active_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const std::string& rid : cancel) (void)client_->Cancel(rid);
    for (Active& a : finished) Finalize(std::move(a));
    if (absl::Now() >= next_count) {
      CountBatches();
      next_count = absl::Now() + kCountEvery;
    }
    if (!load.has_value()) continue;
    absl::StatusOr<BatchStore*> store = Store();
    if (!store.ok()) {
      std::cerr << "carpool-router: batch store: " << store.status().message() << "\n";
      continue;
    }
    // Every batch lives on one tenant's books; the store's id lookup is tenant-scoped, so
    // find it among the unfinished ones.
    absl::StatusOr<std::vector<Batch>> unfinished = (*store)->ListUnfinishedBatches();
    if (!unfinished.ok()) {
      std::cerr << "carpool-router: batch store: " << unfinished.status().message() << "\n";
      continue;
    }
    for (const Batch& b : *unfinished) {
      if (b.id != *load) continue;
      std::vector<std::string> in_flight;
      bool held = false;
      {
        absl::MutexLock lock(&mu_);
        auto it = active_.find(b.id);
        if (it != active_.end()) {
          // Cancelled just as it started: the running batch takes the cancel.
          held = true;
          if (b.status == BatchStatus::kCancelling && it->second.end == End::kNone) {
            it->second.end = End::kCancelled;
            in_flight.assign(it->second.in_flight.begin(), it->second.in_flight.end());
          }
        }
      }
      for (const std::string& rid : in_flight) (void)client_->Cancel(rid);
      if (held) continue;
      if (b.status == BatchStatus::kValidating || b.status == BatchStatus::kInProgress) {
        Load(b);
      } else {
        FinishOrphan(b);
      }
    }
  }
}

void BatchService::Impl::FailBatch(const Batch& batch, const std::string& code,
                                   const std::string& message) {
  std::cerr << "carpool-router: batch " << batch.id << " failed: " << message << "\n";
  Json errors = {{"object", "list"},
                 {"data", Json::array({{{"code", code},
                                        {"message", message},
                                        {"param", nullptr},
                                        {"line", nullptr}}})}};
  absl::StatusOr<BatchStore*> store = Store();
  if (!store.ok()) return;
  absl::StatusOr<Batch> failed =
      (*store)->Transition(batch.tenant, batch.id, BatchStatus::kFailed, now_(), errors.dump());
  if (!failed.ok()) {
    std::cerr << "carpool-router: batch " << batch.id
              << " could not be marked failed: " << failed.status().message() << "\n";
  }
}

void BatchService::Impl::Load(const Batch& batch) {
  BatchStore* store = *Store();
  absl::StatusOr<std::string> content = store->GetFileContent(batch.tenant, batch.input_file_id);
  if (!content.ok()) {
    return FailBatch(batch, "input_file_missing",
                     absl::StrCat("the input file ", batch.input_file_id,
                                  " cannot be read: ", content.status().message()));
  }
  absl::StatusOr<BatchInput> input = ValidateBatchInput(*content, batch.endpoint, options_.input);
  if (!input.ok()) {
    return FailBatch(batch, absl::IsOutOfRange(input.status()) ? "file_too_large" : "invalid_file",
                     std::string(input.status().message()));
  }
  if (!input->errors.empty()) {
    absl::StatusOr<Batch> failed = store->Transition(batch.tenant, batch.id, BatchStatus::kFailed,
                                                     now_(), BatchErrorsJson(input->errors));
    if (!failed.ok()) {
      std::cerr << "carpool-router: batch " << batch.id << ": " << failed.status().message()
                << "\n";
    }
    return;
  }
  Active a;
  a.batch = batch;
  if (batch.status == BatchStatus::kValidating) {
    absl::Status total = store->SetTotal(batch.id, static_cast<int64_t>(input->requests.size()));
    if (!total.ok()) return FailBatch(batch, "storage_error", std::string(total.message()));
    absl::StatusOr<Batch> started =
        store->Transition(batch.tenant, batch.id, BatchStatus::kInProgress, now_());
    if (!started.ok()) {
      // Cancelled while it was validated: it ends cancelled, nothing ran.
      absl::StatusOr<Batch> now = store->GetBatch(batch.tenant, batch.id);
      if (now.ok() && now->status == BatchStatus::kCancelling) FinishOrphan(*now);
      return;
    }
    a.batch = *started;
  }
  absl::StatusOr<std::vector<std::string>> answered = store->AnsweredCustomIds(batch.id);
  if (!answered.ok()) {
    return FailBatch(batch, "storage_error", std::string(answered.status().message()));
  }
  const absl::flat_hash_set<std::string> done(answered->begin(), answered->end());
  a.api_key = KeyOf(batch.tenant);
  a.expires_at = batch.created_at + *WindowSeconds(batch.completion_window);
  a.requests = std::move(input->requests);
  for (int i = 0; i < static_cast<int>(a.requests.size()); ++i) {
    if (!done.contains(a.requests[i].custom_id)) a.pending.push_back(i);
  }
  absl::MutexLock lock(&mu_);
  order_.push_back(a.batch.id);
  active_.emplace(a.batch.id, std::move(a));
  cv_.SignalAll();
}

void BatchService::Impl::Finalize(Active a) {
  BatchStore* store = *Store();
  const Batch& b = a.batch;
  if (a.end == End::kFailed) return FailBatch(b, "storage_error", a.failure);
  BatchStatus final_status = BatchStatus::kCompleted;
  if (a.end != End::kNone) {
    // The lines that never got an answer are listed in the error file, as OpenAI lists them.
    final_status = a.end == End::kExpired ? BatchStatus::kExpired : BatchStatus::kCancelled;
    const char* code = a.end == End::kExpired ? "batch_expired" : "batch_cancelled";
    const char* message = a.end == End::kExpired
                              ? "This request could not be executed before the completion "
                                "window expired."
                              : "This request was not executed: the batch was cancelled.";
    absl::StatusOr<std::vector<std::string>> answered = store->AnsweredCustomIds(b.id);
    if (!answered.ok()) {
      return FailBatch(b, "storage_error", std::string(answered.status().message()));
    }
    const absl::flat_hash_set<std::string> done(answered->begin(), answered->end());
    std::vector<BatchResult> unrun;
    const std::string error = Json({{"code", code}, {"message", message}}).dump();
    for (size_t i = 0; i < a.requests.size(); ++i) {
      if (done.contains(a.requests[i].custom_id)) continue;
      unrun.push_back({static_cast<int64_t>(i), a.requests[i].custom_id, "", error});
    }
    absl::Status recorded = store->RecordResults(b.id, unrun).status();
    if (!recorded.ok()) return FailBatch(b, "storage_error", std::string(recorded.message()));
  } else if (b.status != BatchStatus::kFinalizing) {
    absl::StatusOr<Batch> finalizing =
        store->Transition(b.tenant, b.id, BatchStatus::kFinalizing, now_());
    if (!finalizing.ok()) {
      // Cancelled as its last request finished: it ends cancelled instead.
      absl::StatusOr<Batch> now = store->GetBatch(b.tenant, b.id);
      if (now.ok() && now->status == BatchStatus::kCancelling) {
        a.end = End::kCancelled;
        a.batch = *now;
        return Finalize(std::move(a));
      }
      return FailBatch(b, "storage_error", std::string(finalizing.status().message()));
    }
  }
  absl::StatusOr<BatchOutput> output = store->BuildOutput(b.id);
  if (!output.ok()) return FailBatch(b, "storage_error", std::string(output.status().message()));
  std::string output_id, error_id;
  for (auto [content, suffix, id] :
       {std::tuple{&output->output_jsonl, "output", &output_id},
        std::tuple{&output->error_jsonl, "errors", &error_id}}) {
    if (content->empty()) continue;
    StoredFile meta;
    meta.tenant = b.tenant;
    meta.purpose = "batch_output";
    meta.filename = absl::StrCat(b.id, "_", suffix, ".jsonl");
    meta.created_at = now_();
    absl::StatusOr<StoredFile> file = store->PutFile(std::move(meta), *content);
    if (!file.ok()) return FailBatch(b, "storage_error", std::string(file.status().message()));
    *id = file->id;
  }
  absl::Status files = store->SetOutputFiles(b.id, output_id, error_id);
  if (!files.ok()) return FailBatch(b, "storage_error", std::string(files.message()));
  absl::StatusOr<Batch> ended = store->Transition(b.tenant, b.id, final_status, now_());
  if (!ended.ok()) {
    std::cerr << "carpool-router: batch " << b.id << ": " << ended.status().message() << "\n";
  }
}

void BatchService::Impl::FinishOrphan(const Batch& batch) {
  // cancelling (or finalizing after a crash): finalize from the input file and the store.
  Active a;
  a.batch = batch;
  a.end = batch.status == BatchStatus::kCancelling ? End::kCancelled : End::kNone;
  BatchStore* store = *Store();
  absl::StatusOr<std::string> content = store->GetFileContent(batch.tenant, batch.input_file_id);
  if (content.ok()) {
    absl::StatusOr<BatchInput> input =
        ValidateBatchInput(*content, batch.endpoint, options_.input);
    if (input.ok()) a.requests = std::move(input->requests);
  }
  // Finalizing when the router stopped: the output files are built again from the results.
  Finalize(std::move(a));
}

// ---- executors

bool BatchService::Impl::Running(const std::string& batch_id) {
  if (stopping_) return false;
  auto it = active_.find(batch_id);
  return it != active_.end() && it->second.end == End::kNone;
}

void BatchService::Impl::ExecutorLoop() {
  for (;;) {
    std::string batch_id;
    BatchInputRequest req;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        if (stopping_) return;
        for (const std::string& id : order_) {
          Active& a = active_.at(id);
          if (a.end != End::kNone || a.pending.empty()) continue;
          batch_id = id;
          req = a.requests[a.pending.front()];
          a.pending.pop_front();
          ++a.working;
          break;
        }
        if (!batch_id.empty()) break;
        cv_.Wait(&mu_);
      }
    }
    std::optional<BatchResult> result = Execute(batch_id, req);
    absl::Status recorded;
    if (result.has_value()) {
      absl::StatusOr<BatchStore*> store = Store();
      recorded = store.ok() ? (*store)->RecordResult(batch_id, *result).status() : store.status();
    }
    absl::MutexLock lock(&mu_);
    Active& a = active_.at(batch_id);  // held: `working` keeps it from being finalized
    --a.working;
    if (!recorded.ok()) {
      // A result that cannot be written (disk full) fails the batch: never a silent loss.
      a.end = End::kFailed;
      a.failure = absl::StrCat("a result could not be stored: ", recorded.message());
    } else if (result.has_value()) {
      ++done_;
    }
    cv_.SignalAll();
  }
}

std::optional<BatchResult> BatchService::Impl::Execute(const std::string& batch_id,
                                                        const BatchInputRequest& req) {
  std::string endpoint, api_key;
  {
    absl::MutexLock lock(&mu_);
    const Active& a = active_.at(batch_id);
    endpoint = a.batch.endpoint;
    api_key = a.api_key;
  }
  for (;;) {
    const std::string rid = absl::StrCat(batch_id, "/", req.line, "/",
                                         next_attempt_.fetch_add(1, std::memory_order_relaxed));
    {
      absl::MutexLock lock(&mu_);
      if (!Running(batch_id)) return std::nullopt;
      active_.at(batch_id).in_flight.insert(rid);
    }
    absl::StatusOr<std::string> body = Call(endpoint, req, api_key, rid);
    absl::MutexLock lock(&mu_);
    active_.at(batch_id).in_flight.erase(rid);
    if (!Running(batch_id)) return std::nullopt;
    Json response;
    if (body.ok()) {
      response = {{"status_code", 200}, {"request_id", rid}, {"body", Json::parse(*body)}};
    } else if (Retryable(body.status()) || absl::IsCancelled(body.status())) {
      // Not now (a full lane, a lost worker) or cancelled by someone else than this batch's
      // end: after the router's hint, a new attempt.
      const int64_t wait_ms = std::max(RetryAfterMs(body.status()), options_.retry_ms);
      const absl::Time until = absl::Now() + absl::Milliseconds(wait_ms);
      while (Running(batch_id) && !cv_.WaitWithDeadline(&mu_, until)) {
      }
      if (!Running(batch_id)) return std::nullopt;
      continue;
    } else {
      const HttpError error = HttpErrorFromStatus(body.status());
      response = {{"status_code", error.status},
                  {"request_id", rid},
                  {"body", Json::parse(ErrorBody(error))}};
    }
    return BatchResult{req.line - 1, req.custom_id, response.dump(), ""};
  }
}

absl::StatusOr<std::string> BatchService::Impl::Call(const std::string& endpoint,
                                                     const BatchInputRequest& req,
                                                     const std::string& api_key,
                                                     const std::string& request_id) {
  CallOptions call;
  call.timeout_ms = options_.request_timeout_ms;
  if (endpoint == "/v1/embeddings") {
    ASSIGN_OR_RETURN(EmbeddingsRequest r, ParseEmbeddingsRequest(req.body));
    r.input.request_id = request_id;
    r.input.api_key = api_key;
    r.input.model = r.model;
    r.input.batch_job = true;
    ASSIGN_OR_RETURN(EmbedResult result, client_->Embed(r.input, call));
    {
      absl::MutexLock lock(&mu_);
      prompt_tokens_ += result.usage.prompt_tokens;
    }
    return EmbeddingsBody(result.embeddings, r.model, result.usage, r.base64);
  }
  const ApiKind kind = endpoint == "/v1/chat/completions" ? ApiKind::kChat : ApiKind::kCompletion;
  RequestDefaults defaults{options_.completion_max_tokens, options_.chat_max_tokens};
  ASSIGN_OR_RETURN(GenerationRequest r, ParseGenerationRequest(kind, req.body, defaults));
  r.input.request_id = request_id;
  r.input.api_key = api_key;
  r.input.model = r.model;
  r.input.batch_job = true;
  // Streamed as the gateway streams a whole answer, so a stopping service can end it at once.
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, client_->StartStream(r.input, call));
  std::vector<SampleResult> tokens;
  Utf8Stream utf8;
  std::string text;
  for (;;) {
    absl::StatusOr<std::optional<GenerateChunkOut>> next = stream->Next(kPollMs);
    if (!next.ok()) {
      if (stream->done()) return next.status();
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        stream->Cancel();
        return absl::CancelledError("the batch service is stopping");
      }
      continue;  // only the poll interval passed
    }
    if (!next->has_value()) break;
    tokens.insert(tokens.end(), (*next)->tokens.begin(), (*next)->tokens.end());
    text += utf8.Feed((*next)->text);
  }
  text += utf8.Flush();
  const GenerateResult& result = stream->result();
  {
    absl::MutexLock lock(&mu_);
    prompt_tokens_ += result.usage.prompt_tokens;
    completion_tokens_ += result.usage.completion_tokens;
  }
  ResponseMeta meta;
  meta.id = absl::StrCat(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-", request_id);
  meta.created = now_();
  meta.model = r.model;
  meta.byte_tokens = ByteTokenModel(r.model);
  return ResponseBody(r, meta, text, tokens, result.finish_reason, result.usage);
}

// ---------------------------------------------------------------- BatchService

absl::StatusOr<std::unique_ptr<BatchService>> BatchService::Start(BatchServiceOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<BatchService>(new BatchService(std::move(impl)));
}

BatchService::BatchService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BatchService::~BatchService() = default;

absl::StatusOr<std::string> BatchService::TenantOf(const std::string& api_key) const {
  return impl_->TenantOf(api_key);
}
absl::StatusOr<StoredFile> BatchService::CreateFile(const std::string& tenant,
                                                    const std::string& filename,
                                                    const std::string& purpose,
                                                    std::string_view content) {
  return impl_->CreateFile(tenant, filename, purpose, content);
}
absl::StatusOr<StoredFile> BatchService::GetFile(const std::string& tenant,
                                                 const std::string& id) {
  return impl_->GetFile(tenant, id);
}
absl::StatusOr<std::string> BatchService::GetFileContent(const std::string& tenant,
                                                         const std::string& id) {
  return impl_->GetFileContent(tenant, id);
}
absl::Status BatchService::DeleteFile(const std::string& tenant, const std::string& id) {
  return impl_->DeleteFile(tenant, id);
}
absl::StatusOr<Batch> BatchService::CreateBatch(const std::string& tenant,
                                                const std::string& input_file_id,
                                                const std::string& endpoint,
                                                const std::string& completion_window,
                                                const std::string& metadata_json) {
  return impl_->CreateBatch(tenant, input_file_id, endpoint, completion_window, metadata_json);
}
absl::StatusOr<Batch> BatchService::GetBatch(const std::string& tenant, const std::string& id) {
  return impl_->GetBatch(tenant, id);
}
absl::StatusOr<BatchPage> BatchService::ListBatches(const std::string& tenant,
                                                    const std::string& after, int limit) {
  return impl_->ListBatches(tenant, after, limit);
}
absl::StatusOr<Batch> BatchService::CancelBatch(const std::string& tenant,
                                                const std::string& id) {
  return impl_->CancelBatch(tenant, id);
}
BatchServiceStats BatchService::Stats() const { return impl_->Stats(); }

std::string BatchMetricsText(const BatchServiceStats& stats) {
  std::string out =
      "# HELP carpool_batch_jobs Batch jobs in the state dir, by status.\n"
      "# TYPE carpool_batch_jobs gauge\n";
  for (int i = 0; i < static_cast<int>(stats.batches_by_status.size()); ++i) {
    absl::StrAppend(&out, "carpool_batch_jobs{status=\"",
                    std::string(BatchStatusName(static_cast<BatchStatus>(i))), "\"} ",
                    stats.batches_by_status[i], "\n");
  }
  absl::StrAppend(
      &out,
      "# HELP carpool_batch_requests Requests of running batch jobs: not sent yet (pending) and "
      "at the router (running).\n"
      "# TYPE carpool_batch_requests gauge\n"
      "carpool_batch_requests{state=\"pending\"} ", stats.requests_pending, "\n",
      "carpool_batch_requests{state=\"running\"} ", stats.requests_running, "\n",
      "# HELP carpool_batch_requests_done_total Batch requests answered and recorded.\n"
      "# TYPE carpool_batch_requests_done_total counter\n"
      "carpool_batch_requests_done_total ", stats.requests_done, "\n",
      "# HELP carpool_batch_tokens_total Tokens of the batch requests answered.\n"
      "# TYPE carpool_batch_tokens_total counter\n"
      "carpool_batch_tokens_total{kind=\"prompt\"} ", stats.prompt_tokens, "\n",
      "carpool_batch_tokens_total{kind=\"completion\"} ", stats.completion_tokens, "\n");
  return out;
}

// ---------------------------------------------------------------- JSON

std::string FileJson(const StoredFile& file) {
  return Json({{"id", file.id},
               {"object", "file"},
               {"bytes", file.bytes},
               {"created_at", file.created_at},
               {"filename", file.filename},
               {"purpose", file.purpose},
               {"status", "processed"}})
      .dump();
}

std::string FileDeletedJson(const std::string& id) {
  return Json({{"id", id}, {"object", "file"}, {"deleted", true}}).dump();
}

namespace {

Json BatchObject(const Batch& b) {
  const absl::StatusOr<int64_t> window = WindowSeconds(b.completion_window);
  return Json({{"id", b.id},
               {"object", "batch"},
               {"endpoint", b.endpoint},
               {"errors", Json::parse(b.errors_json, nullptr, false)},
               {"input_file_id", b.input_file_id},
               {"completion_window", b.completion_window},
               {"status", std::string(BatchStatusName(b.status))},
               {"output_file_id", Json::parse(OrNull(b.output_file_id))},
               {"error_file_id", Json::parse(OrNull(b.error_file_id))},
               {"created_at", b.created_at},
               {"in_progress_at", Stamp(b.in_progress_at)},
               {"expires_at", Stamp(window.ok() ? b.created_at + *window : 0)},
               {"finalizing_at", Stamp(b.finalizing_at)},
               {"completed_at", Stamp(b.completed_at)},
               {"failed_at", Stamp(b.failed_at)},
               {"expired_at", Stamp(b.expired_at)},
               {"cancelling_at", Stamp(b.cancelling_at)},
               {"cancelled_at", Stamp(b.cancelled_at)},
               {"request_counts",
                {{"total", b.request_counts.total},
                 {"completed", b.request_counts.completed},
                 {"failed", b.request_counts.failed}}},
               {"metadata", Json::parse(b.metadata_json, nullptr, false)}});
}

}  // namespace

std::string BatchJson(const Batch& batch) { return BatchObject(batch).dump(); }

std::string BatchListJson(const BatchPage& page) {
  Json data = Json::array();
  for (const Batch& b : page.data) data.push_back(BatchObject(b));
  return Json({{"object", "list"},
               {"data", data},
               {"first_id", page.data.empty() ? Json(nullptr) : Json(page.data.front().id)},
               {"last_id", page.data.empty() ? Json(nullptr) : Json(page.data.back().id)},
               {"has_more", page.has_more}})
      .dump();
}

}  // namespace carpool::router::batch
