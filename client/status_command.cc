#include "client/status_command.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <iostream>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/carpool_client.h"
#include "client/generate_command.h"
#include "common/flags.h"

namespace carpool::client {

nlohmann::json StatsToJson(const StatsOut& s) {
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerStatsOut& w : s.workers) {
    workers.push_back({{"worker_id", w.worker_id},
                       {"healthy", w.healthy},
                       {"epoch", w.epoch},
                       {"model", w.model},
                       {"running", w.running},
                       {"max_num_seqs", w.max_num_seqs},
                       {"kv_used_blocks", w.kv_used_blocks},
                       {"num_kv_blocks", w.num_kv_blocks},
                       {"outstanding_tokens", w.outstanding_tokens},
                       {"requests_served", w.requests_served},
                       {"waiting", w.waiting},
                       {"draining", w.draining},
                       {"heartbeat_age_ms", w.heartbeat_age_ms},
                       {"cached_prefix_blocks", w.cached_prefix_blocks},
                       {"migrations_in", w.migrations_in},
                       {"tokens_generated", w.tokens_generated},
                       {"preemptions", w.preemptions},
                       {"suspensions", w.suspensions},
                       {"weight_dtype", w.weight_dtype},
                       {"kv_cache_dtype", w.kv_cache_dtype}});
  }
  nlohmann::json tenants = nlohmann::json::array();
  for (const TenantStatsOut& t : s.tenants) {
    tenants.push_back({{"name", t.name}, {"active", t.active}, {"rejected", t.rejected}});
  }
  nlohmann::json rejections = nlohmann::json::object();
  for (const auto& [reason, n] : s.rejections_by_reason) rejections[reason] = n;
  return {{"workers", std::move(workers)},
          {"queued", s.queued},
          {"inflight", s.inflight},
          {"requests_total", s.requests_total},
          {"requests_rejected", s.requests_rejected},
          {"rejections_by_reason", std::move(rejections)},
          {"queued_by_priority",
           {{"interactive", s.queued_interactive},
            {"default", s.queued_default},
            {"batch", s.queued_batch}}},
          {"queued_tokens", s.queued_tokens},
          {"inflight_tokens", s.inflight_tokens},
          {"max_queued_tokens", s.max_queued_tokens},
          {"max_inflight_tokens", s.max_inflight_tokens},
          {"migrations", s.migrations},
          {"draining", s.draining},
          {"placement", s.placement},
          {"service_tokens_per_s", s.service_tokens_per_s},
          {"batch_lane",
           {{"queued", s.batch_lane_queued},
            {"running", s.batch_lane_inflight},
            {"max_queued", s.batch_max_queued},
            {"max_in_flight", s.batch_max_inflight}}},
          {"batch_jobs",
           {{"by_status", s.batches_by_status},
            {"requests_not_answered", s.batch_requests_pending}}},
          {"tenants", std::move(tenants)}};
}

