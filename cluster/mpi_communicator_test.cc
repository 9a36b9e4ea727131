// Runs as 3 ranks of one mpirun job, all workers of one tensor-parallel group.
#include "cluster/mpi_communicator.h"

#include <unistd.h>

#include <numeric>
#include <string>
#include <vector>

#include "cluster/group_heartbeat.h"
#include "cluster/testing/mpi_test_main.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::cluster {

MpiJobOptions testing::TestJobOptions(int, int world_size) {
  return MpiJobOptions{.role = Role::kWorker, .tensor_parallel = world_size};
}

namespace {

using ::testing::HasSubstr;

class MpiCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto comm = MpiCommunicator::Create(testing::Job().tp_comm(), {.timeout = absl::Seconds(20)});
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = std::move(*comm);
    ASSERT_EQ(comm_->size(), 3);
  }
  void TearDown() override {
    if (comm_ != nullptr) {
      ASSERT_TRUE(comm_->Barrier().ok());
    }
  }
  std::unique_ptr<MpiCommunicator> comm_;
};

TEST_F(MpiCommunicatorTest, AllReduceSumAddsEveryRanksValues) {
  const int r = comm_->rank();
  std::vector<float> data(1000);
  for (int i = 0; i < 1000; ++i) data[i] = static_cast<float>(r * 1000 + i);
  ASSERT_TRUE(comm_->AllReduceSum(data.data(), data.size()).ok());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(data[i], static_cast<float>(3000 + 3 * i)) << i;
  ASSERT_TRUE(comm_->AllReduceSum(data.data(), 0).ok());
}

TEST_F(MpiCommunicatorTest, AllGatherAndGatherPlaceRankBlocksInOrder) {
  const int r = comm_->rank();
  std::vector<float> mine = {static_cast<float>(r), static_cast<float>(10 * r)};
  std::vector<float> all(6, -1);
  ASSERT_TRUE(comm_->AllGather(mine.data(), 2, all.data()).ok());
  EXPECT_EQ(all, (std::vector<float>{0, 0, 1, 10, 2, 20}));

  std::vector<float> gathered(6, -1);
  ASSERT_TRUE(comm_->Gather(mine.data(), 2, r == 1 ? gathered.data() : nullptr, 1).ok());
  if (r == 1) {
    EXPECT_EQ(gathered, (std::vector<float>{0, 0, 1, 10, 2, 20}));
  }
  EXPECT_EQ(comm_->Gather(mine.data(), 2, nullptr, 3).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MpiCommunicatorTest, BroadcastCopiesTheRootsBytes) {
  std::string text(5000, '.');
  if (comm_->rank() == 2) {
    for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 26);
  }
  ASSERT_TRUE(comm_->Broadcast(text.data(), text.size(), 2, absl::InfiniteDuration()).ok());
  for (size_t i = 0; i < text.size(); ++i) ASSERT_EQ(text[i], 'a' + i % 26) << i;
}

// Rank 0 waits alone on a communicator of its own; the others never arrive.
TEST_F(MpiCommunicatorTest, AnOperationWhosePeersNeverArriveTimesOut) {
  auto lonely = MpiCommunicator::Create(testing::Job().tp_comm(),
                                        {.timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(lonely.ok());
  if (comm_->rank() == 0) {
    const absl::Time start = absl::Now();
    const absl::Status s = (*lonely)->Barrier();
    const absl::Duration waited = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("Barrier"));
    EXPECT_GE(waited, absl::Milliseconds(300));
    EXPECT_LT(waited, absl::Seconds(3));
    float x = 1;
    const absl::Status b =
        (*lonely)->Broadcast(&x, sizeof(x), 1, absl::Milliseconds(100));
    EXPECT_EQ(b.code(), absl::StatusCode::kDeadlineExceeded) << b;
  }
}

TEST(GroupHeartbeatTest, LivePeersStayQuietAndLeavingIsNotDying) {
  auto beats = GroupHeartbeat::Create(
      testing::Job().tp_comm(),
      {.interval = absl::Milliseconds(20), .timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(beats.ok()) << beats.status();
  const absl::Time end = absl::Now() + absl::Milliseconds(600);
  while (absl::Now() < end) {
    ASSERT_TRUE((*beats)->Poll().ok());
    absl::SleepFor(absl::Milliseconds(10));
  }
  // Rank 1 leaves first; the leader keeps polling past the timeout without complaint.
  if ((*beats)->rank() == 1) (*beats)->Leave();
  const absl::Time end2 = absl::Now() + absl::Milliseconds(500);
  while (absl::Now() < end2) {
    ASSERT_TRUE((*beats)->Poll().ok());
    absl::SleepFor(absl::Milliseconds(10));
  }
  (*beats)->Leave();
  EXPECT_TRUE((*beats)->Poll().ok());
}

TEST(GroupHeartbeatTest, ASilentPeerIsNamedWithinTheTimeout) {
  auto beats = GroupHeartbeat::Create(
      testing::Job().tp_comm(),
      {.interval = absl::Milliseconds(20), .timeout = absl::Milliseconds(300)});
  ASSERT_TRUE(beats.ok()) << beats.status();
  const int rank = (*beats)->rank();
  if (rank == 2) {
    absl::SleepFor(absl::Seconds(2));  // alive but silent, as a stopped process would be
    return;
  }
  // The leader notices rank 2; rank 1 then notices the leader, which stopped beating.
  const absl::Time start = absl::Now();
  absl::Status s;
  while (s.ok() && absl::Now() - start < absl::Seconds(3)) {
    s = (*beats)->Poll();
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr(rank == 0 ? "rank 2" : "rank 0"));
  EXPECT_GE(waited, absl::Milliseconds(300));
  EXPECT_LT(waited, absl::Milliseconds(rank == 0 ? 1000 : 1600));
}

}  // namespace
}  // namespace carpool::cluster
