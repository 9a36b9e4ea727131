// NcclCommunicator on the GPUs of this machine; reports itself skipped where there are none.
#include "cluster/nccl_communicator.h"

#include <cuda_runtime.h>

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace carpool::cluster {
namespace {

// A device buffer of n floats, freed at scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t n) : device_(device), n_(n) {
    cudaSetDevice(device);
    cudaMalloc(&data_, n * sizeof(float));
  }
  ~DeviceBuffer() {
    cudaSetDevice(device_);
    cudaFree(data_);
  }
  float* get() { return data_; }
  void Upload(const std::vector<float>& v) {
    cudaSetDevice(device_);
    cudaMemcpy(data_, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  std::vector<float> Download() {
    std::vector<float> v(n_);
    cudaSetDevice(device_);
    cudaMemcpy(v.data(), data_, n_ * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  int device_;
  size_t n_;
  float* data_ = nullptr;
};

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    devices_ = NcclCommunicator::DeviceCount();
    if (devices_ == 0) GTEST_SKIP() << "no CUDA device visible: NCCL needs a GPU";
  }
  int devices_ = 0;
};

TEST_F(NcclCommunicatorTest, OneRankKeepsItsData) {
  auto comms = NcclCommunicator::CreateLocal({0}, absl::Seconds(30));
  ASSERT_TRUE(comms.ok()) << comms.status();
  NcclCommunicator& c = *(*comms)[0];
  EXPECT_EQ(c.size(), 1);
  DeviceBuffer data(0, 4), gathered(0, 4);
  data.Upload({1, 2, 3, 4});
  ASSERT_TRUE(c.AllReduceSum(data.get(), 4).ok());
  EXPECT_EQ(data.Download(), (std::vector<float>{1, 2, 3, 4}));
  ASSERT_TRUE(c.AllGather(data.get(), 4, gathered.get()).ok());
  EXPECT_EQ(gathered.Download(), (std::vector<float>{1, 2, 3, 4}));
  ASSERT_TRUE(c.Gather(data.get(), 4, gathered.get(), 0).ok());
  EXPECT_EQ(gathered.Download(), (std::vector<float>{1, 2, 3, 4}));
  ASSERT_TRUE(c.Broadcast(data.get(), 16, 0, absl::Seconds(10)).ok());
  ASSERT_TRUE(c.Barrier().ok());
}

TEST_F(NcclCommunicatorTest, TwoRanksSumGatherAndBroadcast) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 GPUs, found " << devices_;
  auto comms = NcclCommunicator::CreateLocal({0, 1}, absl::Seconds(30));
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<std::vector<float>> reduced(2), all(2), root(2), broadcast(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      NcclCommunicator& c = *(*comms)[r];
      DeviceBuffer data(r, 2), out(r, 4);
      data.Upload({static_cast<float>(r + 1), static_cast<float>(10 * (r + 1))});
      EXPECT_TRUE(c.AllGather(data.get(), 2, out.get()).ok());
      all[r] = out.Download();
      EXPECT_TRUE(c.Gather(data.get(), 2, out.get(), 1).ok());
      root[r] = out.Download();
      EXPECT_TRUE(c.AllReduceSum(data.get(), 2).ok());
      reduced[r] = data.Download();
      if (r == 0) data.Upload({7, 8});
      EXPECT_TRUE(c.Broadcast(data.get(), 2 * sizeof(float), 0, absl::Seconds(10)).ok());
      broadcast[r] = data.Download();
      EXPECT_TRUE(c.Barrier().ok());
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reduced[r], (std::vector<float>{3, 30}));
    EXPECT_EQ(all[r], (std::vector<float>{1, 10, 2, 20}));
    EXPECT_EQ(broadcast[r], (std::vector<float>{7, 8}));
  }
  EXPECT_EQ(root[1], (std::vector<float>{1, 10, 2, 20}));
}

}  // namespace
}  // namespace carpool::cluster
