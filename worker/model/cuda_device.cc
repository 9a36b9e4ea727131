#include "worker/model/cuda_device.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "worker/model/device_sampling.h"

namespace carpool::worker {
namespace {

namespace kc = kernels::cuda;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t Align16(size_t n) { return (n + 15) & ~size_t{15}; }

// Where each step input lives inside the packed step buffers (host pinned and device), in bytes.
struct StepLayout {
  int64_t tokens = 0;  // capacity in tokens
  int64_t seqs = 0;    // capacity in sequences
  int64_t stride = 0;  // block-table entries per sequence
  size_t slots = 0, token_ids = 0, positions = 0, sample_rows = 0, query_start = 0,
         context_lens = 0, block_tables = 0, total = 0;
};

StepLayout MakeStepLayout(int64_t tokens, int64_t seqs, int64_t stride) {
  StepLayout l;
  l.tokens = tokens;
  l.seqs = seqs;
  l.stride = stride;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t offset = at;
    at += Align16(bytes);
    return offset;
  };
  l.slots = take(tokens * sizeof(int64_t));
  l.token_ids = take(tokens * sizeof(int32_t));
  l.positions = take(tokens * sizeof(int32_t));
  l.sample_rows = take(tokens * sizeof(int32_t));
  l.query_start = take((seqs + 1) * sizeof(int32_t));
  l.context_lens = take(seqs * sizeof(int32_t));
  l.block_tables = take(seqs * stride * sizeof(int32_t));
  l.total = at;
  return l;
}

struct PinnedFree {
  void operator()(void* p) const {
    if (p != nullptr && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
  }
};

// One captured decode graph.
struct Graph {
  cudaGraphExec_t exec = nullptr;
  int64_t generation = -1;
  bool failed = false;  // capture failed once: this batch size runs eagerly for good
};

template <typename T>
class CudaDeviceImpl final : public CudaDevice {
 public:
  CudaDeviceImpl(const CudaDeviceOptions& options, StorageType storage)
      : options_(options), storage_(storage) {}

