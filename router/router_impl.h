// Router::Impl, the event loop's state. Internal to carpool_router: router.cc holds the loop,
// the sockets and the client side; router_workers.cc the worker side (registry, dispatch,
// token relay, failover) and the stats.
#ifndef CARPOOL_ROUTER_ROUTER_IMPL_H_
#define CARPOOL_ROUTER_ROUTER_IMPL_H_

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/messages.h"
#include "common/transport.h"
#include "router/admission.h"
#include "router/prefix_index.h"
#include "router/router.h"
#include "router/router_metrics.h"
#include "router/worker_registry.h"
#include "router/zap_handler.h"

namespace carpool::router {

// The reason of FAILED_PRECONDITION for an embed request no worker of the cluster can serve.
inline constexpr char kReasonUnsupported[] = "unsupported";
// A stalled worker's watchdog threshold is at least this many of its measured step times.
inline constexpr int kStallSteps = 20;
// retry_after_ms of a no_workers error.
inline constexpr int64_t kNoWorkersRetryMs = 5000;

// A request the router has admitted and not yet ended.
struct Request {
  uint64_t id = 0;
  std::string client;                 // frontend routing id
  std::string client_request_id;
  bool stream = false;
  bool validated = false;
  GenerateInput input;                // kept until validated
  std::vector<int32_t> prompt;
  SamplingParams sampling;            // seed resolved
  Priority priority = Priority::kDefault;
  int tenant = -1;
  uint64_t cache_salt = 0;
  int64_t arrival = 0;
  int64_t dispatched = 0;
  int64_t first_token = 0;
  std::vector<SampleResult> output;   // every token so far
  int cached_prompt_tokens = 0;
  std::string worker;                 // set while a worker runs it
  uint64_t dispatch_id = 0;           // the current dispatch; events of older ones are stale
  int64_t outstanding = 0;            // what it adds to its worker's outstanding_tokens
  int migrations = 0;
  // An embed request (OnEmbed): its input until validated, then each input's tokens.
  bool embed = false;
  EmbedInput embed_input;             // inputs cleared once validated
  std::vector<std::vector<int32_t>> embed_tokens;
  int64_t embed_total_tokens = 0;
};

class Router::Impl {
 public:
  explicit Impl(const RouterOptions& options);
  ~Impl();

  absl::Status Init();
  absl::Status Run(const std::atomic<bool>& stop, const std::atomic<bool>& drain);

  const std::string& frontend_endpoint() const { return frontend_endpoint_; }
  const std::string& backend_endpoint() const { return backend_endpoint_; }
  const std::string& curve_public_key() const { return curve_public_key_; }
  const RouterMetrics& metrics() const { return metrics_; }
  const std::string& inproc_endpoint() const { return inproc_endpoint_; }
  zmq::context_t* zmq_context() { return &context_; }

 private:
  // ---- router.cc: sockets, clients, admission, draining
  // Clients are named by the socket they came on and their routing id there (ClientKey in
  // router.cc): Request::client and by_client_ hold that name.
  absl::Status DrainFrontend(Socket* socket, char kind);
  absl::Status DrainBackend();
  void SendToClient(const std::string& client, const ServerMessage& message);
  void SendToWorker(const std::string& identity, const RouterMessage& message);
  // Counts a refusal by reason (not cancellations) and sends it.
  void SendError(const std::string& client, const std::string& request_id, absl::StatusCode code,
                 const char* why, std::string message, int64_t retry_after_ms = 0);
  void OnClientFrame(const std::string& client, const std::string& payload);
  // Refuses a client frame that does not decode, naming the request_id found in it (if any).
  void RefuseFrame(const std::string& client, std::string_view frame, std::string message);
  // The shape limits for `client`'s requests (the in-process client's allow larger prompts).
  const RequestLimits& LimitsFor(const std::string& client) const;
  void OnGenerate(const std::string& client, GenerateInput input);
  void OnEmbed(const std::string& client, EmbedInput input);
  // Checks arrival conditions shared by generate and embed (draining, shape, API key, duplicate
  // id); on failure answers the client and returns false. `tenant` is set on success.
  bool Accept(const std::string& client, const std::string& request_id,
              const absl::Status& shape, const std::string& api_key, int* tenant);
  // Queues an accepted request under `a` (its id, tenant and tokens set); false if refused.
  bool Enqueue(Request r, AdmissionRequest a);
  void Refuse(const std::string& client, const std::string& request_id, int tenant,
              const Refusal& refusal);
  // Tokenizes and checks `r` (generate or embed) against the model; on failure answers the
  // client, returns false.
  bool Validate(Request* r);
  bool ValidateEmbedRequest(Request* r);
  void OnCancel(const std::string& client, const std::string& request_id);
  // Stats for `client`: everything in-process; with tenants, over the network, the key's view.
  void OnStats(const std::string& client, const StatsQuery& query);
  void DropClient(const std::string& client);
  // Cancels the requests of the clients the backlog found too slow, one client_too_slow error
  // each; then retries every backlog. From the loop only (it ends requests).
  void ServeBacklog();
  // Ends a request everywhere (admission, worker, tables); tells its worker to stop it.
  // `completed`: it finished normally (feeds the service rate).
  void End(uint64_t id, bool completed = false);
  // Sends `code`/`why` to the request's client and ends it.
  void Fail(uint64_t id, absl::StatusCode code, const char* why, std::string message);
  void ExpireDeadlines();
  void StartDraining(int64_t now);
  // True when Run should return: drained, or the grace period is over (the rest failed).
  bool DrainDone(int64_t now);
  // After the requests: asks the workers to drain and waits (bounded) until they deregister.
  bool WorkersDrained(int64_t now);

