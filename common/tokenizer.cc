#include "common/tokenizer.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace carpool {

const char* TokenizerKindName(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::kByte:
      return "byte";
    case TokenizerKind::kHuggingFace:
      return "hf";
    case TokenizerKind::kNone:
      break;
  }
  return "";
}

std::optional<TokenizerKind> TokenizerKindFromName(absl::string_view name) {
  for (TokenizerKind kind :
       {TokenizerKind::kNone, TokenizerKind::kByte, TokenizerKind::kHuggingFace}) {
    if (name == TokenizerKindName(kind)) return kind;
  }
  return std::nullopt;
}

TokenizerKind TokenizerKindForModel(absl::string_view model_spec) {
  return absl::StartsWith(model_spec, "synthetic:") ? TokenizerKind::kByte : TokenizerKind::kNone;
}

absl::StatusOr<std::vector<int32_t>> ByteTokenizer::Encode(const std::string& text,
                                                           bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (add_special_tokens) ids.push_back(kBos);
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::Decode(absl::Span<const int32_t> ids,
                                  bool skip_special_tokens) const {
  std::string text;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      text.push_back(static_cast<char>(id));
    } else if (!skip_special_tokens || (id != kBos && id != kEos)) {
      absl::StrAppend(&text, "<|", id, "|>");
    }
  }
  return text;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(TokenizerKind kind,
                                                           absl::string_view model_spec) {
  switch (kind) {
    case TokenizerKind::kByte:
      return std::make_unique<ByteTokenizer>();
    case TokenizerKind::kHuggingFace:
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", model_spec,
          "' has a tokenizer.json tokenizer: build it with text::LoadTokenizer or from the "
          "worker's registration (text::HfTokenizer::FromJson)"));
    case TokenizerKind::kNone:
      break;
  }
  return absl::UnimplementedError(absl::StrCat(
      "model '", model_spec,
      "' has no built-in tokenizer yet: pass token ids (--prompt-ids, or \"prompt_ids\" in a "
      "prompts file) instead of text"));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(absl::string_view model_spec) {
  return CreateTokenizer(TokenizerKindForModel(model_spec), model_spec);
}

}  // namespace carpool