  ~CudaDeviceImpl() override {
    (void)cudaSetDevice(options_.device);
    (void)cudaStreamSynchronize(stream_);
    DropGraphs();
    for (cudaEvent_t e : staged_) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    for (cudaEvent_t e : sampled_) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  absl::Status Init() {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int i = 0; i < 2; ++i) {
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staged_[i], cudaEventDisableTiming));
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&sampled_[i], cudaEventDisableTiming));
    }
    ASSIGN_OR_RETURN(gemm_, kc::Gemm::Create({.allow_tf32 = options_.allow_tf32}));
    for (int s : options_.graph_batch_sizes) {
      if (s >= 1 && s <= options_.max_num_seqs) graph_sizes_.push_back(s);
    }
    std::sort(graph_sizes_.begin(), graph_sizes_.end());
    graph_sizes_.erase(std::unique(graph_sizes_.begin(), graph_sizes_.end()), graph_sizes_.end());
    if (!graph_sizes_.empty() && graph_sizes_.back() < options_.max_num_seqs &&
        options_.max_num_seqs <= 65535) {
      graph_sizes_.push_back(options_.max_num_seqs);
    }
    const int64_t stride = CeilDiv(options_.max_context_len, options_.kv_block_size);
    return GrowStepBuffers(
        MakeStepLayout(options_.max_num_batched_tokens, options_.max_num_seqs, stride));
  }

  // ---- CudaDevice

  std::string name() const override { return absl::StrCat("cuda:", options_.device); }
  StorageType storage_type() const override { return storage_; }
  absl::Status status() const override { return status_; }
  int graphs_captured() const override { return graphs_captured_; }
  int64_t graph_replays() const override { return graph_replays_; }

  absl::StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() const override {
    size_t free = 0, total = 0;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return std::make_pair(static_cast<int64_t>(free), static_cast<int64_t>(total));
  }

  absl::Status Synchronize() override {
    Record(kc::Synchronize(stream_));
    return status_;
  }

  // ---- memory

  absl::StatusOr<DeviceArray> Weight(const Tensor& host) override {
    ASSIGN_OR_RETURN(DeviceArray a, Allocate(host.numel()));
    if (host.type() == TensorType::kBF16) {
      // Weights kept bf16 at load (LoadOptions::keep_bf16) go up as they are.
      RETURN_IF_ERROR(Upload(reinterpret_cast<const kc::BFloat16*>(host.bf16_data()), 0,
                             host.numel(), &a));
    } else {
      RETURN_IF_ERROR(Upload(host.data(), 0, host.numel(), &a));
    }
    return a;
  }

  absl::StatusOr<DeviceArray> NormWeight(const Tensor& host) override {
    if (host.empty()) return DeviceArray();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    absl::StatusOr<kc::DeviceBuffer> buffer =
        kc::DeviceBuffer::FromHost(std::vector<float>(host.data(), host.data() + host.numel()));
    if (!buffer.ok()) {
      (void)cudaGetLastError();  // as Allocate: an out-of-memory error is not sticky
      return buffer.status();
    }
    // FromHost copies on the default stream, which does not order with stream_: wait for it
    // before a kernel on stream_ reads the weight.
    RETURN_IF_ERROR(kc::Synchronize(nullptr));
    auto owned = std::make_shared<kc::DeviceBuffer>(std::move(*buffer));
    void* data = owned->data();
    return DeviceArray(std::move(owned), data, host.numel());
  }

  absl::StatusOr<DeviceArray> Allocate(int64_t numel) override {
    if (numel < 0) return absl::InvalidArgumentError("Allocate: negative size");
    if (numel == 0) return DeviceArray();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    absl::StatusOr<kc::DeviceBuffer> buffer = kc::DeviceBuffer::Allocate(numel * sizeof(T));
    if (!buffer.ok()) {
      (void)cudaGetLastError();  // an out-of-memory error is not sticky; do not report it later
      return buffer.status();
    }
    auto owned = std::make_shared<kc::DeviceBuffer>(std::move(*buffer));
    void* data = owned->data();
    return DeviceArray(std::move(owned), data, numel);
  }

  void Reserve(DeviceArray* a, int64_t numel) override {
    if (a->numel() >= numel) return;
    if (capturing_) {
      Record(absl::FailedPreconditionError("Reserve grew an array inside a captured step"));
      return;
    }
    *a = DeviceArray();  // free first, so the peak is the larger array only
    absl::StatusOr<DeviceArray> grown = Allocate(numel);
    if (!grown.ok()) {
      Record(grown.status());
      return;
    }
    *a = std::move(*grown);
    ++generation_;  // a graph may have used the old address
  }

  int64_t FreeBytes() const override {
    absl::StatusOr<std::pair<int64_t, int64_t>> info = MemoryInfo();
    return info.ok() ? info->first : 0;
  }

  // ---- steps

  void SetRope(absl::Span<const float> inv_freq, absl::Span<const float> local_inv_freq) override {
    if (inv_freq.size() != local_inv_freq.size()) {
      Record(absl::InvalidArgumentError("SetRope: the two tables differ in length"));
      return;
    }
    rotary_dim_ = static_cast<int>(inv_freq.size()) * 2;
    // One buffer: the global table, then the local one.
    std::vector<float> tables(inv_freq.begin(), inv_freq.end());
    tables.insert(tables.end(), local_inv_freq.begin(), local_inv_freq.end());
    absl::StatusOr<kc::DeviceBuffer> b = kc::DeviceBuffer::FromHost(tables);
    if (!b.ok()) {
      Record(b.status());
      return;
    }
    // FromHost copies on the default stream, which does not order with stream_ (non-blocking),
    // and a pageable upload may still be in flight when it returns: wait before a kernel on
    // stream_ reads the table.
    Record(kc::Synchronize(nullptr));
    inv_freq_ = std::move(*b);
    ++generation_;
  }

  void SetStep(const StepView& step) override;

  // ---- kernels

  void EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) override {
    if (!Ready()) return;
    Record(kc::EmbeddingGather<T>(P(table), table.numel() / h, Dev<int32_t>(layout_.token_ids),
                                  P(out), num_tokens_, h, stream_));
  }

  void RmsNorm(const DeviceArray& x, const DeviceArray& weight, float eps, int64_t rows, int64_t h,
               DeviceArray* out) override {
    if (!Ready()) return;
    Record(kc::RmsNorm<T>(P(x), F32(weight), eps, P(out), rows, h, stream_));
  }

  void AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& weight, float eps,
                  int64_t rows, int64_t h, DeviceArray* out) override {
    if (!Ready()) return;
    Record(kc::AddRmsNorm<T>(P(x), P(residual), F32(weight), eps, P(out), rows, h, stream_));
  }

  void Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias, int64_t m,
              int64_t n, int64_t k, DeviceArray* y) override {
    if (!Ready()) return;
    const T* b = bias.empty() ? nullptr : P(bias);
    Record(gemm_->Linear<T, T>(P(x), P(w), b, P(y), m, n, k, stream_));
  }

  void Rope(int num_heads, int head_dim, bool local, DeviceArray* x) override {
    if (!Ready()) return;
    const float* table = inv_freq_.as<float>() + (local ? rotary_dim_ / 2 : 0);
    Record(kc::RotaryEmbedding<T>(P(x), Dev<int32_t>(layout_.positions), table, num_tokens_,
                                  num_heads, head_dim, rotary_dim_, stream_));
  }

  void HeadRmsNorm(const DeviceArray& weight, float eps, int64_t rows, int num_heads, int head_dim,
                   DeviceArray* x) override {
    if (!Ready()) return;
    Record(kc::HeadRmsNorm<T>(P(x), F32(weight), eps, rows, num_heads, head_dim, stream_));
  }

  void GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
                   DeviceArray* out) override {
    if (!Ready()) return;
    Record(kc::GeluTanhMul<T>(P(gate), P(up), P(out), rows, inter, stream_));
  }

  void SoftCap(float cap, int64_t n, DeviceArray* x) override {
    if (!Ready()) return;
    Record(kc::SoftCap<T>(P(x), cap, n, stream_));
  }

  void Scale(float factor, int64_t n, DeviceArray* x) override {
    if (!Ready()) return;
    Record(kc::Scale<T>(P(x), factor, n, stream_));
  }

  void SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
               DeviceArray* out) override {
    if (!Ready()) return;
    Record(kc::SiluMul<T>(P(gate), P(up), P(out), rows, inter, stream_));
  }

  void WriteKv(const DeviceArray& k, const DeviceArray& v, const kernels::KvCacheLayout& layout,
               DeviceArray* key_cache, DeviceArray* value_cache) override {
    if (!Ready()) return;
    Record(kc::WriteKvCache<T>(P(k), P(v), Dev<int64_t>(layout_.slots), num_tokens_, layout,
                               P(key_cache), P(value_cache), stream_));
  }

  void Attention(const DeviceArray& q, const DeviceArray& key_cache, const DeviceArray& value_cache,
                 const kernels::KvCacheLayout& layout, int num_heads,
                 const AttentionOptions& options, DeviceArray* out) override;

  void GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) override {
    if (!Ready()) return;
    Record(kc::EmbeddingGather<T>(P(x), x.numel() / h, Dev<int32_t>(layout_.sample_rows), P(out),
                                  num_samples_, h, stream_));
  }

  void CopyRows(const DeviceArray& src, int64_t src_offset, int64_t src_stride, int64_t rows,
                int64_t width, int64_t dst_offset, int64_t dst_stride, DeviceArray* dst) override {
    if (!Ready() || rows <= 0 || width <= 0) return;
    if (src_offset < 0 || dst_offset < 0 || src_stride < width || dst_stride < width ||
        src_offset + (rows - 1) * src_stride + width > src.numel() ||
        dst_offset + (rows - 1) * dst_stride + width > dst->numel()) {
      Record(absl::InvalidArgumentError("CopyRows: rows outside an array"));
      return;
    }
    // One 2-D copy on the stream (a memcpy node when captured).
    Record(kc::CudaStatus(
        cudaMemcpy2DAsync(P(dst) + dst_offset, dst_stride * sizeof(T), P(src) + src_offset,
                          src_stride * sizeof(T), width * sizeof(T), rows,
                          cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpy2DAsync"));
  }

  // ---- graphs

  void* stream() const override { return stream_; }

  int GraphBatchSize(int num_seqs) const override {
    if (!options_.cuda_graphs) return 0;
    for (int s : graph_sizes_) {
      if (s >= num_seqs) return s;
    }
    return 0;
  }

  void RunStep(const std::function<void()>& body) override;

  // ---- sampling

  bool SamplesOnDevice() const override { return true; }
  void Sample(const DeviceArray& logits, int64_t vocab, absl::Span<const SampleRequest> requests,
              std::vector<SampleResult>* out) override;

  // ---- asynchronous steps: the stream runs step N while the host prepares N + 1.

  bool SupportsAsyncStep() const override { return true; }
  // The penalty lists are packed on the host (DeviceSamplingRows), which does not know a
  // pending token: the engine finishes the previous step before such a request.
  bool SamplesPendingPenalties() const override { return false; }
  void SampleAsync(const DeviceArray& logits, int64_t vocab,
                   absl::Span<const SampleRequest> requests) override;
  void FinishSample(std::vector<SampleResult>* out) override;

  // ---- host transfers

  void ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) override;

  void FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) override {
    Record(Upload(host, offset, n, x));
  }

 private:
  static T* P(const DeviceArray& a) { return static_cast<T*>(a.data()); }
  // A norm weight (NormWeight): fp32 whatever T is.
  static const float* F32(const DeviceArray& a) { return static_cast<const float*>(a.data()); }
  static T* P(DeviceArray* a) { return static_cast<T*>(a->data()); }
  template <typename U>
  U* Dev(size_t offset) const {
    return reinterpret_cast<U*>(step_device_.as<char>() + offset);
  }

  // Keeps the first error (the capture's own while capturing).
  void Record(const absl::Status& s) {
    if (s.ok()) return;
    absl::Status& slot = capturing_ ? capture_status_ : status_;
    if (slot.ok()) slot = s;
  }
  bool Ready() const { return status_.ok() && (!capturing_ || capture_status_.ok()); }

  // n host values of S (float, or BFloat16 bits) into x from `offset`, converted to T.
  template <typename S>
  absl::Status Upload(const S* host, int64_t offset, int64_t n, DeviceArray* x);
  absl::Status GrowStepBuffers(const StepLayout& layout);
  absl::Status EnsureWorkspace(size_t bytes);
  absl::Status EnsureStaging();
  void DropGraphs();
  // Enqueues the sampling of `requests` with its pinned and device buffers of `slot` (0 or 1),
  // the results copied back into the pinned buffer and event sampled_[slot] recorded after;
  // sets sample_slots_[slot]. False when nothing was enqueued (an error, recorded).
  bool EnqueueSample(const DeviceArray& logits, int64_t vocab,
                     absl::Span<const SampleRequest> requests, int slot);
  // The results of the sampling enqueued with `slot`, once it is done.
  void CollectSamples(int slot, std::vector<SampleResult>* out);
  // After a failed transfer or sampling: with abort_on_error, prints the error and ends the
  // process (see the header comment); else returns.
  void ExitOnError();
  // Makes `buffer` hold at least `bytes` (contents lost when it grows).
  absl::Status EnsureDevice(kc::DeviceBuffer* buffer, size_t bytes);
  // Captures `body` into `g` (after an eager run of the same step). Errors stay in the capture.
  void Capture(const std::function<void()>& body, Graph* g);

  const CudaDeviceOptions options_;
  const StorageType storage_;
  cudaStream_t stream_ = nullptr;
  // Recorded after the step upload that read step_host_[i]; an asynchronous step alternates
  // the two pinned buffers, so preparing step N + 1 never waits for step N's upload.
  std::array<cudaEvent_t, 2> staged_ = {nullptr, nullptr};
  int step_slot_ = 0;  // the pinned buffer the next SetStep fills
  std::unique_ptr<kc::Gemm> gemm_;
  absl::Status status_;
  absl::Status capture_status_;
  bool capturing_ = false;

  kc::DeviceBuffer inv_freq_;  // [2][rotary_dim / 2]: the global RoPE table, then the local one
  int rotary_dim_ = 0;
  kc::DeviceBuffer staging_;    // fp32 chunks for uploads and read-backs
  kc::DeviceBuffer workspace_;  // decode attention's split merge

  // Step inputs: packed, at fixed addresses until they grow.
  StepLayout layout_;
  std::array<std::unique_ptr<void, PinnedFree>, 2> step_host_;
  kc::DeviceBuffer step_device_;
  int64_t num_tokens_ = 0;
  int64_t num_samples_ = 0;
  int num_seqs_ = 0;
  int max_query_len_ = 1;
  int max_context_len_ = 1;
  bool decode_only_ = true;
  bool graph_step_ = false;
  int block_size_ = 16;  // tokens per block of the step's block tables (StepView::block_size)

  // Device sampling: the rows' parameters and penalty lists (host side), packed with room for
  // the results into one pinned buffer and one device buffer; fp32 logits (a non-fp32 storage
  // type converts the head's rows into them) and the penalized rows' scratch.
  // Two sets (slots), so an asynchronous step's sampling never rewrites the buffers of the step
  // before it, whose results the next step's token ids are gathered from.
  DeviceSamplingRows sampling_rows_;
  std::array<std::unique_ptr<void, PinnedFree>, 2> sample_host_;
  std::array<size_t, 2> sample_host_bytes_ = {0, 0};
  std::array<kc::DeviceBuffer, 2> sample_device_;
  // What a slot's enqueued sampling needs to be read back.
  struct SampleSlot {
    int64_t rows = 0;
    size_t results_at = 0;  // the results' offset in sample_host_ / sample_device_
    std::vector<int> num_top;
    bool ok = false;
  };
  std::array<SampleSlot, 2> sample_slots_;
  std::array<cudaEvent_t, 2> sampled_ = {nullptr, nullptr};
  // Asynchronous steps launched and finished; step k samples with slot k % 2.
  int64_t async_launched_ = 0;
  int64_t async_finished_ = 0;
  // The last asynchronous step's results on the device (for the next step's gather).
  const kc::SampledToken* previous_samples_ = nullptr;
  int64_t previous_rows_ = 0;
  kc::DeviceBuffer sample_logits_;
  kc::DeviceBuffer sample_penalized_;

  // Graphs by batch size; valid while their generation is the current one.
  std::vector<int> graph_sizes_;
  std::map<int, Graph> graphs_;
  int64_t generation_ = 0;
  int graphs_captured_ = 0;
  int64_t graph_replays_ = 0;
};

