#include "worker/backend.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace carpool::worker {
namespace {

// Maps the router's request ids onto an Engine's.
class EngineBackend : public Backend {
 public:
  explicit EngineBackend(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}

  RegisterInfo Describe() const override {
    const EngineOptions& o = engine_->options();
    const ModelConfig& c = engine_->model_config();
    RegisterInfo r;
    r.max_num_seqs = o.scheduler.max_num_seqs;
    r.num_kv_blocks = engine_->kv_cache().num_blocks();
    r.block_size = o.block_size;
    r.max_model_len = o.scheduler.max_model_len;
    r.vocab_size = c.vocab_size;
    r.tokenizer = TokenizerKindForModel(o.model);
    r.bos_token_id = c.bos_token_id;
    r.max_num_batched_tokens = o.scheduler.max_num_batched_tokens;
    r.hidden_size = c.hidden_size;
    return r;
  }

  absl::Status Add(const DispatchInfo& d) override {
    if (seq_of_.contains(d.dispatch_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", d.dispatch_id, " is already running on this worker"));
    }
    EngineRequest r;
    r.prompt_tokens = d.prompt_tokens;
    r.output_tokens = d.output_tokens;
    r.sampling = d.sampling;
    r.priority = d.priority;
    r.cache_salt = d.cache_salt;
    ASSIGN_OR_RETURN(const int64_t id, engine_->Add(std::move(r)));
    seq_of_[d.dispatch_id] = id;
    dispatch_of_[id] = d.dispatch_id;
    return absl::OkStatus();
  }

  void Cancel(uint64_t dispatch_id) override {
    auto it = seq_of_.find(dispatch_id);
    if (it == seq_of_.end()) return;
    engine_->Abort(it->second);
    dispatch_of_.erase(it->second);
    seq_of_.erase(it);
  }

  void CancelAll() override {
    for (const auto& [engine_id, dispatch_id] : dispatch_of_) engine_->Abort(engine_id);
    dispatch_of_.clear();
    seq_of_.clear();
  }

  bool has_unfinished() const override { return engine_->has_unfinished(); }

  std::vector<TokenEvent> Step() override {
    std::vector<TokenEvent> out;
    for (EngineEvent& e : engine_->Step()) {
      auto it = dispatch_of_.find(e.seq_id);
      if (it == dispatch_of_.end()) continue;
      TokenEvent t;
      t.dispatch_id = it->second;
      t.has_token = e.has_token;
      if (e.has_token) t.token = std::move(e.sample);
      if (e.finished) {
        t.finished = true;
        t.finish_reason = FinishReasonName(e.completion->finish_reason);
        t.cached_prompt_tokens = e.completion->cached_prompt_tokens;
        seq_of_.erase(it->second);
        dispatch_of_.erase(it);
      }
      out.push_back(std::move(t));
    }
    return out;
  }

  WorkerLoad Load() const override {
    WorkerLoad l;
    l.running = engine_->scheduler().num_running();
    l.waiting = engine_->scheduler().num_waiting();
    l.kv_used_blocks = engine_->kv_cache().num_used_blocks();
    l.kv_free_blocks = engine_->kv_cache().num_free_blocks();
    l.preemptions = engine_->scheduler().num_preemptions();
    return l;
  }

  // Under tensor parallelism too: the leader's embed passes run on its followers with it.
  int embed_dim() const override { return engine_->model_config().hidden_size; }

  absl::StatusOr<std::vector<std::vector<float>>> EmbedBatch(
      absl::Span<const EmbeddingInput* const> inputs) override {
    return engine_->Embed(inputs);
  }

  // The KV cache's own events, as they are. It registers every full computed block, of output
  // tokens too and however long the prompt, where the router matches prompt chains
  // (PromptBlockHashes); a later prompt that repeats them (a conversation's next turn) matches
  // output blocks too. That is fine for the router: each hash names one block, so a worker never
  // holds more than num_kv_blocks hashes, the cap PrefixIndex::Apply keeps per worker.
  std::optional<KvEventsInfo> TakeKvEvents(bool snapshot) override {
    if (!engine_->kv_cache().prefix_caching_enabled()) return std::nullopt;
    KvCacheEvents changes = engine_->TakeKvCacheEvents();
    KvEventsInfo e;
    e.reset = snapshot;
    if (snapshot) {
      e.stored = engine_->kv_cache().CachedHashes();  // the changes are in there already
      return e;
    }
    if (changes.empty()) return std::nullopt;
    e.stored = std::move(changes.stored);
    e.removed = std::move(changes.removed);
    return e;
  }

 private:
  std::unique_ptr<Engine> engine_;
  absl::flat_hash_map<uint64_t, int64_t> seq_of_;  // dispatch id -> engine seq id
  absl::flat_hash_map<int64_t, uint64_t> dispatch_of_;  // engine seq id -> dispatch id
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateEngineBackend(const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options));
  return std::unique_ptr<Backend>(new EngineBackend(std::move(engine)));
}

}  // namespace carpool::worker
