#include "worker/backend.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace carpool::worker {
namespace {

using Json = nlohmann::json;

// A registration must fit the router's frame limit for worker messages (RouterOptions::
// max_frame_bytes, 64 MiB by default); the tokenizer files go in it whole.
constexpr int64_t kMaxHandoverBytes = 48 << 20;

// What a model folder's registration hands the router so it can tokenize for it.
struct TokenizerHandover {
  TokenizerKind kind = TokenizerKind::kNone;
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string chat_template_jinja;  // the folder's chat_template.jinja ("" when it has none)
  std::vector<int32_t> eos_token_ids;
};

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path.string()));
  return std::move(out).str();
}

// The ids of an "eos_token_id" key (an integer or a list of them) in `file`'s JSON object;
// nullopt when it has none (or null).
absl::StatusOr<std::optional<std::vector<int32_t>>> EosIdsOf(const Json& root,
                                                              const std::string& file) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  }
  auto it = root.find("eos_token_id");
  if (it == root.end() || it->is_null()) return std::nullopt;
  std::vector<int32_t> ids;
  const auto add = [&](const Json& id) -> absl::Status {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": eos_token_id must be a token id or a list of them, got ", id.dump()));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const Json& id : *it) RETURN_IF_ERROR(add(id));
  } else {
    RETURN_IF_ERROR(add(*it));
  }
  return ids;
}

// tokenizer_config.json's eos_token (a string or an AddedToken object) looked up among
// tokenizer.json's added tokens; nullopt when either is missing.
std::optional<int32_t> ConfigEosId(const std::string& tokenizer_json,
                                   const std::string& tokenizer_config_json) {
  const Json config = Json::parse(tokenizer_config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("eos_token")) return std::nullopt;
  const Json& eos = config["eos_token"];
  std::string content;
  if (eos.is_string()) {
    content = eos.get<std::string>();
  } else if (eos.is_object() && eos.contains("content") && eos["content"].is_string()) {
    content = eos["content"].get<std::string>();
  } else {
    return std::nullopt;
  }
  const Json tokenizer = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (!tokenizer.is_object() || !tokenizer.contains("added_tokens") ||
      !tokenizer["added_tokens"].is_array()) {
    return std::nullopt;
  }
  for (const Json& t : tokenizer["added_tokens"]) {
    if (t.is_object() && t.value("content", Json()) == content && t.contains("id") &&
        t["id"].is_number_integer()) {
      return t["id"].get<int32_t>();
    }
  }
  return std::nullopt;
}

// A Hugging Face folder with a tokenizer.json hands it over with its tokenizer_config.json, its
// chat_template.jinja (the chat template of newer checkpoints, when present) and the ids that end generation: generation_config.json's eos_token_id, then config.json's (the
// engine stops on those too), or failing both tokenizer_config.json's eos_token. Anything else
// (a synthetic preset, a folder with no tokenizer.json) hands nothing over. The files are read
// as bytes and checked only for size: the router parses the tokenizer.
absl::StatusOr<TokenizerHandover> ReadTokenizerHandover(const std::string& model,
                                                        const ModelConfig& config) {
  TokenizerHandover h;
  h.kind = TokenizerKindForModel(model);
  std::error_code ec;
  const std::filesystem::path dir(model);
  if (h.kind != TokenizerKind::kNone || !std::filesystem::is_directory(dir, ec) ||
      !std::filesystem::exists(dir / "tokenizer.json", ec)) {
    return h;
  }
  const auto size_of = [&](const char* name) -> int64_t {
    std::error_code e;
    const auto n = std::filesystem::file_size(dir / name, e);
    return e ? 0 : static_cast<int64_t>(n);
  };
  const int64_t total = size_of("tokenizer.json") + size_of("tokenizer_config.json") +
                        size_of("chat_template.jinja");
  if (total > kMaxHandoverBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        (dir / "tokenizer.json").string(),
        " with tokenizer_config.json and chat_template.jinja are ", total,
        " bytes, more than the ", kMaxHandoverBytes,
        " a registration carries to the router"));
  }
  h.kind = TokenizerKind::kHuggingFace;
  ASSIGN_OR_RETURN(h.tokenizer_json, ReadWholeFile(dir / "tokenizer.json"));
  if (std::filesystem::exists(dir / "tokenizer_config.json", ec)) {
    ASSIGN_OR_RETURN(h.tokenizer_config_json, ReadWholeFile(dir / "tokenizer_config.json"));
  }
  if (std::filesystem::exists(dir / "chat_template.jinja", ec)) {
    ASSIGN_OR_RETURN(h.chat_template_jinja, ReadWholeFile(dir / "chat_template.jinja"));
  }
  if (std::filesystem::exists(dir / "generation_config.json", ec)) {
    ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(dir / "generation_config.json"));
    const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat((dir / "generation_config.json").string(), ": not valid JSON"));
    }
    ASSIGN_OR_RETURN(std::optional<std::vector<int32_t>> ids,
                     EosIdsOf(root, (dir / "generation_config.json").string()));
    if (ids.has_value()) h.eos_token_ids = std::move(*ids);
  }
  for (int32_t id : config.eos_token_ids) {
    if (std::find(h.eos_token_ids.begin(), h.eos_token_ids.end(), id) == h.eos_token_ids.end()) {
      h.eos_token_ids.push_back(id);
    }
  }
  if (h.eos_token_ids.empty()) {
    if (std::optional<int32_t> id = ConfigEosId(h.tokenizer_json, h.tokenizer_config_json)) {
      h.eos_token_ids.push_back(*id);
    }
  }
  return h;
}

// Maps the router's request ids onto an Engine's.
class EngineBackend : public Backend {
 public:
  EngineBackend(std::unique_ptr<Engine> engine, TokenizerHandover tokenizer)
      : engine_(std::move(engine)), tokenizer_(std::move(tokenizer)) {}

  RegisterInfo Describe() const override {
    const EngineOptions& o = engine_->options();
    const ModelConfig& c = engine_->model_config();
    RegisterInfo r;
    r.max_num_seqs = o.scheduler.max_num_seqs;
    r.num_kv_blocks = engine_->kv_cache().num_blocks();
    const ModelDevice& device = engine_->model().device();
    r.weight_dtype = device.weight_type();
    r.kv_cache_dtype = StorageTypeName(device.kv_storage_type());
    r.block_size = o.block_size;
    r.max_model_len = o.scheduler.max_model_len;
    r.vocab_size = c.vocab_size;
    r.tokenizer = tokenizer_.kind;
    r.tokenizer_json = tokenizer_.tokenizer_json;
    r.tokenizer_config_json = tokenizer_.tokenizer_config_json;
    r.chat_template_jinja = tokenizer_.chat_template_jinja;
    r.eos_token_ids = tokenizer_.eos_token_ids;
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
    l.suspensions = engine_->scheduler().num_suspensions();
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
  const TokenizerHandover tokenizer_;
  absl::flat_hash_map<uint64_t, int64_t> seq_of_;  // dispatch id -> engine seq id
  absl::flat_hash_map<int64_t, uint64_t> dispatch_of_;  // engine seq id -> dispatch id
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateEngineBackend(const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options));
  ASSIGN_OR_RETURN(TokenizerHandover tokenizer,
                   ReadTokenizerHandover(options.model, engine->model_config()));
  return std::unique_ptr<Backend>(new EngineBackend(std::move(engine), std::move(tokenizer)));
}

}  // namespace carpool::worker
