// carpool status's table and JSON for the batch lane and the batch jobs.
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

}  // namespace
}  // namespace carpool::client
