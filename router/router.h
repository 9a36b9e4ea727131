// carpool-router's core: one event loop over the client-facing frontend socket and the
// worker-facing backend socket. It validates and authenticates requests, admits or refuses them
// at once (router/admission.h), queues them globally, dispatches them late to a worker with
// free capacity chosen by the placement policy (router/placement.h), relays each engine step's
// tokens to the clients, and moves the requests of a dead worker to another one.
//
// Thread-compatible except Stop() and Drain(), which any thread (or a signal handler) may call.
#ifndef CARPOOL_ROUTER_ROUTER_H_
#define CARPOOL_ROUTER_ROUTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/messages.h"
#include "common/tokenizer.h"
#include "router/admission.h"
#include "router/client_backlog.h"
#include "router/placement.h"
#include "router/request_validator.h"
#include "router/tenants.h"
#include "text/chat_template.h"
#include "text/jinja/template.h"

namespace zmq {
class context_t;
}  // namespace zmq

namespace carpool::router {

// What a batch call's frame may hold beyond its file: the envelope and the other fields.
inline constexpr int64_t kBatchCallEnvelopeBytes = 1 << 20;

// Runs one Batch API call (BatchCall, docs/batch.md) for `tenant` (its name; "" on a router
// without tenants): its answer (Router::SetBatchCalls), or the error the client gets, with the
// status's code and message (its reason: the code's name in lower case, "not_found", ...).
using BatchCallHandler = std::function<absl::StatusOr<BatchReplyInfo>(
    const std::string& tenant, const BatchCallInfo& call)>;

struct RouterOptions {
  // Where clients connect. "tcp://127.0.0.1:*" picks a free port. Default: tcp://127.0.0.1:5555.
  std::string frontend = "tcp://127.0.0.1:5555";
  // Where workers connect. Default: tcp://127.0.0.1:5556.
  std::string backend = "tcp://127.0.0.1:5556";
  // A worker silent this long is dead. Default: 1000 ms.
  int64_t heartbeat_timeout_ms = 1000;
  // Client messages larger than this get an INVALID_ARGUMENT error naming their request_id.
  // Default: 1 MiB.
  int64_t max_request_bytes = 1 << 20;
  // The same for messages on the in-process endpoint (inproc_endpoint(): the HTTP gateway, whose
  // rendered prompts may be larger than the body they came in), which also bounds their text
  // prompts (instead of request_limits.max_prompt_bytes, when larger). Set it no smaller than
  // the largest message the in-process client may forward; >= max_request_bytes.
  // Default: 64 MiB.
  int64_t max_inproc_request_bytes = 64 << 20;
  // Frames larger than this drop the connection (ZMQ_MAXMSGSIZE). Default: 64 MiB.
  int64_t max_frame_bytes = 64 << 20;
  // A batch call (BatchCall: an upload of a batch input file) may be this large, on the frontend
  // and in-process; the frontend's ZMQ_MAXMSGSIZE is raised to it. Larger ones get
  // INVALID_ARGUMENT naming the limit. carpool-router sets it to --batch-max-file-bytes +
  // kBatchCallEnvelopeBytes. Default: 200 MB + 1 MiB.
  int64_t max_batch_call_bytes = 200'000'000 + kBatchCallEnvelopeBytes;
  // Answers ZeroMQ queues per client before a send reports the client's pipe full
  // (ZMQ_SNDHWM of the client sockets). Default: 10000.
  int client_send_hwm = 10000;
  // Answers the router keeps per client beyond that, retried as the client reads; past these
  // limits the client is too slow: its requests are cancelled with RESOURCE_EXHAUSTED
  // client_too_slow (router/client_backlog.h). Defaults: 1024 messages, 16 MiB.
  ClientBacklogOptions client_backlog;
  // Queue limits, token budgets, aging, reserve (router/admission.h). admission.clock is
  // replaced by `clock`.
  AdmissionOptions admission;
  // Times a request may move to another worker after its worker died. Default: 3.
  int max_migrations = 3;
  // ZeroMQ I/O threads (the context's ZMQ_IO_THREADS): the sockets' TCP reads and writes and
  // ZMTP framing run on them, one connection on one thread, so with many workers and clients
  // more threads spread that work over cores. Default: 1.
  int io_threads = 1;
  // Progress watchdog: a worker holding dispatched requests that shows no progress (no token,
  // embed answer or change of its KV use) for max(stall_timeout_ms, kStallSteps x its measured
  // step time) is stalled: marked unhealthy, its requests move as for a death. 0: off.
  // Default: 10000.
  int64_t stall_timeout_ms = 10000;
  // Which worker takes a request. Default: least_loaded.
  PlacementPolicy placement = PlacementPolicy::kLeastLoaded;
  // prefix_affinity: tokens of load that one cached prompt token is worth. Default: 1.
  double affinity_load_weight = 1.0;
  // API keys and quotas; empty: no authentication, no quotas. Default: empty.
  TenantTable tenants;
  // With tenants: keys whose stats requests see every tenant (a tenant's key sees itself only;
  // the in-process client needs none). They serve no other request. Default: none.
  std::vector<std::string> admin_api_keys;
  // After Drain(): how long in-flight and queued requests may take to finish before they are
  // ended with UNAVAILABLE / draining and Run returns. Default: 30000.
  int64_t drain_grace_ms = 30000;
  // When a drain ends, tell every worker to drain too (finish, deregister, exit). Off: workers
  // outlive the router and register with the next one. Default: true.
  bool drain_workers = true;
  // CURVE on the frontend: the router's secret key (Z85); empty: plain TCP. With it, only
  // clients whose public key (Z85) is in curve_allowed_client_keys are served. Default: off.
  std::string curve_secret_key;
  std::vector<std::string> curve_allowed_client_keys;
  RequestLimits request_limits;
  // Threads that tokenize (text prompts, Tokenize / Detokenize requests) and build the models'
  // tokenizers, off the event loop (router/tokenizer_pool.h). Default: 2.
  int tokenizer_threads = 2;
  // Text bytes the tokenizer threads may hold at once (requests being tokenized); past it a text
  // request is refused UNAVAILABLE queue_full. Default: 256 MiB.
  int64_t max_tokenizing_bytes = 256 << 20;
  // Builds the tokenizer of a model registered with tokenizer "hf" from the files its worker
  // handed over (tokenizer.json, tokenizer_config.json: "" when none), on the tokenizer
  // threads. Default (empty): text::HfTokenizer::FromJson. Tests inject their own.
  std::function<absl::StatusOr<std::shared_ptr<const Tokenizer>>(
      const std::string& tokenizer_json, const std::string& tokenizer_config_json)>
      load_tokenizer;
  // The chat template override (--chat-template FILE|NAME, text::ChatTemplateOptionsFromFlag):
  // a template's source replaces every model's; a name picks one of a model's named templates
  // (byte-tokenizer models, which have none, keep the built-in one). Default: none (each
  // model's own template).
  text::ChatTemplateOptions chat_template;
  // Bounds of one chat template render: limits.max_output_bytes
  // (--chat-template-max-output-bytes, Default: 8 MiB) and limits.max_run_time_us
  // (--chat-template-timeout-ms, Default: 2 s); past either the request is refused
  // INVALID_ARGUMENT. The renders run on the tokenizer threads.
  text::jinja::RenderOptions chat_render;
  // Not owned; defaults to Clock::Real().
  Clock* clock = nullptr;

