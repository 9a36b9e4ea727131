#include "router/router_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RouterMetricsTest, EveryFamilyIsThereBeforeAnyTraffic) {
  RouterMetrics m;
  const std::string page = m.Render();
  for (const char* name :
       {"carpool_requests_total{kind=\"generate\"} 0", "carpool_requests_waiting 0",
        "carpool_requests_running 0", "carpool_time_to_first_token_seconds_count 0",
        "carpool_time_per_output_token_seconds_count 0", "carpool_preemptions_total 0",
        "carpool_prefix_cache_hit_ratio 0", "carpool_batch_size_count 0",
        "carpool_batch_fill_ratio_count 0", "carpool_workers 0",
        "carpool_batch_lane_requests{state=\"queued\"} 0",
        "carpool_batch_lane_requests{state=\"running\"} 0",
        "# TYPE carpool_batch_lane_requests gauge",
        "# TYPE carpool_e2e_request_latency_seconds histogram",
        "# TYPE carpool_request_queue_time_seconds histogram",
        "# TYPE carpool_rejections_total counter", "# TYPE carpool_kv_cache_usage_ratio gauge",
        "# TYPE carpool_worker_up gauge"}) {
    EXPECT_THAT(page, HasSubstr(name));
  }
}

TEST(RouterMetricsTest, TheBatchLaneGaugesFollowTheLastUpdate) {
  RouterMetrics m;
  m.UpdateBatchLane(7, 3);
  EXPECT_THAT(m.Render(), HasSubstr("carpool_batch_lane_requests{state=\"queued\"} 7"));
  EXPECT_THAT(m.Render(), HasSubstr("carpool_batch_lane_requests{state=\"running\"} 3"));
  m.UpdateBatchLane(0, 1);
  EXPECT_THAT(m.Render(), HasSubstr("carpool_batch_lane_requests{state=\"queued\"} 0"));
  EXPECT_THAT(m.Render(), HasSubstr("carpool_batch_lane_requests{state=\"running\"} 1"));
}

TEST(RouterMetricsTest, FinishedRequestsFeedHistogramsTokensAndHitRatio) {
  RouterMetrics m;
  m.OnReceived("generate");
  m.OnGenerateFinished("length", Usage{30, 5, 10}, Timings{2, 10, 50});
  m.OnGenerateFinished("stop", Usage{10, 1, 0}, Timings{1, 20, 20});
  m.OnError("queue_full");
  m.OnError("queue_full");
  const std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_requests_total{kind=\"generate\"} 1\n"));
  EXPECT_THAT(page, HasSubstr(
                        "carpool_requests_finished_total{kind=\"generate\",finish_reason=\"length\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_rejections_total{reason=\"queue_full\"} 2\n"));
  EXPECT_THAT(page, HasSubstr("carpool_prompt_tokens_total{kind=\"generate\"} 40\n"));
  EXPECT_THAT(page, HasSubstr("carpool_generation_tokens_total 6\n"));
  EXPECT_THAT(page, HasSubstr("carpool_prefix_cache_hit_ratio 0.25\n"));
  EXPECT_THAT(page, HasSubstr("carpool_time_to_first_token_seconds_count 2\n"));
  // The second request had one token: no time per output token.
  EXPECT_THAT(page, HasSubstr("carpool_time_per_output_token_seconds_count 1\n"));
  // The first: (50 ms - 10 ms) over the 4 tokens after its first.
  EXPECT_THAT(page, HasSubstr("carpool_time_per_output_token_seconds_sum 0.01\n"));
  EXPECT_THAT(page, HasSubstr("carpool_time_to_first_token_seconds_bucket{le=\"0.016\"} 1\n"));
}

TEST(RouterMetricsTest, StepsGiveBatchSizeAndFillRatio) {
  RouterMetrics m;
  m.OnStep(8, 16);
  m.OnStep(0, 16);  // no news: not a batch
  const std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_batch_size_bucket{le=\"4\"} 0\n"));
  EXPECT_THAT(page, HasSubstr("carpool_batch_size_bucket{le=\"8\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_batch_size_count 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_batch_fill_ratio_sum 0.5\n"));
}

// A worker as the router saw it: only the fields a test names.
WorkerMetricsSnapshot Worker(std::string id, bool up, int running = 0, int waiting = 0,
                             int kv_used = 0, int kv_total = 0, int64_t preemptions = 0,
                             int64_t suspensions = 0, std::string weights = "",
                             std::string kv = "") {
  WorkerMetricsSnapshot w;
  w.worker_id = std::move(id);
  w.up = up;
  w.running = running;
  w.waiting = waiting;
  w.kv_used_blocks = kv_used;
  w.num_kv_blocks = kv_total;
  w.preemptions = preemptions;
  w.suspensions = suspensions;
  w.weight_dtype = std::move(weights);
  w.kv_cache_dtype = std::move(kv);
  return w;
}

