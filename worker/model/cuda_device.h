// The GPU device of the model (worker/model/model_device.h): kernels/cuda and cuBLASLt on one
// CUDA device and one stream. Only in builds with CUDA (CARPOOL_HAVE_CUDA).
//
// Storage is bf16 by default (fp16 or fp32 on request); every kernel and GEMM accumulates in
// fp32 and rounds its output to the storage type once. Weights are converted on the device: an
// fp32 host tensor goes up in chunks through a staging buffer and a Convert kernel, so the host
// never holds a second copy. Norm weights (NormWeight) stay fp32. Arrays are cudaMalloc'ed
// (256-byte aligned).
//
// Steps: SetStep() packs the step's inputs (token ids, positions, slots, attention sequences and
// block tables, sample rows) into one pinned host buffer and copies it with one asynchronous copy
// into device buffers that keep their addresses from step to step (they grow only when a step
// exceeds them; sized up front from CudaDeviceOptions). The kernels read those buffers.
//
// CUDA graphs (options.cuda_graphs): a decode-only step of exactly one of the captured batch
// sizes runs its attention with fixed bounds (num_seqs = the batch size, max_context_len =
// options.max_context_len, a fixed block-table stride), so one graph per batch size serves every
// later step of that size. RunStep() runs `body` once eagerly the first time (which sizes every
// buffer and workspace and picks the GEMM algorithms), then captures it and replays the graph from
// then on. Anything that moves a buffer (Reserve growing an array, the step buffers growing)
// drops every graph; they are captured again when next needed. A capture that fails turns graphs
// off for that batch size (the step runs eagerly) and is reported once on stderr.
//
// Errors. The kernel methods of ModelDevice return nothing, so the first CUDA or argument error
// is kept (status()); from then on kernels are skipped. By default (abort_on_error) the next
// ToHost() prints the error and ends the process: after a device fault the CUDA context is
// unusable, and the engine has no way to finish the step (as a failed collective does under
// tensor parallelism). Tests turn that off and check status().
//
// Thread-compatible: one thread at a time drives a device. The constructor makes options.device
// the calling thread's current CUDA device, and so do Allocate (hence Weight), MemoryInfo and
// SetStep, so a device created on one thread (where the weights go up) can be stepped on another
// (the worker's engine thread); the calls between SetStep and ToHost must come from the thread
// that called SetStep.
#ifndef CARPOOL_WORKER_MODEL_CUDA_DEVICE_H_
#define CARPOOL_WORKER_MODEL_CUDA_DEVICE_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/model_device.h"

namespace carpool::worker {

struct CudaDeviceOptions {
  // CUDA device index (cudaSetDevice). Default: 0.
  int device = 0;
  // Storage type of weights, activations and the KV cache. Default: bf16.
  StorageType storage = StorageType::kBF16;
  // Capture decode steps as CUDA graphs at graph_batch_sizes. Default: true.
  bool cuda_graphs = true;
  // Batch sizes decode steps are padded to and captured at, ascending; those above
  // max_num_seqs are dropped, and max_num_seqs itself is added when it lies between two.
  // Default: 1, 2, 4, 8, 16, 32, 64, 128, 256.
  std::vector<int> graph_batch_sizes = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  // Bounds the step buffers are sized for up front (they grow past them, which drops every
  // captured graph). max_context_len is also the context bound captured decode graphs attend
  // with; kv_block_size is the KV pool's block size (only steps with StepView::block_size
  // equal to it run as graphs).
  // Defaults: 2048 tokens, 256 sequences, contexts of 8192 tokens, blocks of 16.
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 256;
  int max_context_len = 8192;
  int kv_block_size = 16;
  // Elements converted per chunk when a weight goes up (the staging buffer holds this many fp32
  // values). Default: 16 Mi (64 MiB of staging).
  int64_t upload_chunk_elements = int64_t{16} << 20;
  // Allow TF32 tensor cores for fp32 GEMMs. Default: false (true fp32, for exact comparisons).
  bool allow_tf32 = false;
  // End the process at the next ToHost() after an error (see the header comment). Default: true.
  bool abort_on_error = true;

  absl::Status Validate() const;
};

// A ModelDevice on one CUDA device. Created by CreateCudaDevice.
class CudaDevice : public ModelDevice {
 public:
  // The first error seen (OK while there was none).
  virtual absl::Status status() const = 0;
  // cudaMemGetInfo of the device: {free, total} bytes.
  virtual absl::StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() const = 0;
  // Graphs captured so far, and steps replayed from a graph (for tests and benchmarks).
  virtual int graphs_captured() const = 0;
  virtual int64_t graph_replays() const = 0;
  // Waits for all enqueued work; returns status().
  virtual absl::Status Synchronize() = 0;
};

// UNAVAILABLE when options.device does not exist (or there is no GPU); INVALID_ARGUMENT for bad
// options; RESOURCE_EXHAUSTED when the step buffers or the GEMM workspace do not fit.
absl::StatusOr<std::unique_ptr<CudaDevice>> CreateCudaDevice(const CudaDeviceOptions& options);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_CUDA_DEVICE_H_
