// Tensor parallelism's collectives on device buffers (LlamaModel with a
// cluster::DeviceCommunicator), on the CPU: two ranks over threads, each on a fake GPU (the CPU
// device behind a stream handle and without host views, so the model treats its memory as a
// GPU's), with a device communicator that records every call (op, buffer, count, element type,
// stream, in order) and sums for real. Checked for prefill, decode and mixed steps: both ranks
// make the same calls in the same order; every call is on the rank's device stream, on the array
// the kernel before it wrote and the kernel after it reads; the logits equal the host-staged
// path's bit for bit (two-term sums are the same either way) and the whole model's closely; and
// without a device communicator the model stages through the host communicator and makes no
// device call.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/llama_model.h"
#include "worker/model/model_device.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

// One event of a rank, in the order the model caused it: a device collective, a wait, or a
// kernel's write or read of an array that a collective touches.
struct Event {
  std::string op;           // "all_reduce", "all_gather", "wait", "step", or "<kernel>.<arg>"
  const void* buffer = nullptr;
  const void* recv = nullptr;  // all_gather
  int64_t count = 0;
  cluster::DeviceElementType type = cluster::DeviceElementType::kF32;
  const void* stream = nullptr;
};

// Rendezvous of the ranks' threads: each posts a pointer, one of them combines all of them.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), posted_(size) {}
  int size() const { return size_; }

  // Every rank posts `mine`; once all have, each runs `use` on all the posted pointers; then all
  // leave together (so no pointer dies while another rank reads it).
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
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<const void*> posted_;
};

void Sum(ThreadGroup* group, int rank, float* data, int64_t count) {
  std::vector<float> sum(count, 0.0f);
  group->Exchange(rank, data, [&](const std::vector<const void*>& all) {
    for (const void* p : all) {
      for (int64_t i = 0; i < count; ++i) sum[i] += static_cast<const float*>(p)[i];
    }
  });
  std::copy(sum.begin(), sum.end(), data);
}

void Concatenate(ThreadGroup* group, int rank, const float* send, int64_t count, float* recv) {
  group->Exchange(rank, send, [&](const std::vector<const void*>& all) {
    if (recv == nullptr) return;
    for (size_t r = 0; r < all.size(); ++r) {
      std::memcpy(recv + r * count, all[r], count * sizeof(float));
    }
  });
}

// The host communicator: step plans go nowhere (the test hands each step to every rank itself),
// sums and gathers are real and counted.
class HostGroup : public cluster::Communicator {
 public:
  HostGroup(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduceSum(float* data, int64_t count) override {
    ++all_reduces;
    Sum(group_, rank_, data, count);
    return absl::OkStatus();
  }
  absl::Status AllGather(const float* send, int64_t count, float* recv) override {
    ++gathers;
    Concatenate(group_, rank_, send, count, recv);
    return absl::OkStatus();
  }
  absl::Status Gather(const float* send, int64_t count, float* recv, int root) override {
    ++gathers;
    Concatenate(group_, rank_, send, count, rank_ == root ? recv : nullptr);
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, int64_t, int, absl::Duration) override {
    ++broadcasts;
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    group_->Barrier();
    return absl::OkStatus();
  }
  absl::Duration timeout() const override { return absl::Seconds(60); }

  int all_reduces = 0;
  int gathers = 0;
  int broadcasts = 0;

 private:
  ThreadGroup* const group_;
  const int rank_;
};

// The device communicator under test's eyes: records each call in the rank's event log and
// computes it on the (host) memory of the fake GPU.
class RecordingDeviceGroup : public cluster::DeviceCommunicator {
 public:
  RecordingDeviceGroup(ThreadGroup* group, int rank, std::vector<Event>* log)
      : group_(group), rank_(rank), log_(log) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduceSumOnStream(void* data, int64_t count, cluster::DeviceElementType type,
                                    void* stream) override {
    log_->push_back({"all_reduce", data, nullptr, count, type, stream});
    if (type != cluster::DeviceElementType::kF32) {
      return absl::InvalidArgumentError("the fake GPU holds fp32");
    }
    Sum(group_, rank_, static_cast<float*>(data), count);
    return absl::OkStatus();
  }
  absl::Status AllGatherOnStream(const void* send, int64_t count, cluster::DeviceElementType type,
                                 void* recv, void* stream) override {
    log_->push_back({"all_gather", send, recv, count, type, stream});
    Concatenate(group_, rank_, static_cast<const float*>(send), count, static_cast<float*>(recv));
    return absl::OkStatus();
  }
  absl::Status WaitStream(void* stream) override {
    log_->push_back({"wait", nullptr, nullptr, 0, cluster::DeviceElementType::kF32, stream});
    return absl::OkStatus();
  }

