#include "worker/model/cpu_device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/cpu_kernels.h"

namespace carpool::worker {
namespace cpu = ::carpool::kernels::cpu;

namespace {

float* F(const DeviceArray& a) { return static_cast<float*>(a.data()); }
float* F(DeviceArray* a) { return static_cast<float*>(a->data()); }
const float* OrNull(const DeviceArray& a) { return a.empty() ? nullptr : F(a); }

}  // namespace

const char* StorageTypeName(StorageType t) {
  switch (t) {
    case StorageType::kF32:
      return "fp32";
    case StorageType::kBF16:
      return "bf16";
    case StorageType::kF16:
      return "fp16";
  }
  return "unknown";
}

int StorageTypeBytes(StorageType t) { return t == StorageType::kF32 ? 4 : 2; }

std::unique_ptr<ModelDevice> CreateCpuDevice(const CpuDeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

std::unique_ptr<ModelDevice> CreateCpuDevice(ThreadPool* pool) {
  CpuDeviceOptions options;
  options.pool = pool;
  return CreateCpuDevice(options);
}

CpuDevice::CpuDevice(const CpuDeviceOptions& options)
    : pool_(options.pool), pad_sizes_(options.pad_decode_batch_sizes) {
  std::sort(pad_sizes_.begin(), pad_sizes_.end());
}

absl::StatusOr<DeviceArray> CpuDevice::Weight(const Tensor& host) {
  if (host.empty()) return DeviceArray();
  // Borrowed: the kernels only read weights.
  return DeviceArray(nullptr, const_cast<float*>(host.data()), host.numel());
}

absl::StatusOr<DeviceArray> CpuDevice::Allocate(int64_t numel) {
  if (numel <= 0) return DeviceArray();
  float* p = new (std::nothrow) float[numel];
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", numel, " floats of host memory"));
  }
  return DeviceArray(std::shared_ptr<void>(std::unique_ptr<float[]>(p)), p, numel);
}

void CpuDevice::Reserve(DeviceArray* a, int64_t numel) {
  if (a->numel() >= numel) return;
  absl::StatusOr<DeviceArray> grown = Allocate(numel);
  if (!grown.ok()) {
    std::fprintf(stderr, "CpuDevice::Reserve: %s\n", grown.status().ToString().c_str());
    std::abort();
  }
  *a = std::move(*grown);
}

void CpuDevice::SetRope(absl::Span<const float> inv_freq, absl::Span<const float> local_inv_freq) {
  CARPOOL_CHECK(inv_freq.size() == local_inv_freq.size());
  inv_freq_.assign(inv_freq.begin(), inv_freq.end());
  local_inv_freq_.assign(local_inv_freq.begin(), local_inv_freq.end());
}

void CpuDevice::SetStep(const StepView& step) {
  CARPOOL_CHECK(step.block_size >= 1);
  token_ids_.assign(step.token_ids.begin(), step.token_ids.end());
  positions_.assign(step.positions.begin(), step.positions.end());
  slots_.assign(step.slots.begin(), step.slots.end());
  sample_rows_.assign(step.sample_rows.begin(), step.sample_rows.end());
  decode_only_ = step.decode_only;
  seqs_.assign(step.seqs.begin(), step.seqs.end());
  // Copy the block tables, then point each seq at its copy (after the vector stops growing).
  size_t entries = 0;
  for (const kernels::AttentionSeq& s : step.seqs) {
    entries += (s.context_len + step.block_size - 1) / step.block_size;
  }
  block_tables_.resize(entries);
  size_t at = 0;
  for (kernels::AttentionSeq& s : seqs_) {
    const size_t n = (s.context_len + step.block_size - 1) / step.block_size;
    if (n > 0) std::memcpy(block_tables_.data() + at, s.block_table, n * sizeof(int32_t));
    s.block_table = block_tables_.data() + at;
    at += n;
  }
}

void CpuDevice::EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) {
  cpu::EmbeddingGather(F(table), token_ids_.data(), F(out), static_cast<int64_t>(token_ids_.size()),
                       h);
}

