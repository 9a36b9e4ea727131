// The router's Prometheus metrics: the cluster view served at the HTTP gateway's /metrics
// (docs/http.md lists every name). The router's event loop records into it; any thread renders.
//
// Thread-safe (see common/metrics.h).
#ifndef CARPOOL_ROUTER_ROUTER_METRICS_H_
#define CARPOOL_ROUTER_ROUTER_METRICS_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/messages.h"
#include "common/metrics.h"
#include "common/usage.h"

namespace carpool::router {

// One worker as the router last saw it.
struct WorkerMetricsSnapshot {
  std::string worker_id;
  bool up = false;  // registered, heartbeating and not draining
  int running = 0;
  int waiting = 0;
  int kv_used_blocks = 0;
  int num_kv_blocks = 0;
  int64_t preemptions = 0;  // the worker's cumulative counts
  int64_t suspensions = 0;
  std::string weight_dtype{};  // as it registered ("": no model)
  std::string kv_cache_dtype{};
};

class RouterMetrics {
 public:
  RouterMetrics();

  // A request arrived: kind "generate" or "embed".
  void OnReceived(const char* kind);
  // A request was refused or ended with an error, by reason (cancellations included).
  void OnError(const std::string& reason);
  // A generate request finished on a worker, with the usage and timings its client got. Time to
  // first token is observed when it produced a token, time per output token (the mean after
  // the first) when it produced two or more.
  void OnGenerateFinished(const std::string& finish_reason, const Usage& usage,
                          const Timings& timings);
  // An embed request of `inputs` inputs was answered (usage: prompt_tokens only).
  void OnEmbedFinished(const Usage& usage, const Timings& timings, int inputs);
  // One engine step's message from a worker: `sequences` got news, of `max_num_seqs`.
  void OnStep(int sequences, int max_num_seqs);
  void OnMigration();
  // The router took a batch job's request off its worker for a request waiting for its room.
  void OnBatchPreemption();

  // Gauges: the router's queue and the workers now registered. Workers not listed any more
  // drop out (their preemptions stay counted).
  void UpdateCluster(int waiting, int running, const std::vector<WorkerMetricsSnapshot>& workers);
  // Gauges: batch jobs' requests queued in the batch lane and dispatched (counted in
  // UpdateCluster's waiting and running too).
  void UpdateBatchLane(int queued, int running);

  // A worker's heartbeat carried its embedding batcher's cumulative counts: the cluster-wide
  // embed_* metrics grow by what changed since its last report. Counts that went down mean the
  // worker restarted, and count from zero again. Workers are never forgotten here (a worker that
  // re-registers from the same process must not be counted twice).
  void UpdateEmbedBatcher(const std::string& worker_id, const EmbedBatcherCounters& counters);

  std::string Render() const { return registry_.Render(); }

 private:
  metrics::Registry registry_;
  metrics::Family<metrics::Counter>& requests_;
  metrics::Family<metrics::Counter>& finished_;
  metrics::Family<metrics::Counter>& errors_;
  metrics::Family<metrics::Counter>& prompt_tokens_;
  metrics::Family<metrics::Counter>& generation_tokens_;
  metrics::Family<metrics::Counter>& prefix_hit_tokens_;
  metrics::Family<metrics::Gauge>& prefix_hit_ratio_;
  metrics::Family<metrics::Counter>& preemptions_;
  metrics::Family<metrics::Counter>& suspensions_;
  metrics::Family<metrics::Counter>& migrations_;
  metrics::Family<metrics::Counter>& batch_preemptions_;
  metrics::Family<metrics::Histogram>& ttft_;
  metrics::Family<metrics::Histogram>& tpot_;
  metrics::Family<metrics::Histogram>& e2e_;
  metrics::Family<metrics::Histogram>& queue_;
  metrics::Family<metrics::Histogram>& batch_size_;
  metrics::Family<metrics::Histogram>& fill_ratio_;
  metrics::Family<metrics::Histogram>& embed_inputs_;
  metrics::Family<metrics::Gauge>& waiting_;
  metrics::Family<metrics::Gauge>& running_;
  metrics::Family<metrics::Gauge>& batch_lane_;
  metrics::Family<metrics::Gauge>& worker_up_;
  metrics::Family<metrics::Gauge>& worker_running_;
  metrics::Family<metrics::Gauge>& worker_dtypes_;
  metrics::Family<metrics::Gauge>& worker_waiting_;
  metrics::Family<metrics::Gauge>& kv_usage_;
  metrics::Family<metrics::Gauge>& workers_;
  metrics::Family<metrics::Counter>& embed_batches_;
  metrics::Family<metrics::Histogram>& embed_batch_size_;
  metrics::Family<metrics::Histogram>& embed_fill_ratio_;
  metrics::Family<metrics::Counter>& embed_wait_seconds_;
  metrics::Family<metrics::Counter>& embed_waits_;
  metrics::Family<metrics::Counter>& embed_timeouts_;
  metrics::Family<metrics::Counter>& embed_refusals_;
  metrics::Family<metrics::Counter>& embed_inputs_total_;

  static constexpr size_t kMaxDownWorkers = 1024;

  absl::Mutex mu_;
  // Cumulative preemptions and suspensions last reported per worker, to count deltas, the
  // dtype labels its carpool_worker_dtype_info sample has, and its series of the per-worker
  // gauges (looked up once: a lookup by label builds and compares label vectors, which at
  // 1,024 workers was most of the housekeeping pass).
  struct WorkerCounts {
    int64_t preemptions = 0;
    int64_t suspensions = 0;
    std::string weight_dtype;
    std::string kv_cache_dtype;
    metrics::Gauge* up = nullptr;  // null until first seen
    metrics::Gauge* running = nullptr;
    metrics::Gauge* waiting = nullptr;
    metrics::Gauge* kv_usage = nullptr;
  };
  absl::flat_hash_map<std::string, WorkerCounts> last_counts_ ABSL_GUARDED_BY(mu_);
  // The workers of the last update.
  std::vector<std::string> known_workers_ ABSL_GUARDED_BY(mu_);
  // Workers that left, oldest first, still shown down (carpool_worker_up 0) until they come
  // back or kMaxDownWorkers newer ones left: ids like hostname:pid are new on every restart,
  // and keeping them all would grow the page and the pass for as long as the router runs.
  std::deque<std::string> down_workers_ ABSL_GUARDED_BY(mu_);
  // Each worker's last embedding batcher report, to count deltas.
  absl::flat_hash_map<std::string, EmbedBatcherCounters> last_embed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_ROUTER_METRICS_H_
