#include "router/request_validator.h"

#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer.h"

namespace carpool::router {
namespace {

constexpr char kTooLongPayload[] = "carpool.prompt_too_long";

absl::Status PromptTooLong(std::string message) {
  absl::Status s = absl::InvalidArgumentError(std::move(message));
  s.SetPayload(kTooLongPayload, absl::Cord("1"));
  return s;
}

absl::Status NoTokenizer(std::string_view label) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(label),
                   "the served model has no tokenizer in carpool: send token_ids instead of text"));
}

// A batch job's request is spared its tenant's concurrency limit and the queue's (the batch lane
// has limits of its own): only the router's batch runner may send one.
absl::Status CheckBatchJob(bool batch_job, const RequestLimits& limits) {
  if (batch_job && !limits.allow_batch_job) {
    return absl::InvalidArgumentError("batch_job is reserved for the router's batch runner");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestId(const std::string& id, const RequestLimits& limits) {
  if (id.empty()) return absl::InvalidArgumentError("request_id is empty");
  if (static_cast<int>(id.size()) > limits.max_request_id_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id is longer than ", limits.max_request_id_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateShape(const GenerateInput& r, const RequestLimits& limits) {
  if (absl::Status s = CheckRequestId(r.request_id, limits); !s.ok()) return s;
  if (absl::Status s = CheckBatchJob(r.batch_job, limits); !s.ok()) return s;
  if (r.chat.has_value()) {
    if (r.chat->messages_json.empty()) {
      return absl::InvalidArgumentError("chat.messages_json is empty: send a JSON array");
    }
    if (ChatBytes(*r.chat) > limits.max_prompt_bytes) {
      return PromptTooLong(absl::StrCat("the chat input is ", ChatBytes(*r.chat),
                                        " bytes; the limit is ", limits.max_prompt_bytes));
    }
  } else if (r.has_text) {
    if (r.text.empty()) return absl::InvalidArgumentError("prompt text is empty");
    if (static_cast<int64_t>(r.text.size()) > limits.max_prompt_bytes) {
      return PromptTooLong(absl::StrCat("prompt text is ", r.text.size(),
                                        " bytes; the limit is ", limits.max_prompt_bytes));
    }
  } else if (r.token_ids.empty()) {
    return absl::InvalidArgumentError("prompt is empty: set text or token_ids");
  } else if (static_cast<int64_t>(r.token_ids.size()) > limits.max_prompt_tokens) {
    return PromptTooLong(absl::StrCat("prompt is ", r.token_ids.size(), " tokens; the limit is ",
                                      limits.max_prompt_tokens));
  }
  if (r.sampling.max_tokens < 1 || r.sampling.max_tokens > limits.max_max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens is ", r.sampling.max_tokens,
                                                   "; it must be in [1, ",
                                                   limits.max_max_tokens, "]"));
  }
  // A resumed stream (resume_tokens): what was received counts in max_tokens, and a stream
  // that had them all would have ended.
  if (!r.resume_tokens.empty() &&
      static_cast<int64_t>(r.resume_tokens.size()) >= r.sampling.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume_tokens has ", r.resume_tokens.size(),
        " tokens; a resumed stream must have fewer than max_tokens (", r.sampling.max_tokens,
        "), which counts them"));
  }
  if (static_cast<int>(r.sampling.stop_token_ids.size()) > limits.max_stop_token_ids) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids has ",
                                                   r.sampling.stop_token_ids.size(),
                                                   " entries; the limit is ",
                                                   limits.max_stop_token_ids));
  }
  if (static_cast<int>(r.stop.size()) > limits.max_stop_strings) {
    return absl::InvalidArgumentError(absl::StrCat("stop has ", r.stop.size(),
                                                   " strings; the limit is ",
                                                   limits.max_stop_strings));
  }
  for (size_t i = 0; i < r.stop.size(); ++i) {
    if (static_cast<int>(r.stop[i].size()) > limits.max_stop_string_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is ", r.stop[i].size(),
                                                     " bytes; the limit is ",
                                                     limits.max_stop_string_bytes));
    }
  }
  return r.sampling.Validate(std::numeric_limits<int>::max());
}

absl::StatusOr<ValidatedPrompt> ValidateGenerate(const GenerateInput& r, const ModelLimits& model,
                                                 const RequestLimits& limits) {
  RETURN_IF_ERROR(ValidateShape(r, limits));
  if (r.chat.has_value()) {
    return absl::InvalidArgumentError(
        "a chat prompt is rendered by the router with the model's chat template");
  }
  EncodedTexts encoded;
  if (r.has_text) {
    if (model.tokenizer == nullptr) return NoTokenizer("");
    GenerateInput copy;
    copy.has_text = true;
    copy.text = r.text;
    copy.add_bos = r.add_bos;
    ASSIGN_OR_RETURN(encoded, EncodeTexts(*model.tokenizer, TakeTexts(&copy)));
  }
  return ValidateGenerate(r, encoded, model, limits);
}