void CpuDevice::RmsNorm(const DeviceArray& x, const DeviceArray& weight, float eps, int64_t rows,
                        int64_t h, DeviceArray* out) {
  cpu::RmsNorm(F(x), F(weight), eps, F(out), rows, h, pool_);
}

void CpuDevice::AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& weight,
                           float eps, int64_t rows, int64_t h, DeviceArray* out) {
  cpu::AddRmsNorm(F(x), F(residual), F(weight), eps, F(out), rows, h, pool_);
}

void CpuDevice::Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias,
                       int64_t m, int64_t n, int64_t k, DeviceArray* y) {
  cpu::Linear(F(x), F(w), OrNull(bias), F(y), m, n, k, pool_);
}

void CpuDevice::Rope(int num_heads, int head_dim, bool local, DeviceArray* x) {
  const std::vector<float>& table = local ? local_inv_freq_ : inv_freq_;
  cpu::RotaryEmbedding(F(x), positions_.data(), table.data(),
                       static_cast<int64_t>(positions_.size()), num_heads, head_dim,
                       2 * static_cast<int>(table.size()), pool_);
}

void CpuDevice::HeadRmsNorm(const DeviceArray& weight, float eps, int64_t rows, int num_heads,
                            int head_dim, DeviceArray* x) {
  cpu::HeadRmsNorm(F(x), F(weight), eps, rows, num_heads, head_dim, pool_);
}

void CpuDevice::SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
                        DeviceArray* out) {
  cpu::SiluMul(F(gate), F(up), F(out), rows, inter, pool_);
}

void CpuDevice::GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows,
                            int64_t inter, DeviceArray* out) {
  cpu::GeluTanhMul(F(gate), F(up), F(out), rows, inter, pool_);
}

void CpuDevice::SoftCap(float cap, int64_t n, DeviceArray* x) { cpu::SoftCap(F(x), cap, n, pool_); }

void CpuDevice::Scale(float factor, int64_t n, DeviceArray* x) { cpu::Scale(F(x), factor, n); }

void CpuDevice::WriteKv(const DeviceArray& k, const DeviceArray& v,
                        const kernels::KvCacheLayout& layout, DeviceArray* key_cache,
                        DeviceArray* value_cache) {
  cpu::WriteKvCache(F(k), F(v), slots_.data(), static_cast<int64_t>(slots_.size()), layout,
                    F(key_cache), F(value_cache));
}

void CpuDevice::Attention(const DeviceArray& q, const DeviceArray& key_cache,
                          const DeviceArray& value_cache, const kernels::KvCacheLayout& layout,
                          int num_heads, const AttentionOptions& options, DeviceArray* out) {
  kernels::AttentionParams params;
  params.cache = layout;
  params.num_heads = num_heads;
  params.scale = options.scale;
  params.sliding_window = options.sliding_window;
  params.logit_softcap = options.logit_softcap;
  params.num_seqs = static_cast<int>(seqs_.size());
  params.seqs = seqs_.data();
  if (decode_only_) {
    cpu::PagedAttentionDecode(F(q), F(key_cache), F(value_cache), params, F(out), pool_);
  } else {
    cpu::PagedAttention(F(q), F(key_cache), F(value_cache), params, F(out), pool_);
  }
}

void CpuDevice::GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) {
  const float* src = F(x);
  float* dst = F(out);
  for (size_t i = 0; i < sample_rows_.size(); ++i) {
    std::copy_n(src + sample_rows_[i] * h, h, dst + static_cast<int64_t>(i) * h);
  }
}

int CpuDevice::GraphBatchSize(int num_seqs) const {
  for (int size : pad_sizes_) {
    if (size >= num_seqs) return size;
  }
  return 0;
}

float* CpuDevice::HostData(const DeviceArray& x) { return F(x); }

void CpuDevice::ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) {
  if (n > 0 && host != F(x) + offset) std::memcpy(host, F(x) + offset, n * sizeof(float));
}

void CpuDevice::FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) {
  if (n > 0 && host != F(x) + offset) std::memcpy(F(x) + offset, host, n * sizeof(float));
}

}  // namespace carpool::worker
