// Runs as 5 ranks of one mpirun job: world rank 0 plays the router, ranks 1-4 are workers in
// tensor-parallel groups of 2, as `mpirun -np 1 carpool-router : -np 4 carpool-worker --tp 2`.
#include "cluster/mpi_job.h"

#include <mpi.h>

#include "cluster/testing/mpi_test_main.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::cluster {

MpiJobOptions testing::TestJobOptions(int world_rank, int) {
  if (world_rank == 0) return MpiJobOptions{.role = Role::kRouter};
  return MpiJobOptions{.role = Role::kWorker, .tensor_parallel = 2};
}

namespace {

using ::testing::HasSubstr;

TEST(MpiJobTest, RanksSplitIntoTheRouterAndGroupsOfConsecutiveWorkers) {
  MpiJob& job = testing::Job();
  ASSERT_EQ(job.world_size(), 5);
  EXPECT_TRUE(job.has_router());
  EXPECT_EQ(job.router_rank(), 0);
  EXPECT_TRUE(job.single_node());
  EXPECT_EQ(job.num_workers(), 4);
  if (job.world_rank() == 0) {
    EXPECT_EQ(job.role(), Role::kRouter);
    EXPECT_EQ(job.local_rank(), 0);
    EXPECT_EQ(job.local_size(), 1);
    EXPECT_THAT(job.Describe(), HasSubstr("router"));
    return;
  }
  const int w = job.world_rank() - 1;
  EXPECT_EQ(job.role(), Role::kWorker);
  EXPECT_EQ(job.worker_index(), w);
  EXPECT_EQ(job.tp_size(), 2);
  EXPECT_EQ(job.tp_group(), w / 2);
  EXPECT_EQ(job.tp_rank(), w % 2);
  EXPECT_TRUE(job.tp_group_on_one_node());
  // One node: the local rank among workers is the worker index, the device of a GPU worker.
  EXPECT_EQ(job.local_rank(), w);
  EXPECT_EQ(job.local_size(), 4);
  EXPECT_THAT(job.Describe(), HasSubstr("tensor-parallel group"));

  // The group communicator holds exactly the two consecutive world ranks.
  int size = 0, rank = 0, sum = 0;
  ASSERT_EQ(MPI_Comm_size(job.tp_comm(), &size), MPI_SUCCESS);
  ASSERT_EQ(MPI_Comm_rank(job.tp_comm(), &rank), MPI_SUCCESS);
  EXPECT_EQ(size, 2);
  EXPECT_EQ(rank, w % 2);
  int mine = job.world_rank();
  ASSERT_EQ(MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, job.tp_comm()), MPI_SUCCESS);
  EXPECT_EQ(sum, w / 2 == 0 ? 1 + 2 : 3 + 4);
}

TEST(MpiJobTest, TheRoutersEndpointReachesEveryWorker) {
  MpiJob& job = testing::Job();
  auto reachable = job.ReachableBackendEndpoint();
  ASSERT_TRUE(reachable.ok());
  EXPECT_EQ(*reachable, "tcp://127.0.0.1:*");  // one node
  if (job.role() == Role::kRouter) {
    EXPECT_TRUE(job.PublishRouterEndpoint("tcp://127.0.0.1:43210", absl::Seconds(20)).ok());
    EXPECT_FALSE(job.ReceiveRouterEndpoint(absl::Seconds(1)).ok());
  } else {
    auto endpoint = job.ReceiveRouterEndpoint(absl::Seconds(20));
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    EXPECT_EQ(*endpoint, "tcp://127.0.0.1:43210");
  }
}

TEST(MpiJobTest, WorkersHearThatTheRouterStops) {
  MpiJob& job = testing::Job();
  if (job.role() == Role::kRouter) {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(job.NotifyWorkersToStop(absl::Seconds(10)).ok());
    EXPECT_FALSE(job.RouterStopping());
    return;
  }
  EXPECT_FALSE(job.RouterStopping());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!job.RouterStopping() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(job.RouterStopping());
  EXPECT_TRUE(job.RouterStopping());  // stays true
}

}  // namespace
}  // namespace carpool::cluster