TEST(RouterMetricsTest, WorkersGaugesPreemptionDeltasAndDeparture) {
  RouterMetrics m;
  m.UpdateCluster(3, 2, {Worker("w1", true, 2, 1, 25, 100, 4), Worker("w2", false, 0, 0, 0, 50)});
  m.UpdateCluster(3, 2, {Worker("w1", true, 2, 1, 50, 100, 6), Worker("w2", false, 0, 0, 0, 50)});
  std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_requests_waiting 3\n"));
  EXPECT_THAT(page, HasSubstr("carpool_workers 2\n"));
  EXPECT_THAT(page, HasSubstr("carpool_worker_up{worker=\"w1\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_worker_up{worker=\"w2\"} 0\n"));
  EXPECT_THAT(page, HasSubstr("carpool_kv_cache_usage_ratio{worker=\"w1\"} 0.5\n"));
  EXPECT_THAT(page, HasSubstr("carpool_preemptions_total 6\n"));
  // w1 leaves: reported down, its load gone, its preemptions still counted.
  m.UpdateCluster(0, 0, {Worker("w2", true, 0, 0, 0, 50)});
  page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_worker_up{worker=\"w1\"} 0\n"));
  EXPECT_THAT(page, Not(HasSubstr("carpool_kv_cache_usage_ratio{worker=\"w1\"}")));
  EXPECT_THAT(page, HasSubstr("carpool_preemptions_total 6\n"));
  // It comes back after a restart and counts from zero again.
  m.UpdateCluster(0, 0, {Worker("w1", true, 0, 0, 0, 100, 2), Worker("w2", true, 0, 0, 0, 50)});
  EXPECT_THAT(m.Render(), HasSubstr("carpool_preemptions_total 8\n"));
  // Its gauges are series again (the ones removed when it left are not written to), and follow
  // later updates.
  m.UpdateCluster(0, 0, {Worker("w1", true, 3, 1, 75, 100, 2), Worker("w2", true, 0, 0, 0, 50)});
  page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_worker_up{worker=\"w1\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_kv_cache_usage_ratio{worker=\"w1\"} 0.75\n"));
  EXPECT_THAT(page, HasSubstr("carpool_worker_requests_running{worker=\"w1\"} 3\n"));
}

// Workers that left stay on the page as down, but not forever: ids like hostname:pid are new at
// every restart, so past 1,024 departed ones the oldest series go. One that comes back is up and
// no longer counted among them.
TEST(RouterMetricsTest, DepartedWorkersStayDownUpToABound) {
  RouterMetrics m;
  m.UpdateCluster(0, 0, {Worker("back", true)});
  m.UpdateCluster(0, 0, {});  // "back" left first: the oldest down one
  for (int i = 0; i < 1030; ++i) {
    m.UpdateCluster(0, 0, {Worker(absl::StrCat("w", i), true)});
    if (i == 3) m.UpdateCluster(0, 0, {Worker("w3", true), Worker("back", true)});
  }
  m.UpdateCluster(0, 0, {Worker("back", true)});
  const std::string page = m.Render();
  // Down: w0..w1029 (1,030), "back" is up. Kept: the newest 1,024, so w0..w5 are gone.
  for (int i = 0; i < 6; ++i) {
    EXPECT_THAT(page, Not(HasSubstr(absl::StrCat("carpool_worker_up{worker=\"w", i, "\"}"))))
        << i;
  }
  for (int i : {6, 7, 500, 1029}) {
    EXPECT_THAT(page, HasSubstr(absl::StrCat("carpool_worker_up{worker=\"w", i, "\"} 0\n"))) << i;
  }
  EXPECT_THAT(page, HasSubstr("carpool_worker_up{worker=\"back\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_workers 1\n"));
}

// Issue 16's suspensions count by deltas like preemptions; issue 17's dtypes are one labelled
// sample per worker, replaced when it registers again storing differently, gone when it leaves.
TEST(RouterMetricsTest, SuspensionDeltasAndOneDtypeSamplePerWorker) {
  RouterMetrics m;
  m.UpdateCluster(0, 0,
                  {Worker("w1", true, 0, 0, 0, 100, 0, 3, "bf16", "bf16"), Worker("w2", true)});
  m.UpdateCluster(0, 0,
                  {Worker("w1", true, 0, 0, 0, 100, 0, 5, "bf16", "bf16"), Worker("w2", true)});
  std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_suspensions_total 5\n"));
  EXPECT_THAT(page, HasSubstr(
      "carpool_worker_dtype_info{worker=\"w1\",weights=\"bf16\",kv_cache=\"bf16\"} 1\n"));
  EXPECT_THAT(page, Not(HasSubstr("carpool_worker_dtype_info{worker=\"w2\"")));
  m.UpdateCluster(0, 0, {Worker("w1", true, 0, 0, 0, 100, 0, 1, "int8", "bf16")});
  page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_suspensions_total 6\n"));  // restarted: from zero
  EXPECT_THAT(page, HasSubstr(
      "carpool_worker_dtype_info{worker=\"w1\",weights=\"int8\",kv_cache=\"bf16\"} 1\n"));
  EXPECT_THAT(page, Not(HasSubstr("weights=\"bf16\"")));
  m.UpdateCluster(0, 0, {});
  EXPECT_THAT(m.Render(), Not(HasSubstr("carpool_worker_dtype_info{")));
}

