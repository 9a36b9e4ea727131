// The one kernel interface LlamaModel computes through, so the same model code runs on the CPU
// and on a GPU. LlamaModel owns the order of operations (layers, norms, attention, head, tensor-
// parallel sums); a ModelDevice owns memory, storage types and kernel launches:
//   - CpuDevice (worker/model/cpu_device.h): fp32 activations on kernels/cpu; weights in fp32
//     (used in place), bf16 or int8 (CpuDeviceOptions::weights), a KV cache of fp32 or bf16.
//   - CudaDevice (worker/model/cuda_device.h, only where CARPOOL_HAVE_CUDA): bf16 (or fp16 /
//     fp32) storage with fp32 accumulation on kernels/cuda and cuBLASLt; weights are copied to
//     the device once, converted; step inputs are uploaded once per step; decode steps may be
//     captured and replayed as CUDA graphs.
//
// Arrays are opaque: a DeviceArray is `numel` elements in the device's memory, addressed by
// element offsets, never dereferenced by the model. Its elements are of the device's storage
// type unless its format says otherwise (the CPU's bf16 and int8 weights and bf16 KV cache).
//
// Steps. SetStep() hands the device one step's host-side inputs (token ids, positions, KV slots,
// attention sequences with their block tables, the rows whose logits are wanted); the kernels
// that need them (EmbeddingGather, Rope, WriteKv, Attention, GatherRows) read the current step's
// copy. Between SetStep() and ToHost(), calls are enqueued in order and may run asynchronously;
// ToHost() waits for everything before it.
//
// Thread-compatible: one engine thread drives a device.
#ifndef CARPOOL_WORKER_MODEL_MODEL_DEVICE_H_
#define CARPOOL_WORKER_MODEL_MODEL_DEVICE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sample_result.h"
#include "common/sampling_params.h"
#include "common/thread_pool.h"
#include "kernels/kernel_params.h"
#include "worker/weights/weights.h"

namespace carpool::worker {

// A device's element type for weights, activations and the KV cache.
enum class StorageType { kF32, kBF16, kF16 };
const char* StorageTypeName(StorageType t);
int StorageTypeBytes(StorageType t);

// How a DeviceArray holds its elements. kStorage: the device's storage type (every array of a
// GPU; the CPU's fp32 ones). The CPU device also holds weights as bf16 in the layout
// kernels/cpu/linear_bf16.h reads (kBF16) or quantized to int8 in groups of `group` values along
// K (kInt8, kernels/cpu/linear_int8.h), and KV caches of bf16 values (kBF16, the fp32 cache's
// layout).
struct ArrayFormat {
  enum class Kind : uint8_t { kStorage, kBF16, kInt8 };
  Kind kind = Kind::kStorage;
  int group = 0;  // kInt8 only
};

// `numel` elements on a device (for a weight: the [n, k] values it stands for, whatever its
// format). Move-only. `memory` keeps the array's memory alive: what the device allocated, or a
// reference to a host tensor an array borrows and must outlive; it is empty for arrays that
// borrow memory the caller keeps alive (the CPU's fp32 weights, which LlamaWeights owns).
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(std::shared_ptr<void> memory, void* data, int64_t numel)
      : memory_(std::move(memory)), data_(data), numel_(numel) {}
  // An array of a format other than kStorage, whose values take `bytes` bytes.
  DeviceArray(std::shared_ptr<void> memory, void* data, int64_t numel, ArrayFormat format,
              int64_t bytes)
      : memory_(std::move(memory)), data_(data), numel_(numel), format_(format), bytes_(bytes) {}
  DeviceArray(DeviceArray&&) = default;
  DeviceArray& operator=(DeviceArray&&) = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void* data() const { return data_; }
  int64_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }
  const ArrayFormat& format() const { return format_; }
  // Bytes of the values of an array whose format is not kStorage (packed or quantized weights
  // take more or fewer than numel elements would); 0 for kStorage arrays, which take numel
  // elements of the device's storage type.
  int64_t bytes() const { return bytes_; }
  // The array keeps its memory alive itself (false for an empty array or one that borrows
  // memory its caller keeps alive), so the host tensor it was made from may be released.
  bool owns_memory() const { return memory_ != nullptr; }

 private:
  std::shared_ptr<void> memory_;
  void* data_ = nullptr;
  int64_t numel_ = 0;
  ArrayFormat format_;
  int64_t bytes_ = 0;
};

