#include "worker/device_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

#ifdef CARPOOL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/model/cuda_device.h"
#endif

namespace carpool::worker {

absl::Status DeviceOptions::Validate() const {
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", gpu_memory_utilization));
  }
  if (gpu_index < -1) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu must be >= 0, got ", gpu_index));
  }
  if (quantization == Quantization::kInt8 && dtype.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantization int8 sets the weights' type: leave --dtype auto (got ",
                     StorageTypeFlagName(*dtype), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckDeviceStorage(const DeviceOptions& o) {
  if (o.kind == DeviceKind::kCuda) {
    if (o.quantization != Quantization::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("--quantization ", QuantizationName(o.quantization),
                       " runs on the CPU only; use --device cpu or --quantization none"));
    }
    if (o.kv_cache_dtype.has_value() && *o.kv_cache_dtype != o.gpu_dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-cache-dtype on a GPU is its --dtype (", StorageTypeFlagName(o.gpu_dtype()),
          "); got ", StorageTypeFlagName(*o.kv_cache_dtype), ": use auto"));
    }
    return absl::OkStatus();
  }
  if (o.dtype == StorageType::kF16) {
    return absl::InvalidArgumentError(
        "--dtype float16 is for GPUs; on the CPU --dtype is auto, float32 or bfloat16");
  }
  return absl::OkStatus();
}

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kAuto:
      return "auto";
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

absl::StatusOr<DeviceKind> ParseDeviceKind(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "auto") return DeviceKind::kAuto;
  if (t == "cpu") return DeviceKind::kCpu;
  if (t == "cuda" || t == "gpu") return DeviceKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be cpu, cuda or auto, got '", text, "'"));
}

absl::StatusOr<StorageType> ParseStorageType(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "bfloat16" || t == "bf16") return StorageType::kBF16;
  if (t == "float16" || t == "fp16" || t == "half") return StorageType::kF16;
  if (t == "float32" || t == "fp32" || t == "float") return StorageType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be bfloat16, float16 or float32, got '", text, "'"));
}

absl::StatusOr<std::optional<StorageType>> ParseDtypeFlag(const std::string& text) {
  if (absl::AsciiStrToLower(text) == "auto") return std::nullopt;
  absl::StatusOr<StorageType> t = ParseStorageType(text);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype must be auto, bfloat16, float16 or float32, got '", text, "'"));
  }
  return *t;
}

absl::StatusOr<std::optional<StorageType>> ParseKvCacheDtypeFlag(const std::string& text) {
  if (absl::AsciiStrToLower(text) == "auto") return std::nullopt;
  absl::StatusOr<StorageType> t = ParseStorageType(text);
  if (!t.ok() || *t == StorageType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-dtype must be auto, bfloat16 or float32, got '", text, "'"));
  }
  return *t;
}

std::string DtypeFlagName(const std::optional<StorageType>& t) {
  return t.has_value() ? StorageTypeFlagName(*t) : "auto";
}

absl::StatusOr<Quantization> ParseQuantization(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "none") return Quantization::kNone;
  if (t == "int8") return Quantization::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("--quantization must be none or int8, got '", text, "'"));
}

const char* QuantizationName(Quantization q) {
  return q == Quantization::kInt8 ? "int8" : "none";
}

absl::StatusOr<TpTransport> ParseTpTransport(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "auto") return TpTransport::kAuto;
  if (t == "mpi") return TpTransport::kMpi;
  if (t == "nccl") return TpTransport::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("--tp-transport must be auto, mpi or nccl, got '", text, "'"));
}

const char* TpTransportName(TpTransport t) {
  switch (t) {
    case TpTransport::kMpi:
      return "mpi";
    case TpTransport::kNccl:
      return "nccl";
    case TpTransport::kAuto:
      break;
  }
  return "auto";
}

bool BuiltWithNccl() {
#ifdef CARPOOL_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

absl::StatusOr<TpTransport> ResolveTpTransport(TpTransport requested, int ranks_on_gpu,
                                               int group_size, bool have_nccl) {
  const bool every_rank_on_gpu = ranks_on_gpu == group_size;
  switch (requested) {
    case TpTransport::kMpi:
      return TpTransport::kMpi;
    case TpTransport::kAuto:
      return every_rank_on_gpu && have_nccl ? TpTransport::kNccl : TpTransport::kMpi;
    case TpTransport::kNccl:
      break;
  }
  if (!have_nccl) {
    return absl::FailedPreconditionError(
        "--tp-transport nccl: this build has no NCCL; use --tp-transport mpi or auto");
  }
  if (!every_rank_on_gpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tp-transport nccl needs a GPU on every rank of the tensor-parallel group, but ",
        group_size - ranks_on_gpu, " of its ", group_size,
        " ranks run on the CPU; use --tp-transport mpi or auto (or --device cuda)"));
  }
  return TpTransport::kNccl;
}

const char* StorageTypeFlagName(StorageType t) {
  switch (t) {
    case StorageType::kF32:
      return "float32";
    case StorageType::kBF16:
      return "bfloat16";
    case StorageType::kF16:
      return "float16";
  }
  return "?";
}

bool BuiltWithCuda() {
#ifdef CARPOOL_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() {
#ifdef CARPOOL_HAVE_CUDA
  return kernels::cuda::DeviceCount();
#else
  return 0;
#endif
}

