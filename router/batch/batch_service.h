// Batch jobs (issue 16, docs/batch.md): the OpenAI Batch API's operations on the durable store
// (router/batch/batch_store.h), and the runner that sends each batch's requests to the router
// core in its batch lane and records every answer before it counts.
//
// The runner is an in-process client of the router (an ordinary carpool::Client over inproc,
// like the HTTP gateway): each request of a batch runs exactly as the same body sent to the
// gateway would (router/openai_json.h parses it and builds the response body), flagged
// `batch_job`, so admission queues it in the batch lane (router/admission.h) below every
// interactive class, and failover, deadlines and tenant quotas treat it like any request. A
// result is committed to the store before the batch counts it; after a restart on the same
// state dir every unfinished batch goes on with the requests that have no result yet, so the
// output holds each custom_id once.
//
// Retryable refusals (queue_full, token_budget, tenant_quota, draining, worker_lost, router_lost,
// no workers) are retried after the router's retry_after_ms; any other answer (a 4xx the request
// earns, a 5xx) is that request's result, as OpenAI records it.
//
// Lifecycle of a batch: validating (the whole input file is checked; any bad line fails the
// batch with every error listed) -> in_progress -> finalizing (the output and error files are
// written) -> completed. cancel: cancelling (the requests in flight are cancelled) -> cancelled,
// with what finished kept. A batch still running at the end of its completion_window ends
// expired, with what finished kept.
//
// Tenants: every call names the tenant (its name; "" the anonymous tenant of a router without
// --tenants). Another tenant's ids read as NOT_FOUND. The runner sends a batch's requests with
// its tenant's key from `tenants`, so they count against that tenant's limits.
//
// Thread-safe.
#ifndef CARPOOL_ROUTER_BATCH_BATCH_SERVICE_H_
#define CARPOOL_ROUTER_BATCH_BATCH_SERVICE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "router/batch/batch_input.h"
#include "router/batch/batch_store.h"
#include "router/tenants.h"

namespace zmq {
class context_t;
}  // namespace zmq

namespace carpool::router::batch {

struct BatchServiceOptions {
  // Where the store lives (--state-dir); created on first use. Default: "carpool-state", relative
  // to the router's working directory.
  std::string state_dir = "carpool-state";
  // A cap on the store's size in SQLite pages (BatchStoreOptions::max_pages); 0: the disk's.
  int64_t max_store_pages = 0;
  // Input file limits (--batch-max-lines, --batch-max-file-bytes).
  BatchInputOptions input;
  // Requests of all batches the runner has at the router at once (--batch-max-in-flight plus
  // --batch-max-queued: what the batch lane can hold). Default: 64.
  int max_outstanding = 64;
  // The router core: its inproc endpoint and context (Router::inproc_endpoint(), zmq_context()).
  // Any router endpoint works with zmq_context null (tests). Required.
  std::string router_endpoint;
  zmq::context_t* zmq_context = nullptr;  // not owned
  // The router's tenants: the key each batch's requests are sent with.
  TenantTable tenants;
  // max_tokens of a line's body that gives none (as the gateway's defaults).
  int completion_max_tokens = 16;
  int chat_max_tokens = 256;
  // Longest one request may take at the router before the runner cancels and retries it.
  // Default: 600000.
  int64_t request_timeout_ms = 600000;
  // Wait before retrying a retryable refusal that names no retry_after_ms. Default: 200.
  int64_t retry_ms = 200;
  // Test hook: the clock, unix seconds. Default: the real one.
  int64_t (*now_seconds)() = nullptr;

