// `--model echo`: a Backend without a model, for testing the router and the wire end to end.
// Every dispatch is answered by the next Step(): the prompt tokens come back as output tokens,
// min(prompt length, max_tokens) of them (continuing after output_tokens for a resumed
// request), each with logprob 0; the last event is finished with finish_reason "length".
//
// Thread-compatible, like every Backend.
#ifndef CARPOOL_WORKER_ECHO_BACKEND_H_
#define CARPOOL_WORKER_ECHO_BACKEND_H_

#include <memory>

#include "worker/backend.h"
#include "worker/engine.h"

namespace carpool::worker {

inline constexpr char kEchoModel[] = "echo";

// Capacity comes from `options`: scheduler.max_num_seqs, scheduler.max_num_batched_tokens,
// block_size, scheduler.max_model_len (<= 0: 1 << 20) and num_kv_blocks (0: enough for
// max_num_seqs full-length sequences, at most 1 << 30). The vocabulary is 1 << 30 ids.
std::unique_ptr<Backend> CreateEchoBackend(const EngineOptions& options);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_ECHO_BACKEND_H_
