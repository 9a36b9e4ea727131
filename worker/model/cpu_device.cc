#include "worker/model/cpu_device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/linear_int8.h"

namespace carpool::worker {
namespace cpu = ::carpool::kernels::cpu;

namespace {

using Kind = ArrayFormat::Kind;

float* F(const DeviceArray& a) { return static_cast<float*>(a.data()); }
float* F(DeviceArray* a) { return static_cast<float*>(a->data()); }
uint16_t* U16(const DeviceArray& a) { return static_cast<uint16_t*>(a.data()); }
uint16_t* U16(DeviceArray* a) { return static_cast<uint16_t*>(a->data()); }
const float* OrNull(const DeviceArray& a) { return a.empty() ? nullptr : F(a); }

// `bytes` of host memory, 64-byte aligned (QuantizeInt8Weights asks for it; packed bf16 rows
// get it too), freed with the last reference.
absl::StatusOr<std::shared_ptr<void>> AlignedBytes(int64_t bytes) {
  const size_t size = static_cast<size_t>((bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory for a weight"));
  }
  return std::shared_ptr<void>(p, std::free);
}

}  // namespace

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32:
      return "fp32";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kInt8:
      return "int8";
  }
  return "unknown";
}

absl::Status CheckCpuDeviceOptions(const CpuDeviceOptions& o) {
  if (o.weights == WeightFormat::kInt8 && o.int8_group != 0 &&
      !cpu::IsSupportedInt8Group(o.int8_group)) {
    return absl::InvalidArgumentError(
        absl::StrCat("int8 weights take groups of 32 or 64 values, not ", o.int8_group));
  }
  if (o.kv_cache != StorageType::kF32 && o.kv_cache != StorageType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("the CPU's KV cache is fp32 or bf16, not ",
                                                   StorageTypeName(o.kv_cache)));
  }
  return absl::OkStatus();
}

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
    : pool_(options.pool),
      weights_(options.weights),
      int8_group_(options.int8_group != 0 ? options.int8_group : cpu::kInt8Group),
      kv_cache_(options.kv_cache),
      pad_sizes_(options.pad_decode_batch_sizes) {
  CARPOOL_CHECK(CheckCpuDeviceOptions(options).ok());
  std::sort(pad_sizes_.begin(), pad_sizes_.end());
}

std::string CpuDevice::weight_type() const {
  if (weights_ == WeightFormat::kInt8) return absl::StrCat("int8 (group ", int8_group_, ")");
  return WeightFormatName(weights_);
}

absl::StatusOr<DeviceArray> CpuDevice::VectorWeight(const Tensor& host) {
  const int64_t n = host.numel();
  // Borrowed where the model's weights stay borrowed (the kernels only read them). With packed
  // weights every array holds its own memory, so the host's tensors can all be released; these
  // are a few KiB.
  if (weights_ == WeightFormat::kF32 && host.type() == TensorType::kF32) {
    return DeviceArray(nullptr, const_cast<float*>(host.data()), n);
  }
  ASSIGN_OR_RETURN(DeviceArray a, Allocate(n));
  if (host.type() == TensorType::kBF16) {
    cpu::Bf16ToFloat(host.bf16_data(), n, F(&a));
  } else {
    std::copy_n(host.data(), n, F(&a));
  }
  return a;
}