template <typename T>
absl::Status CudaDeviceImpl<T>::GrowStepBuffers(const StepLayout& layout) {
  if (capturing_) return absl::FailedPreconditionError("step buffers grew during a capture");
  for (int i = 0; i < 2; ++i) {
    if (staged_[i] != nullptr) CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_[i]));
    void* pinned = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned, layout.total));
    step_host_[i].reset(pinned);
  }
  step_device_ = kc::DeviceBuffer();
  ASSIGN_OR_RETURN(step_device_, kc::DeviceBuffer::Allocate(layout.total));
  layout_ = layout;
  ++generation_;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaDeviceImpl<T>::EnsureWorkspace(size_t bytes) {
  if (workspace_.size() >= bytes) return absl::OkStatus();
  if (capturing_) return absl::FailedPreconditionError("attention workspace grew in a capture");
  const size_t grown = std::max(bytes, 2 * workspace_.size());
  workspace_ = kc::DeviceBuffer();
  ASSIGN_OR_RETURN(workspace_, kc::DeviceBuffer::Allocate(grown));
  ++generation_;
  return absl::OkStatus();
}

template <typename T>
absl::Status CudaDeviceImpl<T>::EnsureStaging() {
  if (!staging_.data()) {
    ASSIGN_OR_RETURN(staging_,
                     kc::DeviceBuffer::Allocate(options_.upload_chunk_elements * sizeof(float)));
  }
  return absl::OkStatus();
}