 private:
  ThreadGroup* const group_;
  const int rank_;
  std::vector<Event>* const log_;
};

// The CPU device dressed as a GPU: a stream handle, no host views (so the model copies to and
// from the host as it does on a GPU), and every write and read of an activation logged.
class FakeGpu : public ModelDevice {
 public:
  explicit FakeGpu(std::vector<Event>* log) : cpu_(CreateCpuDevice()), log_(log) {}

  std::string name() const override { return "fake-gpu"; }
  StorageType storage_type() const override { return cpu_->storage_type(); }
  absl::StatusOr<DeviceArray> Weight(const Tensor& host) override { return cpu_->Weight(host); }
  absl::StatusOr<DeviceArray> NormWeight(const Tensor& host) override {
    return cpu_->NormWeight(host);
  }
  absl::StatusOr<DeviceArray> Allocate(int64_t numel) override { return cpu_->Allocate(numel); }
  absl::StatusOr<DeviceArray> AllocateKv(int64_t numel) override {
    return cpu_->AllocateKv(numel);
  }
  void Reserve(DeviceArray* a, int64_t numel) override { cpu_->Reserve(a, numel); }
  int64_t FreeBytes() const override { return cpu_->FreeBytes(); }
  void SetRope(absl::Span<const float> inv_freq, absl::Span<const float> local) override {
    cpu_->SetRope(inv_freq, local);
  }
  void SetStep(const StepView& step) override {
    Log("step", nullptr, static_cast<int64_t>(step.token_ids.size()));
    steps.push_back({static_cast<int64_t>(step.token_ids.size()),
                     static_cast<int64_t>(step.sample_rows.size()), step.decode_only});
    cpu_->SetStep(step);
  }
  void EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) override {
    cpu_->EmbeddingGather(table, h, out);
  }
  void RmsNorm(const DeviceArray& x, const DeviceArray& w, float eps, int64_t rows, int64_t h,
               DeviceArray* out) override {
    Log("RmsNorm.x", x.data());
    cpu_->RmsNorm(x, w, eps, rows, h, out);
  }
  void AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& w, float eps,
                  int64_t rows, int64_t h, DeviceArray* out) override {
    Log("AddRmsNorm.x", x.data());
    cpu_->AddRmsNorm(x, residual, w, eps, rows, h, out);
  }
  void Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias, int64_t m,
              int64_t n, int64_t k, DeviceArray* y) override {
    cpu_->Linear(x, w, bias, m, n, k, y);
    Log("Linear.y", y->data(), m * n);
  }
  void Rope(int num_heads, int head_dim, bool local, DeviceArray* x) override {
    cpu_->Rope(num_heads, head_dim, local, x);
  }
  void HeadRmsNorm(const DeviceArray& w, float eps, int64_t rows, int num_heads, int head_dim,
                   DeviceArray* x) override {
    cpu_->HeadRmsNorm(w, eps, rows, num_heads, head_dim, x);
  }
  void SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
               DeviceArray* out) override {
    cpu_->SiluMul(gate, up, rows, inter, out);
  }
  void GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
                   DeviceArray* out) override {
    cpu_->GeluTanhMul(gate, up, rows, inter, out);
  }
  void SoftCap(float cap, int64_t n, DeviceArray* x) override { cpu_->SoftCap(cap, n, x); }
  void Scale(float factor, int64_t n, DeviceArray* x) override { cpu_->Scale(factor, n, x); }
  void WriteKv(const DeviceArray& k, const DeviceArray& v, const kernels::KvCacheLayout& layout,
               DeviceArray* key_cache, DeviceArray* value_cache) override {
    cpu_->WriteKv(k, v, layout, key_cache, value_cache);
  }
  void Attention(const DeviceArray& q, const DeviceArray& key_cache,
                 const DeviceArray& value_cache, const kernels::KvCacheLayout& layout,
                 int num_heads, const AttentionOptions& options, DeviceArray* out) override {
    cpu_->Attention(q, key_cache, value_cache, layout, num_heads, options, out);
  }
  void GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) override {
    cpu_->GatherRows(x, h, out);
  }
  void* stream() const override { return const_cast<int*>(&stream_tag_); }
  void ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) override {
    Log("ToHost.x", x.data(), n);
    cpu_->ToHost(x, offset, n, host);
  }
  void FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) override {
    cpu_->FromHost(host, offset, n, x);
    Log("FromHost.x", x->data(), n);
  }

  struct Step {
    int64_t tokens, samples;
    bool decode_only;
  };
  std::vector<Step> steps;

 private:
  void Log(const char* op, const void* buffer, int64_t count = 0) {
    log_->push_back({op, buffer, nullptr, count, cluster::DeviceElementType::kF32, nullptr});
  }

  std::unique_ptr<ModelDevice> cpu_;
  std::vector<Event>* const log_;
  int stream_tag_ = 0;
};

