// Which device a worker's model runs on, and how it stores weights and the KV cache: the
// options behind --device, --gpu, --dtype, --quantization, --kv-cache-dtype,
// --gpu-memory-utilization, --cuda-graphs and --tp-transport (worker/engine_flags.h).
//
//   DeviceOptions d;                       // auto: CUDA when built with it and a GPU is visible
//   ASSIGN_OR_RETURN(d, ResolveDevice(d, local_rank));   // kind is now kCpu or kCuda
//
// On a GPU, dtype is the storage type of everything; on the CPU, activations are fp32 and dtype,
// quantization and kv_cache_dtype choose the weights' and the KV cache's (Engine::Create
// resolves their autos). gpu_memory_utilization and cuda_graphs apply to CUDA.
#ifndef CARPOOL_WORKER_DEVICE_OPTIONS_H_
#define CARPOOL_WORKER_DEVICE_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/model_device.h"
#include "worker/weights/model_config.h"

namespace carpool::worker {

enum class DeviceKind { kAuto, kCpu, kCuda };

// Weight-only quantization computed at load.
enum class Quantization { kNone, kInt8 };

// How a tensor-parallel group's collectives travel (--tp-transport). kMpi: through host memory
// over MPI (the CPU's way; on GPUs each sum copies its array to the host and back). kNccl: NCCL
// on the device's buffers, on the step's stream (every rank on a GPU). kAuto: kNccl when every
// rank of the group computes on a GPU and the build has NCCL, else kMpi.
enum class TpTransport { kAuto, kMpi, kNccl };

struct DeviceOptions {
  // kAuto: kCuda when this build has CUDA and a GPU is visible, else kCpu. Default: kAuto.
  DeviceKind kind = DeviceKind::kAuto;
  // CUDA device index; -1: the process's local rank (under mpirun / srun) modulo the number of
  // devices, else 0. Default: -1.
  int gpu_index = -1;
  // On a GPU the storage type of weights, activations and KV cache (bf16, fp16 or fp32); on
  // the CPU that of the linear and embedding weights (fp32 or bf16). nullopt (--dtype auto):
  // bf16 on a GPU; on the CPU bf16 for a BF16 checkpoint where the bf16 kernel has a vector
  // path (CpuAutoDtypeIsBf16 in worker/engine.h), else fp32. Default: auto (EngineOptions sets
  // fp32).
  std::optional<StorageType> dtype = std::nullopt;
  // --quantization int8 (the CPU only): linear and embedding weights quantized to int8 at load,
  // from any checkpoint dtype; dtype must then be auto. Default: none.
  Quantization quantization = Quantization::kNone;
  // The CPU's KV cache: fp32 or bf16. nullopt (--kv-cache-dtype auto): bf16 when the weights are
  // bf16 or int8, else fp32. A GPU's KV cache is in its storage type: set, this must equal it.
  // Default: auto.
  std::optional<StorageType> kv_cache_dtype = std::nullopt;
  // Fraction of the GPU's total memory the worker may fill: the KV pool gets what is left of it
  // after the weights and a workspace margin. In (0, 1]. Default: 0.9.
  double gpu_memory_utilization = 0.9;
  // Capture decode steps at padded batch sizes as CUDA graphs. Default: true.
  bool cuda_graphs = true;
  // Tensor parallelism's collectives (ResolveTpTransport). Default: auto.
  TpTransport tp_transport = TpTransport::kAuto;

  // The storage type on a GPU (dtype, or bf16 for auto).
  StorageType gpu_dtype() const { return dtype.value_or(StorageType::kBF16); }