absl::StatusOr<DeviceArray> CpuDevice::Weight(const Tensor& host) {
  if (host.empty()) return DeviceArray();
  if (host.shape().size() == 1) return VectorWeight(host);
  const int64_t numel = host.numel();
  const int64_t n = host.shape()[0];
  const int64_t k = numel / n;
  const bool from_bf16 = host.type() == TensorType::kBF16;
  if (weights_ == WeightFormat::kF32) {
    if (!from_bf16) return DeviceArray(nullptr, const_cast<float*>(host.data()), numel);
    ASSIGN_OR_RETURN(DeviceArray a, Allocate(numel));
    cpu::Bf16ToFloat(host.bf16_data(), numel, F(&a));
    return a;
  }
  if (weights_ == WeightFormat::kBF16) {
    const ArrayFormat format{Kind::kBF16};
    if (from_bf16 && cpu::Bf16PackingIsRowMajor()) {
      // In place: the array holds a copy of the Tensor, which keeps its memory (the mapped
      // file, for a checkpoint's tensor) alive after the host's weights are released.
      auto keep = std::make_shared<Tensor>(host);
      return DeviceArray(std::move(keep), const_cast<uint16_t*>(host.bf16_data()), numel, format,
                         numel * 2);
    }
    const int64_t bytes = cpu::PackedBf16Size(n, k) * 2;
    ASSIGN_OR_RETURN(std::shared_ptr<void> memory, AlignedBytes(bytes));
    uint16_t* dst = static_cast<uint16_t*>(memory.get());
    if (from_bf16) {
      cpu::PackBf16Weights(host.bf16_data(), n, k, dst, pool_);
    } else {
      cpu::PackBf16Weights(host.data(), n, k, dst, pool_);
    }
    return DeviceArray(std::move(memory), dst, numel, format, bytes);
  }
  const int64_t bytes = cpu::QuantizedInt8Bytes(n, k, int8_group_);
  ASSIGN_OR_RETURN(std::shared_ptr<void> memory, AlignedBytes(bytes));
  if (from_bf16) {
    cpu::QuantizeInt8Weights(host.bf16_data(), n, k, int8_group_, memory.get(), pool_);
  } else {
    cpu::QuantizeInt8Weights(host.data(), n, k, int8_group_, memory.get(), pool_);
  }
  void* data = memory.get();
  return DeviceArray(std::move(memory), data, numel, ArrayFormat{Kind::kInt8, int8_group_},
                     bytes);
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

absl::StatusOr<DeviceArray> CpuDevice::AllocateKv(int64_t numel) {
  if (kv_cache_ == StorageType::kF32) return Allocate(numel);
  if (numel <= 0) return DeviceArray();
  uint16_t* p = new (std::nothrow) uint16_t[numel];
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", numel, " bf16 KV cache values of host memory"));
  }
  return DeviceArray(std::shared_ptr<void>(std::unique_ptr<uint16_t[]>(p)), p, numel,
                     ArrayFormat{Kind::kBF16}, numel * 2);
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
  const int64_t t = static_cast<int64_t>(token_ids_.size());
  const int64_t vocab = table.numel() / h;
  switch (table.format().kind) {
    case Kind::kBF16:
      cpu::EmbeddingGatherBf16(U16(table), vocab, h, token_ids_.data(), t, F(out));
      return;
    case Kind::kInt8:
      cpu::EmbeddingGatherInt8(table.data(), vocab, h, table.format().group, token_ids_.data(), t,
                               F(out));
      return;
    case Kind::kStorage:
      cpu::EmbeddingGather(F(table), token_ids_.data(), F(out), t, h);
      return;
  }
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
  switch (w.format().kind) {
    case Kind::kBF16:
      cpu::LinearBf16(F(x), U16(w), OrNull(bias), F(y), m, n, k, pool_);
      return;
    case Kind::kInt8:
      cpu::LinearInt8(F(x), w.data(), OrNull(bias), F(y), m, n, k, w.format().group, pool_);
      return;
    case Kind::kStorage:
      cpu::Linear(F(x), F(w), OrNull(bias), F(y), m, n, k, pool_);
      return;
  }
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
  const int64_t t = static_cast<int64_t>(slots_.size());
  if (key_cache->format().kind == Kind::kBF16) {
    cpu::WriteKvCacheBf16(F(k), F(v), slots_.data(), t, layout, U16(key_cache),
                          U16(value_cache));
  } else {
    cpu::WriteKvCache(F(k), F(v), slots_.data(), t, layout, F(key_cache), F(value_cache));
  }
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
  if (key_cache.format().kind == Kind::kBF16) {
    if (decode_only_) {
      cpu::PagedAttentionDecodeBf16(F(q), U16(key_cache), U16(value_cache), params, F(out), pool_);
    } else {
      cpu::PagedAttentionBf16(F(q), U16(key_cache), U16(value_cache), params, F(out), pool_);
    }
  } else if (decode_only_) {
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
