// Reads a tokenizer.json (and a tokenizer_config.json) into its components. Every component
// type is checked at load: one this build does not run is refused with an error naming it
// ("tokenizer.json: normalizer type \"BertNormalizer\" is not supported").
#ifndef CARPOOL_TEXT_TOKENIZER_JSON_H_
#define CARPOOL_TEXT_TOKENIZER_JSON_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/decoders.h"
#include "text/normalizers.h"
#include "text/post_processors.h"
#include "text/pre_tokenizers.h"

namespace carpool::text {

struct TokenizerJson {
  std::vector<AddedToken> added_tokens;
  std::unique_ptr<Normalizer> normalizer;         // null: none
  std::unique_ptr<PreTokenizer> pre_tokenizer;    // null: the whole normalized text is one piece
  std::unique_ptr<BpeModel> model;                // never null
  std::unique_ptr<PostProcessor> post_processor;  // null: special tokens add nothing
  std::unique_ptr<Decoder> decoder;               // null: tokens joined with spaces
};

// INVALID_ARGUMENT for malformed JSON, a missing model, truncation or padding settings, and any
// unsupported component.
absl::StatusOr<TokenizerJson> ParseTokenizerJson(std::string_view text);

// The fields of tokenizer_config.json carpool reads. Absent fields stay unset.
struct TokenizerConfig {
  std::optional<std::string> bos_token;  // from a string or an AddedToken object
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  std::optional<int64_t> model_max_length;  // unset also when it is transformers' "no limit"
  std::string tokenizer_class;
};

// An empty text is an empty config. INVALID_ARGUMENT for malformed JSON or wrong field types.
absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(std::string_view text);

// generation_config.json's "eos_token_id" (an id or a list of ids); empty when absent or when
// `text` is empty. INVALID_ARGUMENT for malformed JSON or ids that are not non-negative integers.
absl::StatusOr<std::vector<int32_t>> ParseGenerationEosIds(std::string_view text);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_TOKENIZER_JSON_H_
