// Router::Impl, the tokenizer side: a request's text goes to the tokenizer pool and its tokens
// come back to the loop (OnTokenized), the models' tokenizers and chat templates are built there
// from the files their workers hand over, chat prompts are rendered there right before they are
// tokenized, and Tokenize / Detokenize requests are answered from there. Nothing here renders or
// tokenizes on the loop.
#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "router/embed_kind.h"
#include "router/router_impl.h"
#include "text/hf_tokenizer.h"

namespace carpool::router {
namespace {

absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadHf(const std::string& json,
                                                        const std::string& config) {
  absl::StatusOr<std::unique_ptr<text::HfTokenizer>> t = text::HfTokenizer::FromJson(json, config);
  if (!t.ok()) return t.status();
  return std::shared_ptr<const Tokenizer>(std::move(*t));
}

// A chat template's result: the template when it parsed, else why not.
ChatTemplateLoad LoadChatTemplate(const TokenizerLoad& load,
                                  const text::ChatTemplateOptions& options) {
  absl::StatusOr<std::shared_ptr<const text::ChatTemplate>> t = text::ChatTemplate::FromModelFiles(
      load.tokenizer_config_json, load.chat_template_jinja, options);
  if (!t.ok()) return {nullptr, t.status()};
  return {*std::move(t), absl::OkStatus()};
}

// Renders texts.chat (when set) with `chat` into the first text, then tokenizes every text.
// Thread-safe: the pool runs it.
absl::StatusOr<EncodedTexts> RenderAndEncode(const Tokenizer& tokenizer,
                                             const text::ChatTemplate* chat,
                                             const text::jinja::RenderOptions& options,
                                             PromptTexts texts) {
  if (texts.chat.has_value()) {
    if (chat == nullptr) {
      return absl::InternalError("a chat prompt reached a model without a template");
    }
    text::ChatRequest request;
    request.messages_json = std::move(texts.chat->messages_json);
    request.tools_json = std::move(texts.chat->tools_json);
    request.add_generation_prompt = texts.chat->add_generation_prompt;
    request.chat_template_kwargs_json = std::move(texts.chat->chat_template_kwargs_json);
    absl::StatusOr<std::string> rendered = chat->Render(request, options);
    if (!rendered.ok()) {
      // Bad messages, raise_exception, a limit: the request's fault, never the router's.
      return absl::InvalidArgumentError(
          absl::StrCat("chat template: ", rendered.status().message()));
    }
    texts.texts.insert(texts.texts.begin(), *std::move(rendered));
    texts.labels.insert(texts.labels.begin(), "");
  }
  return EncodeTexts(tokenizer, texts);
}

std::string NoTokenizerMessage(const std::string& model) {
  return absl::StrCat("the served model '", model,
                      "' has no tokenizer in carpool: send token_ids instead of text (and no "
                      "stop strings)");
}

}  // namespace

void Router::Impl::StartTokenizing(Request& r) {
  const uint64_t router_id = r.router_id;
  unadmitted_.insert(router_id);
  const ServedModel* m = r.model_resolved ? models_.Find(r.model) : nullptr;
  if (m == nullptr || m->tokenizer_state == TokenizerState::kLoading) {
    r.stage = Stage::kWaitingForTokenizer;
    return;
  }
  if (m->tokenizer_state == TokenizerState::kFailed) {
    Fail(router_id, absl::StatusCode::kFailedPrecondition, kReasonUnsupported,
         absl::StrCat("the tokenizer of model '", m->name, "' did not load (", m->tokenizer_error,
                      "): send token_ids instead of text"));
    return;
  }
  if (m->tokenizer_state == TokenizerState::kNone) {
    Fail(router_id, absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
         NoTokenizerMessage(m->name));
    return;
  }
  PromptTexts texts = r.kind->TakeTexts(r);
  if (texts.chat.has_value() && m->chat_template == nullptr) {
    Fail(router_id, absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
         m->chat_template_error);
    return;
  }
  const int64_t bytes = PromptBytes(texts);
  if (tokenizing_bytes_ > 0 && tokenizing_bytes_ + bytes > options_.max_tokenizing_bytes) {
    const std::string client = r.client;
    const std::string request_id = r.request_id;
    End(router_id);
    SendError(client, request_id, absl::StatusCode::kUnavailable, reason::kQueueFull,
              absl::StrCat("the tokenizer threads hold ", tokenizing_bytes_,
                           " bytes of text; this request's ", bytes, " would pass the limit of ",
                           options_.max_tokenizing_bytes),
              kTokenizerBusyRetryMs);
    return;
  }
  tokenizing_bytes_ += bytes;
  r.stage = Stage::kTokenizing;
  pool_->Submit([this, router_id, bytes, tokenizer = m->limits.tokenizer,
                 chat = texts.chat.has_value() ? m->chat_template : nullptr,
                 render = options_.chat_render,
                 texts = std::move(texts)]() mutable -> TokenizerPool::Completion {
    absl::StatusOr<EncodedTexts> encoded =
        RenderAndEncode(*tokenizer, chat.get(), render, std::move(texts));
    return [this, router_id, bytes, encoded = std::move(encoded)]() mutable {
      OnTokenized(router_id, bytes, std::move(encoded));
    };
  });
}

void Router::Impl::OnTokenized(uint64_t router_id, int64_t bytes,
                               absl::StatusOr<EncodedTexts> encoded) {
  tokenizing_bytes_ -= bytes;
  auto it = requests_.find(router_id);
  if (it == requests_.end()) return;  // cancelled, expired or its client gone meanwhile
  Request& r = *it->second;
  if (!encoded.ok()) {
    Fail(router_id, encoded.status().code(), ValidationReason(encoded.status()),
         std::string(encoded.status().message()));
    return;
  }
  if (!Validate(r, *encoded)) {
    End(router_id);
    return;
  }
  Submit(r);
}

void Router::Impl::ResumeWaiting() {
  ResumeTextCalls(clock_->NowMicros(), /*expire_only=*/false);
  std::vector<uint64_t> router_ids;
  for (uint64_t router_id : unadmitted_) {
    auto it = requests_.find(router_id);
    if (it != requests_.end() && it->second->stage == Stage::kWaitingForTokenizer) {
      router_ids.push_back(router_id);
    }
  }
  std::sort(router_ids.begin(), router_ids.end());
  for (uint64_t router_id : router_ids) {
    auto it = requests_.find(router_id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    if (!r.model_resolved && !ResolveModel(r)) {
      End(router_id);
      continue;
    }
    StartTokenizing(r);
  }
}

void Router::Impl::ParkTextCall(const std::string& client, const std::string& request_id,
                                std::variant<TokenizeInput, DetokenizeInput> input) {
  text_calls_.insert({client, request_id});
  parked_text_calls_.push_back({clock_->NowMicros(), client, request_id, std::move(input)});
}

void Router::Impl::ResumeTextCalls(int64_t now, bool expire_only) {
  std::vector<ParkedTextCall> parked;
  parked.swap(parked_text_calls_);
  const int64_t wait_limit = options_.admission.no_worker_timeout_ms * 1000;
  for (ParkedTextCall& c : parked) {
    const bool expired = wait_limit > 0 && now - c.arrival >= wait_limit;
    if (expire_only && !expired) {
      parked_text_calls_.push_back(std::move(c));
      continue;
    }
    text_calls_.erase({c.client, c.request_id});
    if (expired) {
      SendError(c.client, c.request_id, absl::StatusCode::kUnavailable, reason::kNoWorkers,
                absl::StrCat("the model had no tokenizer ready for ",
                             options_.admission.no_worker_timeout_ms,
                             " ms (--no-worker-timeout-ms): no worker registered it yet, or its "
                             "tokenizer is still loading"),
                kNoWorkersRetryMs);
      continue;
    }
    if (auto* t = std::get_if<TokenizeInput>(&c.input)) {
      OnTokenize(c.client, std::move(*t));
    } else {
      OnDetokenize(c.client, std::get<DetokenizeInput>(std::move(c.input)));
    }
  }
}

void Router::Impl::StartTokenizerLoad(TokenizerLoad load) {
  auto build = options_.load_tokenizer ? options_.load_tokenizer : LoadHf;
  pool_->Submit([this, load = std::move(load), build = std::move(build),
                 chat_options = options_.chat_template]() mutable -> TokenizerPool::Completion {
    absl::StatusOr<std::shared_ptr<const Tokenizer>> t =
        build(load.tokenizer_json, load.tokenizer_config_json);
    // The template with the tokenizer, so a template carpool cannot run is reported now, at
    // load, not at the first chat request.
    ChatTemplateLoad chat = LoadChatTemplate(load, chat_options);
    return [this, load = std::move(load), t = std::move(t), chat = std::move(chat)]() mutable {
      if (t.ok()) {
        std::cerr << "carpool-router: model " << load.model << ": tokenizer loaded\n";
        if (chat.chat_template != nullptr) {
          std::cerr << "carpool-router: model " << load.model << ": chat template loaded\n";
        } else {
          std::cerr << "carpool-router: " << ChatTemplateError(load.model, chat.status) << "\n";
        }
      } else {
        std::cerr << "carpool-router: model " << load.model
                  << ": its tokenizer did not load: " << t.status().message() << "\n";
      }
      models_.SetTokenizer(load, std::move(t), std::move(chat));
      ResumeWaiting();
    };
  });
}

const ServedModel* Router::Impl::TokenizerFor(const std::string& client,
                                              const std::string& request_id,
                                              const std::string& model, bool* wait) {
  *wait = false;
  if (models_.empty()) {
    *wait = true;
    return nullptr;
  }
  absl::StatusOr<const ServedModel*> m = models_.Resolve(model);
  if (!m.ok()) {
    SendError(client, request_id, m.status().code(), ValidationReason(m.status()),
              std::string(m.status().message()));
    return nullptr;
  }
  switch ((*m)->tokenizer_state) {
    case TokenizerState::kReady:
      return *m;
    case TokenizerState::kLoading:
      *wait = true;
      return nullptr;
    case TokenizerState::kFailed:
      SendError(client, request_id, absl::StatusCode::kFailedPrecondition, kReasonUnsupported,
                absl::StrCat("the tokenizer of model '", (*m)->name, "' did not load (",
                             (*m)->tokenizer_error, ")"));
      return nullptr;
    case TokenizerState::kNone:
      break;
  }
  SendError(client, request_id, absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
            NoTokenizerMessage((*m)->name));
  return nullptr;
}

template <typename TextCall>
const ServedModel* Router::Impl::AcceptTextCall(const std::string& client, TextCall& in,
                                                absl::Status shape) {
  int tenant = -1;
  if (!Accept(client, in.request_id, shape, in.api_key, &tenant)) return nullptr;
  bool wait = false;
  const ServedModel* m = TokenizerFor(client, in.request_id, in.model, &wait);
  if (wait) {
    const std::string request_id = in.request_id;  // before `in` is moved
    ParkTextCall(client, request_id, std::move(in));
    return nullptr;
  }
  return m;
}

void Router::Impl::OnTokenize(const std::string& client, TokenizeInput in) {
  const RequestLimits& limits = LimitsFor(client);
  absl::Status shape = CheckRequestId(in.request_id, limits);
  if (shape.ok() && static_cast<int64_t>(in.text.size()) > limits.max_prompt_bytes) {
    shape = absl::InvalidArgumentError(
        absl::StrCat("text is ", in.text.size(), " bytes; the limit is ", limits.max_prompt_bytes));
  }
  if (shape.ok() && in.chat.has_value()) {
    if (!in.text.empty()) {
      shape = absl::InvalidArgumentError("a tokenize request has text or chat, not both");
    } else if (in.chat->messages_json.empty()) {
      shape = absl::InvalidArgumentError("chat.messages_json is empty: send a JSON array");
    } else if (ChatBytes(*in.chat) > limits.max_prompt_bytes) {
      shape = absl::InvalidArgumentError(absl::StrCat("the chat input is ", ChatBytes(*in.chat),
                                                      " bytes; the limit is ",
                                                      limits.max_prompt_bytes));
    }
  }
  const ServedModel* m = AcceptTextCall(client, in, std::move(shape));
  if (m == nullptr) return;
  if (in.chat.has_value() && m->chat_template == nullptr) {
    SendError(client, in.request_id, absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
              m->chat_template_error);
    return;
  }
  PromptTexts texts;
  if (in.chat.has_value()) {
    texts.chat = std::move(in.chat);
  } else {
    texts.texts.push_back(std::move(in.text));
    texts.labels.emplace_back();
  }
  texts.add_special_tokens = in.add_special_tokens;
  const int64_t bytes = PromptBytes(texts);
  if (tokenizing_bytes_ > 0 && tokenizing_bytes_ + bytes > options_.max_tokenizing_bytes) {
    SendError(client, in.request_id, absl::StatusCode::kUnavailable, reason::kQueueFull,
              absl::StrCat("the tokenizer threads hold ", tokenizing_bytes_,
                           " bytes of text; this request's ", bytes, " would pass the limit of ",
                           options_.max_tokenizing_bytes),
              kTokenizerBusyRetryMs);
    return;
  }
  tokenizing_bytes_ += bytes;
  text_calls_.insert({client, in.request_id});
  pool_->Submit([this, client, request_id = std::move(in.request_id), bytes,
                 max_model_len = m->limits.max_model_len, tokenizer = m->limits.tokenizer,
                 chat = texts.chat.has_value() ? m->chat_template : nullptr,
                 render = options_.chat_render,
                 texts = std::move(texts)]() mutable -> TokenizerPool::Completion {
    absl::StatusOr<EncodedTexts> encoded =
        RenderAndEncode(*tokenizer, chat.get(), render, std::move(texts));
    return [this, client = std::move(client), request_id = std::move(request_id), bytes,
            max_model_len, encoded = std::move(encoded)]() mutable {
      tokenizing_bytes_ -= bytes;
      text_calls_.erase({client, request_id});
      if (!encoded.ok()) {
        SendError(client, request_id, encoded.status().code(), reason::kInvalidArgument,
                  std::string(encoded.status().message()));
        return;
      }
      SendToClient(client, TokenizeResultOut{request_id, std::move((*encoded)[0]), max_model_len});
    };
  });
}

void Router::Impl::OnDetokenize(const std::string& client, DetokenizeInput in) {
  const RequestLimits& limits = LimitsFor(client);
  absl::Status shape = CheckRequestId(in.request_id, limits);
  if (shape.ok() && static_cast<int64_t>(in.token_ids.size()) > limits.max_prompt_tokens) {
    shape = absl::InvalidArgumentError(absl::StrCat(
        "token_ids has ", in.token_ids.size(), " ids; the limit is ", limits.max_prompt_tokens));
  }
  const ServedModel* m = AcceptTextCall(client, in, std::move(shape));
  if (m == nullptr) return;
  for (size_t i = 0; i < in.token_ids.size(); ++i) {
    if (in.token_ids[i] < 0 || in.token_ids[i] >= m->limits.vocab_size) {
      SendError(client, in.request_id, absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
                absl::StrCat("token_ids[", i, "] is ", in.token_ids[i],
                             ", outside the vocabulary [0, ", m->limits.vocab_size, ")"));
      return;
    }
  }
  text_calls_.insert({client, in.request_id});
  pool_->Submit([this, client, request_id = std::move(in.request_id),
                 tokenizer = m->limits.tokenizer, ids = std::move(in.token_ids),
                 skip = in.skip_special_tokens]() mutable -> TokenizerPool::Completion {
    std::string text = tokenizer->Decode(ids, skip);
    return [this, client = std::move(client), request_id = std::move(request_id),
            text = std::move(text)]() mutable {
      text_calls_.erase({client, request_id});
      SendToClient(client, DetokenizeResultOut{request_id, std::move(text)});
    };
  });
}

}  // namespace carpool::router
