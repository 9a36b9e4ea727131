#include "router/router_stats.h"

#include <utility>

namespace carpool::router {

RouterStats::RouterStats(const RouterOptions& options)
    : heartbeat_timeout_ms_(options.heartbeat_timeout_ms),
      max_queued_tokens_(options.admission.max_queued_tokens),
      batch_max_queued_(options.admission.batch_max_queued),
      batch_max_in_flight_(options.admission.batch_max_in_flight),
      placement_(options.placement),
      tenant_rejections_(options.tenants.size(), 0) {
  for (int t = 0; t < options.tenants.size(); ++t) {
    tenant_names_.push_back(options.tenants.at(t).name);
  }
}

void RouterStats::OnReceived(const char* kind) {
  ++requests_total_;
  metrics_.OnReceived(kind);
}

void RouterStats::OnError(std::string_view why) {
  if (why == reason::kCancelled) return;
  auto it = rejections_.find(why);
  if (it == rejections_.end()) it = rejections_.emplace(std::string(why), 0).first;
  ++it->second;
  metrics_.OnError(it->first);
}

void RouterStats::OnTenantRefused(int tenant) {
  if (tenant >= 0) ++tenant_rejections_[tenant];
}

void RouterStats::OnMigration() {
  ++migrations_total_;
  metrics_.OnMigration();
}

bool RouterStats::Healthy(const WorkerState& w, int64_t now_micros) const {
  const int64_t age_ms = (now_micros - w.last_seen_micros) / 1000;
  return w.serving() && age_ms * 2 <= heartbeat_timeout_ms_;
}

void RouterStats::UpdateGauges(const StatsSources& s) {
  std::vector<WorkerMetricsSnapshot> workers;
  // Gauges do not depend on the workers' order: no sort.
  s.workers.ForEach([&](const WorkerState& w) {
    workers.push_back({w.info.worker_id, Healthy(w, s.now_micros),
                       static_cast<int>(w.requests.size()), w.load.waiting, w.load.kv_used_blocks,
                       w.info.num_kv_blocks, w.load.preemptions, w.load.suspensions,
                       w.info.weight_dtype, w.info.kv_cache_dtype});
  });
  const AdmissionCounters& c = s.admission.counters();
  int queued = c.batch_queued;
  for (int q : c.queued) queued += q;
  metrics_.UpdateCluster(queued, c.inflight, workers);
  metrics_.UpdateBatchLane(c.batch_queued, c.batch_inflight);
}

StatsOut RouterStats::Build(const StatsSources& s) const {
  StatsOut out;
  for (const WorkerState* w : s.workers.All()) {
    WorkerStatsOut o;
    o.worker_id = w->info.worker_id;
    o.heartbeat_age_ms = (s.now_micros - w->last_seen_micros) / 1000;
    o.healthy = Healthy(*w, s.now_micros);
    o.epoch = w->epoch;
    o.running = static_cast<int>(w->requests.size());
    o.num_kv_blocks = w->info.num_kv_blocks;
    o.kv_used_blocks = w->load.kv_used_blocks;
    o.outstanding_tokens = w->outstanding_tokens;
    o.max_num_seqs = w->info.max_num_seqs;
    o.model = w->info.model;
    o.requests_served = w->requests_served;
    o.waiting = w->load.waiting;
    o.draining = w->draining;
    o.cached_prefix_blocks = s.prefixes.Size(w->identity);
    o.migrations_in = w->migrations_in;
    o.tokens_generated = w->tokens_generated;
    o.preemptions = w->load.preemptions;
    o.suspensions = w->load.suspensions;
    o.weight_dtype = w->info.weight_dtype;
    o.kv_cache_dtype = w->info.kv_cache_dtype;
    out.workers.push_back(std::move(o));
  }
  const AdmissionCounters& c = s.admission.counters();
  out.queued_interactive = c.queued[static_cast<int>(Priority::kInteractive)];
  out.queued_default = c.queued[static_cast<int>(Priority::kDefault)];
  out.queued_batch = c.queued[static_cast<int>(Priority::kBatch)];
  // Everything waiting, the batch lane too; in flight: every dispatched request.
  out.queued = out.queued_interactive + out.queued_default + out.queued_batch + c.batch_queued;
  out.inflight = c.inflight;
  out.batch_lane_queued = c.batch_queued;
  out.batch_lane_inflight = c.batch_inflight;
  out.batch_max_queued = batch_max_queued_;
  out.batch_max_inflight = batch_max_in_flight_;
  out.queued_tokens = c.queued_tokens;
  out.inflight_tokens = c.inflight_tokens;
  out.max_queued_tokens = max_queued_tokens_;
  out.max_inflight_tokens = s.admission.max_inflight_tokens();
  out.requests_total = requests_total_;
  for (const auto& [why, n] : rejections_) {
    out.rejections_by_reason[why] = n;
    out.requests_rejected += n;
  }
  out.migrations = migrations_total_;
  out.draining = s.draining;
  out.placement = PlacementPolicyName(placement_);
  for (int t = 0; t < static_cast<int>(tenant_names_.size()); ++t) {
    out.tenants.push_back({tenant_names_[t], s.admission.TenantActive(t), tenant_rejections_[t]});
  }
  out.service_tokens_per_s = s.admission.ServiceRate();
  return out;
}

}  // namespace carpool::router
