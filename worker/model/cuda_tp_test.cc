// Tensor parallelism on GPUs, in one process (one thread per rank), against the whole model on
// the GPU, fp32, over prefill, decode and mixed steps:
//   - two ranks on GPU 0 with their sums and logits staged through host memory (--tp-transport
//     mpi): the sharded device model (NCCL refuses two ranks on one device);
//   - where two GPUs exist, two ranks on GPUs 0 and 1 with NCCL on the devices' streams
//     (--tp-transport nccl), and there greedy decoding with CUDA graphs on (decode steps
//     recorded with their NCCL collectives inside, then replayed) against graphs off, and the
//     leader sampling on its device against the host's argmax.
// Reports itself skipped without a GPU.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/model/cuda_device.h"
#include "tests/testing/follower_thread.h"
#include "worker/model/llama_model.h"
#include "worker/weights/weights.h"
#ifdef CARPOOL_HAVE_NCCL
#include "cluster/nccl_communicator.h"
#endif

namespace carpool::worker {
namespace {

constexpr int kRanks = 2;
constexpr int kBlockSize = 4;

// Host collectives between the ranks' threads.
class ThreadGroup {
 public:
  void Exchange(int rank, const void* mine,
                const std::function<void(const std::vector<const void*>&)>& use) {
    posted_[rank] = mine;
    Barrier();
    use(posted_);
    Barrier();
  }
  void Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == kRanks) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<const void*> posted_ = std::vector<const void*>(kRanks);
};

// Step plans go nowhere (the test gives every rank each step); sums and gathers are real.
class ThreadCommunicator : public cluster::Communicator {
 public:
  ThreadCommunicator(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return kRanks; }
  absl::Status AllReduceSum(float* data, int64_t count) override {
    std::vector<float> sum(count, 0.0f);
    group_->Exchange(rank_, data, [&](const std::vector<const void*>& all) {
      for (const void* p : all) {
        for (int64_t i = 0; i < count; ++i) sum[i] += static_cast<const float*>(p)[i];
      }
    });
    std::memcpy(data, sum.data(), count * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status AllGather(const float* send, int64_t count, float* recv) override {
    return Gather(send, count, recv, rank_);
  }
  absl::Status Gather(const float* send, int64_t count, float* recv, int root) override {
    group_->Exchange(rank_, send, [&](const std::vector<const void*>& all) {
      if (rank_ != root) return;
      for (int r = 0; r < kRanks; ++r) {
        std::memcpy(recv + r * count, all[r], count * sizeof(float));
      }
    });
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, int64_t, int, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    group_->Barrier();
    return absl::OkStatus();
  }
  absl::Duration timeout() const override { return absl::Seconds(60); }

 private:
  ThreadGroup* const group_;
  const int rank_;
};

ModelConfig Config() {
  ModelConfig c = SyntheticConfig("tiny").value();
  c.head_dim = 64;  // one the CUDA attention kernels take
  return c;
}

std::unique_ptr<CudaDevice> Device(int gpu, bool cuda_graphs = false) {
  CudaDeviceOptions o;
  o.device = gpu;
  o.storage = StorageType::kF32;
  o.cuda_graphs = cuda_graphs;
  o.graph_batch_sizes = {1, 2, 4, 8};
  o.abort_on_error = false;
  o.max_num_batched_tokens = 64;
  o.max_num_seqs = 8;
  o.max_context_len = 64;
  o.kv_block_size = kBlockSize;
  absl::StatusOr<std::unique_ptr<CudaDevice>> d = CreateCudaDevice(o);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

StepPlan::Seq Seq(int start, int tokens, bool sample, std::vector<int32_t> table) {
  StepPlan::Seq s;
  s.start_position = start;
  s.num_tokens = tokens;
  s.sample = sample;
  s.block_table = std::move(table);
  return s;
}

// A prefill of two prompts, a decode of both, and a mixed step (both decode beside a third
// prompt's chunk).
std::vector<StepPlan> Steps() {
  std::vector<StepPlan> steps(3);
  steps[0].seqs = {Seq(0, 5, true, {0, 1}), Seq(0, 3, true, {2})};
  steps[0].token_ids = {11, 200, 37, 129, 128, 5, 250, 130};
  steps[1].seqs = {Seq(5, 1, true, {0, 1}), Seq(3, 1, true, {2})};
  steps[1].token_ids = {140, 7};
  steps[2].seqs = {Seq(6, 1, true, {0, 1}), Seq(4, 1, true, {2, 3}), Seq(0, 4, true, {4})};
  steps[2].token_ids = {129, 64, 3, 99, 257, 128};
  return steps;
}

std::vector<std::vector<float>> WholeModel() {
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(
      SyntheticWeights(Config(), kSyntheticSeed), KvCacheShape{8, kBlockSize}, nullptr, Device(0));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  std::vector<std::vector<float>> logits;
  for (const StepPlan& step : Steps()) {
    logits.emplace_back();
    (*model)->Forward(step, &logits.back());
  }
  return logits;
}

// Two ranks on `gpus`, their collectives through `device_groups` (null: host staging).
std::vector<std::vector<float>> Sharded(const std::vector<int>& gpus,
                                        const std::vector<cluster::DeviceCommunicator*>& nccl) {
  ThreadGroup group;
  std::vector<std::unique_ptr<ThreadCommunicator>> hosts;
  std::vector<std::unique_ptr<LlamaModel>> models;
  for (int r = 0; r < kRanks; ++r) {
    hosts.push_back(std::make_unique<ThreadCommunicator>(&group, r));
    absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(
        SyntheticWeights(Config(), kSyntheticSeed, {r, kRanks}), KvCacheShape{8, kBlockSize},
        hosts.back().get(), Device(gpus[r]), nccl[r]);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    models.push_back(std::move(*model));
  }
  const std::vector<StepPlan> steps = Steps();
  std::thread follower([&] {
    for (const StepPlan& step : steps) models[1]->Follow(step);
  });
  std::vector<std::vector<float>> logits(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) models[0]->Forward(steps[i], &logits[i]);
  follower.join();
  for (const auto& m : models) {
    EXPECT_TRUE(static_cast<CudaDevice&>(m->device()).status().ok())
        << static_cast<CudaDevice&>(m->device()).status();
  }
  return logits;
}

void ExpectNear(const std::vector<std::vector<float>>& got,
                const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "step " << i;
    for (size_t j = 0; j < want[i].size(); ++j) {
      ASSERT_NEAR(got[i][j], want[i][j], 1e-3) << "step " << i << " value " << j;
    }
  }
}

using ::carpool::testing::FollowerThread;

struct GreedyRun {
  std::vector<std::vector<int32_t>> tokens;  // per sequence
  std::vector<std::vector<float>> logits;    // per step, the leader's
  int graphs_captured = 0;                   // per rank, summed
  int64_t graph_replays = 0;
};

// Two ranks on GPUs 0 and 1 over `nccl`: two prompts prefilled, then six greedy decode steps
// of both (batch 2, a graph size: recorded once, replayed after, where graphs are on).
// With `device_sampling` the leader samples greedily on its device (ForwardAndSample) and
// only the tokens come back (no logits).
GreedyRun ShardedGreedy(const std::vector<cluster::DeviceCommunicator*>& nccl, bool graphs,
                        bool device_sampling = false) {
  ThreadGroup group;
  std::vector<std::unique_ptr<ThreadCommunicator>> hosts;
  std::vector<std::unique_ptr<LlamaModel>> models;
  for (int r = 0; r < kRanks; ++r) {
    hosts.push_back(std::make_unique<ThreadCommunicator>(&group, r));
    absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(
        SyntheticWeights(Config(), kSyntheticSeed, {r, kRanks}), KvCacheShape{8, kBlockSize},
        hosts.back().get(), Device(r, graphs), nccl[r]);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    models.push_back(std::move(*model));
  }
  FollowerThread follower([&](const StepPlan& step) { models[1]->Follow(step); });
  const int64_t vocab = Config().vocab_size;
  const std::vector<std::vector<int32_t>> tables = {{0, 1, 2}, {3, 4, 5}};
  GreedyRun run;
  run.tokens.resize(2);
  StepPlan step;
  step.seqs = {Seq(0, 5, true, tables[0]), Seq(0, 3, true, tables[1])};
  step.token_ids = {11, 200, 37, 129, 128, 5, 250, 130};
  std::vector<int> length = {5, 3};
  for (int k = 0; k < 7; ++k) {
    if (k > 0) {
      step = StepPlan();
      for (int i = 0; i < 2; ++i) {
        step.seqs.push_back(Seq(length[i], 1, true, tables[i]));
        step.token_ids.push_back(run.tokens[i].back());
        ++length[i];
      }
    }
    follower.Push(step);
    if (device_sampling) {
      SamplingParams greedy;
      greedy.temperature = 0.0f;
      std::vector<SampleRequest> requests(2);
      for (int i = 0; i < 2; ++i) {
        requests[i].params = &greedy;
        requests[i].output_tokens = run.tokens[i];
        requests[i].position = length[i];
      }
      EXPECT_TRUE(models[0]->CanSampleOnDevice());
      std::vector<SampleResult> samples;
      models[0]->ForwardAndSample(step, requests, &samples);
      if (samples.size() != 2) {
        ADD_FAILURE() << "step " << k << ": " << samples.size() << " samples";
        break;
      }
      for (int i = 0; i < 2; ++i) run.tokens[i].push_back(samples[i].token);
      continue;
    }
    run.logits.emplace_back();
    models[0]->Forward(step, &run.logits.back());
    if (run.logits.back().size() != static_cast<size_t>(2 * vocab)) {
      ADD_FAILURE() << "step " << k << ": " << run.logits.back().size() << " logits";
      break;
    }
    for (int i = 0; i < 2; ++i) {
      const float* row = run.logits.back().data() + i * vocab;
      run.tokens[i].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
  }
  follower.Finish();
  for (const auto& m : models) {
    auto& d = static_cast<CudaDevice&>(m->device());
    EXPECT_TRUE(d.status().ok()) << d.status();
    run.graphs_captured += d.graphs_captured();
    run.graph_replays += d.graph_replays();
  }
  return run;
}

class CudaTensorParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaTensorParallelTest, TwoRanksOnOneGpuStagedThroughTheHost) {
  const std::vector<std::vector<float>> want = WholeModel();
  ExpectNear(Sharded({0, 0}, {nullptr, nullptr}), want);
}

#ifdef CARPOOL_HAVE_NCCL
TEST_F(CudaTensorParallelTest, TwoGpusOverNcclOnTheDevicesStreams) {
  const int gpus = kernels::cuda::DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one), found " << gpus;
  const std::vector<std::vector<float>> want = WholeModel();
  auto comms = cluster::NcclCommunicator::CreateLocal({0, 1}, absl::Seconds(60));
  ASSERT_TRUE(comms.ok()) << comms.status();
  ExpectNear(Sharded({0, 1}, {(*comms)[0].get(), (*comms)[1].get()}), want);
}

// The decode steps recorded as CUDA graphs with their NCCL all-reduces and all-gather inside,
// replayed on both ranks: the same tokens as running every kernel and collective eagerly.
TEST_F(CudaTensorParallelTest, TwoGpusOverNcclGraphsOnAndOffGiveTheSameTokens) {
  const int gpus = kernels::cuda::DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one), found " << gpus;
  auto comms = cluster::NcclCommunicator::CreateLocal({0, 1}, absl::Seconds(60));
  ASSERT_TRUE(comms.ok()) << comms.status();
  const std::vector<cluster::DeviceCommunicator*> nccl = {(*comms)[0].get(), (*comms)[1].get()};
  const GreedyRun eager = ShardedGreedy(nccl, /*graphs=*/false);
  const GreedyRun graphs = ShardedGreedy(nccl, /*graphs=*/true);
  EXPECT_EQ(eager.graphs_captured, 0);
  EXPECT_EQ(graphs.graphs_captured, kRanks);  // batch 2, once per rank
  EXPECT_EQ(graphs.graph_replays, kRanks * 5);
  EXPECT_EQ(graphs.tokens, eager.tokens);
  ExpectNear(graphs.logits, eager.logits);
}

// The leader samples on its device from the gathered, interleaved logits (graphs on): the
// same greedy tokens as the host's argmax over the logits it copied.
TEST_F(CudaTensorParallelTest, TwoGpusOverNcclLeaderSamplesOnItsDevice) {
  const int gpus = kernels::cuda::DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one), found " << gpus;
  auto comms = cluster::NcclCommunicator::CreateLocal({0, 1}, absl::Seconds(60));
  ASSERT_TRUE(comms.ok()) << comms.status();
  const std::vector<cluster::DeviceCommunicator*> nccl = {(*comms)[0].get(), (*comms)[1].get()};
  const GreedyRun host = ShardedGreedy(nccl, /*graphs=*/true);
  const GreedyRun device = ShardedGreedy(nccl, /*graphs=*/true, /*device_sampling=*/true);
  EXPECT_GT(device.graph_replays, 0);
  EXPECT_EQ(device.tokens, host.tokens);
}
#endif

}  // namespace
}  // namespace carpool::worker
