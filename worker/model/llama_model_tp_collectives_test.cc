// Tensor parallelism's collectives on device buffers (LlamaModel with a
// cluster::DeviceCommunicator), on the CPU: two ranks over threads, each on a fake GPU (the CPU
// device behind a stream handle and without host views, so the model treats its memory as a
// GPU's), with a device communicator that records every call (op, buffer, count, element type,
// stream, in order) and sums for real. Checked for prefill, decode and mixed steps: both ranks
// make the same calls in the same order; every call is on the rank's device stream, on the array
// the kernel before it wrote and the kernel after it reads; the logits equal the host-staged
// path's bit for bit (two-term sums are the same either way) and the whole model's closely; and
// without a device communicator the model stages through the host communicator and makes no
// device call. With fake CUDA graphs (the fake GPU pads decode steps and records and replays them
// as CudaDevice::RunStep does, the communicator's calls recorded into the graph while it
// captures): every captured step records the collectives its eager run made, on every rank; no
// host wait or transfer happens while recording; replays run the recorded collectives; greedy
// tokens equal those without graphs and of the whole model; host-staged steps are never padded
// nor recorded.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/follower_thread.h"
#include "worker/model/llama_model.h"
#include "worker/model/model_device.h"
#include "worker/sampler/sampler.h"
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
  // Fake CUDA graphs: made while the stream records (enqueued into the graph, not run), or run
  // by a graph's replay.
  bool captured = false;
  bool replayed = false;
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

// What a device communicator sees of a fake GPU's stream: whether it is recording a graph
// (work enqueued then goes into the graph and runs only when it is replayed, as
// cudaStreamBeginCapture makes NCCL's kernels do), and the graph's work list.
class FakeStream {
 public:
  virtual ~FakeStream() = default;
  virtual bool capturing() const = 0;
  // Enqueues `work` on the stream: runs it now, or records it into the graph being captured.
  virtual void Enqueue(std::function<void()> work) = 0;
};

// The device communicator under test's eyes: records each call in the rank's event log and
// computes it on the (host) memory of the fake GPU.
class RecordingDeviceGroup : public cluster::DeviceCommunicator {
 public:
  RecordingDeviceGroup(ThreadGroup* group, int rank, std::vector<Event>* log)
      : group_(group), rank_(rank), log_(log) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  // The fake GPU whose stream the calls are enqueued on (nullptr: every call runs at once).
  void set_stream(FakeStream* stream) { fake_stream_ = stream; }

  absl::Status AllReduceSumOnStream(void* data, int64_t count, cluster::DeviceElementType type,
                                    void* stream) override {
    if (type != cluster::DeviceElementType::kF32) {
      return absl::InvalidArgumentError("the fake GPU holds fp32");
    }
    const Event e{"all_reduce", data, nullptr, count, type, stream};
    OnStream(e, [this, data, count] { Sum(group_, rank_, static_cast<float*>(data), count); });
    return absl::OkStatus();
  }
  absl::Status AllGatherOnStream(const void* send, int64_t count, cluster::DeviceElementType type,
                                 void* recv, void* stream) override {
    const Event e{"all_gather", send, recv, count, type, stream};
    OnStream(e, [this, send, count, recv] {
      Concatenate(group_, rank_, static_cast<const float*>(send), count,
                  static_cast<float*>(recv));
    });
    return absl::OkStatus();
  }
  absl::Status WaitStream(void* stream) override {
    Event e{"wait", nullptr, nullptr, 0, cluster::DeviceElementType::kF32, stream};
    // cudaStreamSynchronize on a capturing stream is an error (and would wait for nothing).
    e.captured = fake_stream_ != nullptr && fake_stream_->capturing();
    log_->push_back(e);
    if (e.captured) return absl::FailedPreconditionError("WaitStream inside a capture");
    return absl::OkStatus();
  }

 private:
  // Logs the call; runs it now, or records it into the capture (logged again, as replayed, each
  // time a replay runs it).
  void OnStream(Event e, std::function<void()> run) {
    if (fake_stream_ == nullptr || !fake_stream_->capturing()) {
      log_->push_back(e);
      run();
      return;
    }
    e.captured = true;
    log_->push_back(e);
    e.captured = false;
    e.replayed = true;
    fake_stream_->Enqueue([this, e, run] {
      log_->push_back(e);
      run();
    });
  }

  ThreadGroup* const group_;
  const int rank_;
  std::vector<Event>* const log_;
  FakeStream* fake_stream_ = nullptr;
};

// How the fake GPU runs decode steps: padded to these batch sizes (empty: not padded), and
// recorded and replayed as graphs (capture) or run eagerly every time.
struct FakeGraphs {
  std::vector<int> batch_sizes;
  bool capture = false;
};

