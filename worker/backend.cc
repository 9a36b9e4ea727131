#include "worker/backend.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
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
    r.tokenizer = absl::StartsWith(o.model, "synthetic:") ? "byte" : "";
    r.bos_token_id = c.bos_token_id;
    r.max_num_batched_tokens = o.scheduler.max_num_batched_tokens;
    return r;
  }

  absl::Status Add(const DispatchInfo& d) override {
    if (engine_of_.contains(d.request_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", d.request_id, " is already running on this worker"));
    }
    EngineRequest r;
    r.prompt_tokens = d.prompt_tokens;
    r.output_tokens = d.output_tokens;
    r.sampling = d.sampling;
    r.priority = d.priority;
    r.cache_salt = d.cache_salt;
    ASSIGN_OR_RETURN(const int64_t id, engine_->Add(std::move(r)));
    engine_of_[d.request_id] = id;
    router_of_[id] = d.request_id;
    return absl::OkStatus();
  }

  void Cancel(uint64_t request_id) override {
    auto it = engine_of_.find(request_id);
    if (it == engine_of_.end()) return;
    engine_->Abort(it->second);
    router_of_.erase(it->second);
    engine_of_.erase(it);
  }

  void CancelAll() override {
    for (const auto& [engine_id, router_id] : router_of_) engine_->Abort(engine_id);
    router_of_.clear();
    engine_of_.clear();
  }

  bool has_unfinished() const override { return engine_->has_unfinished(); }

  std::vector<TokenEvent> Step() override {
    std::vector<TokenEvent> out;
    for (EngineEvent& e : engine_->Step()) {
      auto it = router_of_.find(e.request_id);
      if (it == router_of_.end()) continue;
      TokenEvent t;
      t.request_id = it->second;
      t.has_token = e.has_token;
      if (e.has_token) t.token = std::move(e.sample);
      if (e.finished) {
        t.finished = true;
        t.finish_reason = FinishReasonName(e.completion->finish_reason);
        t.cached_prompt_tokens = e.completion->cached_prompt_tokens;
        engine_of_.erase(it->second);
        router_of_.erase(it);
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
    return l;
  }

 private:
  std::unique_ptr<Engine> engine_;
  absl::flat_hash_map<uint64_t, int64_t> engine_of_;  // router id -> engine id
  absl::flat_hash_map<int64_t, uint64_t> router_of_;  // engine id -> router id
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateEngineBackend(const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options));
  return std::unique_ptr<Backend>(new EngineBackend(std::move(engine)));
}

}  // namespace carpool::worker
