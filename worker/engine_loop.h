// The worker's engine thread and what it shares with the I/O thread (worker/worker_server.h).
// Internal to carpool_worker_server.
#ifndef CARPOOL_WORKER_ENGINE_LOOP_H_
#define CARPOOL_WORKER_ENGINE_LOOP_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/messages.h"
#include "common/transport.h"
#include "worker/backend.h"

namespace carpool::worker::internal {

// The inproc PAIR between the two threads carries [tag, payload...]:
//   I/O -> engine: kTagRouter + a router frame (dispatch or cancel), kTagEpoch + the new
//                  epoch (0: re-registering, send nothing), kTagDrain.
//   engine -> I/O: kTagSend + the epoch it is stamped with + an encoded WorkerMessage,
//                  kTagDone once drained (the engine thread has exited).
inline constexpr char kTagRouter[] = "router";
inline constexpr char kTagEpoch[] = "epoch";
inline constexpr char kTagDrain[] = "drain";
inline constexpr char kTagSend[] = "send";
inline constexpr char kTagDone[] = "done";
inline constexpr char kPairEndpoint[] = "inproc://carpool-worker-engine";
// Messages queued between the threads before a send fails; generous, the reader never blocks.
inline constexpr int kPairHighWaterMark = 100000;
// Most frames taken from one socket per wake-up, so neither side starves the other.
inline constexpr int kMaxFramesPerWake = 256;

// One line to stderr, prefixed "carpool-worker: ".
template <typename... Args>
void Log(const Args&... args) {
  const std::string line = absl::StrCat("carpool-worker: ", args..., "\n");
  std::fputs(line.c_str(), stderr);
}

// True for 1, 2, 4, 8, ...: log the first of a run of failures, then ever more rarely.
inline bool ShouldLogCount(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// The engine thread's load, for the I/O thread's heartbeats. Fields may be a step apart.
class SharedLoad {
 public:
  void Publish(const WorkerLoad& l) {
    running_.store(l.running, std::memory_order_relaxed);
    waiting_.store(l.waiting, std::memory_order_relaxed);
    kv_used_.store(l.kv_used_blocks, std::memory_order_relaxed);
    kv_free_.store(l.kv_free_blocks, std::memory_order_relaxed);
  }
  WorkerLoad Read() const {
    return WorkerLoad{
        running_.load(std::memory_order_relaxed), waiting_.load(std::memory_order_relaxed),
        kv_used_.load(std::memory_order_relaxed), kv_free_.load(std::memory_order_relaxed)};
  }

 private:
  std::atomic<int> running_{0}, waiting_{0}, kv_used_{0}, kv_free_{0};
};

// Owns the Backend (through the pointer it is given) for as long as Run runs. Takes dispatches
// and cancels from the pair, runs one step at a time, sends one `step` message per step that
// produced events, stamped with the current epoch, and publishes the load after each step.
// Prefix-cache changes go out as `kv_events` just before a step's message (at most one check
// for evictions every 250 ms), and in full after every new registration.
// Nothing is sent while the epoch is 0; a new nonzero epoch cancels the requests taken under the
// previous one (the router that issued it has given them up).
class EngineLoop {
 public:
  EngineLoop(Backend* backend, Socket* pair, SharedLoad* load, int idle_wait_ms)
      : backend_(backend), pair_(pair), load_(load), idle_wait_ms_(idle_wait_ms) {}

  // Returns once drained, after telling the I/O thread.
  void Run();

 private:
  void DrainInbox(int timeout_ms);
  void Handle(const Frames& frames);
  void HandleRouterFrame(const std::string& frame);
  void OnEpoch(uint64_t epoch);
  void OnDispatch(const DispatchInfo& d);
  // Runs one step; false when it produced nothing.
  bool StepOnce();
  // Sends the backend's prefix-cache changes (all it holds, as a reset, with `snapshot`).
  void SendKvEvents(bool snapshot);
  void Fail(uint64_t request_id, absl::StatusCode code, const char* reason, std::string message);
  // Drops the message while no epoch is known.
  void SendToRouter(const WorkerMessage& message);

  Backend* const backend_;
  Socket* const pair_;
  SharedLoad* const load_;
  const int idle_wait_ms_;
  uint64_t epoch_ = 0;        // stamped on every message; 0 while (re)registering
  uint64_t owner_epoch_ = 0;  // the epoch the requests in flight were taken under
  bool draining_ = false;
  int64_t send_failures_ = 0;
};

}  // namespace carpool::worker::internal

#endif  // CARPOOL_WORKER_ENGINE_LOOP_H_
