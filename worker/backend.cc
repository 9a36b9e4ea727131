#include "worker/backend.h"

#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace carpool::worker {
namespace {

// How often the held prefix blocks are checked against the cache for evictions.
constexpr int64_t kKvCheckMicros = 250'000;
// Prompt prefixes followed at once; the oldest is forgotten beyond this.
constexpr size_t kMaxTrackedPrefixes = 4096;

// A prompt prefix whose full blocks may sit in the prefix cache.
struct PrefixChain {
  std::vector<int32_t> tokens;  // the chain's blocks plus one token (LookupPrefix keeps the last)
  uint64_t salt = 0;
  std::vector<uint64_t> hashes;
};

// Tracks which prompt-prefix blocks the engine's KV cache holds, for the router's
// prefix_affinity placement (KvEventsInfo). A request's prompt chain is recorded at Add and
// confirmed at its first token (its prefill is computed and registered by then); a periodic
// LookupPrefix over the followed chains finds the blocks evicted since.
class PrefixTracker {
 public:
  void OnAdd(uint64_t dispatch_id, const DispatchInfo& d, int block_size) {
    PrefixChain c;
    c.hashes = PromptBlockHashes(d.prompt_tokens, block_size, d.cache_salt);
    if (c.hashes.empty()) return;
    const size_t blocks = c.hashes.size();
    c.tokens.assign(d.prompt_tokens.begin(), d.prompt_tokens.begin() + blocks * block_size + 1);
    c.salt = d.cache_salt;
    pending_[dispatch_id] = std::move(c);
  }

  void Forget(uint64_t dispatch_id) { pending_.erase(dispatch_id); }

  void OnFirstToken(uint64_t dispatch_id, const KvCacheManager& kv) {
    auto it = pending_.find(dispatch_id);
    if (it == pending_.end()) return;
    PrefixChain c = std::move(it->second);
    pending_.erase(it);
    const int held = Held(c, kv);
    for (int i = 0; i < held; ++i) {
      if (held_.insert(c.hashes[i]).second) stored_.push_back(c.hashes[i]);
    }
    if (held == 0 || !chain_ends_.insert(c.hashes[held - 1]).second) return;
    c.hashes.resize(held);
    c.tokens.resize(held * kv.block_size() + 1);
    chains_.push_back(std::move(c));
    if (chains_.size() > kMaxTrackedPrefixes) {
      chain_ends_.erase(chains_.front().hashes.back());
      chains_.pop_front();
    }
  }

  std::optional<KvEventsInfo> Take(bool snapshot, int64_t now, const KvCacheManager& kv) {
    if (snapshot || now - last_check_ >= kKvCheckMicros) {
      last_check_ = now;
      Recheck(kv);
    }
    KvEventsInfo e;
    e.reset = snapshot;
    if (snapshot) {
      e.stored.assign(held_.begin(), held_.end());
    } else {
      e.stored = std::move(stored_);
      e.removed = std::move(removed_);
    }
    stored_.clear();
    removed_.clear();
    if (!snapshot && e.stored.empty() && e.removed.empty()) return std::nullopt;
    return e;
  }

 private:
  static int Held(const PrefixChain& c, const KvCacheManager& kv) {
    return kv.LookupPrefix(TokenSpan(c.tokens), c.salt) / kv.block_size();
  }

  // Recomputes the held set from the cache; differences become stored / removed.
  void Recheck(const KvCacheManager& kv) {
    absl::flat_hash_set<uint64_t> now_held;
    std::deque<PrefixChain> kept;
    chain_ends_.clear();
    for (PrefixChain& c : chains_) {
      const int held = Held(c, kv);
      if (held == 0) continue;
      for (int i = 0; i < held; ++i) now_held.insert(c.hashes[i]);
      c.hashes.resize(held);
      c.tokens.resize(held * kv.block_size() + 1);
      if (chain_ends_.insert(c.hashes.back()).second) kept.push_back(std::move(c));
    }
    for (uint64_t h : held_) {
      if (!now_held.contains(h)) removed_.push_back(h);
    }
    for (uint64_t h : now_held) {
      if (!held_.contains(h)) stored_.push_back(h);
    }
    held_ = std::move(now_held);
    chains_ = std::move(kept);
  }

  absl::flat_hash_map<uint64_t, PrefixChain> pending_;  // dispatch id -> its prompt chain
  std::deque<PrefixChain> chains_;                       // confirmed, oldest first
  absl::flat_hash_set<uint64_t> chain_ends_;             // last hash of each chain (dedup)
  absl::flat_hash_set<uint64_t> held_;
  std::vector<uint64_t> stored_, removed_;               // not reported yet
  int64_t last_check_ = 0;
};

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
    if (engine_->kv_cache().prefix_caching_enabled()) {
      prefixes_.OnAdd(d.dispatch_id, d, engine_->kv_cache().block_size());
    }
    return absl::OkStatus();
  }

  void Cancel(uint64_t dispatch_id) override {
    auto it = seq_of_.find(dispatch_id);
    if (it == seq_of_.end()) return;
    engine_->Abort(it->second);
    dispatch_of_.erase(it->second);
    prefixes_.Forget(dispatch_id);
    seq_of_.erase(it);
  }

  void CancelAll() override {
    for (const auto& [engine_id, dispatch_id] : dispatch_of_) {
      engine_->Abort(engine_id);
      prefixes_.Forget(dispatch_id);
    }
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
      if (e.has_token) {
        t.token = std::move(e.sample);
        prefixes_.OnFirstToken(it->second, engine_->kv_cache());
      }
      if (e.finished) {
        t.finished = true;
        t.finish_reason = FinishReasonName(e.completion->finish_reason);
        t.cached_prompt_tokens = e.completion->cached_prompt_tokens;
        prefixes_.Forget(it->second);
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

  // Not under tensor parallelism: LlamaModel::Embed refuses there.
  int embed_dim() const override {
    const cluster::Communicator* group = engine_->options().tensor_parallel_group;
    return group == nullptr || group->size() == 1 ? engine_->model_config().hidden_size : 0;
  }

  absl::StatusOr<std::vector<std::vector<float>>> EmbedBatch(
      absl::Span<const EmbeddingInput* const> inputs) override {
    return engine_->Embed(inputs);
  }

  std::optional<KvEventsInfo> TakeKvEvents(bool snapshot, int64_t now_micros) override {
    if (!engine_->kv_cache().prefix_caching_enabled()) return std::nullopt;
    return prefixes_.Take(snapshot, now_micros, engine_->kv_cache());
  }

 private:
  std::unique_ptr<Engine> engine_;
  absl::flat_hash_map<uint64_t, int64_t> seq_of_;  // dispatch id -> engine seq id
  absl::flat_hash_map<int64_t, uint64_t> dispatch_of_;  // engine seq id -> dispatch id
  PrefixTracker prefixes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateEngineBackend(const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options));
  return std::unique_ptr<Backend>(new EngineBackend(std::move(engine)));
}

}  // namespace carpool::worker
