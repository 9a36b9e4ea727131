// Tokenizers turn prompt text into token ids and ids back into text. Every process that handles
// text (the router for requests, the worker's engine, the CLI) gets its tokenizer here, so they
// all apply the same rules.
//
// Synthetic models use ByteTokenizer: ids 0..255 are the bytes themselves, then BOS and EOS.
// Hugging Face folders have a tokenizer.json tokenizer (text/hf_tokenizer.h, built with
// text::LoadTokenizer); a worker hands its files to the router when it registers
// (TokenizerKind::kHuggingFace), so the router needs no copy of the folder.
#ifndef CARPOOL_COMMON_TOKENIZER_H_
#define CARPOOL_COMMON_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace carpool {

// Which tokenizer a model uses. A worker announces it at registration (RegisterInfo) so the
// router can tokenize text prompts and detokenize outputs the same way.
enum class TokenizerKind {
  kNone,         // token ids only: text is refused
  kByte,         // ByteTokenizer
  kHuggingFace,  // tokenizer.json (text/hf_tokenizer.h), its bytes in the registration
};

// The wire name: "" for kNone, "byte" for kByte, "hf" for kHuggingFace.
const char* TokenizerKindName(TokenizerKind kind);
// The kind a wire name stands for; nullopt for a name this build does not know.
std::optional<TokenizerKind> TokenizerKindFromName(absl::string_view name);
// The kind a model spec ("synthetic:*", a folder) uses.
TokenizerKind TokenizerKindForModel(absl::string_view model_spec);

// The Hugging Face tokenizer contract: Encode(text, add_special_tokens) and
// Decode(ids, skip_special_tokens). Thread safety: implementations are safe to call from many
// threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids for `text`; with `add_special_tokens`, the special tokens the tokenizer adds around a
  // sequence (for ByteTokenizer: BOS first).
  virtual absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text,
                                                      bool add_special_tokens) const = 0;
  // Text for `ids`; with `skip_special_tokens`, special tokens are left out.
  virtual std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const = 0;
};

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kVocabSize = 258;

  // add_special_tokens: BOS first.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text,
                                              bool add_special_tokens) const override;
  // Special tokens are BOS and EOS: dropped when skipping, "<|256|>" / "<|257|>" otherwise. Any
  // other id outside the byte range renders as "<|id|>".
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override;
};

// The tokenizer of `kind`; for kNone an UNIMPLEMENTED error, naming `model_spec`, that says to
// pass token ids. kHuggingFace is built from its files by text/ (text::LoadTokenizer,
// text::HfTokenizer::FromJson), not here: FAILED_PRECONDITION saying so.
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(TokenizerKind kind,
                                                           absl::string_view model_spec);
// The tokenizer for a model spec: CreateTokenizer(TokenizerKindForModel(spec), spec).
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(absl::string_view model_spec);

}  // namespace carpool

#endif  // CARPOOL_COMMON_TOKENIZER_H_