// How one layer's attention weighs its keys (kernels::AttentionParams' fields of the same names).
struct AttentionOptions {
  float scale = 0.0f;          // usually head_dim ** -0.5
  int sliding_window = 0;      // keys j of query i with i - window < j <= i; 0: all of 0 .. i
  float logit_softcap = 0.0f;  // scores capped as cap * tanh(s / cap) before the softmax; 0: none
};

// One step's inputs as the model prepared them, in host memory; valid during SetStep() only
// (the device copies what it keeps).
struct StepView {
  absl::Span<const int32_t> token_ids;             // [T]
  absl::Span<const int32_t> positions;             // [T]
  absl::Span<const int64_t> slots;                 // [T] KV slot of each token; < 0: not stored
  absl::Span<const kernels::AttentionSeq> seqs;    // query rows and host block tables
  // Tokens per block of the pool the block tables index: seq i's table holds
  // ceil(seqs[i].context_len / block_size) entries, which is what a device copies.
  // REQUIRES: >= 1 (the model always sets it).
  int block_size = 0;
  absl::Span<const int64_t> sample_rows;           // rows whose logits are wanted, in order
  bool decode_only = true;                         // every seq has query_len 1
  // An asynchronous step (ModelDevice::SupportsAsyncStep): the spans' memory (and the block
  // tables the seqs point to) stays valid and unchanged until the step's FinishSample returns,
  // so a device may read it later; a token id t < 0 is the previous asynchronous step's sampled
  // token -(t + 1) (its (-t - 1)-th request's), which the device gathers itself. False: the
  // view is valid during SetStep only and every id is a real token.
  bool async = false;
};

// The token a negative id of an asynchronous step stands for: the previous step's
// (-id - 1)-th sampled token. PendingTokenId(i) is the id standing for sampled row i.
inline int32_t PendingTokenId(int sampled_row) { return -(sampled_row + 1); }
inline int PendingTokenRow(int32_t id) { return -id - 1; }

// One row for ModelDevice::Sample: what the CPU sampler's SampleInput (worker/sampler/sampler.h)
// holds besides the logits. The spans point into the caller's sequences and are read during the
// call only.
struct SampleRequest {
  const SamplingParams* params = nullptr;   // validated against the vocabulary
  absl::Span<const int32_t> prompt_tokens;  // for the repetition penalty
  absl::Span<const int32_t> output_tokens;  // for all penalties
  int64_t position = 0;                     // sequence position of the token being sampled
};

class ModelDevice {
 public:
  virtual ~ModelDevice() = default;

  // "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  // The type of activations (and, unless the device says otherwise below, of weights and KV).
  virtual StorageType storage_type() const = 0;
  // How Weight() stores linear and embedding weights, for status lines: "bf16", "fp32",
  // "int8 (group 32)", ...
  virtual std::string weight_type() const { return StorageTypeName(storage_type()); }
  // The KV cache's element type (AllocateKv), which sizes the pool.
  virtual StorageType kv_storage_type() const { return storage_type(); }

  // ---- memory

