// Router::Impl, the event loop and the state it owns. Internal to carpool_router: router.cc
// holds the loop, the sockets and the client side (arrival, admission, ends, draining);
// router_workers.cc the worker side (dispatch, registrations, worker answers, failover, the
// watchdog); router_text.cc the tokenizer side (text to the tokenizer pool and back, the
// models' tokenizers, Tokenize / Detokenize requests); router_batch.cc the Batch API calls (on a
// thread of their own, through the BatchCallHandler). What differs between request kinds lives
// in their RequestKind (router/request_kind.h: generate_kind.cc, embed_kind.cc); the counts in
// RouterStats.
#ifndef CARPOOL_ROUTER_ROUTER_IMPL_H_
#define CARPOOL_ROUTER_ROUTER_IMPL_H_

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/messages.h"
#include "common/transport.h"
#include "router/admission.h"
#include "router/prefix_index.h"
#include "router/request_kind.h"
#include "router/router.h"
#include "router/router_stats.h"
#include "router/served_models.h"
#include "router/tokenizer_pool.h"
#include "router/worker_registry.h"
#include "router/zap_handler.h"

namespace carpool::router {

// A stalled worker's watchdog threshold is at least this many of its measured step times.
inline constexpr int kStallSteps = 20;
// retry_after_ms of a no_workers error.
inline constexpr int64_t kNoWorkersRetryMs = 5000;
// retry_after_ms of a queue_full refusal for text while the tokenizer threads are full.
inline constexpr int64_t kTokenizerBusyRetryMs = 200;
// Batch calls that may wait for the batch thread at once, and the retry_after_ms of a
// queue_full refusal past them (or past max_batch_call_bytes of uploads waiting).
inline constexpr int kMaxBatchCallsWaiting = 256;
inline constexpr int64_t kBatchBusyRetryMs = 500;

class Router::Impl final : public RequestHost {
 public:
  explicit Impl(const RouterOptions& options);
  ~Impl();

  absl::Status Init();
  absl::Status Run(const std::atomic<bool>& stop, const std::atomic<bool>& drain);

  const std::string& frontend_endpoint() const { return frontend_endpoint_; }
  const std::string& backend_endpoint() const { return backend_endpoint_; }
  const std::string& curve_public_key() const { return curve_public_key_; }
  const RouterMetrics& metrics() const { return stats_.metrics(); }
  const std::string& inproc_endpoint() const { return inproc_endpoint_; }
  zmq::context_t* zmq_context() { return &context_; }
  void SetBatchCalls(BatchCallHandler handler) { batch_handler_ = std::move(handler); }
  void SetBatchStats(std::function<void(StatsOut*)> source) { batch_stats_ = std::move(source); }

  // RequestHost, for the request kinds.
  bool SendToClient(const std::string& client, const ServerMessage& message) override;
  void Fail(uint64_t router_id, absl::StatusCode code, const char* why,
            std::string message) override;
  void Finish(Request& r, WorkerState* w, ServerMessage answer, bool cancel_on_worker) override;
  const WorkerRegistry& workers() const override { return registry_; }
  RouterMetrics& metrics() override { return stats_.metrics(); }

 private:
  // ---- router.cc: sockets, clients, admission, ends, draining
  // Clients are named by the socket they came on and their routing id there (ClientKey in
  // router.cc): Request::client and by_client_ hold that name.
  absl::Status DrainFrontend(Socket* socket, char kind);
  absl::Status DrainBackend();
  void SendToWorker(const std::string& identity, const RouterMessage& message);
  // Counts a refusal by reason (not cancellations) and sends it; false as SendToClient.
  bool SendError(const std::string& client, const std::string& request_id, absl::StatusCode code,
                 const char* why, std::string message, int64_t retry_after_ms = 0);
  void OnClientFrame(const std::string& client, const std::string& payload);
  // Refuses a client frame that does not decode, naming the request_id found in it (if any).
  void RefuseFrame(const std::string& client, std::string_view frame, std::string message);
  // The shape limits for `client`'s requests (the in-process client's allow larger prompts).
  const RequestLimits& LimitsFor(const std::string& client) const;
  // A request of any kind arrives: accepted, its kind's part of admission, its model resolved,
  // then (text) tokenized on the pool, or (token ids) validated when the model is known, and
  // admitted; or answered with the refusal.
  void OnRequest(const std::string& client, Arrival arrival);
  // Resolves r.model against the served models; on failure answers the client and returns
  // false (the caller ends `r`). REQUIRES: !models_.empty().
  bool ResolveModel(Request& r);
  // Submits a validated `r` to the admission controller with its real prompt tokens; a
  // refusal answers the client and ends `r`.
  bool Submit(Request& r);
  // Checks the arrival conditions every kind shares (duplicate request_id, draining, shape,
  // slow client, API key); on failure answers the client and returns false. `tenant` is set on
  // success.
  bool Accept(const std::string& client, const std::string& request_id,
              const absl::Status& shape, const std::string& api_key, int* tenant);
  void Refuse(const std::string& client, const std::string& request_id, int tenant,
              const Refusal& refusal);
  // Checks `r` against its model (its kind's Validate), `encoded` the tokens of its texts; on
  // failure answers the client and returns false (the caller ends `r`).
  bool Validate(Request& r, const EncodedTexts& encoded);
  void OnCancel(const std::string& client, const std::string& request_id);
  // Stats for `client`: everything in-process; with tenants, over the network, the key's view.
  void OnStats(const std::string& client, const StatsQuery& query);
  void DropClient(const std::string& client);
  // Cancels the requests of the clients the backlog found too slow, one client_too_slow error
  // each; then retries every backlog. From the loop only (it ends requests).
  void ServeBacklog();
  // Ends a request everywhere (admission, worker, tables); tells its worker to stop it.
  // `completed`: it finished normally (feeds the service rate).
  void End(uint64_t router_id, bool completed = false);
  void ExpireDeadlines();
  // Requests not admitted yet: past their deadline, or waiting for a tokenizer longer than
  // the no-worker timeout.
  void ExpireUnadmitted(int64_t now);
  void StartDraining(int64_t now);
  // True when Run should return: drained, or the grace period is over (the rest failed).
  bool DrainDone(int64_t now);
  // After the requests: asks the workers to drain and waits (bounded) until they deregister.
  bool WorkersDrained(int64_t now);
  StatsSources Sources() const;