StepPlan::Seq Seq(int64_t id, int start, int tokens, bool sample, std::vector<int32_t> table) {
  StepPlan::Seq s;
  s.seq_id = id;
  s.start_position = start;
  s.num_tokens = tokens;
  s.sample = sample;
  s.block_table = std::move(table);
  return s;
}

// Prefill of two prompts (5 and 3 tokens), a decode step of both, a mixed step (both decode
// while a third prompt's first chunk, unsampled, comes in), and the third's last chunk with the
// first two decoding again. Blocks of 4 tokens.
std::vector<StepPlan> Steps() {
  std::vector<StepPlan> steps(4);
  steps[0].seqs = {Seq(0, 0, 5, true, {0, 1}), Seq(1, 0, 3, true, {2})};
  steps[0].token_ids = {11, 200, 37, 129, 128, 5, 250, 130};
  steps[1].seqs = {Seq(0, 5, 1, true, {0, 1}), Seq(1, 3, 1, true, {2})};
  steps[1].token_ids = {140, 7};
  steps[2].seqs = {Seq(0, 6, 1, true, {0, 1}), Seq(1, 4, 1, true, {2, 3}),
                   Seq(2, 0, 4, false, {4})};
  steps[2].token_ids = {129, 64, 3, 99, 257, 128};
  steps[3].seqs = {Seq(0, 7, 1, true, {0, 1}), Seq(1, 5, 1, true, {2, 3}),
                   Seq(2, 4, 3, true, {4, 5})};
  steps[3].token_ids = {12, 13, 201, 202, 0};
  return steps;
}

struct Rank {
  std::vector<Event> log;
  std::unique_ptr<HostGroup> host;
  std::unique_ptr<RecordingDeviceGroup> device_group;
  FakeGpu* device = nullptr;
  std::unique_ptr<LlamaModel> model;
};

constexpr int kRanks = 2;
constexpr char kModel[] = "synthetic:tiny";

// Two ranks' models; with device collectives unless `staged`.
std::vector<std::unique_ptr<Rank>> MakeRanks(ThreadGroup* group, bool staged) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->host = std::make_unique<HostGroup>(group, r);
    rank->device_group = std::make_unique<RecordingDeviceGroup>(group, r, &rank->log);
    auto device = std::make_unique<FakeGpu>(&rank->log);
    rank->device = device.get();
    absl::StatusOr<std::unique_ptr<LlamaWeights>> weights = LoadWeights(kModel, {r, kRanks});
    EXPECT_TRUE(weights.ok()) << weights.status();
    if (!weights.ok()) return {};
    absl::StatusOr<std::unique_ptr<LlamaModel>> model =
        LlamaModel::Create(std::move(*weights), KvCacheShape{8, 4}, rank->host.get(),
                           std::move(device), staged ? nullptr : rank->device_group.get());
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return {};
    rank->model = std::move(*model);
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

// Runs every step on both ranks (the follower on its own thread); the leader's logits per step.
std::vector<std::vector<float>> RunSteps(const std::vector<std::unique_ptr<Rank>>& ranks) {
  const std::vector<StepPlan> steps = Steps();
  std::thread follower([&] {
    for (const StepPlan& step : steps) ranks[1]->model->Follow(step);
  });
  std::vector<std::vector<float>> logits(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) ranks[0]->model->Forward(steps[i], &logits[i]);
  follower.join();
  return logits;
}