template <typename T>
void CudaDeviceImpl<T>::SetStep(const StepView& step) {
  if (!status_.ok()) return;
  // The engine may be created on one thread and stepped on another (the worker's engine
  // thread): each step makes the device current on the calling thread (cheap when it is).
  Record(kc::CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice"));
  if (!status_.ok()) return;
  const int64_t t = static_cast<int64_t>(step.token_ids.size());
  const int num_seqs = static_cast<int>(step.seqs.size());
  int max_query = 1, max_context = 1;
  int64_t max_blocks = 1;
  const int block_size = step.block_size > 0 ? step.block_size : options_.kv_block_size;
  for (const kernels::AttentionSeq& s : step.seqs) {
    max_query = std::max(max_query, s.query_len);
    max_context = std::max(max_context, s.context_len);
    max_blocks = std::max(max_blocks, CeilDiv(s.context_len, block_size));
  }
  const int64_t samples = static_cast<int64_t>(step.sample_rows.size());
  if (t > layout_.tokens || samples > layout_.tokens || num_seqs > layout_.seqs ||
      max_blocks > layout_.stride) {
    Record(GrowStepBuffers(MakeStepLayout(std::max(layout_.tokens, std::max(t, samples)),
                                          std::max<int64_t>(layout_.seqs, num_seqs),
                                          std::max(layout_.stride, max_blocks))));
    if (!status_.ok()) return;
  }
  // The upload that last read this pinned buffer (two steps ago for an asynchronous step, which
  // has long run; the step before for a synchronous one) must be done before it is rewritten.
  const int slot = step.async ? step_slot_ : 0;
  step_slot_ = step.async ? 1 - step_slot_ : step_slot_;
  Record(kc::CudaStatus(cudaEventSynchronize(staged_[slot]), "cudaEventSynchronize"));
  char* host = static_cast<char*>(step_host_[slot].get());
  std::memcpy(host + layout_.slots, step.slots.data(), t * sizeof(int64_t));
  std::memcpy(host + layout_.token_ids, step.token_ids.data(), t * sizeof(int32_t));
  const bool pending = step.async && std::any_of(step.token_ids.begin(), step.token_ids.end(),
                                                 [](int32_t id) { return id < 0; });
  if (pending && previous_samples_ == nullptr) {
    Record(absl::FailedPreconditionError(
        "SetStep: a pending token id without an asynchronous step before it"));
    return;
  }
  std::memcpy(host + layout_.positions, step.positions.data(), t * sizeof(int32_t));
  int32_t* sample_rows = reinterpret_cast<int32_t*>(host + layout_.sample_rows);
  for (int64_t i = 0; i < samples; ++i) sample_rows[i] = static_cast<int32_t>(step.sample_rows[i]);
  int32_t* query_start = reinterpret_cast<int32_t*>(host + layout_.query_start);
  int32_t* context_lens = reinterpret_cast<int32_t*>(host + layout_.context_lens);
  int32_t* tables = reinterpret_cast<int32_t*>(host + layout_.block_tables);
  for (int s = 0; s < num_seqs; ++s) {
    const kernels::AttentionSeq& seq = step.seqs[s];
    query_start[s] = seq.query_start;
    context_lens[s] = seq.context_len;
    const int64_t blocks = CeilDiv(seq.context_len, block_size);
    std::memcpy(tables + s * layout_.stride, seq.block_table, blocks * sizeof(int32_t));
  }
  query_start[num_seqs] =
      num_seqs > 0 ? step.seqs[num_seqs - 1].query_start + step.seqs[num_seqs - 1].query_len : 0;
  // One copy of everything up to the end of the used part of the block tables.
  const size_t bytes = layout_.block_tables + num_seqs * layout_.stride * sizeof(int32_t);
  Record(kc::CopyToDevice(step_device_.data(), host, bytes, stream_));
  Record(kc::CudaStatus(cudaEventRecord(staged_[slot], stream_), "cudaEventRecord"));
  // The ids the host did not know yet: the previous step's samples, in stream order after
  // them (its sampling kernel ran before this upload).
  if (pending) {
    Record(kc::GatherPendingTokens(Dev<int32_t>(layout_.token_ids), t, previous_samples_,
                                   previous_rows_, stream_));
  }

  num_tokens_ = t;
  num_samples_ = samples;
  num_seqs_ = num_seqs;
  max_query_len_ = max_query;
  max_context_len_ = max_context;
  decode_only_ = step.decode_only;
  block_size_ = block_size;
  // A padded decode step of a captured size runs with fixed bounds so that its graph is reusable.
  // Graphs are keyed by batch size alone and bake in the sampled row count (GatherRows and the
  // head's GEMM), so only steps that sample every row replay them: a decode-only step may hold a
  // one-token prefill chunk that samples nothing, and replaying a graph captured with a different
  // count would compute too few rows (stale logits) or read stale sample rows.
  graph_step_ = options_.cuda_graphs && step.decode_only && t == num_seqs && samples == t &&
                GraphBatchSize(num_seqs) == num_seqs && max_context <= options_.max_context_len &&
                block_size == options_.kv_block_size;
}

template <typename T>
void CudaDeviceImpl<T>::Attention(const DeviceArray& q, const DeviceArray& key_cache,
                                  const DeviceArray& value_cache,
                                  const kernels::KvCacheLayout& layout, int num_heads,
                                  const AttentionOptions& options, DeviceArray* out) {
  if (!Ready()) return;
  if (layout.block_size != block_size_) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("CudaDevice: the step's block tables are for blocks of ", block_size_,
                     " tokens, attention asked for ", layout.block_size)));
    return;
  }
  kc::PagedAttentionBatch b;
  b.cache = layout;
  b.num_heads = num_heads;
  b.scale = options.scale;
  b.sliding_window = options.sliding_window;
  b.logit_softcap = options.logit_softcap;
  b.num_seqs = num_seqs_;
  b.query_start = decode_only_ ? nullptr : Dev<int32_t>(layout_.query_start);
  b.context_lens = Dev<int32_t>(layout_.context_lens);
  b.block_tables = Dev<int32_t>(layout_.block_tables);
  b.block_table_stride = static_cast<int>(layout_.stride);
  b.max_query_len = decode_only_ ? 1 : max_query_len_;
  b.max_context_len = graph_step_ ? options_.max_context_len : max_context_len_;
  if (decode_only_) {
    const size_t ws = kc::PagedAttentionDecodeWorkspaceBytes(b);
    if (absl::Status s = EnsureWorkspace(ws); !s.ok()) return Record(s);
    Record(kc::PagedAttentionDecode<T>(P(q), P(key_cache), P(value_cache), b, workspace_.data(),
                                       workspace_.size(), P(out), stream_));
  } else {
    Record(kc::PagedAttention<T>(P(q), P(key_cache), P(value_cache), b, P(out), stream_));
  }
}

