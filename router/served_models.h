// The models a cluster serves, by name (RegisterInfo::model), each with its limits and its
// tokenizer. A request's `model` picks one: "" is the only model (INVALID_ARGUMENT naming the
// served models when there are several), an unknown name is NOT_FOUND unknown_model.
//
// Tokenizers: "byte" is ByteTokenizer, "" none (token ids only), "hf" is built from the files
// the first registration of the model hands over (text::HfTokenizer::FromJson) on the
// tokenizer pool, never on the loop: until then the model's tokenizer is loading. Built
// tokenizers are cached by their files' content, so models (or re-registrations) with the
// same files share one.
//
// A model stays known once a worker registered it, also after its workers left (its queued
// requests wait for a worker as before); its max_model_len is the smallest any of its workers
// registered.
//
// Thread-compatible: the router's event loop.
#ifndef CARPOOL_ROUTER_SERVED_MODELS_H_
#define CARPOOL_ROUTER_SERVED_MODELS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/messages.h"
#include "router/request_validator.h"

namespace carpool::router {

enum class TokenizerState {
  kNone,     // the model takes token ids only
  kLoading,  // being built on the pool: text requests wait
  kReady,
  kFailed,  // the handed-over files did not load (error in ServedModel::tokenizer_error)
};

struct ServedModel {
  std::string name;
  ModelLimits limits;  // limits.tokenizer set when kReady
  TokenizerState tokenizer_state = TokenizerState::kNone;
  std::string tokenizer_error;
  std::vector<int32_t> eos_token_ids;
  uint64_t tokenizer_key = 0;  // the content hash of its handed-over files ("hf")
};

// What a registration asks of the loop: build a tokenizer from these files on the pool, then
// call SetTokenizer(model, key, ...).
struct TokenizerLoad {
  std::string model;
  uint64_t key = 0;  // the content hash
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};

class ServedModels {
 public:
  // Records `info`'s model (and its limits). Returns a load to run when the model's tokenizer
  // must be built from the registration's files (not cached, not already loading).
  std::optional<TokenizerLoad> Register(const RegisterInfo& info);
  // The result of a TokenizerLoad: the model's tokenizer (or its error), and the cache entry.
  void SetTokenizer(const TokenizerLoad& load,
                    absl::StatusOr<std::shared_ptr<const Tokenizer>> tokenizer);

  bool empty() const { return models_.empty(); }
  // The model `requested` names: see the file comment. REQUIRES: !empty().
  absl::StatusOr<const ServedModel*> Resolve(const std::string& requested) const;
  const ServedModel* Find(const std::string& name) const;
  // Every model's name, sorted.
  std::vector<std::string> Names() const;

 private:
  struct CacheEntry {
    std::string tokenizer_json;
    std::string tokenizer_config_json;
    std::shared_ptr<const Tokenizer> tokenizer;  // null while loading
  };

  std::map<std::string, ServedModel> models_;
  absl::flat_hash_map<uint64_t, CacheEntry> cache_;  // by content hash
};

// The reason of a Resolve error NOT_FOUND.
inline bool IsUnknownModel(const absl::Status& s) { return absl::IsNotFound(s); }

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_SERVED_MODELS_H_
