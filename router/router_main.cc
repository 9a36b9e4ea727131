// carpool-router: the cluster's front door. Flags only; the work is in router.cc.
//
//   carpool-router [flags]            serve (docs/cluster.md)
//   carpool-router keygen FILE        write a CURVE key pair: FILE (secret) and FILE.pub
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cluster/router_launch.h"
#include "common/flags.h"
#include "router/batch/batch_calls.h"
#include "router/batch/batch_service.h"
#include "router/http_gateway.h"
#include "router/router.h"
#include "router/served_models.h"
#include "router/zap_handler.h"
#include "text/chat_template.h"

namespace {

carpool::router::Router* g_router = nullptr;
std::atomic<int> g_signals{0};

// The first SIGTERM/SIGINT drains (finish what was admitted, then exit 0); a second stops now.
void OnSignal(int) {
  if (g_router == nullptr) return;
  if (g_signals.fetch_add(1, std::memory_order_relaxed) == 0) {
    g_router->Drain();
  } else {
    g_router->Stop();
  }
}

int Keygen(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: carpool-router keygen FILE\n";
    return 2;
  }
  auto pub = carpool::router::WriteCurveKeyPair(argv[2]);
  if (!pub.ok()) {
    std::cerr << "carpool-router: " << pub.status().message() << "\n";
    return 1;
  }
  std::cout << *pub << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "keygen") return Keygen(argc, argv);
  carpool::router::RouterOptions options;
  carpool::router::AdmissionOptions& a = options.admission;
  std::string placement = "least_loaded";
  std::string tenants_file, curve_secret_file, curve_allow_file, admin_key_file;
  carpool::router::HttpGatewayOptions http;
  http.listen.clear();
  std::string chat_template;
  int64_t chat_template_timeout_ms = options.chat_render.limits.max_run_time_us / 1000;
  carpool::router::batch::BatchServiceOptions batch;
  bool help = false;
  carpool::FlagParser flags;
  flags.AddString("frontend", &options.frontend, "client endpoint");
  flags.AddString("backend", &options.backend, "worker endpoint");
  flags.AddInt64("heartbeat-timeout-ms", &options.heartbeat_timeout_ms,
                 "a worker silent this long is dead");
  flags.AddInt("max-queued-requests", &a.max_queued_requests,
               "requests waiting for a worker before queue_full");
  flags.AddInt64("max-queued-tokens", &a.max_queued_tokens,
                 "prompt + max_tokens reserved by queued requests before token_budget; "
                 "0: no limit");
  flags.AddInt64("max-inflight-tokens", &a.max_inflight_tokens,
                 "prompt + max_tokens reserved by dispatched requests; 0: the workers' "
                 "KV capacity");
  flags.AddInt64("interactive-reserve", &a.interactive_reserve_tokens,
                 "in-flight tokens only interactive requests may use");
  flags.AddInt64("priority-aging-ms", &a.priority_aging_ms,
                 "waiting this long raises a queued request one class");
  flags.AddInt64("skip-ahead-ms", &a.skip_ahead_ms,
                 "how long requests that fit may go ahead of a queued one that does not; then "
                 "the budget is held for it");
  flags.AddInt64("no-worker-timeout-ms", &a.no_worker_timeout_ms,
                 "a queued request with no worker able to serve it this long ends UNAVAILABLE "
                 "no_workers; 0: waits without end");
  flags.AddInt64("stall-timeout-ms", &options.stall_timeout_ms,
                 "a worker holding requests with no progress this long (or 20 of its step "
                 "times, if longer) is stalled and its requests move; 0: off");
  flags.AddString("placement", &placement,
                  "round_robin | least_loaded | power_of_two | prefix_affinity");
  flags.AddDouble("affinity-load-weight", &options.affinity_load_weight,
                  "prefix_affinity: load tokens one cached token is worth");
  flags.AddString("tenants", &tenants_file, "API keys and quotas, textproto");
  flags.AddString("admin-key-file", &admin_key_file,
                  "with --tenants: keys (one per line) whose stats see every tenant; a tenant's "
                  "key sees itself only");
  flags.AddBool("drain-workers", &options.drain_workers,
                "on SIGTERM, drain the workers too once in-flight work is done");
  flags.AddInt("tokenizer-threads", &options.tokenizer_threads,
               "threads that tokenize text and build the models' tokenizers, off the event "
               "loop");
  flags.AddInt64("drain-grace-ms", &options.drain_grace_ms,
                 "after SIGTERM, how long admitted requests may take to finish");
  flags.AddString("curve-secret-key-file", &curve_secret_file,
                  "CURVE secret key of the frontend (from `carpool-router keygen`)");
  flags.AddString("curve-allow", &curve_allow_file,
                  "client public keys allowed under CURVE, one per line");
  flags.AddBytes("max-request-bytes", &options.max_request_bytes, "largest client message");
  flags.AddInt("max-migrations", &options.max_migrations,
               "times a request may move after its worker died");
  flags.AddInt("io-threads", &options.io_threads,
               "ZeroMQ I/O threads for the router's sockets (TCP and ZMTP work of its "
               "connections), 1-64");
  flags.AddString("http", &http.listen,
                  "serve the OpenAI-compatible HTTP API on HOST:PORT, port 0 picks one; "
                  "none: off (docs/http.md)");
  flags.AddInt("http-max-connections", &http.server.max_connections,
               "HTTP connections open at once, idle ones included; more get 503");
  flags.AddInt("http-max-concurrent-requests", &http.server.max_concurrent_requests,
               "HTTP requests handled at once (a stream holds one until it ends); more get 503");
  flags.AddBytes("http-max-body-bytes", &http.server.max_body_bytes,
                 "largest HTTP request body; larger get 413");
  flags.AddBytes("http-max-header-bytes", &http.server.max_header_bytes,
                 "largest HTTP request header block; larger get 431");
  flags.AddInt64("http-body-timeout-ms", &http.server.body_timeout_ms,
                 "an HTTP request body must arrive within this of its head, else 408");
  flags.AddInt64("http-write-timeout-ms", &http.server.write_timeout_ms,
                 "an HTTP answer the client does not read within this closes the connection");
  flags.AddInt64("http-idle-timeout-ms", &http.server.idle_timeout_ms,
                 "an HTTP request head must arrive within this (else 408), and a connection "
                 "silent this long is closed");
  flags.AddInt64("http-request-timeout-ms", &http.request_timeout_ms,
                 "longest an HTTP generation may take without deadline_ms");
  flags.AddString("chat-template", &chat_template,
                  "FILE: a Jinja chat template used instead of every model's own; NAME: the "
                  "named template of a model's tokenizer_config.json list; default: each "
                  "model's own (docs/chat_templates.md)");
  flags.AddBytes("chat-template-max-output-bytes", &options.chat_render.limits.max_output_bytes,
                 "largest prompt a chat template render may write; past it the request gets 400");
  flags.AddInt64("chat-template-timeout-ms", &chat_template_timeout_ms,
                 "longest one chat template render may run; past it the request gets 400");
  flags.AddString("state-dir", &batch.state_dir,
                  "where batch jobs, their files and results are kept (SQLite; created on first "
                  "use; docs/batch.md)");
  flags.AddInt("batch-max-in-flight", &a.batch_max_in_flight,
               "batch jobs' requests dispatched to workers at once");
  flags.AddInt("batch-max-queued", &a.batch_max_queued,
               "batch jobs' requests queued in the batch lane at once");
  flags.AddInt64("batch-max-lines", &batch.input.max_lines, "most requests in one batch file");
  flags.AddBytes("batch-max-file-bytes", &batch.input.max_bytes,
                 "largest batch input file; larger uploads get 413");
  flags.AddBool("help", &help, "show this help");
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-router: " << s.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << "usage: carpool-router [flags]\n       carpool-router keygen FILE\n"
              << flags.Help();
    return 0;
  }
  const auto fail = [](const absl::Status& s, int code) {
    std::cerr << "carpool-router: " << s.message() << "\n";
    return code;
  };
  auto chat_options = carpool::text::ChatTemplateOptionsFromFlag(chat_template);
  if (!chat_options.ok()) return fail(chat_options.status(), 2);
  options.chat_template = std::move(*chat_options);
  if (!options.chat_template.override_source.empty()) {
    // A template file carpool cannot run is refused now, naming the construct and its line.
    carpool::router::ChatTemplateLoad t =
        carpool::router::ByteModelsChatTemplate(options.chat_template);
    if (t.chat_template == nullptr) {
      return fail(
          absl::InvalidArgumentError(absl::StrCat(t.status.message(), " (", chat_template, ")")),
          2);
    }
  }
  if (chat_template_timeout_ms < 1 || chat_template_timeout_ms > INT64_MAX / 1000) {
    return fail(absl::InvalidArgumentError("--chat-template-timeout-ms must be >= 1"), 2);
  }
  options.chat_render.limits.max_run_time_us = chat_template_timeout_ms * 1000;
  auto policy = carpool::router::ParsePlacementPolicy(placement);
  if (!policy.ok()) return fail(policy.status(), 2);
  options.placement = *policy;
  if (!tenants_file.empty()) {
    auto tenants = carpool::router::TenantTable::Load(tenants_file);
    if (!tenants.ok()) return fail(tenants.status(), 2);
    options.tenants = std::move(*tenants);
  }
  if (!admin_key_file.empty()) {
    auto keys = carpool::router::LoadKeyFile(admin_key_file);
    if (!keys.ok()) return fail(keys.status(), 2);
    options.admin_api_keys = std::move(*keys);
  }
  if (!curve_secret_file.empty()) {
    auto key = carpool::router::ReadCurveKeyFile(curve_secret_file);
    if (!key.ok()) return fail(key.status(), 2);
    options.curve_secret_key = *key;
    if (curve_allow_file.empty()) {
      return fail(absl::InvalidArgumentError("--curve-secret-key-file needs --curve-allow"), 2);
    }
    auto allowed = carpool::router::ReadCurveAllowList(curve_allow_file);
    if (!allowed.ok()) return fail(allowed.status(), 2);
    options.curve_allowed_client_keys = std::move(*allowed);
  } else if (!curve_allow_file.empty()) {
    return fail(absl::InvalidArgumentError("--curve-allow needs --curve-secret-key-file"), 2);
  }
  // Under mpirun the job's workers learn the backend over MPI (cluster/router_launch.h).
  auto mpi = carpool::cluster::RouterMpiSession::JoinIfLaunched(&argc, &argv, std::getenv);
  if (!mpi.ok()) return fail(mpi.status(), 1);
  if (*mpi != nullptr && !flags.WasSet("backend")) options.backend = (*mpi)->backend();
  // The gateway forwards its requests' prompts and chat messages over inproc: they never reach
  // 4x its body limit, so neither may that path's.
  if (!http.listen.empty()) {
    options.max_inproc_request_bytes =
        std::max(options.max_inproc_request_bytes, 4 * http.server.max_body_bytes);
  }
  // A batch file upload travels whole in one message, over HTTP or the SDK.
  options.max_batch_call_bytes = batch.input.max_bytes + carpool::router::kBatchCallEnvelopeBytes;
  auto router = carpool::router::Router::Create(options);
  if (!router.ok()) return fail(router.status(), 1);
  g_router = router->get();
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (!(*router)->curve_public_key().empty()) {
    std::cerr << "carpool-router: CURVE on; server public key " << (*router)->curve_public_key()
              << ", " << options.curve_allowed_client_keys.size() << " client key(s) allowed\n";
  }
  std::cerr << "carpool-router: placement " << placement << ", "
            << (options.tenants.enabled() ? std::to_string(options.tenants.size()) + " tenant(s)"
                                          : std::string("no tenants"))
            << "\n";
  std::cerr << "carpool-router: chat template: "
            << (!options.chat_template.override_source.empty()
                    ? "the file " + chat_template + " for every model"
                : !options.chat_template.override_name.empty()
                    ? "the one named " + chat_template + " of each model's list"
                    : std::string("each model's own"))
            << "\n";
  std::cerr << "carpool-router: frontend " << (*router)->frontend_endpoint() << ", backend "
            << (*router)->backend_endpoint() << std::endl;
  if (*mpi != nullptr) {
    if (absl::Status p = (*mpi)->Publish((*router)->backend_endpoint()); !p.ok()) return fail(p, 1);
  }
  // Batch jobs: the runner is an in-process client of the router, so it starts after it. An
  // unusable --state-dir stops the start here, naming it. The handler holds the service weakly:
  // it ends with the router's batch thread, never after the router's context.
  batch.router_endpoint = (*router)->inproc_endpoint();
  batch.zmq_context = (*router)->zmq_context();
  batch.tenants = options.tenants;
  batch.max_outstanding = a.batch_max_in_flight + a.batch_max_queued;
  batch.completion_max_tokens = http.completion_max_tokens;
  batch.chat_max_tokens = http.chat_max_tokens;
  auto batch_started = carpool::router::batch::BatchService::Start(batch);
  std::shared_ptr<carpool::router::batch::BatchService> batch_service;
  if (batch_started.ok()) {
    batch_service = std::move(*batch_started);
  } else if (flags.WasSet("state-dir")) {
    return fail(batch_started.status(), 1);
  } else {
    // The default state dir is only a convenience: where it cannot be used (a read-only working
    // directory), the router serves without batch jobs and says why.
    std::cerr << "carpool-router: batch jobs off: " << batch_started.status().message()
              << " (give --state-dir)\n";
  }
  if (batch_service != nullptr) {
    (*router)->SetBatchCalls(
        [weak = std::weak_ptr<carpool::router::batch::BatchService>(batch_service)](
            const std::string& tenant, const carpool::BatchCallInfo& call)
            -> absl::StatusOr<carpool::BatchReplyInfo> {
          std::shared_ptr<carpool::router::batch::BatchService> service = weak.lock();
          if (service == nullptr) return absl::UnavailableError("the router is stopping");
          return carpool::router::batch::HandleBatchCall(*service, tenant, call);
        });
    (*router)->SetBatchStats(
        [weak = std::weak_ptr<carpool::router::batch::BatchService>(batch_service)](
            carpool::StatsOut* stats) {
          std::shared_ptr<carpool::router::batch::BatchService> service = weak.lock();
          if (service == nullptr) return;
          const carpool::router::batch::BatchServiceStats b = service->Stats();
          for (int i = 0; i < static_cast<int>(b.batches_by_status.size()); ++i) {
            if (b.batches_by_status[i] == 0) continue;
            stats->batches_by_status[std::string(carpool::router::batch::BatchStatusName(
                static_cast<carpool::router::batch::BatchStatus>(i)))] = b.batches_by_status[i];
          }
          stats->batch_requests_pending = b.requests_pending + b.requests_running;
        });
    std::cerr << "carpool-router: batch jobs kept in " << batch.state_dir << std::endl;
  }
  std::unique_ptr<carpool::router::HttpGateway> gateway;
  if (!http.listen.empty()) {
    // Every HTTP connection is a descriptor: take the hard limit, and say so when even that is
    // below what --http-max-connections allows.
    rlimit files = {};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
    }
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
        files.rlim_cur < static_cast<rlim_t>(http.server.max_connections) + 256) {
      std::cerr << "carpool-router: the descriptor limit (" << files.rlim_cur
                << ") is below --http-max-connections + 256; connections beyond it wait in "
                   "the kernel's backlog\n";
    }
    http.router_endpoint = (*router)->inproc_endpoint();
    http.zmq_context = (*router)->zmq_context();
    http.metrics = [r = router->get(), service = batch_service.get()] {
      return r->RenderMetrics() +
             (service != nullptr ? carpool::router::batch::BatchMetricsText(service->Stats())
                                 : std::string());
    };
    http.batch = batch_service.get();
    http.max_upload_bytes = batch.input.max_bytes + carpool::router::kBatchCallEnvelopeBytes;
    auto started = carpool::router::HttpGateway::Start(http);
    if (!started.ok()) return fail(started.status(), 1);
    gateway = std::move(*started);
    const std::string host = http.listen.substr(0, http.listen.rfind(':'));
    std::cerr << "carpool-router: http gateway listening on http://" << host << ":"
              << gateway->port() << std::endl;
  }
  absl::Status s = (*router)->Run();
  gateway.reset();  // its client socket lives in the router's context
  batch_service.reset();  // what is in flight runs again after the next start
  g_router = nullptr;
  if (*mpi != nullptr) (*mpi)->Stop();  // the job's workers stop too
  if (!s.ok()) return fail(s, 1);
  std::cerr << "carpool-router: stopped\n";
  return 0;
}