  absl::Status Validate() const;
};

class Router {
 public:
  // Binds both sockets (and starts the ZAP handler under CURVE).
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterOptions& options);
  ~Router();

  // The endpoints actually bound (with the chosen ports).
  const std::string& frontend_endpoint() const;
  const std::string& backend_endpoint() const;
  // The frontend's CURVE public key (Z85); empty without CURVE.
  const std::string& curve_public_key() const;
  // The cluster view in the Prometheus text format (router/router_metrics.h). Any thread.
  std::string RenderMetrics() const;
  // In-process clients (the HTTP gateway) connect here, with a socket of zmq_context(): a socket
  // of its own, served like the frontend but with max_inproc_request_bytes, and trusted (no CURVE:
  // it never leaves the process). The context lives as long as the Router; close its sockets
  // before destroying it.
  const std::string& inproc_endpoint() const;
  zmq::context_t* zmq_context();

  // Serves until Stop(), or after Drain() until nothing is left (or the grace period ends).
  // Returns OK then; an error if a socket fails.
  absl::Status Run();
  // Serves BatchCall messages with `handler`, called on a thread of its own, one call at a time
  // (a store's fsyncs or a 200 MB upload never hold up the event loop). Without one, batch calls
  // get FAILED_PRECONDITION. REQUIRES: before Run(). (A setter, not an option: the batch service
  // talks to the router through inproc_endpoint(), so it starts after the router.)
  void SetBatchCalls(BatchCallHandler handler);
  // Fills the batch jobs' part of the router's stats (batches_by_status, batch_requests_pending)
  // each time a client asks for them; called on the event loop, so it must not wait on a lock
  // held for long. REQUIRES: before Run().
  void SetBatchStats(std::function<void(StatsOut*)> source);

  // Makes Run() return within one poll interval. Async-signal-safe.
  void Stop() { stop_.store(true, std::memory_order_relaxed); }
  // Stops admitting (new requests get UNAVAILABLE / draining), finishes what was admitted within
  // drain_grace_ms, then (with options.drain_workers) drains the workers, and Run() returns.
  // Async-signal-safe.
  void Drain() { drain_.store(true, std::memory_order_relaxed); }

 private:
  class Impl;
  explicit Router(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> drain_{false};
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_ROUTER_H_
