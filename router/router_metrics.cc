#include "router/router_metrics.h"

#include <algorithm>
#include <string_view>

#include "absl/container/flat_hash_set.h"

namespace carpool::router {
namespace {

using metrics::ExponentialBuckets;

// 1 ms .. ~65 s.
std::vector<double> LatencyBuckets() { return ExponentialBuckets(0.001, 2, 17); }
// 0.5 ms .. ~4 s per output token.
std::vector<double> TokenBuckets() { return ExponentialBuckets(0.0005, 2, 14); }

// 0.1, 0.2, ..., 1 as i / 10, so the labels read as written (0.1 * 3 is 0.30000000000000004).
std::vector<double> TenthBuckets() {
  std::vector<double> out;
  for (int i = 1; i <= 10; ++i) out.push_back(i / 10.0);
  return out;
}

}  // namespace

RouterMetrics::RouterMetrics()
    : requests_(registry_.AddCounter("carpool_requests_total",
                                     "Requests received by the router, by kind.", {"kind"})),
      finished_(registry_.AddCounter("carpool_requests_finished_total",
                                     "Requests answered in full, by kind and finish reason.",
                                     {"kind", "finish_reason"})),
      errors_(registry_.AddCounter(
          "carpool_rejections_total",
          "Requests refused at admission or ended with an error, by reason.", {"reason"})),
      prompt_tokens_(registry_.AddCounter("carpool_prompt_tokens_total",
                                          "Prompt (prefill) tokens of finished requests.",
                                          {"kind"})),
      generation_tokens_(registry_.AddCounter("carpool_generation_tokens_total",
                                              "Tokens generated (decode) by finished requests.")),
      prefix_hit_tokens_(registry_.AddCounter(
          "carpool_prefix_cache_hit_tokens_total",
          "Prompt tokens of finished requests that were served from the prefix cache.")),
      prefix_hit_ratio_(registry_.AddGauge(
          "carpool_prefix_cache_hit_ratio",
          "carpool_prefix_cache_hit_tokens_total / carpool_prompt_tokens_total{kind=generate}.")),
      preemptions_(registry_.AddCounter("carpool_preemptions_total",
                                        "Sequences preempted by the workers' schedulers.")),
      suspensions_(registry_.AddCounter(
          "carpool_suspensions_total",
          "Batch jobs' sequences the workers' schedulers suspended, keeping their KV blocks, to "
          "give their slots to more urgent requests.")),
      migrations_(registry_.AddCounter(
          "carpool_migrations_total", "Requests moved to another worker after theirs died.")),
      batch_preemptions_(registry_.AddCounter(
          "carpool_batch_preemptions_total",
          "Batch jobs' requests the router took off a worker for other requests to run; each "
          "resumes later from the tokens it had.")),
      ttft_(registry_.AddHistogram("carpool_time_to_first_token_seconds",
                                   "From arrival at the router to the first token.",
                                   LatencyBuckets())),
      tpot_(registry_.AddHistogram("carpool_time_per_output_token_seconds",
                                   "Mean time between output tokens after the first, per request.",
                                   TokenBuckets())),
      e2e_(registry_.AddHistogram("carpool_e2e_request_latency_seconds",
                                  "From arrival at the router to the last answer, by kind.",
                                  LatencyBuckets(), {"kind"})),
      queue_(registry_.AddHistogram("carpool_request_queue_time_seconds",
                                    "From arrival at the router to dispatch to a worker, by kind.",
                                    LatencyBuckets(), {"kind"})),
      batch_size_(registry_.AddHistogram(
          "carpool_batch_size", "Sequences with news per engine step, over all workers.",
          ExponentialBuckets(1, 2, 10))),
      fill_ratio_(registry_.AddHistogram(
          "carpool_batch_fill_ratio",
          "Sequences with news per engine step divided by the worker's max_num_seqs.",
          metrics::LinearBuckets(0.1, 0.1, 10))),
      embed_inputs_(registry_.AddHistogram("carpool_embed_request_inputs",
                                           "Inputs per finished embed request.",
                                           ExponentialBuckets(1, 2, 12))),
      waiting_(registry_.AddGauge("carpool_requests_waiting",
                                  "Requests admitted and queued in the router.")),
      running_(registry_.AddGauge("carpool_requests_running",
                                  "Requests dispatched to a worker and not finished.")),
      batch_lane_(registry_.AddGauge(
          "carpool_batch_lane_requests",
          "Batch jobs' requests in the router's batch lane: queued, or running on a worker.",
          {"state"})),
      worker_up_(registry_.AddGauge(
          "carpool_worker_up", "1 while the worker is registered, heartbeating and not draining.",
          {"worker"})),
      worker_running_(registry_.AddGauge("carpool_worker_requests_running",
                                         "Requests the router has dispatched to the worker.",
                                         {"worker"})),
      worker_dtypes_(registry_.AddGauge(
          "carpool_worker_dtype_info",
          "1 for each worker, labelled with how it stores its weights and its KV cache.",
          {"worker", "weights", "kv_cache"})),
      worker_waiting_(registry_.AddGauge("carpool_worker_requests_waiting",
                                         "Requests queued inside the worker (last load report).",
                                         {"worker"})),
      kv_usage_(registry_.AddGauge("carpool_kv_cache_usage_ratio",
                                   "Fraction of the worker's KV blocks in use.", {"worker"})),
      workers_(registry_.AddGauge("carpool_workers", "Workers registered with the router.")),
      embed_batches_(registry_.AddCounter(
          "carpool_embed_batches_total",
          "Embedding batches run by the workers' batchers (retries of split batches included).")),
      embed_batch_size_(registry_.AddHistogram("carpool_embed_batch_size",
                                               "Inputs per embedding batch, over all workers.",
                                               ExponentialBuckets(1, 2, 11))),
      embed_fill_ratio_(registry_.AddHistogram(
          "carpool_embed_batch_fill_ratio",
          "Inputs per embedding batch divided by the worker's embed max_batch_size.",
          TenthBuckets())),
      embed_wait_seconds_(registry_.AddCounter(
          "carpool_embed_queue_wait_seconds_total",
          "Total time embedding inputs waited in a worker's queue before their first batch.")),
      embed_waits_(registry_.AddCounter(
          "carpool_embed_queue_waits_total",
          "Embedding inputs that reached a batch (the count behind the wait total).")),
      embed_timeouts_(registry_.AddCounter(
          "carpool_embed_timeouts_total",
          "Embedding inputs dropped at their deadline before they ran.")),
      embed_refusals_(registry_.AddCounter(
          "carpool_embed_refusals_total",
          "Embedding inputs a worker turned away because its embed queue was full.")),
      embed_inputs_total_(registry_.AddCounter(
          "carpool_embed_inputs_total",
          "Embedding inputs the workers' batchers finished, by outcome.", {"outcome"})) {
  // Series that exist from the start, so a scrape before any traffic sees them at zero.
  for (const char* kind : {"generate", "embed"}) {
    requests_.With({kind});
    prompt_tokens_.With({kind});
  }
  generation_tokens_.With({});
  prefix_hit_tokens_.With({});
  prefix_hit_ratio_.With({});
  preemptions_.With({});
  suspensions_.With({});
  migrations_.With({});
  batch_preemptions_.With({});
  ttft_.With({});
  tpot_.With({});
  batch_size_.With({});
  fill_ratio_.With({});
  waiting_.With({});
  running_.With({});
  for (const char* state : {"queued", "running"}) batch_lane_.With({state});
  workers_.With({});
  embed_batches_.With({});
  embed_batch_size_.With({});
  embed_fill_ratio_.With({});
  embed_wait_seconds_.With({});
  embed_waits_.With({});
  embed_timeouts_.With({});
  embed_refusals_.With({});
  for (const char* outcome : {"answered", "failed", "cancelled"}) {
    embed_inputs_total_.With({outcome});
  }
}

void RouterMetrics::OnReceived(const char* kind) { requests_.With({kind}).Inc(); }

void RouterMetrics::OnError(const std::string& reason) { errors_.With({reason}).Inc(); }

void RouterMetrics::OnGenerateFinished(const std::string& finish_reason, const Usage& usage,
                                       const Timings& timings) {
  finished_.With({"generate", finish_reason}).Inc();
  queue_.With({"generate"}).Observe(timings.queue_ms / 1e3);
  if (usage.completion_tokens > 0) ttft_.With({}).Observe(timings.ttft_ms / 1e3);
  if (usage.completion_tokens > 1) {
    tpot_.With({}).Observe((timings.total_ms - timings.ttft_ms) / 1e3 /
                           (usage.completion_tokens - 1));
  }
  e2e_.With({"generate"}).Observe(timings.total_ms / 1e3);
  metrics::Counter& prompt = prompt_tokens_.With({"generate"});
  prompt.Inc(usage.prompt_tokens);
  generation_tokens_.With({}).Inc(usage.completion_tokens);
  metrics::Counter& hits = prefix_hit_tokens_.With({});
  hits.Inc(usage.cached_prompt_tokens);
  if (prompt.Value() > 0) prefix_hit_ratio_.With({}).Set(hits.Value() / prompt.Value());
}

void RouterMetrics::OnEmbedFinished(const Usage& usage, const Timings& timings, int inputs) {
  finished_.With({"embed", "stop"}).Inc();
  queue_.With({"embed"}).Observe(timings.queue_ms / 1e3);
  e2e_.With({"embed"}).Observe(timings.total_ms / 1e3);
  embed_inputs_.With({}).Observe(inputs);
  prompt_tokens_.With({"embed"}).Inc(usage.prompt_tokens);
}

void RouterMetrics::OnStep(int sequences, int max_num_seqs) {
  if (sequences <= 0) return;
  batch_size_.With({}).Observe(sequences);
  if (max_num_seqs > 0) {
    fill_ratio_.With({}).Observe(static_cast<double>(sequences) / max_num_seqs);
  }
}

void RouterMetrics::OnMigration() { migrations_.With({}).Inc(); }

void RouterMetrics::OnBatchPreemption() { batch_preemptions_.With({}).Inc(); }

namespace {

int64_t CountAt(const std::vector<int64_t>& counts, size_t i) {
  return i < counts.size() ? counts[i] : 0;
}

// True when some cumulative count of `now` is below `before`: a new worker process.
bool Restarted(const EmbedBatcherCounters& before, const EmbedBatcherCounters& now) {
  for (auto field : {&EmbedBatcherCounters::submitted, &EmbedBatcherCounters::refused,
                     &EmbedBatcherCounters::timed_out, &EmbedBatcherCounters::cancelled,
                     &EmbedBatcherCounters::answered, &EmbedBatcherCounters::failed,
                     &EmbedBatcherCounters::batches, &EmbedBatcherCounters::queue_wait_count,
                     &EmbedBatcherCounters::queue_wait_sum_micros}) {
    if (now.*field < before.*field) return true;
  }
  for (size_t i = 0; i < before.batch_size_counts.size(); ++i) {
    if (CountAt(now.batch_size_counts, i) < before.batch_size_counts[i]) return true;
  }
  return false;
}

}  // namespace

void RouterMetrics::UpdateEmbedBatcher(const std::string& worker_id,
                                       const EmbedBatcherCounters& now) {
  absl::MutexLock lock(&mu_);
  EmbedBatcherCounters& last = last_embed_[worker_id];
  if (Restarted(last, now)) last = EmbedBatcherCounters{};
  auto add = [](metrics::Counter& c, int64_t after, int64_t before) {
    if (after > before) c.Inc(static_cast<double>(after - before));
  };
  add(embed_batches_.With({}), now.batches, last.batches);
  add(embed_waits_.With({}), now.queue_wait_count, last.queue_wait_count);
  if (now.queue_wait_sum_micros > last.queue_wait_sum_micros) {
    embed_wait_seconds_.With({}).Inc(
        static_cast<double>(now.queue_wait_sum_micros - last.queue_wait_sum_micros) / 1e6);
  }
  add(embed_timeouts_.With({}), now.timed_out, last.timed_out);
  add(embed_refusals_.With({}), now.refused, last.refused);
  add(embed_inputs_total_.With({"answered"}), now.answered, last.answered);
  add(embed_inputs_total_.With({"failed"}), now.failed, last.failed);
  add(embed_inputs_total_.With({"cancelled"}), now.cancelled, last.cancelled);
  metrics::Histogram& sizes = embed_batch_size_.With({});
  metrics::Histogram& fill = embed_fill_ratio_.With({});
  for (size_t s = 1; s < now.batch_size_counts.size(); ++s) {
    const int64_t batches = now.batch_size_counts[s] - CountAt(last.batch_size_counts, s);
    if (batches <= 0) continue;
    sizes.Observe(static_cast<double>(s), static_cast<uint64_t>(batches));
    if (now.max_batch_size > 0) {
      fill.Observe(static_cast<double>(s) / now.max_batch_size, static_cast<uint64_t>(batches));
    }
  }
  last = now;
}

void RouterMetrics::UpdateBatchLane(int queued, int running) {
  batch_lane_.With({"queued"}).Set(queued);
  batch_lane_.With({"running"}).Set(running);
}

void RouterMetrics::UpdateCluster(int waiting, int running,
                                  const std::vector<WorkerMetricsSnapshot>& workers) {
  waiting_.With({}).Set(waiting);
  running_.With({}).Set(running);
  workers_.With({}).Set(static_cast<double>(workers.size()));
  absl::MutexLock lock(&mu_);
  std::vector<std::string> now;
  // The workers of this snapshot, to tell the known ones that left in one lookup each (a scan
  // of `now` per known worker made this pass quadratic: 1.8 ms at 1,024 workers).
  absl::flat_hash_set<std::string_view> present;
  present.reserve(workers.size());
  for (const WorkerMetricsSnapshot& w : workers) {
    now.push_back(w.worker_id);
    present.insert(w.worker_id);
    WorkerCounts& last = last_counts_[w.worker_id];
    if (last.up == nullptr) {
      // New, or back after it left: no longer one of the down ones.
      if (auto it = std::find(down_workers_.begin(), down_workers_.end(), w.worker_id);
          it != down_workers_.end()) {
        down_workers_.erase(it);
      }
      // Series stay where they are until removed, which drops this entry too (below).
      last.up = &worker_up_.With({w.worker_id});
      last.running = &worker_running_.With({w.worker_id});
      last.waiting = &worker_waiting_.With({w.worker_id});
      last.kv_usage = &kv_usage_.With({w.worker_id});
    }
    last.up->Set(w.up ? 1 : 0);
    last.running->Set(w.running);
    last.waiting->Set(w.waiting);
    last.kv_usage->Set(
        w.num_kv_blocks > 0 ? static_cast<double>(w.kv_used_blocks) / w.num_kv_blocks : 0);
    // A restarted worker counts from zero again.
    const auto delta = [](int64_t now, int64_t before) {
      return now >= before ? now - before : now;
    };
    const int64_t preempted = delta(w.preemptions, last.preemptions);
    const int64_t suspended = delta(w.suspensions, last.suspensions);
    if (preempted > 0) preemptions_.With({}).Inc(static_cast<double>(preempted));
    if (suspended > 0) suspensions_.With({}).Inc(static_cast<double>(suspended));
    // A worker that registers again may store differently: one sample per worker.
    if (last.weight_dtype != w.weight_dtype || last.kv_cache_dtype != w.kv_cache_dtype) {
      if (!last.weight_dtype.empty()) {
        worker_dtypes_.Remove({w.worker_id, last.weight_dtype, last.kv_cache_dtype});
      }
      if (!w.weight_dtype.empty()) {
        worker_dtypes_.With({w.worker_id, w.weight_dtype, w.kv_cache_dtype}).Set(1);
      }
    }
    last.preemptions = w.preemptions;
    last.suspensions = w.suspensions;
    if (last.weight_dtype != w.weight_dtype) last.weight_dtype = w.weight_dtype;
    if (last.kv_cache_dtype != w.kv_cache_dtype) last.kv_cache_dtype = w.kv_cache_dtype;
  }
  for (std::string& gone : known_workers_) {
    if (present.contains(gone)) continue;
    // Left or died: down until it registers again, and no stale load. Done once, when it goes.
    worker_up_.With({gone}).Set(0);
    worker_running_.Remove({gone});
    worker_waiting_.Remove({gone});
    kv_usage_.Remove({gone});
    if (auto it = last_counts_.find(gone); it != last_counts_.end()) {
      if (!it->second.weight_dtype.empty()) {
        worker_dtypes_.Remove({gone, it->second.weight_dtype, it->second.kv_cache_dtype});
      }
      last_counts_.erase(it);
    }
    down_workers_.push_back(std::move(gone));
  }
  while (down_workers_.size() > kMaxDownWorkers) {
    worker_up_.Remove({down_workers_.front()});
    down_workers_.pop_front();
  }
  known_workers_ = std::move(now);
}

}  // namespace carpool::router