absl::StatusOr<DeviceOptions> ResolveDevice(const DeviceOptions& options, int local_rank) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  DeviceOptions d = options;
  const int count = CudaDeviceCount();
  if (d.kind == DeviceKind::kAuto) d.kind = count > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
  if (d.kind == DeviceKind::kCpu) return d;
  if (!BuiltWithCuda()) {
    return absl::FailedPreconditionError(
        "--device cuda: this carpool-worker was built without CUDA (configure with nvcc "
        "present, -DCARPOOL_CUDA=ON); use --device cpu");
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "--device cuda: no CUDA device is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES "
        "hides them); use --device cpu");
  }
  if (d.gpu_index >= count) {
    return absl::FailedPreconditionError(absl::StrCat("--gpu ", d.gpu_index, ": only ", count,
                                                      " CUDA device", count == 1 ? "" : "s",
                                                      " visible"));
  }
  if (d.gpu_index < 0) d.gpu_index = local_rank > 0 ? local_rank % count : 0;
  return d;
}

int64_t KvPoolBytesForUtilization(double utilization, int64_t total_bytes, int64_t free_bytes,
                                  int64_t margin_bytes) {
  const int64_t in_use = total_bytes - std::min(free_bytes, total_bytes);
  const int64_t budget =
      static_cast<int64_t>(std::floor(utilization * static_cast<double>(total_bytes)));
  return std::max<int64_t>(0, budget - in_use - margin_bytes);
}

int64_t GpuActivationMarginBytes(const ModelConfig& c, int64_t max_tokens, StorageType storage) {
  const int64_t bytes = storage == StorageType::kF32 ? 4 : 2;
  const int64_t q = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_kv_heads} * c.head_dim;
  // residual, hidden, q, k, v, attention out, o/down out, gate, up; logits in storage and fp32.
  const int64_t per_token = (3 * int64_t{c.hidden_size} + 3 * q + 2 * kv +
                             2 * int64_t{c.intermediate_size} + c.vocab_size) *
                                bytes +
                            int64_t{c.vocab_size} * 4;
  return max_tokens * per_token + (int64_t{512} << 20);
}

absl::Status CheckCudaSupportsModel(const ModelConfig& c) {
  if (c.head_dim != 64 && c.head_dim != 128) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: the CUDA attention kernels support head_dim 64 or 128, this "
                     "model has ",
                     c.head_dim, "; use --device cpu"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelDevice>> CreateCudaModelDevice(const DeviceOptions& options,
                                                                   const DeviceLimits& limits) {
#ifdef CARPOOL_HAVE_CUDA
  CudaDeviceOptions o;
  o.device = std::max(options.gpu_index, 0);
  o.storage = options.gpu_dtype();
  o.cuda_graphs = options.cuda_graphs;
  o.max_num_batched_tokens = std::max(limits.max_num_batched_tokens, limits.max_num_seqs);
  o.max_num_seqs = limits.max_num_seqs;
  o.max_context_len = limits.max_model_len;
  o.kv_block_size = limits.block_size;
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CreateCudaDevice(o);
  if (!device.ok()) return device.status();
  return std::unique_ptr<ModelDevice>(std::move(*device));
#else
  return absl::FailedPreconditionError("this build has no CUDA device support");
#endif
}

absl::StatusOr<GpuMemoryInfo> CudaMemoryInfo(const DeviceOptions& options) {
#ifdef CARPOOL_HAVE_CUDA
  size_t free = 0, total = 0;
  // Measure the GPU the device was created on, whichever device this thread had current.
  CUDA_RETURN_IF_ERROR(cudaSetDevice(std::max(options.gpu_index, 0)));
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
  return GpuMemoryInfo{static_cast<int64_t>(total), static_cast<int64_t>(free)};
#else
  (void)options;
  return absl::FailedPreconditionError("this build has no CUDA device support");
#endif
}

absl::StatusOr<int64_t> CudaKvPoolBytes(const DeviceOptions& options, int64_t weight_bytes,
                                        int64_t margin_bytes) {
  ASSIGN_OR_RETURN(const GpuMemoryInfo memory, CudaMemoryInfo(options));
  return KvPoolBytesForUtilization(options.gpu_memory_utilization, memory.total_bytes,
                                   memory.free_bytes, weight_bytes + margin_bytes);
}

absl::Status GpuMemoryFitError(const std::string& device_name, double utilization,
                               const GpuMemoryInfo& memory, int64_t weight_bytes,
                               int64_t margin_bytes, int64_t kv_block_bytes) {
  const auto mib = [](int64_t bytes) { return absl::StrCat(bytes >> 20, " MiB"); };
  const int64_t needed = weight_bytes + margin_bytes + kv_block_bytes;
  const int64_t others = memory.total_bytes - std::min(memory.free_bytes, memory.total_bytes);
  // What the utilization leaves this process: KvPoolBytesForUtilization's budget before margins.
  const int64_t allowed = KvPoolBytesForUtilization(utilization, memory.total_bytes,
                                                    memory.free_bytes, 0);
  return absl::ResourceExhaustedError(absl::StrCat(
      "the model does not fit on ", device_name, ": it needs ", mib(needed), " (",
      mib(weight_bytes), " of weights, ", mib(margin_bytes), " for activations, ",
      mib(kv_block_bytes), " for one KV block), and --gpu-memory-utilization ", utilization,
      " allows ", mib(allowed), " of the GPU's ", mib(memory.total_bytes), " (",
      mib(memory.free_bytes), " free, ", mib(others),
      " held by other processes); raise --gpu-memory-utilization, lower "
      "--max-num-batched-tokens, split the model with --tp, or free GPU memory"));
}

}  // namespace carpool::worker
