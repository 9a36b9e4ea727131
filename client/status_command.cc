#include "client/status_command.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
                       {"migrations_in", w.migrations_in}});
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
          {"tenants", std::move(tenants)}};
}

std::string StatsToTable(const StatsOut& s) {
  size_t id_width = 6;
  for (const WorkerStatsOut& w : s.workers) id_width = std::max(id_width, w.worker_id.size());
  const int width = static_cast<int>(id_width);
  std::string out = absl::StrFormat(
      "%-*s  %-8s  %5s  %11s  %7s  %13s  %11s  %8s  %8s  %8s  %6s\n", width, "worker", "health",
      "epoch", "running/max", "waiting", "kv used/total", "outstanding", "served", "migrated",
      "prefixes", "beat");
  for (const WorkerStatsOut& w : s.workers) {
    const char* health = w.draining ? "draining" : (w.healthy ? "yes" : "NO");
    absl::StrAppendFormat(
        &out, "%-*s  %-8s  %5d  %11s  %7d  %13s  %11d  %8d  %8d  %8d  %4dms\n", width,
        w.worker_id, health, w.epoch, absl::StrCat(w.running, "/", w.max_num_seqs), w.waiting,
        absl::StrCat(w.kv_used_blocks, "/", w.num_kv_blocks), w.outstanding_tokens,
        w.requests_served, w.migrations_in, w.cached_prefix_blocks, w.heartbeat_age_ms);
  }
  if (s.workers.empty()) out += "(no workers registered)\n";
  absl::StrAppend(&out, "queue: ", s.queued, " waiting (interactive ", s.queued_interactive,
                  ", default ", s.queued_default, ", batch ", s.queued_batch, "), ", s.inflight,
                  " in flight", s.draining ? "; DRAINING" : "", "\n");
  absl::StrAppend(&out, "reserved tokens: ", s.queued_tokens, " queued",
                  s.max_queued_tokens > 0 ? absl::StrCat(" of ", s.max_queued_tokens) : "",
                  ", ", s.inflight_tokens, " in flight of ", s.max_inflight_tokens,
                  "; service rate ", static_cast<int64_t>(s.service_tokens_per_s),
                  " tokens/s; placement ", s.placement.empty() ? "?" : s.placement,
                  "; migrations ", s.migrations, "\n");
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

int RunStatus(int argc, char** argv, int first) {
  ClientOptions options;
  int64_t timeout_ms = 5000;
  bool json = false;
  bool help = false;
  FlagParser parser;
  parser.AddString("router", &options.router_endpoint,
                   "the router's client endpoint (default tcp://127.0.0.1:5555)");
  parser.AddInt64("timeout-ms", &timeout_ms, "how long to wait for the answer (default 5000)");
  parser.AddBool("json", &json, "print the stats as one JSON object");
  parser.AddBool("help", &help, "show this help");
  const auto fail = [](const absl::Status& s, int code) {
    std::cerr << "carpool status: " << s.message() << "\n";
    return code;
  };
  if (absl::Status s = parser.Parse(argc, argv, first); !s.ok()) return fail(s, 2);
  if (help) {
    std::cout << "usage: carpool status [--router ENDPOINT] [--json]\n" << parser.Help();
    return 0;
  }
  if (!parser.positionals().empty()) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("unexpected argument '", parser.positionals()[0], "'")),
                2);
  }
  if (timeout_ms <= 0) return fail(absl::InvalidArgumentError("--timeout-ms must be > 0"), 2);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return fail(client.status(), 2);
  absl::StatusOr<StatsOut> stats = (*client)->Stats(timeout_ms);
  if (!stats.ok()) {
    return fail(absl::Status(stats.status().code(),
                             absl::StrCat(stats.status().message(), " (is a router listening on ",
                                          options.router_endpoint, "?)")),
                1);
  }
  if (json) {
    std::cout << DumpJson(StatsToJson(*stats)) << "\n";
  } else {
    std::cout << StatsToTable(*stats);
  }
  return 0;
}

}  // namespace carpool::client