// The CPU device dressed as a GPU: a stream handle, no host views (so the model copies to and
// from the host as it does on a GPU), and every write and read of an activation logged.
//
// Graphs are modelled on CudaDevice::RunStep: a decode-only step padded to one of the batch
// sizes, every row sampled, runs `body` eagerly the first time its size is seen, then records
// `body` as that size's graph (logged as begin_capture / end_capture: nothing runs while
// recording, every kernel and collective is kept with the addresses it was given) and from
// then on replays the graph (logged as replay) without calling `body`. A host transfer, a
// reallocation or a stream wait while recording is an error (capture_errors), as on a GPU;
// a reallocation drops every graph.
class FakeGpu : public ModelDevice, public FakeStream {
 public:
  explicit FakeGpu(std::vector<Event>* log, FakeGraphs graphs = {})
      : cpu_(CreateCpuDevice()), log_(log), graphs_(std::move(graphs)) {}

  bool capturing() const override { return capturing_; }
  void Enqueue(std::function<void()> work) override {
    if (capturing_) {
      recording_.push_back(std::move(work));
    } else {
      work();
    }
  }
  int GraphBatchSize(int num_seqs) const override {
    for (int size : graphs_.batch_sizes) {
      if (size >= num_seqs) return size;
    }
    return 0;
  }
  void RunStep(const std::function<void()>& body) override {
    if (!graphs_.capture || !graph_step_) {
      body();
      return;
    }
    std::vector<std::function<void()>>& graph = graphs_by_size_[num_seqs_];
    if (!graph.empty()) {
      Log("replay", nullptr, num_seqs_);
      ++replays;
      for (const auto& work : graph) work();
      return;
    }
    body();
    Log("begin_capture", nullptr, num_seqs_);
    capturing_ = true;
    recording_.clear();
    body();
    capturing_ = false;
    Log("end_capture", nullptr, num_seqs_);
    graph = std::move(recording_);
    ++captures;
  }

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
  void Reserve(DeviceArray* a, int64_t numel) override {
    const void* before = a->data();
    cpu_->Reserve(a, numel);
    if (a->data() == before) return;
    if (capturing_) capture_errors.push_back("Reserve moved an array while capturing");
    graphs_by_size_.clear();  // a graph may hold the old address
  }
  int64_t FreeBytes() const override { return cpu_->FreeBytes(); }
  void SetRope(absl::Span<const float> inv_freq, absl::Span<const float> local) override {
    cpu_->SetRope(inv_freq, local);
  }
  void SetStep(const StepView& step) override {
    Log("step", nullptr, static_cast<int64_t>(step.token_ids.size()));
    if (capturing_) capture_errors.push_back("SetStep while capturing");
    steps.push_back({static_cast<int64_t>(step.token_ids.size()),
                     static_cast<int64_t>(step.sample_rows.size()), step.decode_only});
    num_seqs_ = static_cast<int>(step.seqs.size());
    graph_step_ = step.decode_only && step.sample_rows.size() == step.token_ids.size() &&
                  GraphBatchSize(num_seqs_) == num_seqs_;
    cpu_->SetStep(step);
  }
  void EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) override {
    Run([=, table = View(table), out = View(*out), this] { cpu_->EmbeddingGather(*table, h, out.get()); });
  }
  void RmsNorm(const DeviceArray& x, const DeviceArray& w, float eps, int64_t rows, int64_t h,
               DeviceArray* out) override {
    Log("RmsNorm.x", x.data());
    Run([=, x = View(x), w = View(w), out = View(*out), this] {
      cpu_->RmsNorm(*x, *w, eps, rows, h, out.get());
    });
  }
  void AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& w, float eps,
                  int64_t rows, int64_t h, DeviceArray* out) override {
    Log("AddRmsNorm.x", x.data());
    Run([=, x = View(x), residual = View(*residual), w = View(w), out = View(*out), this] {
      cpu_->AddRmsNorm(*x, residual.get(), *w, eps, rows, h, out.get());
    });
  }
  void Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias, int64_t m,
              int64_t n, int64_t k, DeviceArray* y) override {
    Run([=, x = View(x), w = View(w), bias = View(bias), y = View(*y), this] {
      cpu_->Linear(*x, *w, *bias, m, n, k, y.get());
    });
    Log("Linear.y", y->data(), m * n);
  }
  void Rope(int num_heads, int head_dim, bool local, DeviceArray* x) override {
    Run([=, x = View(*x), this] { cpu_->Rope(num_heads, head_dim, local, x.get()); });
  }
  void HeadRmsNorm(const DeviceArray& w, float eps, int64_t rows, int num_heads, int head_dim,
                   DeviceArray* x) override {
    Run([=, w = View(w), x = View(*x), this] {
      cpu_->HeadRmsNorm(*w, eps, rows, num_heads, head_dim, x.get());
    });
  }
  void SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
               DeviceArray* out) override {
    Run([=, gate = View(gate), up = View(up), out = View(*out), this] {
      cpu_->SiluMul(*gate, *up, rows, inter, out.get());
    });
  }
  void GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
                   DeviceArray* out) override {
    Run([=, gate = View(gate), up = View(up), out = View(*out), this] {
      cpu_->GeluTanhMul(*gate, *up, rows, inter, out.get());
    });
  }
  void SoftCap(float cap, int64_t n, DeviceArray* x) override {
    Run([=, x = View(*x), this] { cpu_->SoftCap(cap, n, x.get()); });
  }
  void Scale(float factor, int64_t n, DeviceArray* x) override {
    Run([=, x = View(*x), this] { cpu_->Scale(factor, n, x.get()); });
  }
  void WriteKv(const DeviceArray& k, const DeviceArray& v, const kernels::KvCacheLayout& layout,
               DeviceArray* key_cache, DeviceArray* value_cache) override {
    Run([=, k = View(k), v = View(v), key_cache = View(*key_cache),
         value_cache = View(*value_cache), this] {
      cpu_->WriteKv(*k, *v, layout, key_cache.get(), value_cache.get());
    });
  }
  void Attention(const DeviceArray& q, const DeviceArray& key_cache,
                 const DeviceArray& value_cache, const kernels::KvCacheLayout& layout,
                 int num_heads, const AttentionOptions& options, DeviceArray* out) override {
    Run([=, q = View(q), key_cache = View(key_cache), value_cache = View(value_cache),
         out = View(*out), this] {
      cpu_->Attention(*q, *key_cache, *value_cache, layout, num_heads, options, out.get());
    });
  }
  void GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) override {
    Run([=, x = View(x), out = View(*out), this] { cpu_->GatherRows(*x, h, out.get()); });
  }
  void CopyRows(const DeviceArray& src, int64_t src_offset, int64_t src_stride, int64_t rows,
                int64_t width, int64_t dst_offset, int64_t dst_stride, DeviceArray* dst) override {
    Log("CopyRows.src", src.data(), rows * width);
    Run([=, src = View(src), dst = View(*dst), this] {
      cpu_->CopyRows(*src, src_offset, src_stride, rows, width, dst_offset, dst_stride,
                     dst.get());
    });
    Log("CopyRows.dst", dst->data(), rows * width);
  }
  // "The device's sampler": the CPU sampler on the rows the model hands over (so what is
  // checked is which array, rows, vocabulary and requests the model passes).
  bool SamplesOnDevice() const override { return true; }
  void Sample(const DeviceArray& logits, int64_t vocab, absl::Span<const SampleRequest> requests,
              std::vector<SampleResult>* out) override {
    const int64_t n = static_cast<int64_t>(requests.size());
    Log("Sample.logits", logits.data(), n * vocab);
    if (capturing_) capture_errors.push_back("Sample while capturing");
    std::vector<float> rows(n * vocab);
    if (n > 0) cpu_->ToHost(logits, 0, n * vocab, rows.data());
    if (sampler_ == nullptr || sampler_->vocab_size() != vocab) {
      sampler_ = std::make_unique<Sampler>(static_cast<int>(vocab));
    }
    out->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      SampleInput in;
      in.logits = rows.data() + i * vocab;
      in.params = requests[i].params;
      in.prompt_tokens = requests[i].prompt_tokens;
      in.output_tokens = requests[i].output_tokens;
      in.position = requests[i].position;
      (*out)[i] = sampler_->Sample(in);
    }
  }
  void* stream() const override { return const_cast<int*>(&stream_tag_); }
  void ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) override {
    Log("ToHost.x", x.data(), n);
    if (capturing_) capture_errors.push_back("ToHost while capturing");
    cpu_->ToHost(x, offset, n, host);
  }
  void FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) override {
    if (capturing_) capture_errors.push_back("FromHost while capturing");
    cpu_->FromHost(host, offset, n, x);
    Log("FromHost.x", x->data(), n);
  }

  struct Step {
    int64_t tokens, samples;
    bool decode_only;
  };
  std::vector<Step> steps;
  int captures = 0;
  int replays = 0;
  std::vector<std::string> capture_errors;

 private:
  // A kernel's array as the kernel was given it: the same memory (a graph keeps addresses).
  static std::shared_ptr<DeviceArray> View(const DeviceArray& a) {
    return std::make_shared<DeviceArray>(nullptr, a.data(), a.numel(), a.format(), a.bytes());
  }
  // A kernel on the stream.
  void Run(std::function<void()> kernel) { Enqueue(std::move(kernel)); }
  void Log(const char* op, const void* buffer, int64_t count = 0) {
    Event e{op, buffer, nullptr, count, cluster::DeviceElementType::kF32, nullptr};
    e.captured = capturing_;
    log_->push_back(e);
  }

  std::unique_ptr<ModelDevice> cpu_;
  std::vector<Event>* const log_;
  const FakeGraphs graphs_;
  int stream_tag_ = 0;
  bool capturing_ = false;
  bool graph_step_ = false;
  int num_seqs_ = 0;
  std::vector<std::function<void()>> recording_;
  std::map<int, std::vector<std::function<void()>>> graphs_by_size_;
  std::unique_ptr<Sampler> sampler_;
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