  absl::Status Validate() const;
};

// What /metrics and `carpool status` show of the batch lane.
struct BatchServiceStats {
  // Batches by BatchStatus (indexed by its value), over the whole store, as counted at most
  // half a second ago.
  std::array<int64_t, 8> batches_by_status = {};
  int64_t requests_pending = 0;    // of running batches, not sent to the router yet
  int64_t requests_running = 0;    // at the router now (queued or on a worker)
  int64_t requests_done = 0;       // results recorded since the start (this process)
  int64_t prompt_tokens = 0;       // usage of the results recorded since the start
  int64_t completion_tokens = 0;
};

class BatchService {
 public:
  // Opens the store when the state dir exists (and resumes its unfinished batches); otherwise
  // checks that it can be created (its nearest existing parent is a writable directory) and
  // creates it on first use. An unusable state dir is an error here, naming the path.
  static absl::StatusOr<std::unique_ptr<BatchService>> Start(BatchServiceOptions options);
  // Stops the runner: the requests in flight are cancelled at the router (they run again after
  // the next start); nothing recorded is lost.
  ~BatchService();
  BatchService(const BatchService&) = delete;
  BatchService& operator=(const BatchService&) = delete;

  // The tenant name of an API key: "" without tenants; UNAUTHENTICATED for an unknown key.
  absl::StatusOr<std::string> TenantOf(const std::string& api_key) const;

  // ---- files (purpose "batch" only for uploads; outputs are "batch_output")
  // INVALID_ARGUMENT for another purpose or an empty file, OUT_OF_RANGE (HTTP 413) above
  // input.max_bytes.
  absl::StatusOr<StoredFile> CreateFile(const std::string& tenant, const std::string& filename,
                                        const std::string& purpose, std::string_view content);
  absl::StatusOr<StoredFile> GetFile(const std::string& tenant, const std::string& id);
  absl::StatusOr<std::string> GetFileContent(const std::string& tenant, const std::string& id);
  absl::Status DeleteFile(const std::string& tenant, const std::string& id);

  // ---- batches
  // A new batch in validating; validation and the run follow on the runner. INVALID_ARGUMENT for
  // an endpoint that is not a batch endpoint, a completion_window that is not a duration
  // ("24h"; carpool also takes "Ns", "Nm", "Nh" up to 24h), metadata that is not an object of at
  // most 16 string values; NOT_FOUND for an input file the tenant does not own.
  absl::StatusOr<Batch> CreateBatch(const std::string& tenant, const std::string& input_file_id,
                                    const std::string& endpoint,
                                    const std::string& completion_window,
                                    const std::string& metadata_json);
  absl::StatusOr<Batch> GetBatch(const std::string& tenant, const std::string& id);
  absl::StatusOr<BatchPage> ListBatches(const std::string& tenant, const std::string& after,
                                        int limit);
  // validating or in_progress -> cancelling (-> cancelled once its requests in flight ended);
  // cancelling or cancelled: unchanged; any other final status: FAILED_PRECONDITION.
  absl::StatusOr<Batch> CancelBatch(const std::string& tenant, const std::string& id);

  BatchServiceStats Stats() const;

  class Impl;

 private:
  explicit BatchService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prometheus text for /metrics: carpool_batch_jobs{status}, carpool_batch_requests{state=
// pending|running}, carpool_batch_requests_done_total and carpool_batch_tokens_total{kind=
// prompt|completion} (rate() of it: the batch lane's tokens/s).
std::string BatchMetricsText(const BatchServiceStats& stats);

// OpenAI's JSON objects.
// {"id", "object": "file", "bytes", "created_at", "filename", "purpose"}
std::string FileJson(const StoredFile& file);
// {"id", "object": "file", "deleted": true}
std::string FileDeletedJson(const std::string& id);
// {"id", "object": "batch", "endpoint", "errors", "input_file_id", "completion_window",
//  "status", "output_file_id", "error_file_id", "created_at", ..., "request_counts", "metadata"}
std::string BatchJson(const Batch& batch);
// {"object": "list", "data": [...], "first_id", "last_id", "has_more"}
std::string BatchListJson(const BatchPage& page);

}  // namespace carpool::router::batch

#endif  // CARPOOL_ROUTER_BATCH_BATCH_SERVICE_H_