absl::StatusOr<ValidatedPrompt> ValidateGenerate(const GenerateInput& r,
                                                 const EncodedTexts& encoded,
                                                 const ModelLimits& model,
                                                 const RequestLimits& /*limits*/) {
  ValidatedPrompt out;
  if (r.has_text || r.chat.has_value()) {
    if (encoded.size() != 1) return absl::InternalError("the prompt text was not tokenized");
    out.tokens = encoded[0];
    if (out.tokens.empty()) return absl::InvalidArgumentError("the prompt text has no tokens");
  } else {
    out.tokens = r.token_ids;
  }
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    if (out.tokens[i] < 0 || out.tokens[i] >= model.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " has id ",
                                                     out.tokens[i],
                                                     ", outside the vocabulary [0, ",
                                                     model.vocab_size, ")"));
    }
  }
  for (size_t i = 0; i < r.resume_tokens.size(); ++i) {
    if (r.resume_tokens[i] < 0 || r.resume_tokens[i] >= model.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("resume_tokens[", i, "] has id ",
                                                     r.resume_tokens[i],
                                                     ", outside the vocabulary [0, ",
                                                     model.vocab_size, ")"));
    }
  }
  out.resume_tokens = r.resume_tokens;
  if (absl::Status s = r.sampling.Validate(model.vocab_size); !s.ok()) return s;
  if (!r.stop.empty() && model.tokenizer == nullptr) {
    return NoTokenizer("stop strings are matched on the output text: ");
  }
  const int64_t prompt_len = static_cast<int64_t>(out.tokens.size());
  if (prompt_len >= model.max_model_len) {
    return PromptTooLong(absl::StrCat("prompt is ", prompt_len, " tokens; max_model_len is ",
                                      model.max_model_len,
                                      " and at least one token must be generated"));
  }
  // Resume tokens are fewer than max_tokens (ValidateShape), so this bounds the prompt and
  // them together too.
  if (prompt_len + r.sampling.max_tokens > model.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", prompt_len,
                                                   " tokens) + max_tokens (",
                                                   r.sampling.max_tokens,
                                                   ") exceeds max_model_len ",
                                                   model.max_model_len));
  }
  return out;
}

absl::Status ValidateEmbedShape(const EmbedInput& r, const RequestLimits& limits) {
  if (absl::Status s = CheckRequestId(r.request_id, limits); !s.ok()) return s;
  if (absl::Status s = CheckBatchJob(r.batch_job, limits); !s.ok()) return s;
  if (r.inputs.empty()) return absl::InvalidArgumentError("inputs is empty: give at least one");
  if (static_cast<int64_t>(r.inputs.size()) > limits.max_embed_inputs) {
    return absl::InvalidArgumentError(absl::StrCat("inputs has ", r.inputs.size(),
                                                   " entries; the limit is ",
                                                   limits.max_embed_inputs));
  }
  if (r.pooling != Pooling::kMean && r.pooling != Pooling::kLast) {
    return absl::InvalidArgumentError("pooling must be mean or last");
  }
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const EmbedItem& item = r.inputs[i];
    if (item.has_text) {
      if (item.text.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("inputs[", i, "]: text is empty"));
      }
      if (static_cast<int64_t>(item.text.size()) > limits.max_prompt_bytes) {
        return PromptTooLong(absl::StrCat("inputs[", i, "]: text is ", item.text.size(),
                                          " bytes; the limit is ", limits.max_prompt_bytes));
      }
    } else if (item.token_ids.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs[", i, "] is empty: set text or token_ids"));
    } else if (static_cast<int64_t>(item.token_ids.size()) > limits.max_prompt_tokens) {
      return PromptTooLong(absl::StrCat("inputs[", i, "] is ", item.token_ids.size(),
                                        " tokens; the limit is ", limits.max_prompt_tokens));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ValidatedEmbed> ValidateEmbed(const EmbedInput& r, const ModelLimits& model,
                                             const RequestLimits& limits) {
  RETURN_IF_ERROR(ValidateEmbedShape(r, limits));
  EncodedTexts encoded;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (r.inputs[i].has_text && model.tokenizer == nullptr) {
      return NoTokenizer(absl::StrCat("inputs[", i, "]: "));
    }
  }
  EmbedInput copy = r;
  PromptTexts texts = TakeTexts(&copy);
  if (!texts.texts.empty()) {
    ASSIGN_OR_RETURN(encoded, EncodeTexts(*model.tokenizer, texts));
  }
  return ValidateEmbed(r, encoded, model, limits);
}