template <typename T>
void CudaDeviceImpl<T>::DropGraphs() {
  for (auto& [size, g] : graphs_) {
    if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
    g.exec = nullptr;
  }
}

template <typename T>
void CudaDeviceImpl<T>::RunStep(const std::function<void()>& body) {
  if (!status_.ok()) return;
  if (!graph_step_) {
    body();
    return;
  }
  Graph& g = graphs_[num_seqs_];
  if (g.exec != nullptr && g.generation == generation_) {
    Record(kc::CudaStatus(cudaGraphLaunch(g.exec, stream_), "cudaGraphLaunch"));
    ++graph_replays_;
    return;
  }
  // First step of this size (or buffers moved): run it eagerly, which computes this step and
  // sizes every buffer, workspace and GEMM algorithm; then record the same work for later steps.
  body();
  if (!status_.ok() || g.failed) return;
  Capture(body, &g);
}

template <typename T>
void CudaDeviceImpl<T>::Capture(const std::function<void()>& body, Graph* g) {
  if (g->exec != nullptr) (void)cudaGraphExecDestroy(g->exec);
  g->exec = nullptr;
  const int64_t generation = generation_;
  capture_status_ = absl::OkStatus();
  capturing_ = true;
  absl::Status s = kc::CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                                  "cudaStreamBeginCapture");
  if (s.ok()) {
    body();
    cudaGraph_t graph = nullptr;
    absl::Status ended =
        kc::CudaStatus(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    if (s.ok()) s = capture_status_;
    if (s.ok()) s = ended;
    if (s.ok() && generation_ != generation) {
      s = absl::FailedPreconditionError("a buffer moved during the capture");
    }
    if (s.ok()) {
      s = kc::CudaStatus(cudaGraphInstantiate(&g->exec, graph, 0), "cudaGraphInstantiate");
    }
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
  capturing_ = false;
  if (!s.ok()) {
    (void)cudaGetLastError();  // a failed capture's error must not be reported by a later call
    if (g->exec != nullptr) (void)cudaGraphExecDestroy(g->exec);
    g->exec = nullptr;
    g->failed = true;
    const std::string line =
        absl::StrCat("carpool: ", name(), ": CUDA graph capture of decode batch ", num_seqs_,
                     " failed (", s.ToString(), "); that batch size runs without a graph\n");
    (void)!write(STDERR_FILENO, line.data(), line.size());
    return;
  }
  g->generation = generation;
  ++graphs_captured_;
}

template <typename T>
template <typename S>
absl::Status CudaDeviceImpl<T>::Upload(const S* host, int64_t offset, int64_t n,
                                       DeviceArray* x) {
  if (offset < 0 || n < 0 || offset + n > x->numel()) {
    return absl::InvalidArgumentError("FromHost: range outside the array");
  }
  if (capturing_) return absl::FailedPreconditionError("host transfer inside a captured step");
  T* dst = P(x) + offset;
  if constexpr (std::is_same_v<T, S>) {
    RETURN_IF_ERROR(kc::CopyToDevice(dst, host, n * sizeof(S), stream_));
  } else {
    RETURN_IF_ERROR(EnsureStaging());  // room for upload_chunk_elements floats, so for any S
    for (int64_t at = 0; at < n; at += options_.upload_chunk_elements) {
      const int64_t len = std::min(options_.upload_chunk_elements, n - at);
      // Stream order keeps a chunk's copy behind the previous chunk's conversion.
      RETURN_IF_ERROR(kc::CopyToDevice(staging_.data(), host + at, len * sizeof(S), stream_));
      RETURN_IF_ERROR((kc::Convert<S, T>(staging_.as<S>(), dst + at, len, stream_)));
    }
  }
  // The host buffer may be freed or reused as soon as we return.
  return kc::Synchronize(stream_);
}

template <typename T>
absl::Status CudaDeviceImpl<T>::EnsureDevice(kc::DeviceBuffer* buffer, size_t bytes) {
  if (buffer->size() >= bytes) return absl::OkStatus();
  *buffer = kc::DeviceBuffer();
  ASSIGN_OR_RETURN(*buffer, kc::DeviceBuffer::Allocate(bytes));
  return absl::OkStatus();
}

template <typename T>
bool CudaDeviceImpl<T>::EnqueueSample(const DeviceArray& logits, int64_t vocab,
                                      absl::Span<const SampleRequest> requests, int slot) {
  const int64_t n = static_cast<int64_t>(requests.size());
  SampleSlot& record = sample_slots_[slot];
  record.rows = n;
  record.ok = false;
  record.num_top.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    record.num_top[i] = static_cast<int>(std::min<int64_t>(requests[i].params->logprobs, vocab));
  }
  if (n == 0) {
    record.ok = true;
    return true;
  }
  if (status_.ok() && (vocab < 1 || n * vocab > logits.numel())) {
    Record(absl::InvalidArgumentError("Sample: rows outside the logits"));
  }
  if (status_.ok() && capturing_) {
    // Not Record: inside a capture that would only fail the capture, and this copies to the host.
    status_ = absl::FailedPreconditionError("Sample inside a captured step");
  }
  // The packed buffers: rows, penalty entries, then the results.
  sampling_rows_.Pack(requests, vocab);
  const size_t rows_bytes = Align16(n * sizeof(kc::SamplingRow));
  const size_t penalties_bytes =
      Align16(sampling_rows_.penalties().size() * sizeof(kc::PenaltyToken));
  const size_t results_at = rows_bytes + penalties_bytes;
  const size_t total = results_at + n * sizeof(kc::SampledToken);
  const int64_t penalized = sampling_rows_.num_penalized();
  // The slot's buffers were last used two asynchronous steps ago (finished), or by the last
  // synchronous sampling (waited for).
  if (status_.ok() && sample_host_bytes_[slot] < total) {
    void* pinned = nullptr;
    const size_t bytes = std::max(total, 2 * sample_host_bytes_[slot]);
    Record(kc::CudaStatus(cudaMallocHost(&pinned, bytes), "cudaMallocHost"));
    if (status_.ok()) {
      sample_host_[slot].reset(pinned);
      sample_host_bytes_[slot] = bytes;
    }
  }
  if (status_.ok()) Record(EnsureDevice(&sample_device_[slot], total));
  if (status_.ok() && penalized > 0) {
    Record(EnsureDevice(&sample_penalized_, penalized * vocab * sizeof(float)));
  }
  // The head's rows in fp32: as they are, or converted (exactly, as ToHost widens them).
  const float* fp32_logits = static_cast<const float*>(logits.data());
  if constexpr (!std::is_same_v<T, float>) {
    if (status_.ok()) Record(EnsureDevice(&sample_logits_, n * vocab * sizeof(float)));
    if (status_.ok()) {
      Record(kc::Convert<T, float>(P(logits), sample_logits_.as<float>(), n * vocab, stream_));
    }
    fp32_logits = sample_logits_.as<float>();
  }
  if (!status_.ok()) return false;
  char* host = static_cast<char*>(sample_host_[slot].get());
  char* dev = sample_device_[slot].as<char>();
  std::memcpy(host, sampling_rows_.rows().data(), n * sizeof(kc::SamplingRow));
  std::memcpy(host + rows_bytes, sampling_rows_.penalties().data(),
              sampling_rows_.penalties().size() * sizeof(kc::PenaltyToken));
  Record(kc::CopyToDevice(dev, host, results_at, stream_));
  const kc::PenaltyToken* penalties =
      penalized > 0 ? reinterpret_cast<const kc::PenaltyToken*>(dev + rows_bytes) : nullptr;
  auto* results = reinterpret_cast<kc::SampledToken*>(dev + results_at);
  Record(kc::Sample(fp32_logits, reinterpret_cast<const kc::SamplingRow*>(dev), n, vocab,
                    penalties, penalized > 0 ? sample_penalized_.as<float>() : nullptr, results,
                    stream_));
  Record(kc::CopyToHost(host + results_at, results, n * sizeof(kc::SampledToken), stream_));
  Record(kc::CudaStatus(cudaEventRecord(sampled_[slot], stream_), "cudaEventRecord"));
  record.results_at = results_at;
  record.ok = status_.ok();
  return record.ok;
}

