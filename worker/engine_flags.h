// Command-line flags for EngineOptions, shared by every binary that runs an engine.
#ifndef CARPOOL_WORKER_ENGINE_FLAGS_H_
#define CARPOOL_WORKER_ENGINE_FLAGS_H_

#include "common/flags.h"
#include "worker/device_options.h"
#include "worker/engine.h"

namespace carpool::worker {

// Binds --model, --block-size, --num-kv-blocks, --kv-cache-memory, --max-num-batched-tokens,
// --max-num-seqs, --max-model-len, --scheduler, --enable-chunked-prefill,
// --enable-prefix-caching, --static-batch-timeout-ms, --threads, --device-sampling
// (auto|on|off) and --async-step (auto|on|off) to `options`, and the device
// flags below to options->device, whose kind and dtype it sets to auto (a GPU when the build has
// CUDA and one is visible; bf16 weights for a BF16 checkpoint on the CPU). `options` must outlive the parser.
void RegisterEngineFlags(FlagParser* parser, EngineOptions* options);

// Binds --device (cpu|cuda|auto), --gpu N, --dtype (auto|bfloat16|float16|float32),
// --quantization (none|int8), --kv-cache-dtype (auto|bfloat16|float32),
// --gpu-memory-utilization (0, 1], --cuda-graphs / --no-cuda-graphs and --tp-transport
// (auto|mpi|nccl) to `options`. Malformed
// values are errors naming the flag and the choices; ranges and combinations are checked by
// DeviceOptions::Validate and CheckDeviceStorage.
// `options` must outlive the parser.
void RegisterDeviceFlags(FlagParser* parser, DeviceOptions* options);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_ENGINE_FLAGS_H_