  // ---- router_workers.cc: dispatch, workers, failover, stats
  void TryDispatch();
  void Dispatch(Request* r, WorkerState* w, int64_t cached_tokens);
  // Places and sends the queued embed request `r`: true when it left the queue (dispatched, or
  // failed because no worker can embed), false when it must wait for embed credit.
  bool TryDispatchEmbed(Request* r);
  void DispatchEmbed(Request* r, WorkerState* w);
  void OnEmbedDone(WorkerState* w, EmbedDoneInfo done, int64_t now);
  // Takes `r` off its worker's books (sequence or embed slots, outstanding tokens).
  void DetachFromWorker(Request* r, WorkerState* w);
  bool AnyWorkerCanEmbed() const;
  void OnWorkerMessage(const std::string& identity, WorkerMessage m);
  void OnRegister(const std::string& identity, const RegisterInfo& info, int64_t now);
  Request* Lookup(const WorkerState* w, uint64_t dispatch_id);
  void OnTokenEvent(WorkerState* w, TokenEvent e, int64_t now);
  void OnFailed(WorkerState* w, const RequestFailedInfo& f);
  // Back to the front of the queue to resume elsewhere, or WORKER_LOST past max_migrations.
  void Failover(uint64_t id);
  void RemoveWorker(const std::string& identity, const char* why);
  // Every 50 ms: dead workers, stalled workers, then queued requests that can no longer run
  // (too_large) or have had no worker too long (no_workers).
  void CheckWorkers(int64_t now);
  // The progress watchdog (RouterOptions::stall_timeout_ms).
  void NoteProgress(WorkerState* w, int64_t now, bool step);
  void CheckStalls(int64_t now);
  void FailQueuedThatCannotRun();
  // The admission limits from the serving workers: in-flight budget, largest worker, any at all.
  void UpdateCapacity();
  // The gauges of metrics_: queue, running, each worker's load.
  void UpdateMetrics();
  std::string DecodeText(const std::vector<int32_t>& ids) const;
  StatsOut BuildStats() const;

  RouterOptions options_;
  Clock* clock_;
  zmq::context_t context_{1};
  std::unique_ptr<ZapHandler> zap_;
  std::unique_ptr<Socket> frontend_;
  std::unique_ptr<Socket> inproc_;  // in-process clients (inproc_endpoint_)
  std::unique_ptr<Socket> backend_;
  RequestLimits inproc_limits_;
  std::string frontend_endpoint_;
  std::string backend_endpoint_;
  std::string curve_public_key_;
  std::string inproc_endpoint_;

  RouterMetrics metrics_;
  ModelLimits limits_;
  WorkerRegistry registry_;
  PrefixIndex prefix_index_;
  std::unique_ptr<AdmissionController> admission_;
  absl::flat_hash_map<uint64_t, Request> requests_;
  absl::flat_hash_map<std::pair<std::string, std::string>, uint64_t> by_client_;
  absl::flat_hash_map<uint64_t, uint64_t> dispatch_to_request_;
  std::unique_ptr<ClientBacklog> backlog_;
  std::vector<std::string> too_slow_;  // clients to end in ServeBacklog
  uint64_t next_request_id_ = 1;
  uint64_t next_dispatch_id_ = 1;
  uint64_t placements_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};
  int64_t requests_total_ = 0;
  int64_t migrations_total_ = 0;
  std::map<std::string, int64_t> rejections_;
  std::vector<int64_t> tenant_rejections_;
  bool draining_ = false;
  int64_t drain_deadline_ = 0;
  // The workers' part of a drain: until they confirm, or this deadline passes (0: not started).
  int64_t workers_drain_deadline_ = 0;
  int64_t next_worker_drain_send_ = 0;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_ROUTER_IMPL_H_
