// The worker's engine thread and what it shares with the I/O thread (worker/worker_server.h).
// Internal to carpool_worker_server.
#ifndef CARPOOL_WORKER_ENGINE_LOOP_H_
#define CARPOOL_WORKER_ENGINE_LOOP_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/messages.h"
#include "common/transport.h"
#include "worker/backend.h"
#include "worker/batching/dynamic_batcher.h"

namespace carpool::worker::internal {

// The inproc PAIR between the two threads carries [tag, payload...]:
//   I/O -> engine: kTagRouter + a router frame (dispatch, embed dispatch or cancel), kTagEpoch
//                  + the new epoch (0: re-registering, send nothing), kTagDrain.
//   engine -> I/O: kTagSend + the epoch it is stamped with + an encoded WorkerMessage,
//                  kTagEpochSeen + an epoch once it took that kTagEpoch (everything it sends
//                  after was stamped under it), kTagDone once drained (the engine thread has
//                  exited).
inline constexpr char kTagRouter[] = "router";
inline constexpr char kTagEpoch[] = "epoch";
inline constexpr char kTagDrain[] = "drain";
inline constexpr char kTagSend[] = "send";
inline constexpr char kTagDone[] = "done";
inline constexpr char kTagEpochSeen[] = "epoch_seen";
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

// The engine thread's load, for the I/O thread's heartbeats. Fields may be a step apart; the
// embedding batcher's counts are one consistent snapshot.
class SharedLoad {
 public:
  void Publish(const WorkerLoad& l) {
    running_.store(l.running, std::memory_order_relaxed);
    waiting_.store(l.waiting, std::memory_order_relaxed);
    kv_used_.store(l.kv_used_blocks, std::memory_order_relaxed);
    kv_free_.store(l.kv_free_blocks, std::memory_order_relaxed);
    preemptions_.store(l.preemptions, std::memory_order_relaxed);
    suspensions_.store(l.suspensions, std::memory_order_relaxed);
    embed_queued_.store(l.embed_queued, std::memory_order_relaxed);
  }
  WorkerLoad Read() const {
    WorkerLoad l;
    l.running = running_.load(std::memory_order_relaxed);
    l.waiting = waiting_.load(std::memory_order_relaxed);
    l.kv_used_blocks = kv_used_.load(std::memory_order_relaxed);
    l.kv_free_blocks = kv_free_.load(std::memory_order_relaxed);
    l.preemptions = preemptions_.load(std::memory_order_relaxed);
    l.suspensions = suspensions_.load(std::memory_order_relaxed);
    l.embed_queued = embed_queued_.load(std::memory_order_relaxed);
    return l;
  }
  void PublishEmbedBatcher(const EmbedBatcherCounters& c) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    embed_batcher_ = c;
  }
  // Nullopt until the engine thread publishes one (never, when the worker cannot embed).
  std::optional<EmbedBatcherCounters> ReadEmbedBatcher() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return embed_batcher_;
  }

 private:
  std::atomic<int> running_{0}, waiting_{0}, kv_used_{0}, kv_free_{0}, embed_queued_{0};
  std::atomic<int64_t> preemptions_{0}, suspensions_{0};
  mutable absl::Mutex mu_;
  std::optional<EmbedBatcherCounters> embed_batcher_ ABSL_GUARDED_BY(mu_);
};

struct EngineLoopOptions {
  // Longest sleep without work. Default: 50.
  int idle_wait_ms = 50;
  // The embedding batcher (pull mode, driven by the loop). max_concurrent_batches must be 1:
  // batches run on the engine thread, one at a time. Unused when the backend cannot embed.
  // Default: 32 inputs a batch, 2 ms wait, a queue of 1024 inputs, the real clock.
  DynamicBatcherOptions embed = DefaultEmbedOptions();

  static DynamicBatcherOptions DefaultEmbedOptions();
};

