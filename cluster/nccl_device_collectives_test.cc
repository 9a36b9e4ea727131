// NcclCommunicator as a DeviceCommunicator: collectives enqueued on the caller's stream, in
// fp32 and bf16, waited for with WaitStream, and recorded into a CUDA graph and replayed. On the
// GPUs of this machine; reports itself skipped where there are none (the two-rank case needs two
// GPUs: NCCL refuses two ranks on one device).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "cluster/nccl_communicator.h"
#include "gtest/gtest.h"

namespace carpool::cluster {
namespace {

// bf16 bits of small integers (exact in bf16: the top half of the fp32 bits).
uint16_t Bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}
float FromBf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// `bytes` of device memory on `device`, with a stream of its own, freed at scope exit.
class Buffers {
 public:
  Buffers(int device, size_t bytes) : device_(device), bytes_(bytes) {
    cudaSetDevice(device);
    cudaMalloc(&a_, bytes);
    cudaMalloc(&b_, bytes * 2);
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  }
  ~Buffers() {
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
    cudaFree(a_);
    cudaFree(b_);
  }
  void* a() { return a_; }
  void* b() { return b_; }
  void* stream() { return stream_; }
  template <typename T>
  void Upload(const std::vector<T>& v) {
    cudaSetDevice(device_);
    cudaMemcpy(a_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  template <typename T>
  std::vector<T> Download(void* from, size_t n) {
    std::vector<T> v(n);
    cudaSetDevice(device_);
    cudaMemcpy(v.data(), from, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  int device_;
  size_t bytes_;
  void* a_ = nullptr;
  void* b_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

class NcclDeviceCollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    devices_ = NcclCommunicator::DeviceCount();
    if (devices_ == 0) GTEST_SKIP() << "no CUDA device visible: NCCL needs a GPU";
  }
  int devices_ = 0;
};

TEST_F(NcclDeviceCollectivesTest, OneRankOnTheCallersStreamInFp32AndBf16) {
  auto comms = NcclCommunicator::CreateLocal({0}, absl::Seconds(30));
  ASSERT_TRUE(comms.ok()) << comms.status();
  DeviceCommunicator& c = *(*comms)[0];
  Buffers f32(0, 4 * sizeof(float));
  f32.Upload(std::vector<float>{1, 2, 3, 4});
  ASSERT_TRUE(c.AllReduceSumOnStream(f32.a(), 4, DeviceElementType::kF32, f32.stream()).ok());
  ASSERT_TRUE(
      c.AllGatherOnStream(f32.a(), 4, DeviceElementType::kF32, f32.b(), f32.stream()).ok());
  ASSERT_TRUE(c.WaitStream(f32.stream()).ok());
  EXPECT_EQ(f32.Download<float>(f32.a(), 4), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(f32.Download<float>(f32.b(), 4), (std::vector<float>{1, 2, 3, 4}));

  Buffers bf16(0, 3 * sizeof(uint16_t));
  bf16.Upload(std::vector<uint16_t>{Bf16(-2), Bf16(0.5f), Bf16(96)});
  ASSERT_TRUE(c.AllReduceSumOnStream(bf16.a(), 3, DeviceElementType::kBF16, bf16.stream()).ok());
  ASSERT_TRUE(
      c.AllGatherOnStream(bf16.a(), 3, DeviceElementType::kBF16, bf16.b(), bf16.stream()).ok());
  ASSERT_TRUE(c.WaitStream(bf16.stream()).ok());
  const std::vector<uint16_t> got = bf16.Download<uint16_t>(bf16.b(), 3);
  EXPECT_EQ(FromBf16(got[0]), -2.0f);
  EXPECT_EQ(FromBf16(got[1]), 0.5f);
  EXPECT_EQ(FromBf16(got[2]), 96.0f);
}

// What the model relies on where a step is a captured graph: the collectives enqueued during a
// capture on the stream are recorded, and each replay runs them again.
TEST_F(NcclDeviceCollectivesTest, OneRankCollectivesAreCapturedInAGraph) {
  auto comms = NcclCommunicator::CreateLocal({0}, absl::Seconds(30));
  ASSERT_TRUE(comms.ok()) << comms.status();
  DeviceCommunicator& c = *(*comms)[0];
  Buffers buf(0, 2 * sizeof(float));
  buf.Upload(std::vector<float>{5, 7});
  cudaStream_t s = static_cast<cudaStream_t>(buf.stream());
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status reduce = c.AllReduceSumOnStream(buf.a(), 2, DeviceElementType::kF32, s);
  const absl::Status gather = c.AllGatherOnStream(buf.a(), 2, DeviceElementType::kF32, buf.b(), s);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(reduce.ok()) << reduce;
  ASSERT_TRUE(gather.ok()) << gather;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_GE(nodes, 1u);  // the collectives' kernels (or NCCL's no-op for one rank) are in it
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_TRUE(c.WaitStream(s).ok());
  EXPECT_EQ(buf.Download<float>(buf.b(), 2), (std::vector<float>{5, 7}));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(NcclDeviceCollectivesTest, TwoRanksSumAndGatherBf16OnTheirStreams) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one), found "
                                 << devices_;
  auto comms = NcclCommunicator::CreateLocal({0, 1}, absl::Seconds(30));
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<std::vector<uint16_t>> reduced(2), gathered(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      DeviceCommunicator& c = *(*comms)[r];
      Buffers buf(r, 2 * sizeof(uint16_t));
      buf.Upload(std::vector<uint16_t>{Bf16(r + 1.0f), Bf16(8.0f * (r + 1))});
      EXPECT_TRUE(
          c.AllGatherOnStream(buf.a(), 2, DeviceElementType::kBF16, buf.b(), buf.stream()).ok());
      EXPECT_TRUE(
          c.AllReduceSumOnStream(buf.a(), 2, DeviceElementType::kBF16, buf.stream()).ok());
      EXPECT_TRUE(c.WaitStream(buf.stream()).ok());
      reduced[r] = buf.Download<uint16_t>(buf.a(), 2);
      gathered[r] = buf.Download<uint16_t>(buf.b(), 4);
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(reduced[r].size(), 2u);
    EXPECT_EQ(FromBf16(reduced[r][0]), 3.0f);
    EXPECT_EQ(FromBf16(reduced[r][1]), 24.0f);
    ASSERT_EQ(gathered[r].size(), 4u);
    EXPECT_EQ(FromBf16(gathered[r][0]), 1.0f);
    EXPECT_EQ(FromBf16(gathered[r][1]), 8.0f);
    EXPECT_EQ(FromBf16(gathered[r][2]), 2.0f);
    EXPECT_EQ(FromBf16(gathered[r][3]), 16.0f);
  }
}

}  // namespace
}  // namespace carpool::cluster
