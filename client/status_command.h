// `carpool status --router ENDPOINT`: the router's view of the cluster, as a table or JSON.
#ifndef CARPOOL_CLIENT_STATUS_COMMAND_H_
#define CARPOOL_CLIENT_STATUS_COMMAND_H_

#include <string>

#include "common/messages.h"
#include "nlohmann/json.hpp"

namespace carpool::client {

// Stats as JSON: {"workers": [{"worker_id", "healthy", "epoch", "model", "running",
// "max_num_seqs", "kv_used_blocks", "num_kv_blocks", "outstanding_tokens", "requests_served"}],
// "queued", "inflight", "requests_total", "requests_rejected", "rejections_by_reason": {...}}.
nlohmann::json StatsToJson(const StatsOut& stats);

// A fixed-width table, one row per worker, then the queue and the totals.
std::string StatsToTable(const StatsOut& stats);

// Entry point: argv[first..] are the command's flags. Returns the process exit code.
int RunStatus(int argc, char** argv, int first);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_STATUS_COMMAND_H_