template <typename T>
void CudaDeviceImpl<T>::CollectSamples(int slot, std::vector<SampleResult>* out) {
  const SampleSlot& record = sample_slots_[slot];
  out->clear();
  if (record.rows == 0) return;
  if (record.ok) {
    Record(kc::CudaStatus(cudaEventSynchronize(sampled_[slot]), "cudaEventSynchronize"));
  }
  if (!record.ok || !status_.ok()) {
    if (status_.ok()) Record(absl::InternalError("Sample: the sampling was not enqueued"));
    ExitOnError();
    out->assign(record.rows, SampleResult());
    return;
  }
  const auto* results = reinterpret_cast<const kc::SampledToken*>(
      static_cast<char*>(sample_host_[slot].get()) + record.results_at);
  out->reserve(record.rows);
  for (int64_t i = 0; i < record.rows; ++i) {
    out->push_back(ToSampleResult(results[i], record.num_top[i]));
  }
}

template <typename T>
void CudaDeviceImpl<T>::Sample(const DeviceArray& logits, int64_t vocab,
                               absl::Span<const SampleRequest> requests,
                               std::vector<SampleResult>* out) {
  // A synchronous step between asynchronous ones takes the slot the next asynchronous step
  // would, after that slot's step finished (the engine finishes every step it launched before
  // it samples synchronously).
  const int slot = static_cast<int>(async_launched_ % 2);
  if (async_launched_ != async_finished_) {
    Record(absl::FailedPreconditionError("Sample while asynchronous steps are in flight"));
  }
  EnqueueSample(logits, vocab, requests, slot);
  CollectSamples(slot, out);
}

