// Command-line flags for EngineOptions, shared by every binary that runs an engine.
#ifndef CARPOOL_WORKER_ENGINE_FLAGS_H_
#define CARPOOL_WORKER_ENGINE_FLAGS_H_

#include "common/flags.h"
#include "worker/engine.h"

namespace carpool::worker {

// Binds --model, --block-size, --num-kv-blocks, --kv-cache-memory, --max-num-batched-tokens,
// --max-num-seqs, --max-model-len, --scheduler, --enable-chunked-prefill,
// --enable-prefix-caching, --static-batch-timeout-ms and --threads to `options`.
// `options` must outlive the parser.
void RegisterEngineFlags(FlagParser* parser, EngineOptions* options);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_ENGINE_FLAGS_H_