  // `host` (a linear or embedding weight [n, k], or a bias) in the device's weight format. A GPU
  // copies and converts it (from fp32). The CPU device, in fp32 format, borrows an fp32 tensor
  // (no copy, so `host` must outlive the array) and widens a bf16 one into memory of its own; in
  // bf16 or int8 format it packs or quantizes the tensor (fp32 or bf16) into memory of its own,
  // or borrows a bf16 tensor in place where the bf16 packing is row-major (the array then keeps
  // `host`'s memory alive itself). Biases (1-D) stay fp32.
  virtual absl::StatusOr<DeviceArray> Weight(const Tensor& host) = 0;
  // The weight of a norm (`host`, fp32): an array of fp32 values whatever the storage type,
  // which RmsNorm, AddRmsNorm and HeadRmsNorm take as their `weight` (and nothing else reads).
  // A norm weight in bf16 would lose the low bits of Gemma's folded 1 + w, which transformers
  // applies in fp32. The CPU device treats it as a bias (Weight).
  virtual absl::StatusOr<DeviceArray> NormWeight(const Tensor& host) { return Weight(host); }
  // A new array of `numel` elements, contents undefined. RESOURCE_EXHAUSTED when it does not fit.
  virtual absl::StatusOr<DeviceArray> Allocate(int64_t numel) = 0;
  // One layer's keys or values of the KV pool: `numel` elements of kv_storage_type(), contents
  // undefined, for WriteKv and Attention. RESOURCE_EXHAUSTED when it does not fit.
  virtual absl::StatusOr<DeviceArray> AllocateKv(int64_t numel) { return Allocate(numel); }
  // Makes `a` hold at least `numel` elements, reallocating (contents lost) when it is smaller.
  // Growth is for scratch activations; a device may keep the larger size for good. A device
  // that replays recorded steps (RunStep) must drop the recordings that used an array it
  // reallocates.
  virtual void Reserve(DeviceArray* a, int64_t numel) = 0;
  // Bytes the device could still allocate (a GPU: free memory; the CPU: -1, unknown).
  virtual int64_t FreeBytes() const = 0;

  // ---- steps

  // The RoPE inverse frequencies ([rotary_dim / 2], fp32) of the global layers and of the
  // sliding (local) ones (Gemma 3's differ; otherwise the two are equal), set once before the
  // first step. REQUIRES: the same length.
  virtual void SetRope(absl::Span<const float> inv_freq,
                       absl::Span<const float> local_inv_freq) = 0;
  // Hands over the next step's inputs.
  virtual void SetStep(const StepView& step) = 0;

  // ---- kernels, over the current step's T tokens unless a row count is given. Shapes and
  // semantics as the CPU kernels (kernels/cpu/cpu_kernels.h); `x + offset` means element offset.

