// carpool-sim-fleet: N simulated workers in one process behind one router
// (router/testing/sim_fleet.h), for benchmarks and tests at cluster scale.
//
//   carpool-sim-fleet --router tcp://127.0.0.1:5556 --workers 1024 --cached-blocks 10000
//
// Ctrl-C or SIGTERM stops it: every registered worker deregisters first.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "common/flags.h"
#include "router/testing/sim_fleet.h"

namespace {

std::atomic<bool> stop_requested{false};

void OnSignal(int) { stop_requested.store(true); }

}  // namespace

int main(int argc, char** argv) {
  using carpool::router::testing::SimFleet;
  using carpool::router::testing::SimFleetOptions;
  SimFleetOptions o;
  int seed = static_cast<int>(o.seed);
  carpool::FlagParser flags;
  flags.AddString("router", &o.router, "the router's backend endpoint (required)");
  flags.AddInt("workers", &o.workers, "simulated workers");
  flags.AddString("id-prefix", &o.id_prefix, "worker i is <id-prefix>-<i>");
  flags.AddString("model", &o.model, "the model every worker registers");
  flags.AddInt("max-num-seqs", &o.max_num_seqs, "sequences per worker");
  flags.AddInt("num-kv-blocks", &o.num_kv_blocks, "KV blocks per worker");
  flags.AddInt("block-size", &o.block_size, "tokens per KV block");
  flags.AddInt("max-model-len", &o.max_model_len, "context length registered");
  flags.AddInt("step-ms", &o.step_ms,
               "one token per running request every step; 0: all tokens at once");
  flags.AddInt("heartbeat-ms", &o.heartbeat_ms, "heartbeat interval");
  flags.AddInt("router-lost-ms", &o.router_lost_ms,
               "as carpool-worker's: ZMTP heartbeats every router-lost-ms / 3 on each "
               "connection; 0: none");
  flags.AddInt("cached-blocks", &o.cached_blocks,
               "random prefix-cache blocks each worker holds from the start");
  flags.AddInt("threads", &o.threads, "threads serving the workers' sockets");
  flags.AddInt("seed", &seed, "seeds the random cached blocks");
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-sim-fleet: " << s.message() << "\n" << flags.Help();
    return 2;
  }
  if (!flags.positionals().empty()) {
    std::cerr << "carpool-sim-fleet: unexpected argument '" << flags.positionals()[0] << "'\n";
    return 2;
  }
  o.seed = static_cast<uint64_t>(seed);
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto fleet = SimFleet::Start(o);
  if (!fleet.ok()) {
    std::cerr << "carpool-sim-fleet: " << fleet.status().message() << "\n";
    return 2;
  }
  std::cerr << "carpool-sim-fleet: " << o.workers << " workers connecting to " << o.router
            << "\n";
  bool reported = false;
  while (!stop_requested.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!reported && (*fleet)->counters().registered == o.workers) {
      std::cerr << "carpool-sim-fleet: all " << o.workers << " workers registered\n";
      reported = true;
    }
  }
  const int registered = (*fleet)->counters().registered;
  (*fleet)->Stop(/*deregister=*/true);
  const auto c = (*fleet)->counters();
  std::cerr << "carpool-sim-fleet: stopped; " << registered << " workers deregistered, "
            << c.dispatches << " dispatches, " << c.tokens << " tokens\n";
  return 0;
}
