#include "router/request_validator.h"

#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer.h"

namespace carpool::router {
namespace {

constexpr char kTooLongPayload[] = "carpool.prompt_too_long";

absl::Status PromptTooLong(std::string message) {
  absl::Status s = absl::InvalidArgumentError(std::move(message));
  s.SetPayload(kTooLongPayload, absl::Cord("1"));
  return s;
}

absl::Status CheckRequestId(const std::string& id, const RequestLimits& limits) {
  if (id.empty()) return absl::InvalidArgumentError("request_id is empty");
  if (static_cast<int>(id.size()) > limits.max_request_id_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id is longer than ", limits.max_request_id_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateShape(const GenerateInput& r, const RequestLimits& limits) {
  if (r.request_id.empty()) return absl::InvalidArgumentError("request_id is empty");
  if (static_cast<int>(r.request_id.size()) > limits.max_request_id_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id is longer than ",
                                                   limits.max_request_id_bytes, " bytes"));
  }
  if (r.has_text) {
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
  if (static_cast<int>(r.sampling.stop_token_ids.size()) > limits.max_stop_token_ids) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids has ",
                                                   r.sampling.stop_token_ids.size(),
                                                   " entries; the limit is ",
                                                   limits.max_stop_token_ids));
  }
  return r.sampling.Validate(std::numeric_limits<int>::max());
}

absl::StatusOr<ValidatedPrompt> ValidateGenerate(const GenerateInput& r, const ModelLimits& model,
                                                 const RequestLimits& limits) {
  if (absl::Status s = ValidateShape(r, limits); !s.ok()) return s;
  ValidatedPrompt out;
  if (r.has_text) {
    if (model.tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          "the served model has no tokenizer in carpool yet: send token_ids instead of text");
    }
    auto ids = model.tokenizer->Encode(r.text, r.add_bos);
    if (!ids.ok()) return ids.status();
    out.tokens = std::move(*ids);
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
  if (absl::Status s = r.sampling.Validate(model.vocab_size); !s.ok()) return s;
  const int64_t prompt_len = static_cast<int64_t>(out.tokens.size());
  if (prompt_len >= model.max_model_len) {
    return PromptTooLong(absl::StrCat("prompt is ", prompt_len, " tokens; max_model_len is ",
                                      model.max_model_len,
                                      " and at least one token must be generated"));
  }
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
  if (absl::Status s = ValidateEmbedShape(r, limits); !s.ok()) return s;
  ValidatedEmbed out;
  out.inputs.reserve(r.inputs.size());
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const EmbedItem& item = r.inputs[i];
    std::vector<int32_t> tokens;
    if (item.has_text) {
      if (model.tokenizer == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "inputs[", i,
            "]: the served model has no tokenizer in carpool yet: send token_ids instead of "
            "text"));
      }
      auto ids = model.tokenizer->Encode(item.text, r.add_bos);
      if (!ids.ok()) return ids.status();
      tokens = std::move(*ids);
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

const char* ValidationReason(const absl::Status& status) {
  return status.GetPayload(kTooLongPayload).has_value() ? reason::kPromptTooLong
                                                        : reason::kInvalidArgument;
}

}  // namespace carpool::router
