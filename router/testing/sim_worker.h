// Test helpers for the router: a simulated worker and a scripted client, both on real ZeroMQ
// sockets, so router tests control service rates exactly without a model.
#ifndef CARPOOL_ROUTER_TESTING_SIM_WORKER_H_
#define CARPOOL_ROUTER_TESTING_SIM_WORKER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/messages.h"
#include "common/transport.h"

namespace carpool::router::testing {

struct SimWorkerOptions {
  std::string id = "sim";
  int max_num_seqs = 4;
  // One token per running request every step_ms. Default: 2.
  int step_ms = 2;
  int num_kv_blocks = 4096;
  int block_size = 16;
  int max_model_len = 4096;
};

// Registers with the router, heartbeats every 100 ms, and runs dispatched requests: every step
// each running request gets one token (id 1) until it has max_tokens. Records when each request
// arrived, keyed by its tag (see Tag()).
class SimWorker {
 public:
  SimWorker(const std::string& backend, const SimWorkerOptions& options);
  ~SimWorker();

  // Tag -> microseconds (Clock::Real) when the worker received its first dispatch.
  std::map<int, int64_t> dispatch_times() const;
  int dispatches() const;

 private:
  void Run(std::string backend);

  const SimWorkerOptions options_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::map<int, int64_t> dispatch_times_;
  int dispatches_ = 0;
  std::thread thread_;
};

// A prompt whose first two tokens encode `tag` (< 65536), so SimWorker can tell requests apart.
std::vector<int32_t> TaggedPrompt(int tag, int length = 4);
int Tag(const std::vector<int32_t>& prompt);

// How one request ended, as a client saw it.
struct Outcome {
  bool ended = false;
  bool ok = false;
  GenerateFinalOut final;
  ErrorInfo error;
  int64_t sent_micros = 0;
  int64_t ended_micros = 0;
};

// One scripted request: sent `at_ms` after Drive starts.
struct Scripted {
  int64_t at_ms = 0;
  GenerateInput request;
};

// Sends every request at its time from one DEALER, collects the answers until every request
// has ended or `timeout_ms` passes. Keyed by request_id.
std::map<std::string, Outcome> Drive(const std::string& frontend,
                                     const std::vector<Scripted>& script, int timeout_ms,
                                     const SocketOptions& socket = SocketOptions());

// The router's stats over a fresh DEALER, asked with `api_key` (needed where the router has
// tenants); an empty StatsOut after 5 s without an answer, or on an error.
StatsOut QueryStats(const std::string& frontend, const std::string& api_key = "");

}  // namespace carpool::router::testing

#endif  // CARPOOL_ROUTER_TESTING_SIM_WORKER_H_