  // out[t] = table[token_ids[t]], rows of width h.
  virtual void EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) = 0;
  // The norms (RmsNorm, AddRmsNorm, HeadRmsNorm) take weights made by NormWeight.
  virtual void RmsNorm(const DeviceArray& x, const DeviceArray& weight, float eps, int64_t rows,
                       int64_t h, DeviceArray* out) = 0;
  // residual += x; out = RmsNorm(residual). out may be x.
  virtual void AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& weight,
                          float eps, int64_t rows, int64_t h, DeviceArray* out) = 0;
  // y[m, n] = x[m, k] · w[n, k]^T (+ bias[n]; bias may be empty).
  virtual void Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias,
                      int64_t m, int64_t n, int64_t k, DeviceArray* y) = 0;
  // Rotate-half RoPE in place on x [T, num_heads, head_dim] at the step's positions, with the
  // local table when `local`, else the global one.
  virtual void Rope(int num_heads, int head_dim, bool local, DeviceArray* x) = 0;
  // In place RMSNorm of every head of x [rows, num_heads, head_dim] with weight [head_dim].
  virtual void HeadRmsNorm(const DeviceArray& weight, float eps, int64_t rows, int num_heads,
                           int head_dim, DeviceArray* x) = 0;
  // out = silu(gate) * up, [rows, inter]; out may be gate.
  virtual void SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows,
                       int64_t inter, DeviceArray* out) = 0;
  // out = gelu_tanh(gate) * up (the tanh approximation of GELU), [rows, inter]; out may be gate.
  virtual void GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows,
                           int64_t inter, DeviceArray* out) = 0;
  // In place on x[0, n): x = cap * tanh(x / cap). REQUIRES: cap > 0.
  virtual void SoftCap(float cap, int64_t n, DeviceArray* x) = 0;
  // In place on x[0, n): x *= factor (in fp32, rounded to the storage type once).
  virtual void Scale(float factor, int64_t n, DeviceArray* x) = 0;
  // Stores k and v ([T, kv_heads, head_dim]) at the step's slots of one layer's pool. The pool
  // is AllocateKv's (or, for Embed's scratch keys and values, Allocate's) memory.
  virtual void WriteKv(const DeviceArray& k, const DeviceArray& v,
                       const kernels::KvCacheLayout& layout, DeviceArray* key_cache,
                       DeviceArray* value_cache) = 0;
  // Paged attention of the step's sequences over one layer's pool: q, out [T, num_heads, D].
  // With options.sliding_window, block-table entries before a sequence's window are not read.
  virtual void Attention(const DeviceArray& q, const DeviceArray& key_cache,
                         const DeviceArray& value_cache, const kernels::KvCacheLayout& layout,
                         int num_heads, const AttentionOptions& options, DeviceArray* out) = 0;
  // out[i] = x[sample_rows[i]], rows of width h.
  virtual void GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) = 0;
  // Copies `rows` rows of `width` elements: row r of src at src_offset + r * src_stride to
  // dst_offset + r * dst_stride of dst, enqueued in order with the kernels (a GPU's is a
  // device-to-device copy that a captured step records). The tensor-parallel leader
  // interleaves its gathered logits slices with it. Default: through HostData, for a device
  // whose memory is the host's.
  virtual void CopyRows(const DeviceArray& src, int64_t src_offset, int64_t src_stride,
                        int64_t rows, int64_t width, int64_t dst_offset, int64_t dst_stride,
                        DeviceArray* dst) {
    const float* from = HostData(src);
    float* to = HostData(*dst);
    if (from == nullptr || to == nullptr) return;
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(from + src_offset + r * src_stride, width, to + dst_offset + r * dst_stride);
    }
  }

  // ---- whole steps and CUDA graphs

  // The batch size a decode-only step of `num_seqs` sequences should be padded to so that it
  // can run as a captured graph; 0: run it as it is (no graphs, or too many sequences). The
  // model pads with dummy sequences (token 0, position 0, slot -1, context 1 over block 0) whose
  // rows are also sampled, and drops their logits.
  virtual int GraphBatchSize(int num_seqs) const { return 0; }
  // Runs `body`, which enqueues one whole step (no host transfers, no collectives, no
  // reallocation by Reserve). For a decode-only step padded to GraphBatchSize, a GPU may record
  // `body` the first time as a CUDA graph and replay the graph for later steps of that size
  // instead of calling `body`. Other devices and steps just call `body`.
  virtual void RunStep(const std::function<void()>& body) { body(); }

  // ---- collectives on the device's buffers

  // The stream the device's kernels are enqueued on (a cudaStream_t), for collectives on its
  // arrays that must run in order with them (cluster::DeviceCommunicator, given it with
  // DeviceArray::data() of kStorage arrays); nullptr for a device without one (the CPU), whose
  // collectives go through host memory. Such collectives may run inside RunStep's body: they
  // are enqueued on this stream, so a captured graph records them.
  virtual void* stream() const { return nullptr; }

  // ---- sampling on the device

  // Whether Sample() is implemented (a GPU). Where it is not, the engine copies the logits to
  // the host and samples there (worker/sampler/sampler.h).
  virtual bool SamplesOnDevice() const { return false; }
  // Samples one token per request from rows [0, requests.size()) of `logits` (an array of
  // rows of `vocab` values as the head wrote them, in the storage type), row i with
  // requests[i], under the CPU sampler's contract (Sampler::Sample: the same pipeline, penalties
  // on the prompt and output tokens, the same (seed, position) draw, logprobs of the raw
  // distribution), so that the same logits give the same token as on the host. Waits for the
  // work enqueued so far and for its own, then writes out[i] (token, logprob, top_logprobs;
  // `out` is resized). Only ids and logprobs cross to the host. REQUIRES: SamplesOnDevice();
  // every params->logprobs <= kMaxLogprobs.
  virtual void Sample(const DeviceArray& logits, int64_t vocab,
                      absl::Span<const SampleRequest> requests, std::vector<SampleResult>* out) {
    out->clear();
  }

  // ---- asynchronous steps
  //
  // Whether the device can run a step while the host prepares the next (a GPU's stream, a
  // test's fake device). Where it can, the model may launch an asynchronous step: SetStep with
  // StepView::async, the step's kernels as usual, then SampleAsync instead of Sample, which
  // enqueues the sampling and returns without waiting; FinishSample later waits for the oldest
  // launched step and writes its samples. The host launches step N + 1 before it finishes step
  // N, never more than two steps ahead: the model double-buffers the views' memory, so step
  // N + 1's inputs never overwrite step N's. In step N + 1's view and in its requests'
  // output_tokens, a negative id (PendingTokenId) is a token step N sampled, which the host
  // does not know yet: the device gathers it from N's results (token ids before the embedding,
  // penalty histories before sampling). Results are those of the synchronous path, token for
  // token. Default: false.
  virtual bool SupportsAsyncStep() const { return false; }
  // Whether SampleAsync also gathers pending tokens in the requests' output_tokens (the
  // penalties' histories). Where it does not (a GPU, whose penalty lists are packed on the
  // host), the engine finishes step N before it launches a step N + 1 that holds a penalized
  // request whose last token is N's. Default: true.
  virtual bool SamplesPendingPenalties() const { return true; }
  // Enqueues the sampling of an asynchronous step (Sample's contract otherwise); the results
  // come from FinishSample. REQUIRES: SupportsAsyncStep() and SamplesOnDevice(); the step's
  // SetStep had StepView::async.
  virtual void SampleAsync(const DeviceArray& logits, int64_t vocab,
                           absl::Span<const SampleRequest> requests) {}
  // Waits for the oldest asynchronous step not yet finished and writes its samples to `out`
  // (one per request of its SampleAsync). REQUIRES: such a step.
  virtual void FinishSample(std::vector<SampleResult>* out) { out->clear(); }

  // ---- host transfers (fp32 on the host), for logits, pooled embeddings and collectives.

  // The array as host fp32 memory when the device's memory is the host's (the CPU device), so
  // collectives and pooling can work in place; nullptr otherwise. Where it is non-null, a
  // DeviceArray that borrows host fp32 memory (empty `memory`) is a valid array for the device
  // too, so results can be written straight into a host buffer.
  virtual float* HostData(const DeviceArray& x) { return nullptr; }

  // Waits for the work enqueued so far, then copies x[offset, offset + n) to `host`.
  virtual void ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) = 0;
  // Copies host[0, n) into x[offset, offset + n).
  virtual void FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) = 0;
};

