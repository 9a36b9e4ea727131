// What a worker's engine loop drives: the inference Engine, or the echo stand-in
// (worker/echo_backend.h). A Backend speaks the router's request ids and wire structs, so the
// loop around it only moves messages.
//
// Thread-compatible: one thread (the engine loop) owns a Backend.
#ifndef CARPOOL_WORKER_BACKEND_H_
#define CARPOOL_WORKER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/messages.h"
#include "worker/engine.h"

namespace carpool::worker {

class Backend {
 public:
  virtual ~Backend() = default;

  // Capacity and model description for `register`; worker_id and model are left for the caller.
  virtual RegisterInfo Describe() const = 0;

  // Queues a dispatched request. INVALID_ARGUMENT (naming the problem) when it cannot run here,
  // including a dispatch_id already in flight; nothing is queued then.
  virtual absl::Status Add(const DispatchInfo& request) = 0;
  // Drops a request and frees what it holds; nothing more is reported for it. Unknown ids
  // (finished, never seen) are ignored.
  virtual void Cancel(uint64_t dispatch_id) = 0;
  // Cancel() for every request in flight.
  virtual void CancelAll() = 0;

  virtual bool has_unfinished() const = 0;
  // One step: the events it produced, at most one per request, in order. Empty when nothing
  // could run.
  virtual std::vector<TokenEvent> Step() = 0;

  // running, waiting, KV blocks and the cumulative preemption count; embed_queued is left for
  // the engine loop, which owns the embedding queue.
  virtual WorkerLoad Load() const = 0;

  // Embeddings (docs/dynamic_batching.md, "Embeddings in the worker"). The width of the vectors
  // EmbedBatch returns; 0 when this backend cannot embed. Default: 0.
  virtual int embed_dim() const { return 0; }
  // One vector of embed_dim() floats per input, in input order, or one error for the whole
  // batch: INVALID_ARGUMENT naming the bad input (empty, a token outside the vocabulary, too
  // long), UNIMPLEMENTED when this backend cannot embed. Runs at once on the calling (engine)
  // thread, between steps; keeps nothing (no KV blocks) afterwards. A result depends only on
  // its input, not on the rest of the batch.
  virtual absl::StatusOr<std::vector<std::vector<float>>> EmbedBatch(
      absl::Span<const EmbeddingInput* const> inputs) {
    return absl::UnimplementedError("this worker's model cannot compute embeddings");
  }

  // Prefix-cache blocks (KvCacheManager block hashes) that this backend came to hold or stopped
  // holding since the last call, evictions included, as the KV cache recorded them; with
  // `snapshot`, a reset followed by every block held now. nullopt when there is nothing to
  // report. Default: never anything (no prefix cache).
  virtual std::optional<KvEventsInfo> TakeKvEvents(bool snapshot) {
    return std::nullopt;
  }
};

// A Backend over Engine::Create(options). A Hugging Face folder with a tokenizer.json registers
// TokenizerKind::kHuggingFace with the bytes of tokenizer.json and tokenizer_config.json and the
// ids that end generation (generation_config.json's eos_token_id, config.json's); an error
// names a tokenizer file that cannot be read, a malformed generation_config.json, or tokenizer
// files too large for a registration (48 MiB together).
absl::StatusOr<std::unique_ptr<Backend>> CreateEngineBackend(const EngineOptions& options);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_BACKEND_H_