  // ---- router_text.cc: the tokenizer side
  // Sends r's texts to the pool (Stage::kTokenizing), or parks it until its model's tokenizer
  // is there (Stage::kWaitingForTokenizer); a model without one refuses it.
  void StartTokenizing(Request& r);
  void OnTokenized(uint64_t router_id, int64_t bytes, absl::StatusOr<EncodedTexts> encoded);
  // After a registration or a tokenizer load: the parked requests go on.
  void ResumeWaiting();
  void StartTokenizerLoad(TokenizerLoad load);
  // The model of a Tokenize / Detokenize request, its tokenizer ready; null when not: the
  // error sent, or `wait` set (no worker registered yet, or the tokenizer is loading).
  const ServedModel* TokenizerFor(const std::string& client, const std::string& request_id,
                                  const std::string& model, bool* wait);
  // A Tokenize / Detokenize request waits for its model's tokenizer (its id stays in flight).
  void ParkTextCall(const std::string& client, const std::string& request_id,
                    std::variant<TokenizeInput, DetokenizeInput> input);
  // The parked ones go on (or, with expire_only, only those past the no-worker timeout end).
  void ResumeTextCalls(int64_t now, bool expire_only);
  // A Tokenize / Detokenize call whose checks that need no model gave `shape`: its model when
  // the tokenizer is ready; null when the call was refused (the error sent) or parked (`in`
  // moved) until its tokenizer is there.
  template <typename TextCall>
  const ServedModel* AcceptTextCall(const std::string& client, TextCall& in, absl::Status shape);
  void OnTokenize(const std::string& client, TokenizeInput in);
  void OnDetokenize(const std::string& client, DetokenizeInput in);

  // ---- router_batch.cc: the Batch API
  // Authenticated as any request, then run on batch_pool_ through batch_handler_; the
  // completion answers the client.
  void OnBatchCall(const std::string& client, BatchCallInfo in);