template <typename T>
void CudaDeviceImpl<T>::SampleAsync(const DeviceArray& logits, int64_t vocab,
                                    absl::Span<const SampleRequest> requests) {
  if (async_launched_ - async_finished_ >= 2) {
    Record(absl::FailedPreconditionError("SampleAsync with two steps in flight"));
  }
  const int slot = static_cast<int>(async_launched_ % 2);
  ++async_launched_;
  if (EnqueueSample(logits, vocab, requests, slot)) {
    previous_samples_ = reinterpret_cast<const kc::SampledToken*>(
        sample_device_[slot].as<char>() + sample_slots_[slot].results_at);
    previous_rows_ = sample_slots_[slot].rows;
  }
}

template <typename T>
void CudaDeviceImpl<T>::FinishSample(std::vector<SampleResult>* out) {
  if (async_finished_ >= async_launched_) {
    Record(absl::FailedPreconditionError("FinishSample with no step in flight"));
    ExitOnError();
    out->clear();
    return;
  }
  const int slot = static_cast<int>(async_finished_ % 2);
  ++async_finished_;
  CollectSamples(slot, out);
}

template <typename T>
void CudaDeviceImpl<T>::ExitOnError() {
  if (status_.ok() || !options_.abort_on_error) return;
  const std::string line =
      absl::StrCat("carpool: ", name(), " failed: ", status_.ToString(), "; exiting\n");
  (void)!write(STDERR_FILENO, line.data(), line.size());
  std::_Exit(1);
}