// Two ranks' models; with device collectives unless `staged`, on fake GPUs that run decode
// steps as `graphs` says.
std::vector<std::unique_ptr<Rank>> MakeRanks(ThreadGroup* group, bool staged,
                                             const FakeGraphs& graphs = {}) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->host = std::make_unique<HostGroup>(group, r);
    rank->device_group = std::make_unique<RecordingDeviceGroup>(group, r, &rank->log);
    auto device = std::make_unique<FakeGpu>(&rank->log, graphs);
    rank->device = device.get();
    rank->device_group->set_stream(device.get());
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
std::vector<std::vector<float>> RunSteps(const std::vector<std::unique_ptr<Rank>>& ranks,
                                         const std::vector<StepPlan>& steps = Steps()) {
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
        size_t k = i + 1;
        if (r == 0) {
          // The leader interleaves the slices on the device (a copy per rank from the
          // gathered array into one of [samples][vocab]) before the wait, then copies that.
          const void* full = nullptr;
          for (int q = 0; q < kRanks; ++q, k += 2) {
            ASSERT_LT(k + 1, log.size());
            EXPECT_EQ(log[k].op, "CopyRows.src");
            EXPECT_EQ(log[k].buffer, e.recv);
            EXPECT_EQ(log[k].count, e.count);
            EXPECT_EQ(log[k + 1].op, "CopyRows.dst");
            if (q == 0) full = log[k + 1].buffer;
            EXPECT_EQ(log[k + 1].buffer, full);
          }
          ASSERT_LT(k + 1, log.size());
          EXPECT_EQ(log[k].op, "wait");
          EXPECT_EQ(log[k + 1].op, "ToHost.x");
          EXPECT_EQ(log[k + 1].buffer, full);
          EXPECT_EQ(log[k + 1].count, kRanks * e.count);
        } else {
          ASSERT_LT(k, log.size());
          EXPECT_EQ(log[k].op, "wait");
          if (k + 1 < log.size()) {
            EXPECT_EQ(log[k + 1].op, "step");
          }
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

// ---- CUDA graphs over tensor-parallel decode steps

using ::carpool::testing::FollowerThread;

size_t Argmax(const float* row, int64_t n) {
  return static_cast<size_t>(std::max_element(row, row + n) - row);
}

// A greedy run: three prompts (5, 3 and 2 tokens) prefilled together, then three decode steps
// of the first two (batch 2, a graph size) and three of all three (batch 3, padded to 4), every
// token the argmax of the step before's logits. Blocks of 4 tokens.
struct GreedyRun {
  std::vector<std::vector<int32_t>> tokens;  // per sequence, the sampled tokens in order
  std::vector<std::vector<float>> logits;    // per step, the leader's
};

// `forward` computes one step on the leader (and hands it to the followers).
GreedyRun Greedy(int64_t vocab,
                 const std::function<void(const StepPlan&, std::vector<float>*)>& forward) {
  const std::vector<std::vector<int32_t>> prompts = {{11, 200, 37, 129, 128}, {5, 250, 130},
                                                     {64, 3}};
  const std::vector<std::vector<int32_t>> tables = {{0, 1, 6}, {2, 3, 7}, {4, 5}};
  GreedyRun run;
  run.tokens.resize(prompts.size());
  std::vector<int> length(prompts.size(), 0);
  StepPlan prefill;
  for (size_t i = 0; i < prompts.size(); ++i) {
    prefill.seqs.push_back(Seq(static_cast<int64_t>(i), 0, static_cast<int>(prompts[i].size()),
                               true, tables[i]));
    prefill.token_ids.insert(prefill.token_ids.end(), prompts[i].begin(), prompts[i].end());
    length[i] = static_cast<int>(prompts[i].size());
  }
  std::vector<StepPlan> steps = {prefill};
  std::vector<std::vector<size_t>> seqs_of = {{0, 1, 2}};
  for (int k = 0; k < 6; ++k) seqs_of.push_back(k < 3 ? std::vector<size_t>{0, 1}
                                                       : std::vector<size_t>{0, 1, 2});
  for (size_t k = 0; k < seqs_of.size(); ++k) {
    StepPlan step;
    if (k == 0) {
      step = prefill;
    } else {
      for (size_t i : seqs_of[k]) {
        step.seqs.push_back(Seq(static_cast<int64_t>(i), length[i], 1, true, tables[i]));
        step.token_ids.push_back(run.tokens[i].back());
        ++length[i];
      }
    }
    run.logits.emplace_back();
    forward(step, &run.logits.back());
    EXPECT_EQ(run.logits.back().size(), seqs_of[k].size() * vocab) << "step " << k;
    if (run.logits.back().size() != seqs_of[k].size() * vocab) return run;
    for (size_t j = 0; j < seqs_of[k].size(); ++j) {
      run.tokens[seqs_of[k][j]].push_back(
          static_cast<int32_t>(Argmax(run.logits.back().data() + j * vocab, vocab)));
    }
  }
  return run;
}

// Greedy over two ranks: the leader here, the follower on its own thread.
GreedyRun GreedyOverRanks(const std::vector<std::unique_ptr<Rank>>& ranks) {
  FollowerThread follower([&](const StepPlan& step) { ranks[1]->model->Follow(step); });
  const int64_t vocab = ranks[0]->model->config().vocab_size;
  GreedyRun run = Greedy(vocab, [&](const StepPlan& step, std::vector<float>* logits) {
    follower.Push(step);
    ranks[0]->model->Forward(step, logits);
  });
  follower.Finish();
  return run;
}

bool IsCollective(const Event& e) {
  return e.op == "all_reduce" || e.op == "all_gather" || e.op == "wait";
}

// The collectives a rank's stream ran, in order: those called outside a capture and those a
// replay ran (not the recordings themselves), as "op count" strings.
std::vector<std::string> Executed(const std::vector<Event>& log) {
  std::vector<std::string> out;
  for (const Event& e : log) {
    if (IsCollective(e) && !e.captured) out.push_back(absl::StrCat(e.op, " ", e.count));
  }
  return out;
}

const FakeGraphs kGraphs = {{1, 2, 4, 8}, /*capture=*/true};
const FakeGraphs kPaddedOnly = {{1, 2, 4, 8}, /*capture=*/false};

TEST(TensorParallelCudaGraphsTest, CapturedStepsRecordTheCollectivesTheirEagerRunMade) {
  ThreadGroup group(kRanks);
  std::vector<std::unique_ptr<Rank>> ranks = MakeRanks(&group, /*staged=*/false, kGraphs);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  const GreedyRun run = GreedyOverRanks(ranks);
  const ModelConfig& c = ranks[0]->model->config();
  const int64_t h = c.hidden_size;

  for (int r = 0; r < kRanks; ++r) {
    const FakeGpu& d = *ranks[r]->device;
    // Batch 2 and batch 3 (padded to 4): each recorded once, then replayed twice.
    EXPECT_EQ(d.captures, 2) << "rank " << r;
    EXPECT_EQ(d.replays, 4) << "rank " << r;
    EXPECT_TRUE(d.capture_errors.empty()) << "rank " << r << ": " << d.capture_errors[0];
    const std::vector<Event>& log = ranks[r]->log;
    size_t step_at = 0;  // the current step's SetStep
    for (size_t i = 0; i < log.size(); ++i) {
      if (log[i].op == "step") step_at = i;
      // No host wait, and no host transfer, while the stream records.
      if (log[i].captured) {
        EXPECT_NE(log[i].op, "wait") << "rank " << r << " event " << i;
        EXPECT_NE(log[i].op, "ToHost.x") << "rank " << r << " event " << i;
        EXPECT_NE(log[i].op, "FromHost.x") << "rank " << r << " event " << i;
      }
      if (log[i].op != "begin_capture") continue;
      // The eager run of the step (from its SetStep to the capture) against the recording.
      std::vector<std::string> eager, recorded;
      for (size_t j = step_at; j < i; ++j) {
        if (IsCollective(log[j])) eager.push_back(absl::StrCat(log[j].op, " ", log[j].count));
      }
      size_t j = i + 1;
      for (; j < log.size() && log[j].op != "end_capture"; ++j) {
        if (IsCollective(log[j])) {
          EXPECT_TRUE(log[j].captured);
          recorded.push_back(absl::StrCat(log[j].op, " ", log[j].count));
        }
      }
      ASSERT_LT(j, log.size()) << "rank " << r << ": a capture that never ends";
      const int64_t padded = log[i].count;
      // The embedding's sum, two per layer, over the padded batch, then the logits' gather.
      std::vector<std::string> want;
      for (int k = 0; k < 1 + 2 * c.num_layers; ++k) {
        want.push_back(absl::StrCat("all_reduce ", padded * h));
      }
      want.push_back(absl::StrCat("all_gather ", padded * (c.vocab_size / kRanks)));
      EXPECT_EQ(recorded, want) << "rank " << r << " capture at event " << i;
      EXPECT_EQ(eager, want) << "rank " << r << " capture at event " << i;
      // The host waits for the stream once the step is recorded (and after every replay).
      size_t k = j + 1;
      while (k < log.size() && !IsCollective(log[k])) ++k;
      ASSERT_LT(k, log.size());
      EXPECT_EQ(log[k].op, "wait");
      EXPECT_FALSE(log[k].captured);
    }
    for (size_t i = 0; i < log.size(); ++i) {
      if (log[i].op != "replay") continue;
      // A replay runs the recorded collectives, then the host waits.
      std::vector<std::string> replayed;
      size_t k = i + 1;
      for (; k < log.size() && log[k].replayed; ++k) {
        replayed.push_back(absl::StrCat(log[k].op, " ", log[k].count));
      }
      EXPECT_EQ(replayed.size(), static_cast<size_t>(2 + 2 * c.num_layers)) << "event " << i;
      ASSERT_LT(k, log.size());
      EXPECT_EQ(log[k].op, "wait");
    }
  }
  // Every rank's stream ran the same collectives, and so did a padded run without graphs.
  const std::vector<std::string> leader = Executed(ranks[0]->log);
  EXPECT_EQ(Executed(ranks[1]->log), leader);
  ThreadGroup group2(kRanks);
  std::vector<std::unique_ptr<Rank>> eager = MakeRanks(&group2, /*staged=*/false, kPaddedOnly);
  ASSERT_EQ(eager.size(), static_cast<size_t>(kRanks));
  const GreedyRun eager_run = GreedyOverRanks(eager);
  EXPECT_EQ(eager[0]->device->captures, 0);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(Executed(eager[r]->log), leader) << "rank " << r;
  // The replays computed what the eager steps did, bit for bit.
  EXPECT_EQ(run.tokens, eager_run.tokens);
  EXPECT_EQ(run.logits, eager_run.logits);
  // The step counters count replayed steps' sums too.
  EXPECT_EQ(ranks[0]->model->collective_times().all_reduces,
            eager[0]->model->collective_times().all_reduces);
  EXPECT_EQ(ranks[0]->model->collective_times().all_reduces, 7 * (1 + 2 * c.num_layers));
}

TEST(TensorParallelCudaGraphsTest, SameTokensAsWithoutGraphsAndAsOneRank) {
  ThreadGroup group(kRanks);
  std::vector<std::unique_ptr<Rank>> graphs = MakeRanks(&group, /*staged=*/false, kGraphs);
  ASSERT_EQ(graphs.size(), static_cast<size_t>(kRanks));
  const GreedyRun got = GreedyOverRanks(graphs);
  EXPECT_GT(graphs[0]->device->replays, 0);

  // No graphs and no padding.
  std::vector<std::unique_ptr<Rank>> plain = MakeRanks(&group, /*staged=*/false);
  ASSERT_EQ(plain.size(), static_cast<size_t>(kRanks));
  const GreedyRun want = GreedyOverRanks(plain);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t i = 0; i < want.logits.size(); ++i) {
    ASSERT_EQ(got.logits[i].size(), want.logits[i].size()) << "step " << i;
    for (size_t j = 0; j < want.logits[i].size(); ++j) {
      ASSERT_NEAR(got.logits[i][j], want.logits[i][j], 1e-5) << "step " << i << " value " << j;
    }
  }

  // The whole model on the CPU.
  absl::StatusOr<std::unique_ptr<LlamaWeights>> weights = LoadWeights(kModel);
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<LlamaModel>> whole =
      LlamaModel::Create(std::move(*weights), KvCacheShape{8, 4});
  ASSERT_TRUE(whole.ok()) << whole.status();
  const GreedyRun one = Greedy((*whole)->config().vocab_size,
                               [&](const StepPlan& step, std::vector<float>* logits) {
                                 (*whole)->Forward(step, logits);
                               });
  EXPECT_EQ(got.tokens, one.tokens);
  for (size_t i = 0; i < one.logits.size(); ++i) {
    ASSERT_EQ(got.logits[i].size(), one.logits[i].size()) << "step " << i;
    for (size_t j = 0; j < one.logits[i].size(); ++j) {
      ASSERT_NEAR(got.logits[i][j], one.logits[i][j], 1e-4) << "step " << i << " value " << j;
    }
  }
}

TEST(TensorParallelCudaGraphsTest, HostStagedStepsAreNeitherPaddedNorRecorded) {
  ThreadGroup group(kRanks);
  std::vector<std::unique_ptr<Rank>> staged = MakeRanks(&group, /*staged=*/true, kGraphs);
  ASSERT_EQ(staged.size(), static_cast<size_t>(kRanks));
  const GreedyRun got = GreedyOverRanks(staged);
  for (int r = 0; r < kRanks; ++r) {
    const FakeGpu& d = *staged[r]->device;
    EXPECT_EQ(d.captures, 0);
    EXPECT_EQ(d.replays, 0);
    ASSERT_EQ(d.steps.size(), 7u);
    EXPECT_EQ(d.steps[4].tokens, 3);  // batch 3 as it is, not padded to 4
    for (const Event& e : staged[r]->log) EXPECT_FALSE(IsCollective(e)) << e.op;
  }
  ThreadGroup group2(kRanks);
  std::vector<std::unique_ptr<Rank>> plain = MakeRanks(&group2, /*staged=*/false);
  ASSERT_EQ(plain.size(), static_cast<size_t>(kRanks));
  EXPECT_EQ(got.tokens, GreedyOverRanks(plain).tokens);
}

// ---- sampling on the leader's device under tensor parallelism

// Seven steps as Greedy's, each token sampled with `params` by `sample` (given the step and one
// request per sequence, in plan order); the sampled results per step.
std::vector<std::vector<SampleResult>> Sampled(
    const SamplingParams& params,
    const std::function<void(const StepPlan&, absl::Span<const SampleRequest>,
                             std::vector<SampleResult>*)>& sample) {
  const std::vector<std::vector<int32_t>> prompts = {{11, 200, 37, 129, 128}, {5, 250, 130},
                                                     {64, 3}};
  const std::vector<std::vector<int32_t>> tables = {{0, 1, 6}, {2, 3, 7}, {4, 5}};
  std::vector<std::vector<int32_t>> outputs(prompts.size());
  std::vector<int> length(prompts.size(), 0);
  std::vector<std::vector<SampleResult>> results;
  for (int k = 0; k < 7; ++k) {
    const std::vector<size_t> seqs = k == 0 || k > 3 ? std::vector<size_t>{0, 1, 2}
                                                     : std::vector<size_t>{0, 1};
    StepPlan step;
    std::vector<SampleRequest> requests;
    for (size_t i : seqs) {
      if (k == 0) {
        step.seqs.push_back(Seq(static_cast<int64_t>(i), 0,
                                static_cast<int>(prompts[i].size()), true, tables[i]));
        step.token_ids.insert(step.token_ids.end(), prompts[i].begin(), prompts[i].end());
        length[i] = static_cast<int>(prompts[i].size());
      } else {
        step.seqs.push_back(Seq(static_cast<int64_t>(i), length[i], 1, true, tables[i]));
        step.token_ids.push_back(outputs[i].back());
        ++length[i];
      }
      SampleRequest request;
      request.params = &params;
      request.prompt_tokens = prompts[i];
      request.output_tokens = outputs[i];
      request.position = length[i];
      requests.push_back(request);
    }
    results.emplace_back();
    sample(step, requests, &results.back());
    EXPECT_EQ(results.back().size(), seqs.size()) << "step " << k;
    if (results.back().size() != seqs.size()) break;
    for (size_t j = 0; j < seqs.size(); ++j) outputs[seqs[j]].push_back(results.back()[j].token);
  }
  return results;
}

// The leader samples on its device (ForwardAndSample), the follower follows.
std::vector<std::vector<SampleResult>> SampledOnDevice(
    const std::vector<std::unique_ptr<Rank>>& ranks, const SamplingParams& params) {
  FollowerThread follower([&](const StepPlan& step) { ranks[1]->model->Follow(step); });
  auto results = Sampled(params, [&](const StepPlan& step,
                                     absl::Span<const SampleRequest> requests,
                                     std::vector<SampleResult>* out) {
    follower.Push(step);
    ranks[0]->model->ForwardAndSample(step, requests, out);
  });
  follower.Finish();
  return results;
}

// The leader copies the logits to the host and samples there (the CPU sampler).
std::vector<std::vector<SampleResult>> SampledOnHost(
    const std::vector<std::unique_ptr<Rank>>& ranks, const SamplingParams& params) {
  FollowerThread follower([&](const StepPlan& step) { ranks[1]->model->Follow(step); });
  const int vocab = ranks[0]->model->config().vocab_size;
  Sampler sampler(vocab);
  std::vector<float> logits;
  auto results = Sampled(params, [&](const StepPlan& step,
                                     absl::Span<const SampleRequest> requests,
                                     std::vector<SampleResult>* out) {
    follower.Push(step);
    ranks[0]->model->Forward(step, &logits);
    out->clear();
    if (logits.size() != requests.size() * vocab) return;
    for (size_t i = 0; i < requests.size(); ++i) {
      SampleInput in;
      in.logits = logits.data() + i * vocab;
      in.params = requests[i].params;
      in.prompt_tokens = requests[i].prompt_tokens;
      in.output_tokens = requests[i].output_tokens;
      in.position = requests[i].position;
      out->push_back(sampler.Sample(in));
    }
  });
  follower.Finish();
  return results;
}

void ExpectSameSamples(const std::vector<std::vector<SampleResult>>& got,
                       const std::vector<std::vector<SampleResult>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size()) << "step " << k;
    for (size_t i = 0; i < want[k].size(); ++i) {
      EXPECT_EQ(got[k][i].token, want[k][i].token) << "step " << k << " row " << i;
      EXPECT_EQ(got[k][i].logprob, want[k][i].logprob) << "step " << k << " row " << i;
      ASSERT_EQ(got[k][i].top_logprobs.size(), want[k][i].top_logprobs.size());
      for (size_t j = 0; j < want[k][i].top_logprobs.size(); ++j) {
        EXPECT_EQ(got[k][i].top_logprobs[j].token, want[k][i].top_logprobs[j].token);
      }
    }
  }
}

