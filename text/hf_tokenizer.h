// A Hugging Face tokenizer read from tokenizer.json (+ tokenizer_config.json), run the way the
// `tokenizers` library runs it: added tokens are found first (on the raw text for tokens with
// normalized=false, on the normalized text otherwise), the rest is normalized, pre-tokenized and
// cut by the BPE model, and the post-processor adds special tokens when asked.
//
// Thread safety: Encode and Decode may run on many threads at once.
#ifndef CARPOOL_TEXT_HF_TOKENIZER_H_
#define CARPOOL_TEXT_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer.h"
#include "text/added_tokens.h"
#include "text/tokenizer_json.h"

namespace carpool::text {

class HfTokenizer : public Tokenizer {
 public:
  // `path`: a folder holding tokenizer.json (and optionally tokenizer_config.json and
  // generation_config.json), or a tokenizer.json file (read alone, as the library's
  // Tokenizer.fromFile does). A folder with only tokenizer.model is NOT_FOUND saying
  // tokenizer.json is missing.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& path);
  // The config texts may be empty.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json,
      std::string_view generation_config_json = "");

  // INVALID_ARGUMENT naming the byte offset when `text` is not valid UTF-8; RESOURCE_EXHAUSTED
  // when a regex of the file passes its work limit.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text,
                                              bool add_special_tokens) const override;
  // Ids outside the vocabulary are left out, as the library does.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override;

  std::optional<int32_t> bos_token_id() const { return bos_id_; }
  std::optional<int32_t> eos_token_id() const { return eos_id_; }
  // The ids that end generation: generation_config.json's eos_token_id (one or a list), else
  // eos_token_id(); empty when neither is known.
  const std::vector<int32_t>& stop_token_ids() const { return stop_ids_; }
  std::optional<int64_t> model_max_length() const { return model_max_length_; }
  // An added token marked special.
  bool IsSpecial(int32_t id) const;
  // The token string of `id` (added token or vocabulary), or nullopt.
  std::optional<std::string> IdToToken(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // One more than the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const { return vocab_size_; }

 private:
  HfTokenizer() = default;
  absl::Status EncodeSegment(std::string_view raw, bool at_origin, std::vector<int32_t>* ids) const;
  const AddedToken* FindAdded(int32_t id) const;
  void AssignAddedTokenIds();

  TokenizerJson parts_;
  std::unique_ptr<AddedTokenMatcher> raw_matcher_;         // normalized=false tokens
  std::unique_ptr<AddedTokenMatcher> normalized_matcher_;  // normalized=true tokens
  absl::flat_hash_map<int32_t, size_t> added_by_id_;       // id -> index in parts_.added_tokens
  absl::flat_hash_map<std::string, int32_t> added_by_content_;
  std::unique_ptr<PostProcessor> config_post_processor_;  // from add_bos/eos_token; overrides
  std::optional<int32_t> bos_id_, eos_id_;
  std::vector<int32_t> stop_ids_;
  std::optional<int64_t> model_max_length_;
  int32_t vocab_size_ = 0;
  // The pre-tokenizer looks at which bytes are aligned with the input's offset 0 (Metaspace
  // "first"): only then do the normalizers track it.
  bool track_origin_ = false;
};

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_HF_TOKENIZER_H_