template <typename T>
void CudaDeviceImpl<T>::ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) {
  if (status_.ok() && (offset < 0 || n < 0 || offset + n > x.numel())) {
    Record(absl::InvalidArgumentError("ToHost: range outside the array"));
  }
  if (status_.ok()) {
    const T* src = P(x) + offset;
    if constexpr (std::is_same_v<T, float>) {
      Record(kc::CopyToHost(host, src, n * sizeof(float), stream_));
    } else {
      Record(EnsureStaging());
      for (int64_t at = 0; at < n && status_.ok(); at += options_.upload_chunk_elements) {
        const int64_t len = std::min(options_.upload_chunk_elements, n - at);
        Record(kc::Convert<T, float>(src + at, staging_.as<float>(), len, stream_));
        Record(kc::CopyToHost(host + at, staging_.data(), len * sizeof(float), stream_));
      }
    }
    Record(kc::Synchronize(stream_));
  }
  if (!status_.ok()) {
    ExitOnError();
    std::fill(host, host + std::max<int64_t>(n, 0), 0.0f);
  }
}

template <typename T>
absl::StatusOr<std::unique_ptr<CudaDevice>> Make(const CudaDeviceOptions& options) {
  auto device = std::make_unique<CudaDeviceImpl<T>>(options, options.storage);
  RETURN_IF_ERROR(device->Init());
  return device;
}

}  // namespace

absl::Status CudaDeviceOptions::Validate() const {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("CudaDevice: " + what);
  };
  if (device < 0) return bad(absl::StrCat("device must be >= 0, got ", device));
  if (max_num_batched_tokens < 1 || max_num_seqs < 1 || max_context_len < 1 || kv_block_size < 1) {
    return bad(
        "max_num_batched_tokens, max_num_seqs, max_context_len and kv_block_size must be "
        ">= 1");
  }
  if (upload_chunk_elements < 1) return bad("upload_chunk_elements must be >= 1");
  for (int s : graph_batch_sizes) {
    if (s < 1) return bad(absl::StrCat("graph batch sizes must be >= 1, got ", s));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CreateCudaDevice(const CudaDeviceOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  const int count = kc::DeviceCount();
  if (options.device >= count) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " visible)"));
  }
  switch (options.storage) {
    case StorageType::kF32:
      return Make<float>(options);
    case StorageType::kBF16:
      return Make<kc::BFloat16>(options);
    case StorageType::kF16:
      return Make<kc::Half>(options);
  }
  return absl::InvalidArgumentError("CudaDevice: unknown storage type");
}

}  // namespace carpool::worker