TEST(TensorParallelDeviceSamplingTest, LeaderSamplesOnItsDeviceAsTheHostWouldForEveryMode) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 2;
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.top_k = 40;
  seeded.top_p = 0.95f;
  seeded.min_p = 0.01f;
  seeded.repetition_penalty = 1.1f;
  seeded.frequency_penalty = 0.2f;
  seeded.has_seed = true;
  seeded.seed = 1234;
  seeded.logprobs = 1;
  for (const FakeGraphs& graphs : {FakeGraphs{}, kGraphs}) {
    for (const SamplingParams* params : {&greedy, &seeded}) {
      SCOPED_TRACE(absl::StrCat(graphs.capture ? "graphs" : "no graphs",
                                params == &greedy ? ", greedy" : ", seeded"));
      ThreadGroup group(kRanks);
      std::vector<std::unique_ptr<Rank>> device = MakeRanks(&group, /*staged=*/false, graphs);
      ASSERT_EQ(device.size(), static_cast<size_t>(kRanks));
      ASSERT_TRUE(device[0]->model->CanSampleOnDevice());
      // The followers cannot resolve pending ids: no asynchronous steps under TP.
      EXPECT_FALSE(device[0]->model->CanStepAsync());
      const auto got = SampledOnDevice(device, *params);
      if (graphs.capture) {
        EXPECT_GT(device[0]->device->replays, 0);
      }
      ThreadGroup group2(kRanks);
      std::vector<std::unique_ptr<Rank>> host = MakeRanks(&group2, /*staged=*/false, graphs);
      ASSERT_EQ(host.size(), static_cast<size_t>(kRanks));
      ExpectSameSamples(got, SampledOnHost(host, *params));

      // The leader's sampler read the interleaved logits on the device, one row of the whole
      // vocabulary per wanted sequence (not the padding's), and no logits came to the host.
      const int64_t vocab = device[0]->model->config().vocab_size;
      const std::vector<Event>& log = device[0]->log;
      std::vector<const void*> sampled;
      int samples = 0;
      for (size_t i = 0; i < log.size(); ++i) {
        if (log[i].op != "Sample.logits") continue;
        EXPECT_EQ(log[i].count % vocab, 0);
        EXPECT_EQ(log[i].count / vocab, static_cast<int64_t>(got[samples].size()));
        ++samples;
        sampled.push_back(log[i].buffer);
      }
      EXPECT_EQ(samples, 7);
      for (const Event& e : log) {
        if (e.op != "ToHost.x") continue;
        for (const void* b : sampled) EXPECT_NE(e.buffer, b);
      }
      for (const Event& e : device[1]->log) EXPECT_NE(e.op, "Sample.logits");
    }
  }
}

TEST(TensorParallelDeviceSamplingTest, HostStagingSamplesOnTheHost) {
  ThreadGroup group(kRanks);
  std::vector<std::unique_ptr<Rank>> staged = MakeRanks(&group, /*staged=*/true);
  ASSERT_EQ(staged.size(), static_cast<size_t>(kRanks));
  EXPECT_FALSE(staged[0]->model->CanSampleOnDevice());
  EXPECT_FALSE(staged[0]->model->CanStepAsync());
}

}  // namespace
}  // namespace carpool::worker
