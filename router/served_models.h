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
// Chat templates (text/chat_template.h): an "hf" model's is built from its handed-over
// tokenizer_config.json and chat_template.jinja (or the router's --chat-template) together with
// its tokenizer, on the pool; a byte-tokenizer model gets the byte models' template
// (ChatTemplate::Builtin() unless the router was given a template file). A model whose template
// is missing or did not parse has chat_template null and chat_template_error saying so, in
// words its chat requests are refused with.
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
#include "text/chat_template.h"

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
  // Renders its chat requests; null: it has none (chat_template_error says why).
  std::shared_ptr<const text::ChatTemplate> chat_template;
  std::string chat_template_error;
};

// What a registration asks of the loop: build a tokenizer (and the chat template) from these
// files on the pool, then call SetTokenizer(load, ...).
struct TokenizerLoad {
  std::string model;
  uint64_t key = 0;  // the content hash
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string chat_template_jinja;
};

// A model's chat template as built: the template, or null and why (ChatTemplate::FromModelFiles'
// error: NOT_FOUND when the model has none).
struct ChatTemplateLoad {
  std::shared_ptr<const text::ChatTemplate> chat_template;
  absl::Status status;
};

// What a chat request to `model` is told when its template is missing or did not load (`status`,
// not OK): INVALID_ARGUMENT's message.
std::string ChatTemplateError(const std::string& model, const absl::Status& status);

// The byte-tokenizer models' template under the router's --chat-template `options`: the
// override's source when given (parsed here, so call it once), else ChatTemplate::Builtin().
ChatTemplateLoad ByteModelsChatTemplate(const text::ChatTemplateOptions& options);

class ServedModels {
 public:
  // Byte-tokenizer models get `byte_chat_template` (Default: ChatTemplate::Builtin()).
  ServedModels();
  explicit ServedModels(ChatTemplateLoad byte_chat_template);

  // Records `info`'s model (and its limits). Returns a load to run when the model's tokenizer
  // must be built from the registration's files (not cached, not already loading).
  std::optional<TokenizerLoad> Register(const RegisterInfo& info);
  // The result of a TokenizerLoad: the model's tokenizer (or its error) and chat template, and
  // the cache entry.
  void SetTokenizer(const TokenizerLoad& load,
                    absl::StatusOr<std::shared_ptr<const Tokenizer>> tokenizer,
                    ChatTemplateLoad chat_template = {});

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
    std::string chat_template_jinja;
    std::shared_ptr<const Tokenizer> tokenizer;  // null while loading
    ChatTemplateLoad chat_template;
    bool Holds(const std::string& json, const std::string& config, const std::string& jinja) const {
      return tokenizer_json == json && tokenizer_config_json == config &&
             chat_template_jinja == jinja;
    }
  };

  ChatTemplateLoad byte_chat_template_;

  std::map<std::string, ServedModel> models_;
  absl::flat_hash_map<uint64_t, CacheEntry> cache_;  // by content hash
};

// The reason of a Resolve error NOT_FOUND.
inline bool IsUnknownModel(const absl::Status& s) { return absl::IsNotFound(s); }

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_SERVED_MODELS_H_