// Owns the Backend (through the pointer it is given) for as long as Run runs. Takes dispatches
// and cancels from the pair, runs one step at a time, sends one `step` message per step that
// produced events, stamped with the current epoch, and publishes the load after each step.
// Embed dispatches go into a pull-mode DynamicBatcher, one item per input; each dispatch is
// answered by one `embed_done` once all its inputs are done, or one `failed`. Policy: each
// iteration runs at most one engine step and then at most one embedding batch, so no step
// waits for more than one embedding batch; without generation work the iterations (and so the
// batches) follow each other without sleeping, and the poll timeout never passes the
// batcher's next deadline (rounded up to a millisecond), so max_wait is kept. The batcher's
// counts (plus the inputs of dispatches refused for a full queue) go to SharedLoad after every
// iteration that changed them, for the heartbeats.
// Prefix-cache changes (blocks registered and evicted, as the KV cache records them) go out as
// `kv_events` right after the step that made them, before its message, and in full after every
// new registration.
// Nothing is sent while the epoch is 0; epoch 0 (re-registering: the router does not know this
// registration) and any other new epoch cancel the requests taken under the previous one (the
// router has given them up; a restarted one reuses epoch numbers and dispatch ids).
class EngineLoop {
 public:
  // REQUIRES: options.embed.Validate() is OK and max_concurrent_batches is 1.
  EngineLoop(Backend* backend, Socket* pair, SharedLoad* load, const EngineLoopOptions& options);
  ~EngineLoop();

  // Returns once drained (generation and embeddings), after telling the I/O thread.
  void Run();

 private:
  using EmbedBatcher = DynamicBatcher<EmbeddingInput, std::vector<float>>;
  // An embed dispatch in flight.
  struct EmbedJob {
    std::vector<EmbedBatcher::Ticket> tickets;
    std::vector<std::vector<float>> results;  // by input
    size_t remaining = 0;
  };

  // How long the next DrainInbox may wait.
  int WaitMs(bool stalled) const;
  void DrainInbox(int timeout_ms);
  void Handle(const Frames& frames);
  void HandleRouterFrame(const std::string& frame);
  void OnEpoch(uint64_t epoch);
  void OnDispatch(const DispatchInfo& d);
  void OnEmbedDispatch(EmbedDispatchInfo d);
  // INVALID_ARGUMENT naming the problem when `d` cannot be embedded here.
  absl::Status CheckEmbedDispatch(const EmbedDispatchInfo& d) const;
  // The batcher's callback for input `index` of request `dispatch_id`.
  void OnEmbedResult(uint64_t dispatch_id, size_t index, absl::StatusOr<std::vector<float>> r);
  // Forgets an embed dispatch and cancels its inputs; nothing is sent. Unknown ids: no-op.
  void CancelEmbed(uint64_t dispatch_id);
  // Runs one embedding batch if one is due; false when none was.
  bool RunEmbedBatch();
  WorkerLoad CurrentLoad() const;
  // Publishes the batcher's counts to load_ when they changed since the last time.
  void PublishEmbedBatcher();
  // Runs one step; false when it produced nothing.
  bool StepOnce();
  // Sends the backend's prefix-cache changes (all it holds, as a reset, with `snapshot`).
  void SendKvEvents(bool snapshot);
  void Fail(uint64_t dispatch_id, absl::StatusCode code, const char* reason, std::string message);
  // Drops the message while no epoch is known.
  void SendToRouter(const WorkerMessage& message);

  Backend* const backend_;
  Socket* const pair_;
  SharedLoad* const load_;
  const int idle_wait_ms_;
  const DynamicBatcherOptions embed_options_;
  Clock* const clock_;
  const RegisterInfo described_;  // vocabulary and max_model_len for checking embed inputs
  uint64_t epoch_ = 0;        // stamped on every message; 0 while (re)registering
  uint64_t owner_epoch_ = 0;  // the epoch the requests in flight were taken under
  bool draining_ = false;
  int64_t send_failures_ = 0;
  int64_t embed_refused_inputs_ = 0;  // inputs of embed dispatches refused: queue full
  std::optional<EmbedBatcherCounters> published_embed_;  // what load_ holds
  absl::flat_hash_map<uint64_t, EmbedJob> embeds_;  // by dispatch id
  // Null when the backend cannot embed. Last: destroyed first, while its callbacks can still
  // reach embeds_.
  std::unique_ptr<EmbedBatcher> embedder_;
};

}  // namespace carpool::worker::internal

#endif  // CARPOOL_WORKER_ENGINE_LOOP_H_
