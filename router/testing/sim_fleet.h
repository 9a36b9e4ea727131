// A fleet of simulated workers in one process, for router tests and benchmarks at cluster scale
// (docs/cluster.md, issue 19): N workers behind one router on one machine, each speaking the
// real worker protocol on its own DEALER socket with its own routing id.
//
// Each simulated worker registers (RegisterInfo, re-sent until a RegisterAckInfo names an
// epoch), heartbeats with its load every heartbeat_ms, and runs what it is dispatched: every
// step (step_ms while it runs anything) each running request gets one token, SimToken of its
// prompt and output position, until max_tokens; a resumed dispatch continues after the output
// tokens it carries. Its prefix cache is simulated for the router's index: it starts holding
// cached_blocks random block hashes, stores the prompt block chain (PromptBlockHashes) of every
// dispatch, evicts least recently used blocks beyond num_kv_blocks, and reports all of it as
// KvEventsInfo (in full after each registration, then the changes, before a step's tokens).
// It honours WorkerCancelInfo and DrainInfo (refuses new work with reason draining, finishes
// what runs, deregisters).
//
// A few threads each own a shard of the workers and serve its sockets with one poll, so 1,024
// workers fit on a small machine. Thread-safe: every public method may be called from any
// thread.
#ifndef CARPOOL_ROUTER_TESTING_SIM_FLEET_H_
#define CARPOOL_ROUTER_TESTING_SIM_FLEET_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/messages.h"

namespace carpool::router::testing {

struct SimFleetOptions {
  // The router's backend endpoint. Required.
  std::string router;
  // Simulated workers. Default: 1.
  int workers = 1;
  // Worker i's id and routing id are "<id_prefix>-<i>". Default: "sim".
  std::string id_prefix = "sim";
  // The model every worker registers. Default: "sim".
  std::string model = "sim";
  // Registered capacity of each worker. Defaults: 64 sequences, 16384 KV blocks of 16 tokens,
  // max_model_len 4096.
  int max_num_seqs = 64;
  int num_kv_blocks = 16384;
  int block_size = 16;
  int max_model_len = 4096;
  // One token per running request every step_ms; 0: a dispatch's tokens come at once, one
  // step per poll. Default: 20.
  int step_ms = 20;
  // Heartbeat interval (the worker's default). Default: 200.
  int heartbeat_ms = 200;
  // As the worker's --router-lost-ms: ZMTP heartbeats (PING) every router_lost_ms / 3 on each
  // connection, dropped after router_lost_ms without traffic back; 0: none. Default: 2000 (the
  // worker's default).
  int router_lost_ms = 2000;
  // Random block hashes each worker holds from the start (at most num_kv_blocks), so the
  // router's prefix index has a realistic size. Default: 0.
  int cached_blocks = 0;
  // Threads serving the workers' sockets, each a shard. Default: 2.
  int threads = 2;
  // Keep a record of every dispatch (dispatches()). Default: false.
  bool record_dispatches = false;
  // Seeds the random cached hashes. Default: 1.
  uint64_t seed = 1;

  absl::Status Validate() const;
};

// The token a simulated worker generates at output position `position` of a request whose
// prompt is `prompt`: printable ASCII (32..126), so byte-tokenizer text is valid UTF-8.
int32_t SimToken(absl::Span<const int32_t> prompt, int position);
// SimToken for positions [0, n).
std::vector<int32_t> SimTokens(absl::Span<const int32_t> prompt, int n);

// One dispatch a worker received (SimFleetOptions::record_dispatches).
struct SimDispatch {
  int worker = 0;  // index in the fleet
  uint64_t dispatch_id = 0;
  std::vector<int32_t> prompt;
  int resumed_from = 0;  // output tokens the dispatch carried
};

struct SimFleetCounters {
  int registered = 0;  // workers holding an epoch now
  int deregistered = 0;  // workers that drained and deregistered
  int64_t registrations = 0;  // acks with an epoch, re-registrations included
  int64_t dispatches = 0;
  int64_t cancels = 0;       // cancels that found their request running
  int64_t refused = 0;       // dispatches refused while draining
  int64_t tokens = 0;
  int64_t finished = 0;
  int64_t heartbeats = 0;
  int64_t kv_events = 0;     // KvEventsInfo messages sent
  std::vector<int64_t> dispatches_per_worker;
};

class SimFleet {
 public:
  // Creates the sockets and starts the threads; the workers register as soon as the router is
  // up. INVALID_ARGUMENT for bad options (naming the field).
  static absl::StatusOr<std::unique_ptr<SimFleet>> Start(const SimFleetOptions& options);
  // Stop(/*deregister=*/true).
  ~SimFleet();
  SimFleet(const SimFleet&) = delete;
  SimFleet& operator=(const SimFleet&) = delete;

  // Waits until every worker holds an epoch; false when timeout_ms passes first.
  bool WaitRegistered(int timeout_ms) const;
  // Stops every worker. `deregister`: each registered worker sends DeregisterInfo first (and
  // the sockets linger up to 1 s to deliver it); otherwise they just go silent, as a crashed
  // host does. Idempotent.
  void Stop(bool deregister = true);

  SimFleetCounters counters() const;
  std::vector<SimDispatch> dispatches() const;
  const SimFleetOptions& options() const { return options_; }
  // "<id_prefix>-<i>".
  std::string WorkerId(int i) const;

 private:
  struct Shard;
  struct Worker;
  explicit SimFleet(const SimFleetOptions& options);

  // A shard's thread: polls its workers' sockets, runs their timers (registration retries,
  // heartbeats, steps), and at the end deregisters them (deregister_on_stop_).
  void Serve(Shard* shard);
  void OnFrame(Worker& w, const std::string& frame, int64_t now);
  void OnDispatch(Worker& w, const DispatchInfo& d, int64_t now);
  // Whatever is due for `w` at `now`; returns when it next needs a Tick (micros).
  int64_t Tick(Worker& w, int64_t now);
  void Step(Worker& w, int64_t now);
  void Send(Worker& w, const WorkerMessage& m);
  void SendRegister(Worker& w, int64_t now);
  void SetEpoch(Worker& w, uint64_t epoch);
  WorkerLoad Load(const Worker& w) const;
  // The simulated prefix cache (see Worker).
  int Held(const Worker& w) const;
  void StoreBlock(Worker& w, uint64_t hash);
  void EvictOne(Worker& w);
  void SendKvChanges(Worker& w);
  void SendKvSnapshot(Worker& w);

  const SimFleetOptions options_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> deregister_on_stop_{true};
  std::once_flag stopped_;
  // SimFleetCounters, updated by the shards' threads.
  std::atomic<int> registered_{0};
  std::atomic<int> deregistered_{0};
  std::atomic<int64_t> registrations_{0}, dispatches_{0}, cancels_{0}, refused_{0}, tokens_{0},
      finished_{0}, heartbeats_{0}, kv_events_{0};
  std::unique_ptr<std::atomic<int64_t>[]> per_worker_;  // dispatches, by worker index
  mutable std::mutex record_mu_;
  std::vector<SimDispatch> record_;
};

}  // namespace carpool::router::testing

#endif  // CARPOOL_ROUTER_TESTING_SIM_FLEET_H_
