// carpool status's table and JSON for the batch lane, the batch jobs and the workers' dtypes.
#include "client/status_command.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace carpool::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

StatsOut WithBatches() {
  StatsOut s;
  s.batch_lane_queued = 3;
  s.batch_lane_inflight = 5;
  s.batch_max_queued = 64;
  s.batch_max_inflight = 32;
  s.batches_by_status = {{"completed", 4}, {"in_progress", 2}};
  s.batch_requests_pending = 1234;
  return s;
}

TEST(StatusCommandTest, TableShowsTheBatchLaneAndJobs) {
  const std::string table = StatsToTable(WithBatches());
  EXPECT_THAT(table, HasSubstr("batch lane: 3 queued of 64, 5 running of 32\n"));
  EXPECT_THAT(table, HasSubstr("batch jobs: 4 completed, 2 in_progress; 1234 requests not "
                               "answered yet\n"));
}

TEST(StatusCommandTest, TableLeavesOutBatchJobsARouterDoesNotReport) {
  StatsOut s;
  const std::string table = StatsToTable(s);
  EXPECT_THAT(table, Not(HasSubstr("batch jobs")));
  EXPECT_THAT(table, Not(HasSubstr("batch lane:")));
}

TEST(StatusCommandTest, JsonHasTheBatchJobs) {
  const nlohmann::json j = StatsToJson(WithBatches());
  EXPECT_EQ(j["batch_jobs"]["by_status"]["in_progress"], 2);
  EXPECT_EQ(j["batch_jobs"]["requests_not_answered"], 1234);
  EXPECT_EQ(j["batch_lane"]["max_in_flight"], 32);
}

// Issue 17: each worker's weight and KV cache storage, and (issue 16) its scheduler's
// preemptions and suspensions.
TEST(StatusCommandTest, WorkersShowTheirDtypesAndSuspensions) {
  StatsOut s;
  WorkerStatsOut w;
  w.worker_id = "w1";
  w.weight_dtype = "int8";
  w.kv_cache_dtype = "bf16";
  w.preemptions = 2;
  w.suspensions = 7;
  s.workers.push_back(w);
  WorkerStatsOut echo;
  echo.worker_id = "echo";
  s.workers.push_back(echo);
  const std::string table = StatsToTable(s);
  EXPECT_THAT(table, HasSubstr("weights/kv\n"));
  EXPECT_THAT(table, HasSubstr("  int8/bf16\n"));
  EXPECT_THAT(table, HasSubstr("ms  -\n"));  // a worker without a model
  const nlohmann::json j = StatsToJson(s);
  EXPECT_EQ(j["workers"][0]["weight_dtype"], "int8");
  EXPECT_EQ(j["workers"][0]["kv_cache_dtype"], "bf16");
  EXPECT_EQ(j["workers"][0]["suspensions"], 7);
  EXPECT_EQ(j["workers"][0]["preemptions"], 2);
}

}  // namespace
}  // namespace carpool::client
