#include "router/served_models.h"

#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace carpool::router {

std::string ChatTemplateError(const std::string& model, const absl::Status& status) {
  if (absl::IsNotFound(status) &&
      absl::StartsWith(status.message(), "the model has no chat template")) {
    return absl::StrCat("model '", model,
                        "' has no chat template (tokenizer_config.json has no chat_template and "
                        "the folder no chat_template.jinja): start the router with "
                        "--chat-template FILE");
  }
  return absl::StrCat("the chat template of model '", model, "' did not load (", status.message(),
                      "): start the router with --chat-template FILE|NAME");
}

namespace {

void SetChatTemplate(ServedModel& m, const ChatTemplateLoad& load) {
  m.chat_template = load.chat_template;
  m.chat_template_error =
      load.chat_template != nullptr ? "" : ChatTemplateError(m.name, load.status);
}

}  // namespace

ChatTemplateLoad ByteModelsChatTemplate(const text::ChatTemplateOptions& options) {
  if (options.override_source.empty()) return {text::ChatTemplate::Builtin(), absl::OkStatus()};
  text::ChatTemplateOptions source_only;
  source_only.override_source = options.override_source;
  absl::StatusOr<std::shared_ptr<const text::ChatTemplate>> t =
      text::ChatTemplate::FromModelFiles("", "", source_only);
  if (!t.ok()) return {nullptr, t.status()};
  return {*std::move(t), absl::OkStatus()};
}

ServedModels::ServedModels() : ServedModels(ChatTemplateLoad{text::ChatTemplate::Builtin(), {}}) {}

ServedModels::ServedModels(ChatTemplateLoad byte_chat_template)
    : byte_chat_template_(std::move(byte_chat_template)) {}

std::optional<TokenizerLoad> ServedModels::Register(const RegisterInfo& info) {
  auto [it, added] = models_.try_emplace(info.model);
  ServedModel& m = it->second;
  m.name = info.model;
  if (added || info.max_model_len < m.limits.max_model_len) {
    m.limits.known = true;
    m.limits.vocab_size = info.vocab_size;
    m.limits.max_model_len = info.max_model_len;
    m.limits.bos_token_id = info.bos_token_id;
  }
  if (!added && m.tokenizer_state != TokenizerState::kFailed) return std::nullopt;
  // The tokenizer comes from the model's first registration (a failed load is retried by the
  // next one).
  m.eos_token_ids = info.eos_token_ids;
  if (info.tokenizer != TokenizerKind::kHuggingFace) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = CreateTokenizer(info.tokenizer, info.model);
    m.limits.tokenizer = t.ok() ? std::shared_ptr<const Tokenizer>(std::move(*t)) : nullptr;
    m.tokenizer_state = m.limits.tokenizer ? TokenizerState::kReady : TokenizerState::kNone;
    if (info.tokenizer == TokenizerKind::kByte) {
      SetChatTemplate(m, byte_chat_template_);
    }
    return std::nullopt;
  }
  const uint64_t key =
      absl::HashOf(info.tokenizer_json, info.tokenizer_config_json, info.chat_template_jinja) | 1;
  m.tokenizer_key = key;
  auto cached = cache_.find(key);
  if (cached != cache_.end() &&
      cached->second.Holds(info.tokenizer_json, info.tokenizer_config_json,
                           info.chat_template_jinja)) {
    if (cached->second.tokenizer != nullptr) {
      m.limits.tokenizer = cached->second.tokenizer;
      m.tokenizer_state = TokenizerState::kReady;
      SetChatTemplate(m, cached->second.chat_template);
      return std::nullopt;
    }
    m.tokenizer_state = TokenizerState::kLoading;  // the same files are loading for another
    return std::nullopt;
  }
  m.tokenizer_state = TokenizerState::kLoading;
  if (cached == cache_.end()) {
    cache_[key] = CacheEntry{
        info.tokenizer_json, info.tokenizer_config_json, info.chat_template_jinja, nullptr, {}};
  }
  return TokenizerLoad{info.model, key, info.tokenizer_json, info.tokenizer_config_json,
                       info.chat_template_jinja};
}

void ServedModels::SetTokenizer(const TokenizerLoad& load,
                                absl::StatusOr<std::shared_ptr<const Tokenizer>> tokenizer,
                                ChatTemplateLoad chat_template) {
  auto cached = cache_.find(load.key);
  const bool ours = cached != cache_.end() &&
                    cached->second.Holds(load.tokenizer_json, load.tokenizer_config_json,
                                         load.chat_template_jinja);
  if (ours) {
    if (tokenizer.ok()) {
      cached->second.tokenizer = *tokenizer;
      cached->second.chat_template = chat_template;
    } else {
      cache_.erase(cached);  // a later registration may try again
    }
  }
  for (auto& [name, m] : models_) {
    if (m.tokenizer_state != TokenizerState::kLoading) continue;
    if (m.tokenizer_key != load.key && name != load.model) continue;
    if (tokenizer.ok()) {
      m.limits.tokenizer = *tokenizer;
      m.tokenizer_state = TokenizerState::kReady;
      SetChatTemplate(m, chat_template);
    } else {
      m.tokenizer_state = TokenizerState::kFailed;
      m.tokenizer_error = std::string(tokenizer.status().message());
    }
  }
}

absl::StatusOr<const ServedModel*> ServedModels::Resolve(const std::string& requested) const {
  if (requested.empty()) {
    if (models_.size() == 1) return &models_.begin()->second;
    return absl::InvalidArgumentError(absl::StrCat("this cluster serves ", models_.size(),
                                                   " models (", absl::StrJoin(Names(), ", "),
                                                   "): name one in `model`"));
  }
  auto it = models_.find(requested);
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "model '", requested, "' is not served here; served: ", absl::StrJoin(Names(), ", ")));
  }
  return &it->second;
}

const ServedModel* ServedModels::Find(const std::string& name) const {
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : &it->second;
}

std::vector<std::string> ServedModels::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, m] : models_) names.push_back(name);
  return names;
}

}  // namespace carpool::router
