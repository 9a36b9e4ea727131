// `--model echo`: a Backend without a model, for testing the router and the wire end to end.
// Every dispatch is answered by the next Step(): the prompt tokens come back as output tokens,
// min(prompt length, max_tokens) of them (continuing after output_tokens for a resumed
// request), each with logprob 0; the last event is finished with finish_reason "length".
//
// Embeddings have kEchoEmbedDim floats, a pure function of the token ids: token t contributes
//   e(t)[j] = ((t + 1) * (j + 1) * 7919 mod 2003) / 1001 - 1       (in [-1, 1], j < 8),
// the input's vector is the mean of its tokens' e (kMean) or the last token's (kLast), computed
// in double, scaled to unit L2 norm when asked (a zero vector stays zero), then rounded to
// float. An empty input or a negative token id is INVALID_ARGUMENT.
//
// Thread-compatible, like every Backend.
#ifndef CARPOOL_WORKER_ECHO_BACKEND_H_
#define CARPOOL_WORKER_ECHO_BACKEND_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/backend.h"
#include "worker/engine.h"

namespace carpool::worker {

inline constexpr char kEchoModel[] = "echo";
inline constexpr int kEchoEmbedDim = 8;

// The echo backend's embedding of `tokens` (see above); REQUIRES: not empty, ids >= 0.
std::vector<float> EchoEmbedding(const std::vector<int32_t>& tokens, Pooling pooling,
                                 bool normalize);

// Capacity comes from `options`: scheduler.max_num_seqs, scheduler.max_num_batched_tokens,
// block_size, scheduler.max_model_len (<= 0: 1 << 20) and num_kv_blocks (0: enough for
// max_num_seqs full-length sequences, at most 1 << 30). The vocabulary is 1 << 30 ids.
std::unique_ptr<Backend> CreateEchoBackend(const EngineOptions& options);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_ECHO_BACKEND_H_
