// --gpus: the list's parsing, the local rank's entry, and which device an ordinal is with
// CUDA_VISIBLE_DEVICES set (as Slurm sets it on a shared node) and unset. No GPU needed.
#include "worker/gpu_list.h"

#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseGpuListTest, TakesOrdinalsInOrder) {
  absl::StatusOr<std::vector<int>> gpus = ParseGpuList("2,3");
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_THAT(*gpus, ElementsAre(2, 3));
  EXPECT_THAT(*ParseGpuList("7"), ElementsAre(7));
  EXPECT_THAT(*ParseGpuList("6, 4 ,5"), ElementsAre(6, 4, 5));
}

TEST(ParseGpuListTest, RefusesBadListsNamingTheFlagAndEntry) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c :
       {Case{"", "got none"}, Case{" ", "got none"}, Case{"2,,3", "'' is not a device ordinal"},
        Case{"0,x", "'x' is not a device ordinal"}, Case{"1.5", "'1.5' is not a device ordinal"},
        Case{"0,-1", "device ordinal -1 must be >= 0"},
        Case{"2,3,2", "device ordinal 2 is listed twice"},
        Case{"99999999999", "is not a device ordinal"}}) {
    absl::StatusOr<std::vector<int>> gpus = ParseGpuList(c.text);
    ASSERT_FALSE(gpus.ok()) << "'" << c.text << "'";
    EXPECT_EQ(gpus.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(gpus.status().message(), HasSubstr("--gpus")) << c.text;
    EXPECT_THAT(gpus.status().message(), HasSubstr(c.says)) << c.text;
  }
}

TEST(GpuForLocalRankTest, EachRankTakesItsLocalRanksEntry) {
  const std::vector<int> gpus = {2, 3};
  EXPECT_EQ(*GpuForLocalRank(gpus, 2, 0), 2);
  EXPECT_EQ(*GpuForLocalRank(gpus, 2, 1), 3);
  const std::vector<int> four = {4, 5, 6, 7};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(*GpuForLocalRank(four, 4, r), 4 + r);
}

TEST(GpuForLocalRankTest, OneRankWithoutLauncherTakesItsOnlyEntry) {
  const std::vector<int> gpus = {5};
  EXPECT_EQ(*GpuForLocalRank(gpus, 1, -1), 5);
  EXPECT_EQ(*GpuForLocalRank(gpus, 1, 0), 5);
}

TEST(GpuForLocalRankTest, RefusesAListThatIsNotOnePerRank) {
  const std::vector<int> three = {0, 1, 2};
  absl::StatusOr<int> gpu = GpuForLocalRank(three, 2, 0);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gpu.status().message(), HasSubstr("--gpus 0,1,2 lists 3 GPUs for --tp 2"));
  const std::vector<int> one = {0};
  gpu = GpuForLocalRank(one, 2, 0);
  ASSERT_FALSE(gpu.ok());
  EXPECT_THAT(gpu.status().message(), HasSubstr("lists 1 GPU for --tp 2"));
}

TEST(GpuForLocalRankTest, RefusesALocalRankWithoutEntry) {
  const std::vector<int> gpus = {2, 3};
  // A job holding two groups on the node: local ranks 2 and 3 belong to the second group.
  absl::StatusOr<int> gpu = GpuForLocalRank(gpus, 2, 2);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gpu.status().message(), HasSubstr("local rank 2 has no entry"));
  // No launcher said which rank this is.
  gpu = GpuForLocalRank(gpus, 2, -1);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gpu.status().message(), HasSubstr("no local rank"));
}

TEST(VisibleDeviceNameTest, UnsetMeansTheNodesOwnIndex) {
  EXPECT_EQ(VisibleDeviceName(0, nullptr), "0");
  EXPECT_EQ(VisibleDeviceName(3, nullptr), "3");
  EXPECT_EQ(VisibleDeviceName(-1, nullptr), std::nullopt);
}

TEST(VisibleDeviceNameTest, SetMeansTheEntryOfTheJobsList) {
  // Slurm on a shared node without ConstrainDevices: the job holds the node's GPUs 4 to 7, so a
  // group planned on slots 2,3 runs on devices 6 and 7, not on the node's 2 and 3.
  const char* slurm = "4,5,6,7";
  const std::vector<int> gpus = *ParseGpuList("2,3");
  EXPECT_EQ(VisibleDeviceName(*GpuForLocalRank(gpus, 2, 0), slurm), "6");
  EXPECT_EQ(VisibleDeviceName(*GpuForLocalRank(gpus, 2, 1), slurm), "7");
  EXPECT_EQ(VisibleDeviceName(0, slurm), "4");
  EXPECT_EQ(VisibleDeviceName(4, slurm), std::nullopt);  // the job has 4 GPUs here
  EXPECT_EQ(VisibleDeviceName(1, "GPU-8e1a,GPU-33f0"), "GPU-33f0");
}

TEST(VisibleDeviceNameTest, ListEndsAtItsFirstEmptyEntry) {
  EXPECT_EQ(VisibleDeviceName(0, ""), std::nullopt);  // set and empty: no device
  EXPECT_EQ(VisibleDeviceName(0, "4,,5"), "4");
  EXPECT_EQ(VisibleDeviceName(1, "4,,5"), std::nullopt);
}

}  // namespace
}  // namespace carpool::worker
