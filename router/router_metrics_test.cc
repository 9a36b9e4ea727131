#include "router/router_metrics.h"

#include <string>

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
        "# TYPE carpool_e2e_request_latency_seconds histogram",
        "# TYPE carpool_request_queue_time_seconds histogram",
        "# TYPE carpool_rejections_total counter", "# TYPE carpool_kv_cache_usage_ratio gauge",
        "# TYPE carpool_worker_up gauge"}) {
    EXPECT_THAT(page, HasSubstr(name));
  }
}

TEST(RouterMetricsTest, FinishedRequestsFeedHistogramsTokensAndHitRatio) {
  RouterMetrics m;
  m.OnReceived("generate");
  m.OnGenerateFinished("length", 0.002, 0.010, 0.001, 0.050, 30, 5, 10);
  m.OnGenerateFinished("stop", 0.001, 0.020, -1, 0.020, 10, 1, 0);
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

TEST(RouterMetricsTest, WorkersGaugesPreemptionDeltasAndDeparture) {
  RouterMetrics m;
  m.UpdateCluster(3, 2, {{"w1", true, 2, 1, 25, 100, 4}, {"w2", false, 0, 0, 0, 50, 0}});
  m.UpdateCluster(3, 2, {{"w1", true, 2, 1, 50, 100, 6}, {"w2", false, 0, 0, 0, 50, 0}});
  std::string page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_requests_waiting 3\n"));
  EXPECT_THAT(page, HasSubstr("carpool_workers 2\n"));
  EXPECT_THAT(page, HasSubstr("carpool_worker_up{worker=\"w1\"} 1\n"));
  EXPECT_THAT(page, HasSubstr("carpool_worker_up{worker=\"w2\"} 0\n"));
  EXPECT_THAT(page, HasSubstr("carpool_kv_cache_usage_ratio{worker=\"w1\"} 0.5\n"));
  EXPECT_THAT(page, HasSubstr("carpool_preemptions_total 6\n"));
  // w1 leaves: reported down, its load gone, its preemptions still counted.
  m.UpdateCluster(0, 0, {{"w2", true, 0, 0, 0, 50, 0}});
  page = m.Render();
  EXPECT_THAT(page, HasSubstr("carpool_worker_up{worker=\"w1\"} 0\n"));
  EXPECT_THAT(page, Not(HasSubstr("carpool_kv_cache_usage_ratio{worker=\"w1\"}")));
  EXPECT_THAT(page, HasSubstr("carpool_preemptions_total 6\n"));
  // It comes back after a restart and counts from zero again.
  m.UpdateCluster(0, 0, {{"w1", true, 0, 0, 0, 100, 2}, {"w2", true, 0, 0, 0, 50, 0}});
  EXPECT_THAT(m.Render(), HasSubstr("carpool_preemptions_total 8\n"));
}

}  // namespace
}  // namespace carpool::router