EmbedBatcherCounters Embed(int64_t answered, std::vector<int64_t> batch_size_counts,
                           int max_batch_size) {
  EmbedBatcherCounters c;
  c.submitted = answered;
  c.answered = answered;
  c.batch_size_counts = std::move(batch_size_counts);
  for (int64_t n : c.batch_size_counts) c.batches += n;
  c.max_batch_size = max_batch_size;
  c.queue_wait_count = answered;
  c.queue_wait_sum_micros = 1000 * answered;  // 1 ms each
  return c;
}

TEST(RouterMetricsTest, EmbedBatcherFamiliesStartAtZero) {
  RouterMetrics m;
  const std::string page = m.Render();
  for (const char* line :
       {"carpool_embed_batches_total 0\n", "carpool_embed_batch_size_count 0\n",
        "carpool_embed_batch_size_bucket{le=\"1024\"} 0\n",
        "carpool_embed_batch_fill_ratio_count 0\n", "carpool_embed_queue_wait_seconds_total 0\n",
        "carpool_embed_queue_waits_total 0\n", "carpool_embed_timeouts_total 0\n",
        "carpool_embed_refusals_total 0\n", "carpool_embed_inputs_total{outcome=\"answered\"} 0\n",
        "carpool_embed_inputs_total{outcome=\"failed\"} 0\n",
        "carpool_embed_inputs_total{outcome=\"cancelled\"} 0\n"}) {
    EXPECT_THAT(page, HasSubstr(line));
  }
}

TEST(RouterMetricsTest, EmbedBatcherReportsAddUpByDeltasOverWorkers) {
  RouterMetrics m;
  // w1: batches of 1 and 4 inputs (max 4); w2: one batch of 2 (max 8).
  EmbedBatcherCounters w1 = Embed(9, {0, 1, 0, 0, 2}, 4);
  w1.refused = 2;
  w1.timed_out = 1;
  w1.cancelled = 3;
  m.UpdateEmbedBatcher("w1", w1);
  m.UpdateEmbedBatcher("w2", Embed(2, {0, 0, 1, 0, 0, 0, 0, 0, 0}, 8));
  // The same report again changes nothing; then w1 runs two more full batches and one fails.
  m.UpdateEmbedBatcher("w1", w1);
  w1 = Embed(17, {0, 1, 0, 0, 4}, 4);
  w1.refused = 2;
  w1.timed_out = 1;
  w1.cancelled = 3;
  w1.failed = 1;
  m.UpdateEmbedBatcher("w1", w1);
  const std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_embed_batches_total 6\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_inputs_total{outcome=\"answered\"} 19\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_inputs_total{outcome=\"failed\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_inputs_total{outcome=\"cancelled\"} 3\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_refusals_total 2\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_timeouts_total 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_queue_waits_total 19\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_queue_wait_seconds_total 0.019\n"));
  // Sizes: one 1, one 2, four 4s.
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_size_bucket{le=\"1\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_size_bucket{le=\"2\"} 2\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_size_bucket{le=\"4\"} 6\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_size_count 6\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_size_sum 19\n"));
  // Fill: 1/4 and 2/8 (both 0.25), four full batches (1.0).
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_fill_ratio_bucket{le=\"0.2\"} 0\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_fill_ratio_bucket{le=\"0.3\"} 2\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_fill_ratio_bucket{le=\"0.9\"} 2\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_fill_ratio_count 6\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_fill_ratio_sum 4.5\n"));
}

TEST(RouterMetricsTest, EmbedBatcherOfARestartedWorkerCountsFromZero) {
  RouterMetrics m;
  m.UpdateEmbedBatcher("w1", Embed(40, {0, 0, 0, 0, 10}, 4));
  // A new process: its counts are below the last report, so all of them are new.
  m.UpdateEmbedBatcher("w1", Embed(3, {0, 1, 1, 0, 0}, 4));
  std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_embed_batches_total 12\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_inputs_total{outcome=\"answered\"} 43\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_size_bucket{le=\"1\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_size_count 12\n"));
  // And from there on by deltas again.
  m.UpdateEmbedBatcher("w1", Embed(7, {0, 1, 1, 0, 1}, 4));
  page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_embed_batches_total 13\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_inputs_total{outcome=\"answered\"} 47\n"));
  EXPECT_THAT(page, HasSubstr("carpool_embed_batch_size_bucket{le=\"4\"} 13\n"));
}

}  // namespace
}  // namespace carpool::router