TEST(TensorParallelDeviceCollectivesTest, EveryRankMakesTheSameCallsOnTheArraysItComputes) {
  ThreadGroup group(kRanks);
  std::vector<std::unique_ptr<Rank>> ranks = MakeRanks(&group, /*staged=*/false);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  const std::vector<std::vector<float>> logits = RunSteps(ranks);

  const ModelConfig& c = ranks[0]->model->config();
  const int64_t h = c.hidden_size;
  const int64_t local_vocab = c.vocab_size / kRanks;
  // The steps as the devices saw them: prefill, decode, mixed, mixed.
  const std::vector<StepPlan> steps = Steps();
  for (const auto& rank : ranks) {
    ASSERT_EQ(rank->device->steps.size(), steps.size());
    EXPECT_FALSE(rank->device->steps[0].decode_only);
    EXPECT_TRUE(rank->device->steps[1].decode_only);
    EXPECT_FALSE(rank->device->steps[2].decode_only);
  }

  // The collectives only, per rank: the same ops, counts and types in the same order.
  std::vector<std::vector<const Event*>> calls(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    for (const Event& e : ranks[r]->log) {
      if (e.op == "all_reduce" || e.op == "all_gather" || e.op == "wait") calls[r].push_back(&e);
    }
  }
  ASSERT_EQ(calls[0].size(), calls[1].size());
  for (size_t i = 0; i < calls[0].size(); ++i) {
    EXPECT_EQ(calls[0][i]->op, calls[1][i]->op) << "call " << i;
    EXPECT_EQ(calls[0][i]->count, calls[1][i]->count) << "call " << i;
    EXPECT_EQ(calls[0][i]->type, calls[1][i]->type) << "call " << i;
  }
  for (int r = 0; r < kRanks; ++r) {
    for (const Event* e : calls[r]) EXPECT_EQ(e->stream, ranks[r]->device->stream());
  }

  // Per step: the embedding's sum and two per layer over [T, h], the logits' all-gather over
  // [samples, vocab / ranks] when the step samples, then one wait for the stream.
  std::vector<std::string> want_ops;
  std::vector<int64_t> want_counts;
  for (const StepPlan& step : steps) {
    const int64_t t = step.num_tokens();
    int64_t s = 0;
    for (const StepPlan::Seq& q : step.seqs) s += q.sample ? 1 : 0;
    for (int i = 0; i < 1 + 2 * c.num_layers; ++i) {
      want_ops.push_back("all_reduce");
      want_counts.push_back(t * h);
    }
    if (s > 0) {
      want_ops.push_back("all_gather");
      want_counts.push_back(s * local_vocab);
    }
    want_ops.push_back("wait");
    want_counts.push_back(0);
  }
  ASSERT_EQ(calls[0].size(), want_ops.size());
  for (size_t i = 0; i < want_ops.size(); ++i) {
    EXPECT_EQ(calls[0][i]->op, want_ops[i]) << "call " << i;
    EXPECT_EQ(calls[0][i]->count, want_counts[i]) << "call " << i;
  }

  // Each sum is over the array the kernel before it wrote (the embedding's upload, o_proj's or
  // down_proj's output) and that the next kernel reads; the leader copies the gathered logits
  // to the host after the wait, a follower reads nothing.
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<Event>& log = ranks[r]->log;
    for (size_t i = 0; i < log.size(); ++i) {
      const Event& e = log[i];
      if (e.op == "all_reduce") {
        ASSERT_GT(i, 0u);
        const Event& before = log[i - 1];
        EXPECT_TRUE(before.op == "Linear.y" || before.op == "FromHost.x") << before.op;
        EXPECT_EQ(before.buffer, e.buffer) << "rank " << r << " event " << i;
        EXPECT_GE(before.count, e.count);
        ASSERT_LT(i + 1, log.size());
        const Event& after = log[i + 1];
        EXPECT_TRUE(after.op == "AddRmsNorm.x" || after.op == "RmsNorm.x") << after.op;
        EXPECT_EQ(after.buffer, e.buffer) << "rank " << r << " event " << i;
      } else if (e.op == "all_gather") {
        EXPECT_EQ(log[i - 1].op, "Linear.y");  // the head, on the rank's vocabulary slice
        EXPECT_EQ(log[i - 1].buffer, e.buffer);
        ASSERT_LT(i + 1, log.size());
        EXPECT_EQ(log[i + 1].op, "wait");
        if (r == 0) {
          ASSERT_LT(i + 2, log.size());
          EXPECT_EQ(log[i + 2].op, "ToHost.x");
          EXPECT_EQ(log[i + 2].buffer, e.recv);
          EXPECT_EQ(log[i + 2].count, kRanks * e.count);
        } else if (i + 2 < log.size()) {
          EXPECT_EQ(log[i + 2].op, "step");
        }
      }
    }
    // Nothing went through host memory over the host communicator but the step plans.
    EXPECT_EQ(ranks[r]->host->all_reduces, 0);
    EXPECT_EQ(ranks[r]->host->gathers, 0);
  }
  EXPECT_GT(ranks[0]->host->broadcasts, 0);
  EXPECT_EQ(ranks[0]->model->collective_times().all_reduces,
            static_cast<int64_t>(steps.size()) * (1 + 2 * c.num_layers));
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_FALSE(logits[i].empty());
}