  // INVALID_ARGUMENT naming the flag: ranges, and combinations no device takes (--quantization
  // int8 with an explicit --dtype). What only one kind of device refuses is checked where the
  // kind is known (CheckDeviceStorage).
  absl::Status Validate() const;
};

// The storage flags against the resolved kind (kCpu or kCuda): the CPU takes --dtype fp32 or
// bf16 and --kv-cache-dtype fp32 or bf16; a GPU takes no --quantization and a --kv-cache-dtype
// only equal to its --dtype. INVALID_ARGUMENT naming the flag and the choices otherwise.
absl::Status CheckDeviceStorage(const DeviceOptions& options);

const char* DeviceKindName(DeviceKind kind);  // "auto", "cpu", "cuda"
// "cpu" | "cuda" | "auto"; INVALID_ARGUMENT naming --device otherwise.
absl::StatusOr<DeviceKind> ParseDeviceKind(const std::string& text);
// "bfloat16" | "bf16" | "float16" | "fp16" | "half" | "float32" | "fp32" | "float";
// INVALID_ARGUMENT naming --dtype otherwise.
absl::StatusOr<StorageType> ParseStorageType(const std::string& text);
const char* StorageTypeFlagName(StorageType t);  // "bfloat16", "float16", "float32"
// --dtype: "auto" (nullopt) or a ParseStorageType name; INVALID_ARGUMENT naming --dtype and the
// choices otherwise.
absl::StatusOr<std::optional<StorageType>> ParseDtypeFlag(const std::string& text);
// --kv-cache-dtype: "auto" (nullopt), a bf16 or an fp32 name of ParseStorageType;
// INVALID_ARGUMENT naming --kv-cache-dtype and the choices otherwise.
absl::StatusOr<std::optional<StorageType>> ParseKvCacheDtypeFlag(const std::string& text);
// "auto" for nullopt, else StorageTypeFlagName.
std::string DtypeFlagName(const std::optional<StorageType>& t);
// --quantization: "none" | "int8"; INVALID_ARGUMENT naming --quantization and the choices
// otherwise.
absl::StatusOr<Quantization> ParseQuantization(const std::string& text);
const char* QuantizationName(Quantization q);  // "none", "int8"
// --tp-transport: "auto" | "mpi" | "nccl"; INVALID_ARGUMENT naming --tp-transport and the
// choices otherwise.
absl::StatusOr<TpTransport> ParseTpTransport(const std::string& text);
const char* TpTransportName(TpTransport t);  // "auto", "mpi", "nccl"

// True when this build has NCCL (the NCCL communicator, cluster/nccl_communicator.h).
bool BuiltWithNccl();

// The transport (kMpi or kNccl) a tensor-parallel group of `group_size` ranks, of which
// `ranks_on_gpu` resolved their device to CUDA, uses under `requested`. Every rank must call it
// with the same counts (carpool-worker sums them over the group first), so that all agree.
// FAILED_PRECONDITION naming --tp-transport when kNccl is asked for but a rank runs on the CPU
// or the build has no NCCL (`have_nccl`).
absl::StatusOr<TpTransport> ResolveTpTransport(TpTransport requested, int ranks_on_gpu,
                                               int group_size, bool have_nccl);

// True when this build has the CUDA backend.
bool BuiltWithCuda();
// Visible CUDA devices; 0 without CUDA in the build, a driver or a device.
int CudaDeviceCount();

// Resolves kAuto and gpu_index. `local_rank` is the process's rank on its node under a launcher
// (-1: none). FAILED_PRECONDITION when CUDA is asked for but the build has none or no GPU is
// visible, or --gpu names a device that does not exist; INVALID_ARGUMENT from Validate.
absl::StatusOr<DeviceOptions> ResolveDevice(const DeviceOptions& options, int local_rank);

// KV pool bytes under a memory-utilization target: utilization x total, minus what is in use
// (total - free: the weights and everything else allocated so far, by this or any process),
// minus `margin_bytes` for activations and workspaces allocated after the pool. 0 when nothing
// is left.
int64_t KvPoolBytesForUtilization(double utilization, int64_t total_bytes, int64_t free_bytes,
                                  int64_t margin_bytes);

// Bytes a step's activations, workspaces and staging may take on a GPU beyond the weights and
// the KV pool, for a model of `config` with up to `max_tokens` tokens in a step: every scratch
// array of LlamaModel at max_tokens rows in `storage`, fp32 logits for max_tokens rows, and a
// fixed 512 MiB for cuBLASLt, attention and upload workspaces and allocator slack.
int64_t GpuActivationMarginBytes(const ModelConfig& config, int64_t max_tokens,
                                 StorageType storage);

// OK when the CUDA kernels can run a model of `config`; else FAILED_PRECONDITION naming what
// they lack (today: paged attention supports head_dim 64 and 128 only). Checked by
// Engine::Create before a CUDA device is built, so that an unsupported model fails there rather
// than at its first step (where the device's first error ends the process).
absl::Status CheckCudaSupportsModel(const ModelConfig& config);

// Sizes for a CUDA device's step buffers and graphs (from the engine's options).
struct DeviceLimits {
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 256;
  int max_model_len = 8192;
  int block_size = 16;
};

// The CUDA device that `options` (resolved, kind kCuda) asks for. FAILED_PRECONDITION in a
// build without CUDA; otherwise CreateCudaDevice's errors.
absl::StatusOr<std::unique_ptr<ModelDevice>> CreateCudaModelDevice(const DeviceOptions& options,
                                                                   const DeviceLimits& limits);

// The KV pool bytes of --gpu-memory-utilization on the current CUDA device, before
// `weight_bytes` of weights (in the storage type) are uploaded: KvPoolBytesForUtilization with
// the device's free and total memory and a margin of weight_bytes + margin_bytes.
// FAILED_PRECONDITION without CUDA.
absl::StatusOr<int64_t> CudaKvPoolBytes(const DeviceOptions& options, int64_t weight_bytes,
                                        int64_t margin_bytes);

// A GPU's memory as the driver reports it (cudaMemGetInfo).
struct GpuMemoryInfo {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
};

// The memory of the CUDA device `options` names. FAILED_PRECONDITION without CUDA.
absl::StatusOr<GpuMemoryInfo> CudaMemoryInfo(const DeviceOptions& options);

// RESOURCE_EXHAUSTED for a model that does not fit on a GPU under --gpu-memory-utilization,
// naming what it needs (weights, activation margin and one KV block, each and in sum), what the
// utilization allows of the GPU's memory, what is free and what other processes hold, and the
// flags that would make it fit.
absl::Status GpuMemoryFitError(const std::string& device_name, double utilization,
                               const GpuMemoryInfo& memory, int64_t weight_bytes,
                               int64_t margin_bytes, int64_t kv_block_bytes);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_DEVICE_OPTIONS_H_