absl::StatusOr<ValidatedEmbed> ValidateEmbed(const EmbedInput& r, const EncodedTexts& encoded,
                                             const ModelLimits& model,
                                             const RequestLimits& /*limits*/) {
  ValidatedEmbed out;
  out.inputs.reserve(r.inputs.size());
  size_t next_text = 0;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const EmbedItem& item = r.inputs[i];
    std::vector<int32_t> tokens;
    if (item.has_text) {
      if (next_text >= encoded.size()) {
        return absl::InternalError(absl::StrCat("inputs[", i, "] was not tokenized"));
      }
      tokens = encoded[next_text++];
    } else {
      tokens = item.token_ids;
    }
    if (tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("inputs[", i, "] has no tokens"));
    }
    for (size_t t = 0; t < tokens.size(); ++t) {
      if (tokens[t] < 0 || tokens[t] >= model.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("inputs[", i, "] token ", t, " has id ", tokens[t],
                         ", outside the vocabulary [0, ", model.vocab_size, ")"));
      }
    }
    if (static_cast<int64_t>(tokens.size()) > model.max_model_len) {
      return PromptTooLong(absl::StrCat("inputs[", i, "] is ", tokens.size(),
                                        " tokens; max_model_len is ", model.max_model_len));
    }
    out.total_tokens += static_cast<int64_t>(tokens.size());
    out.inputs.push_back(std::move(tokens));
  }
  return out;
}

absl::Status CheckUtf8(std::string_view text, std::string_view what) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<uint8_t>(text[i]);
    int n = 0;
    if (lead < 0x80) {
      n = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      n = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      n = 3;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      n = 4;
    }
    bool ok = n > 0 && i + n <= text.size();
    for (int k = 1; ok && k < n; ++k) {
      const auto b = static_cast<uint8_t>(text[i + k]);
      uint8_t lo = 0x80, hi = 0xBF;
      if (k == 1) {  // no overlongs, no surrogates, nothing past U+10FFFF
        if (lead == 0xE0) lo = 0xA0;
        if (lead == 0xED) hi = 0x9F;
        if (lead == 0xF0) lo = 0x90;
        if (lead == 0xF4) hi = 0x8F;
      }
      ok = b >= lo && b <= hi;
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(what), " is not valid UTF-8 at byte ", i));
    }
    i += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<EncodedTexts> EncodeTexts(const Tokenizer& tokenizer, const PromptTexts& texts) {
  EncodedTexts out;
  out.reserve(texts.texts.size());
  for (size_t i = 0; i < texts.texts.size(); ++i) {
    const std::string& label = i < texts.labels.size() ? texts.labels[i] : std::string();
    RETURN_IF_ERROR(CheckUtf8(texts.texts[i], label.empty() ? "the prompt text"
                                                             : label + "text"));
    absl::StatusOr<std::vector<int32_t>> ids =
        tokenizer.Encode(texts.texts[i], texts.add_special_tokens);
    if (!ids.ok()) {
      return absl::Status(ids.status().code(), absl::StrCat(label, ids.status().message()));
    }
    out.push_back(std::move(*ids));
  }
  return out;
}

int64_t ChatBytes(const ChatInput& chat) {
  return static_cast<int64_t>(chat.messages_json.size() + chat.tools_json.size() +
                              chat.chat_template_kwargs_json.size());
}

int64_t PromptBytes(const PromptTexts& texts) {
  int64_t bytes = texts.chat.has_value() ? ChatBytes(*texts.chat) : 0;
  for (const std::string& t : texts.texts) bytes += static_cast<int64_t>(t.size());
  return bytes;
}

PromptTexts TakeTexts(GenerateInput* r) {
  PromptTexts t;
  t.add_special_tokens = r->add_bos;
  if (r->chat.has_value()) {
    t.chat = std::move(r->chat);
    r->chat.emplace();  // still a chat prompt (ValidateGenerate), its fields moved out
    t.add_special_tokens = false;
  } else if (r->has_text) {
    t.texts.push_back(std::move(r->text));
    t.labels.emplace_back();
    r->text.clear();
  }
  return t;
}

PromptTexts TakeTexts(EmbedInput* r) {
  PromptTexts t;
  t.add_special_tokens = r->add_bos;
  for (size_t i = 0; i < r->inputs.size(); ++i) {
    EmbedItem& item = r->inputs[i];
    if (!item.has_text) continue;
    t.texts.push_back(std::move(item.text));
    t.labels.push_back(absl::StrCat("inputs[", i, "]: "));
    item.text.clear();
  }
  return t;
}

absl::Status UnknownModel(std::string message) {
  return absl::NotFoundError(std::move(message));
}

const char* ValidationReason(const absl::Status& status) {
  if (absl::IsNotFound(status)) return reason::kUnknownModel;
  return status.GetPayload(kTooLongPayload).has_value() ? reason::kPromptTooLong
                                                        : reason::kInvalidArgument;
}

}  // namespace carpool::router