TEST(TensorParallelDeviceCollectivesTest, SameLogitsAsHostStagingAndTheWholeModel) {
  ThreadGroup group(kRanks);
  std::vector<std::unique_ptr<Rank>> device = MakeRanks(&group, /*staged=*/false);
  ASSERT_EQ(device.size(), static_cast<size_t>(kRanks));
  const std::vector<std::vector<float>> got = RunSteps(device);

  // --tp-transport mpi: the same model through host memory, and no device collective.
  std::vector<std::unique_ptr<Rank>> staged = MakeRanks(&group, /*staged=*/true);
  ASSERT_EQ(staged.size(), static_cast<size_t>(kRanks));
  const std::vector<std::vector<float>> want = RunSteps(staged);
  const int layers = staged[0]->model->config().num_layers;
  for (int r = 0; r < kRanks; ++r) {
    for (const Event& e : staged[r]->log) {
      EXPECT_TRUE(e.op != "all_reduce" && e.op != "all_gather" && e.op != "wait") << e.op;
    }
    EXPECT_EQ(staged[r]->host->all_reduces, 4 * (1 + 2 * layers));
    EXPECT_EQ(staged[r]->host->gathers, 4);  // every step samples
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "step " << i;
    EXPECT_EQ(got[i], want[i]) << "step " << i;
  }

  // The whole model on the CPU: the same logits but for the order of the sums.
  absl::StatusOr<std::unique_ptr<LlamaWeights>> weights = LoadWeights(kModel);
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<LlamaModel>> whole =
      LlamaModel::Create(std::move(*weights), KvCacheShape{8, 4});
  ASSERT_TRUE(whole.ok()) << whole.status();
  const std::vector<StepPlan> steps = Steps();
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<float> logits;
    (*whole)->Forward(steps[i], &logits);
    ASSERT_EQ(logits.size(), got[i].size()) << "step " << i;
    for (size_t j = 0; j < logits.size(); ++j) {
      ASSERT_NEAR(got[i][j], logits[j], 1e-4) << "step " << i << " value " << j;
    }
  }
}

TEST(TensorParallelDeviceCollectivesTest, DeviceCollectivesNeedADeviceWithAStream) {
  ThreadGroup group(kRanks);
  HostGroup host(&group, 0);
  std::vector<Event> log;
  RecordingDeviceGroup device_group(&group, 0, &log);
  absl::StatusOr<std::unique_ptr<LlamaWeights>> weights = LoadWeights(kModel, {0, kRanks});
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(
      std::move(*weights), KvCacheShape{8, 4}, &host, CreateCpuDevice(), &device_group);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("--tp-transport mpi"), std::string::npos)
      << model.status();

  // A device group that is not the tensor-parallel group's rank.
  RecordingDeviceGroup other_rank(&group, 1, &log);
  weights = LoadWeights(kModel, {0, kRanks});
  ASSERT_TRUE(weights.ok()) << weights.status();
  model = LlamaModel::Create(std::move(*weights), KvCacheShape{8, 4}, &host,
                             std::make_unique<FakeGpu>(&log), &other_rank);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(log.empty());
}

}  // namespace
}  // namespace carpool::worker
