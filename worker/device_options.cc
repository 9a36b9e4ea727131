#include "worker/device_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

#ifdef CARPOOL_HAVE_CUDA
#include "kernels/cuda/device_buffer.h"
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

}  // namespace carpool::worker
