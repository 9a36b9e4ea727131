#include "cluster/job_layout.h"

#include <map>
#include <string>

#include "cluster/mpi_job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::cluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

RankInfo Router() { return RankInfo{Role::kRouter, 0, 0}; }
RankInfo Worker(int tp) { return RankInfo{Role::kWorker, tp, 0}; }

TEST(JobLayoutTest, MpmdRouterThenTwoGroupsOfConsecutiveRanks) {
  auto layout = PlanJobLayout({Router(), Worker(2), Worker(2), Worker(2), Worker(2)});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->router_rank, 0);
  EXPECT_EQ(layout->tp_size, 2);
  EXPECT_EQ(layout->num_groups(), 2);
  EXPECT_THAT(layout->Group(0), ElementsAre(1, 2));
  EXPECT_THAT(layout->Group(1), ElementsAre(3, 4));
}

TEST(JobLayoutTest, WorkersOnlyAndARouterAnywhere) {
  auto only = PlanJobLayout({Worker(1), Worker(1), Worker(1)});
  ASSERT_TRUE(only.ok());
  EXPECT_EQ(only->router_rank, -1);
  EXPECT_EQ(only->num_groups(), 3);
  EXPECT_THAT(only->Group(2), ElementsAre(2));

  auto last = PlanJobLayout({Worker(2), Worker(2), Router()});
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->router_rank, 2);
  EXPECT_THAT(last->Group(0), ElementsAre(0, 1));
}

TEST(JobLayoutTest, RouterAloneHasNoGroups) {
  auto layout = PlanJobLayout({Router()});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->num_groups(), 0);
}

TEST(JobLayoutTest, ErrorsNameTheRanks) {
  auto two_routers = PlanJobLayout({Router(), Worker(1), Router()});
  EXPECT_EQ(two_routers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(two_routers.status().message(), HasSubstr("world ranks 0 and 2"));

  auto disagree = PlanJobLayout({Router(), Worker(2), Worker(1)});
  EXPECT_EQ(disagree.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(disagree.status().message(), HasSubstr("world rank 1 has 2, world rank 2 has 1"));

  auto indivisible = PlanJobLayout({Router(), Worker(2), Worker(2), Worker(2)});
  EXPECT_EQ(indivisible.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(indivisible.status().message(), HasSubstr("--tp 2 does not divide"));

  EXPECT_FALSE(PlanJobLayout({Worker(0)}).ok());
}

TEST(LaunchedByMpiTest, LooksForTheLaunchersVariables) {
  std::map<std::string, std::string> env;
  auto lookup = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EXPECT_FALSE(LaunchedByMpi(lookup));
  env["OMPI_COMM_WORLD_SIZE"] = "4";
  EXPECT_TRUE(LaunchedByMpi(lookup));
  env.clear();
  env["PMIX_RANK"] = "0";
  EXPECT_TRUE(LaunchedByMpi(lookup));
  env.clear();
  env["PMI_RANK"] = "3";
  EXPECT_TRUE(LaunchedByMpi(lookup));
}

}  // namespace
}  // namespace carpool::cluster