namespace {

// Per-second rates between two snapshots, by worker id; empty without a previous one.
struct Rates {
  bool known = false;
  std::map<std::string, double> tokens_per_s;
  double cluster_tokens_per_s = 0;
  double refusals_per_s = 0;
};

Rates RatesBetween(const StatsOut* before, const StatsOut& now, double seconds) {
  Rates r;
  if (before == nullptr || seconds <= 0) return r;
  r.known = true;
  std::map<std::string, int64_t> old;
  for (const WorkerStatsOut& w : before->workers) old[w.worker_id] = w.tokens_generated;
  for (const WorkerStatsOut& w : now.workers) {
    auto it = old.find(w.worker_id);
    // A worker new since the last refresh (or restarted) counts from zero.
    const int64_t base = it == old.end() || it->second > w.tokens_generated ? 0 : it->second;
    const double rate = static_cast<double>(w.tokens_generated - base) / seconds;
    r.tokens_per_s[w.worker_id] = rate;
    r.cluster_tokens_per_s += rate;
  }
  r.refusals_per_s =
      static_cast<double>(std::max<int64_t>(0, now.requests_rejected - before->requests_rejected)) /
      seconds;
  return r;
}

std::string Table(const StatsOut& s, const Rates& rates) {
  size_t id_width = 6;
  for (const WorkerStatsOut& w : s.workers) id_width = std::max(id_width, w.worker_id.size());
  const int width = static_cast<int>(id_width);
  std::string out = absl::StrFormat(
      "%-*s  %-8s  %5s  %11s  %7s  %6s  %13s  %9s  %11s  %8s  %8s  %8s  %6s  %s\n", width,
      "worker", "health", "epoch", "running/max", "waiting", "kv %", "kv used/total", "tokens/s",
      "outstanding", "served", "migrated", "prefixes", "beat", "weights/kv");
  for (const WorkerStatsOut& w : s.workers) {
    const char* health = w.draining ? "draining" : (w.healthy ? "yes" : "NO");
    const double kv_pct =
        w.num_kv_blocks > 0 ? 100.0 * w.kv_used_blocks / w.num_kv_blocks : 0.0;
    auto rate = rates.tokens_per_s.find(w.worker_id);
    const std::string tokens_per_s =
        rate == rates.tokens_per_s.end() ? "-" : absl::StrFormat("%.1f", rate->second);
    absl::StrAppendFormat(
        &out, "%-*s  %-8s  %5d  %11s  %7d  %5.1f%%  %13s  %9s  %11d  %8d  %8d  %8d  %4dms  %s\n",
        width, w.worker_id, health, w.epoch, absl::StrCat(w.running, "/", w.max_num_seqs),
        w.waiting, kv_pct, absl::StrCat(w.kv_used_blocks, "/", w.num_kv_blocks), tokens_per_s,
        w.outstanding_tokens, w.requests_served, w.migrations_in, w.cached_prefix_blocks,
        w.heartbeat_age_ms,
        w.weight_dtype.empty() ? "-" : absl::StrCat(w.weight_dtype, "/", w.kv_cache_dtype));
  }
  if (s.workers.empty()) out += "(no workers registered)\n";
  // A router that reports the batch lane's limits has one (older ones report 0).
  const bool batch_lane = s.batch_max_queued > 0;
  absl::StrAppend(&out, "queue: ", s.queued, " waiting (interactive ", s.queued_interactive,
                  ", default ", s.queued_default, ", batch ", s.queued_batch,
                  batch_lane ? absl::StrCat(", batch lane ", s.batch_lane_queued) : "", "), ",
                  s.inflight, " in flight", s.draining ? "; DRAINING" : "", "\n");
  if (batch_lane) {
    absl::StrAppend(&out, "batch lane: ", s.batch_lane_queued, " queued of ", s.batch_max_queued,
                    ", ", s.batch_lane_inflight, " running of ", s.batch_max_inflight, "\n");
  }
  if (!s.batches_by_status.empty()) {
    std::vector<std::string> counts;
    for (const auto& [status, n] : s.batches_by_status) {
      counts.push_back(absl::StrCat(n, " ", status));
    }
    absl::StrAppend(&out, "batch jobs: ", absl::StrJoin(counts, ", "), "; ",
                    s.batch_requests_pending, " requests not answered yet\n");
  }
  absl::StrAppend(&out, "reserved tokens: ", s.queued_tokens, " queued",
                  s.max_queued_tokens > 0 ? absl::StrCat(" of ", s.max_queued_tokens) : "",
                  ", ", s.inflight_tokens, " in flight of ", s.max_inflight_tokens,
                  "; service rate ", static_cast<int64_t>(s.service_tokens_per_s),
                  " tokens/s; placement ", s.placement.empty() ? "?" : s.placement,
                  "; migrations ", s.migrations, "\n");
  if (rates.known) {
    absl::StrAppendFormat(&out, "now: %.1f tokens/s generated, %.1f refusals/s\n",
                          rates.cluster_tokens_per_s, rates.refusals_per_s);
  }
  for (const TenantStatsOut& t : s.tenants) {
    absl::StrAppend(&out, "tenant ", t.name, ": ", t.active, " active, ", t.rejected,
                    " rejected\n");
  }
  absl::StrAppend(&out, "requests: ", s.requests_total, " total, ", s.requests_rejected,
                  " rejected");
  if (!s.rejections_by_reason.empty()) {
    std::string by_reason;
    for (const auto& [reason, n] : s.rejections_by_reason) {
      absl::StrAppend(&by_reason, by_reason.empty() ? "" : ", ", reason, " ", n);
    }
    absl::StrAppend(&out, " (", by_reason, ")");
  }
  out += "\n";
  return out;
}

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

}  // namespace