  // ---- router_workers.cc: dispatch, workers, failover
  // Places queued requests (in AdmissionController::Next order) while workers take them.
  void TryDispatch();
  void Dispatch(Request& r, WorkerState* w, int64_t cached_prefix_tokens);
  // `r` (seen as `view` by `workers`, its model's) fits no worker now: when it is not a batch
  // job's and needs KV room, preempts the most recently dispatched batch job's request on a
  // worker where `r` could then be placed (its tokens within the capacity that frees). Slots
  // need no preemption here: batch jobs do not hold them against other requests (their
  // workers suspend them). True when one was preempted.
  bool PreemptBatchJobForCapacity(const Request& r, const std::vector<WorkerState*>& workers,
                              const PlacementView& view);
  // When nothing more can be dispatched and the head of the order (not in `unplaced`, nor in
  // `preempted_for`) waits for in-flight budget that batch jobs' generations on its model's
  // workers hold: preempts one of them (the newest that makes room alone, else the newest) and
  // adds the head to `preempted_for`. True when one was preempted.
  bool PreemptBatchJobForBudget(const absl::flat_hash_set<uint64_t>& unplaced,
                                absl::flat_hash_set<uint64_t>* preempted_for);
  // Takes batch job's request `r` off `w` (told to drop it) and back to the front of the batch
  // lane, to resume later from its prompt and the tokens it already produced.
  void PreemptBatchJob(Request& r, WorkerState* w);
  // Takes `r` off its worker's books (its kind's part, and outstanding tokens); false when the
  // worker does not hold it.
  bool DetachFromWorker(Request& r, WorkerState* w);
  void OnWorkerMessage(const std::string& identity, WorkerMessage m);
  void OnRegister(const std::string& identity, const RegisterInfo& info, int64_t now);
  // The request `w` runs under `dispatch_id`; null when cancelled, moved or stale.
  Request* Lookup(const WorkerState* w, uint64_t dispatch_id);
  // A token or an embed answer: to the request's kind.
  void OnRequestEvent(WorkerState* w, WorkerEvent event, int64_t now);
  void OnFailed(WorkerState* w, const RequestFailedInfo& f);
  // Back to the front of the queue to resume elsewhere, or WORKER_LOST past max_migrations.
  void Failover(uint64_t router_id);
  void RemoveWorker(const std::string& identity, const char* why);
  // Every 50 ms: dead workers, stalled workers, then queued requests that can no longer run
  // (too_large) or have had no worker too long (no_workers).
  void CheckWorkers(int64_t now);
  // The progress watchdog (RouterOptions::stall_timeout_ms).
  void NoteProgress(WorkerState* w, int64_t now, bool step);
  // Marks a stalled worker healthy again (placement and the admission budget count it); `why`
  // ends up in the log line.
  void Unstall(WorkerState* w, const char* why);
  void CheckStalls(int64_t now);
  void FailQueuedThatCannotRun();
  // The admission limits from the serving workers: in-flight budget, largest worker, any at all.
  void UpdateCapacity();

  RouterOptions options_;
  Clock* clock_;
  zmq::context_t context_;  // options_.io_threads I/O threads
  std::unique_ptr<ZapHandler> zap_;
  std::unique_ptr<Socket> frontend_;
  std::unique_ptr<Socket> inproc_;  // in-process clients (inproc_endpoint_)
  std::unique_ptr<Socket> backend_;
  RequestLimits inproc_limits_;
  std::string frontend_endpoint_;
  std::string backend_endpoint_;
  std::string curve_public_key_;
  std::string inproc_endpoint_;

  RouterStats stats_;
  ServedModels models_;
  WorkerRegistry registry_;
  PrefixIndex prefix_index_;
  std::unique_ptr<AdmissionController> admission_;
  // Every kind of request, asked in order which one a client message is.
  std::vector<std::unique_ptr<RequestKind>> kinds_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Request>> requests_;  // by router_id
  // (client, request_id) -> router_id, and dispatch_id -> router_id of the current dispatches.
  absl::flat_hash_map<std::pair<std::string, std::string>, uint64_t> by_client_;
  absl::flat_hash_map<uint64_t, uint64_t> by_dispatch_;
  // The requests not admitted yet (waiting for a tokenizer, or tokenizing), by router_id, and
  // those of them that are batch jobs' (bounded by --batch-max-queued instead of
  // --max-queued-requests, so a batch's texts never take the room other requests wait in).
  absl::flat_hash_set<uint64_t> unadmitted_;
  absl::flat_hash_set<uint64_t> unadmitted_batch_jobs_;
  // Tokenize / Detokenize requests on the pool, by (client, request_id).
  absl::flat_hash_set<std::pair<std::string, std::string>> text_calls_;
  struct ParkedTextCall {
    int64_t arrival = 0;
    std::string client;
    std::string request_id;
    std::variant<TokenizeInput, DetokenizeInput> input;
  };
  std::vector<ParkedTextCall> parked_text_calls_;
  int64_t tokenizing_bytes_ = 0;  // the texts on the tokenizer pool (max_tokenizing_bytes)
  BatchCallHandler batch_handler_;
  std::function<void(StatsOut*)> batch_stats_;  // Router::SetBatchStats
  // Batch calls on batch_pool_, by (client, request_id), and the bytes of their uploads.
  absl::flat_hash_set<std::pair<std::string, std::string>> batch_calls_;
  int64_t batch_call_bytes_ = 0;
  std::unique_ptr<ClientBacklog> backlog_;
  std::vector<std::string> too_slow_;  // clients to end in ServeBacklog
  uint64_t next_router_id_ = 1;
  uint64_t next_dispatch_id_ = 1;
  uint64_t placements_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};  // placement's random draws
  bool draining_ = false;
  int64_t drain_deadline_ = 0;
  // The workers' part of a drain: until they confirm, or this deadline passes (0: not started).
  int64_t workers_drain_deadline_ = 0;
  int64_t next_worker_drain_send_ = 0;
  // Last: destroyed first, so no job outlives what its completion would touch. batch_pool_
  // runs the batch calls, one at a time, on a thread of its own.
  std::unique_ptr<TokenizerPool> pool_;
  std::unique_ptr<TokenizerPool> batch_pool_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_ROUTER_IMPL_H_
