#include "worker/tokenizer.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace carpool::worker {

absl::StatusOr<std::vector<int32_t>> ByteTokenizer::Encode(const std::string& text,
                                                           bool add_bos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  if (add_bos) ids.push_back(kBos);
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      text.push_back(static_cast<char>(id));
    } else if (id != kBos && id != kEos) {
      absl::StrAppend(&text, "<|", id, "|>");
    }
  }
  return text;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(const std::string& model_spec) {
  if (absl::StartsWith(model_spec, "synthetic:")) return std::make_unique<ByteTokenizer>();
  return absl::UnimplementedError(absl::StrCat(
      "model '", model_spec,
      "' has no built-in tokenizer yet: pass token ids (--prompt-ids, or \"prompt_ids\" in a "
      "prompts file) instead of text"));
}

}  // namespace carpool::worker