std::string StatsToTable(const StatsOut& s) { return Table(s, Rates()); }

int RunStatus(int argc, char** argv, int first) {
  ClientOptions options;
  int64_t timeout_ms = 5000;
  bool json = false;
  bool once = false;
  bool watch = false;
  int64_t interval_ms = 1000;
  int64_t count = 0;
  bool help = false;
  FlagParser parser;
  parser.AddString("router", &options.router_endpoint, "the router's client endpoint");
  parser.AddInt64("timeout-ms", &timeout_ms, "how long to wait for the answer");
  parser.AddString("api-key", &options.api_key,
                   "key for a router with --tenants: a tenant's key shows that tenant, an admin "
                   "key every tenant");
  parser.AddBool("json", &json, "print the stats as one JSON object (implies --once)");
  parser.AddBool("once", &once,
                 "print one table and exit (what runs without --once or --watch when stdout is "
                 "not a terminal)");
  parser.AddBool("watch", &watch,
                 "refresh the table every --interval-ms until Ctrl-C (what runs without --once or "
                 "--watch on a terminal)");
  parser.AddInt64("interval-ms", &interval_ms, "refresh interval of the live table");
  parser.AddInt64("count", &count, "live table: stop after this many refreshes; 0: never");
  parser.AddBool("help", &help, "show this help");
  const auto fail = [](const absl::Status& s, int code) {
    std::cerr << "carpool status: " << s.message() << "\n";
    return code;
  };
  if (absl::Status s = parser.Parse(argc, argv, first); !s.ok()) return fail(s, 2);
  if (help) {
    std::cout << "usage: carpool status [--router ENDPOINT] [--once | --watch] [--json]\n"
              << parser.Help();
    return 0;
  }
  if (!parser.positionals().empty()) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("unexpected argument '", parser.positionals()[0], "'")),
                2);
  }
  if (timeout_ms <= 0) return fail(absl::InvalidArgumentError("--timeout-ms must be > 0"), 2);
  if (interval_ms <= 0) return fail(absl::InvalidArgumentError("--interval-ms must be > 0"), 2);
  if (count < 0) return fail(absl::InvalidArgumentError("--count must be >= 0"), 2);
  if (once && watch) {
    return fail(absl::InvalidArgumentError("--once and --watch exclude each other"), 2);
  }
  if (json && watch) return fail(absl::InvalidArgumentError("--json prints once; drop --watch"), 2);
  const bool live = watch || (!once && !json && isatty(STDOUT_FILENO));
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return fail(client.status(), 2);
  const auto unreachable = [&](const absl::Status& st) {
    return fail(absl::Status(st.code(), absl::StrCat(st.message(), " (is a router listening on ",
                                                     options.router_endpoint, "?)")),
                1);
  };
  if (!live) {
    absl::StatusOr<StatsOut> stats = (*client)->Stats(timeout_ms);
    if (!stats.ok()) return unreachable(stats.status());
    if (json) {
      std::cout << DumpJson(StatsToJson(*stats)) << "\n";
    } else {
      std::cout << StatsToTable(*stats);
    }
    return 0;
  }
  // Live: clear the screen and redraw every interval, with rates from the last two snapshots.
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::optional<StatsOut> previous;
  absl::Time previous_at;
  for (int64_t n = 0; !g_stop.load() && (count == 0 || n < count); ++n) {
    if (n > 0) {
      const absl::Time until = absl::Now() + absl::Milliseconds(interval_ms);
      while (!g_stop.load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
      if (g_stop.load()) break;
    }
    absl::StatusOr<StatsOut> stats = (*client)->Stats(timeout_ms);
    const absl::Time at = absl::Now();
    if (!stats.ok()) return unreachable(stats.status());
    const Rates rates = RatesBetween(previous.has_value() ? &*previous : nullptr, *stats,
                                     absl::ToDoubleSeconds(at - previous_at));
    std::cout << "\x1b[H\x1b[2J" << "carpool status  " << options.router_endpoint << "  "
              << absl::FormatTime("%H:%M:%S", at, absl::LocalTimeZone()) << "  (every "
              << interval_ms << " ms; Ctrl-C quits)\n\n"
              << Table(*stats, rates) << std::flush;
    previous = *std::move(stats);
    previous_at = at;
  }
  return 0;
}

}  // namespace carpool::client
