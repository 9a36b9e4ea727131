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
                       {"requests_served", w.requests_served}});
  }
  nlohmann::json rejections = nlohmann::json::object();
  for (const auto& [reason, n] : s.rejections_by_reason) rejections[reason] = n;
  return {{"workers", std::move(workers)},
          {"queued", s.queued},
          {"inflight", s.inflight},
          {"requests_total", s.requests_total},
          {"requests_rejected", s.requests_rejected},
          {"rejections_by_reason", std::move(rejections)}};
}

std::string StatsToTable(const StatsOut& s) {
  size_t id_width = 6;
  for (const WorkerStatsOut& w : s.workers) id_width = std::max(id_width, w.worker_id.size());
  const int width = static_cast<int>(id_width);
  std::string out =
      absl::StrFormat("%-*s  %-7s  %5s  %11s  %13s  %11s  %8s\n", width, "worker", "healthy",
                      "epoch", "running/max", "kv used/total", "outstanding", "served");
  for (const WorkerStatsOut& w : s.workers) {
    absl::StrAppendFormat(&out, "%-*s  %-7s  %5d  %11s  %13s  %11d  %8d\n", width, w.worker_id,
                          w.healthy ? "yes" : "NO", w.epoch,
                          absl::StrCat(w.running, "/", w.max_num_seqs),
                          absl::StrCat(w.kv_used_blocks, "/", w.num_kv_blocks),
                          w.outstanding_tokens, w.requests_served);
  }
  if (s.workers.empty()) out += "(no workers registered)\n";
  absl::StrAppend(&out, "queue: ", s.queued, " waiting, ", s.inflight, " in flight\n");
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
