// The CPU ModelDevice: fp32 activations on kernels/cpu (see model_device.h for the contract).
//
// Weights (CpuDeviceOptions::weights): in fp32 they are borrowed in place (Weight() copies
// nothing, so the Tensor must outlive its array); in bf16 or int8 every weight array holds its
// memory itself (packed or quantized copies, norms and biases copied as fp32, and bf16 tensors
// borrowed in place where the packing is row-major keep a reference to their Tensor), so the
// model can release the host's tensors once it has its arrays. Linear and EmbeddingGather run
// the kernel of the weight's format. AllocateKv() holds fp32 or bf16 (CpuDeviceOptions::
// kv_cache), and WriteKv / Attention run the kernels of the cache's format. Allocate() owns
// host float arrays; HostData() is every array's own pointer, so collectives and pooling work
// in place and ToHost/FromHost are plain copies (of fp32 arrays: activations). SetStep() copies
// the step into buffers reused across steps (no allocation once they have grown), block tables
// included, so the caller's StepView may go away. Every kernel runs synchronously, split over
// CpuDeviceOptions::pool (or on the calling thread without one).
//
// Thread-compatible: one engine thread drives it.
#ifndef CARPOOL_WORKER_MODEL_CPU_DEVICE_H_
#define CARPOOL_WORKER_MODEL_CPU_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/model_device.h"

namespace carpool::worker {

class CpuDevice : public ModelDevice {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options);

  std::string name() const override { return "cpu"; }
  StorageType storage_type() const override { return StorageType::kF32; }
  std::string weight_type() const override;
  StorageType kv_storage_type() const override { return kv_cache_; }

  absl::StatusOr<DeviceArray> Weight(const Tensor& host) override;
  absl::StatusOr<DeviceArray> Allocate(int64_t numel) override;
  absl::StatusOr<DeviceArray> AllocateKv(int64_t numel) override;
  void Reserve(DeviceArray* a, int64_t numel) override;
  int64_t FreeBytes() const override { return -1; }

  void SetRope(absl::Span<const float> inv_freq, absl::Span<const float> local_inv_freq) override;
  void SetStep(const StepView& step) override;

  void EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) override;
  void RmsNorm(const DeviceArray& x, const DeviceArray& weight, float eps, int64_t rows, int64_t h,
               DeviceArray* out) override;
  void AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& weight, float eps,
                  int64_t rows, int64_t h, DeviceArray* out) override;
  void Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias, int64_t m,
              int64_t n, int64_t k, DeviceArray* y) override;
  void Rope(int num_heads, int head_dim, bool local, DeviceArray* x) override;
  void HeadRmsNorm(const DeviceArray& weight, float eps, int64_t rows, int num_heads, int head_dim,
                   DeviceArray* x) override;
  void SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
               DeviceArray* out) override;
  void GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
                   DeviceArray* out) override;
  void SoftCap(float cap, int64_t n, DeviceArray* x) override;
  void Scale(float factor, int64_t n, DeviceArray* x) override;
  void WriteKv(const DeviceArray& k, const DeviceArray& v, const kernels::KvCacheLayout& layout,
               DeviceArray* key_cache, DeviceArray* value_cache) override;
  void Attention(const DeviceArray& q, const DeviceArray& key_cache, const DeviceArray& value_cache,
                 const kernels::KvCacheLayout& layout, int num_heads,
                 const AttentionOptions& options, DeviceArray* out) override;
  void GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) override;

  int GraphBatchSize(int num_seqs) const override;

  float* HostData(const DeviceArray& x) override;
  void ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) override;
  void FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) override;

 private:
  // A 1-D tensor (bias or norm) as fp32.
  absl::StatusOr<DeviceArray> VectorWeight(const Tensor& host);

  ThreadPool* const pool_;      // may be null
  const WeightFormat weights_;
  const int int8_group_;        // the resolved group (never 0)
  const StorageType kv_cache_;
  std::vector<int> pad_sizes_;  // sorted ascending
  std::vector<float> inv_freq_, local_inv_freq_;
  // The current step (SetStep's copy). seqs_[i].block_table points into block_tables_.
  std::vector<int32_t> token_ids_, positions_;
  std::vector<int64_t> slots_, sample_rows_;
  std::vector<kernels::AttentionSeq> seqs_;
  std::vector<int32_t> block_tables_;
  bool decode_only_ = true;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_CPU_DEVICE_H_
