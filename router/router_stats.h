// The router's counts and what it reports of them: the answer to a `stats` request (StatsOut,
// docs/protocol.md) and its Prometheus metrics (RouterMetrics, docs/http.md), whose gauges it
// sets from the registry and the admission controller.
//
// Thread-compatible: fed and read by the router's event loop. metrics() may be rendered from
// any thread (RouterMetrics is thread-safe).
#ifndef CARPOOL_ROUTER_ROUTER_STATS_H_
#define CARPOOL_ROUTER_ROUTER_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/messages.h"
#include "router/admission.h"
#include "router/prefix_index.h"
#include "router/router.h"
#include "router/router_metrics.h"
#include "router/worker_registry.h"

namespace carpool::router {

// What the reports are read from, at `now_micros`.
struct StatsSources {
  const WorkerRegistry& workers;
  const AdmissionController& admission;
  const PrefixIndex& prefixes;
  bool draining = false;
  int64_t now_micros = 0;
};

class RouterStats {
 public:
  explicit RouterStats(const RouterOptions& options);

  RouterMetrics& metrics() { return metrics_; }
  const RouterMetrics& metrics() const { return metrics_; }

  // A request of `kind` ("generate", "embed") arrived.
  void OnReceived(const char* kind);
  // A request was refused or ended with an error, by reason. A cancellation is neither and is
  // not counted.
  void OnError(std::string_view why);
  // Admission refused a request of tenant `tenant` (-1: anonymous, not counted by tenant).
  void OnTenantRefused(int tenant);
  // A request moved to another worker.
  void OnMigration();

  // The gauges of metrics(): the queue, the running requests, each worker's load.
  void UpdateGauges(const StatsSources& s);
  // The cluster, every worker and every tenant (a caller shows a tenant only its own line).
  StatsOut Build(const StatsSources& s) const;

 private:
  // Serving and heard from within half the heartbeat timeout.
  bool Healthy(const WorkerState& w, int64_t now_micros) const;

  int64_t heartbeat_timeout_ms_;
  int64_t max_queued_tokens_;
  int batch_max_queued_;
  int batch_max_in_flight_;
  PlacementPolicy placement_;
  std::vector<std::string> tenant_names_;
  RouterMetrics metrics_;
  int64_t requests_total_ = 0;
  int64_t migrations_total_ = 0;
  std::map<std::string, int64_t, std::less<>> rejections_;  // by reason
  std::vector<int64_t> tenant_rejections_;                  // by tenant
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_ROUTER_STATS_H_