// How the CPU device stores linear and embedding weights.
enum class WeightFormat {
  kF32,   // fp32, borrowed from the host tensors (which must be fp32)
  kBF16,  // bf16 (kernels/cpu/linear_bf16.h), from fp32 (rounded) or bf16 tensors
  kInt8,  // int8 with a scale per group along K (kernels/cpu/linear_int8.h), from either
};
const char* WeightFormatName(WeightFormat f);  // "fp32", "bf16", "int8"

struct CpuDeviceOptions {
  // The threads the kernels split their work over (not owned; outlives the device). The engine
  // passes its own pool (EngineOptions::num_threads). Default: null, every kernel on the
  // calling thread (the results are the same bits either way).
  ThreadPool* pool = nullptr;
  // Testing only: decode-only steps of up to the largest of these sizes are padded to the next
  // one, as a GPU pads for CUDA graphs, so the model's padding is checked on the CPU. Default:
  // none (no padding).
  std::vector<int> pad_decode_batch_sizes;
  // Linear and embedding weights. Norm weights and biases are fp32 whatever this is.
  // Default: fp32.
  WeightFormat weights = WeightFormat::kF32;
  // kInt8: values per scale along K, a group kernels::cpu::IsSupportedInt8Group takes; 0: the
  // kernel's default (kernels::cpu::kInt8Group). Default: 0.
  int int8_group = 0;
  // The KV cache's element type: kF32 or kBF16. Default: fp32.
  StorageType kv_cache = StorageType::kF32;
};

// OK when the CPU device can take `options`; INVALID_ARGUMENT naming the bad field otherwise
// (an int8 group the kernel lacks, a KV type other than fp32 and bf16).
absl::Status CheckCpuDeviceOptions(const CpuDeviceOptions& options);

// The CPU device: fp32 activations on kernels/cpu, weights and KV cache as `options` asks.
// REQUIRES: CheckCpuDeviceOptions(options) is OK (checked).
std::unique_ptr<ModelDevice> CreateCpuDevice(const CpuDeviceOptions& options = {});
// The same on `pool` (CpuDeviceOptions::pool), no padding.
std::unique_ptr<ModelDevice> CreateCpuDevice(ThreadPool* pool);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_MODEL_DEVICE_H_
