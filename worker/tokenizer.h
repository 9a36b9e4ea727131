// Tokenizers turn prompt text into token ids and ids back into text.
//
// Synthetic models use ByteTokenizer: ids 0..255 are the bytes themselves, then BOS and EOS.
// Hugging Face folders have no tokenizer yet: they take token ids (--prompt-ids) only.
#ifndef CARPOOL_WORKER_TOKENIZER_H_
#define CARPOOL_WORKER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace carpool::worker {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids for `text`, with the BOS token first when `add_bos`.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text,
                                                      bool add_bos) const = 0;
  // Text for `ids`; special tokens are dropped, ids outside the byte range render as "<|id|>".
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;
};

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kVocabSize = 258;

  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text,
                                              bool add_bos) const override;
  std::string Decode(absl::Span<const int32_t> ids) const override;
};

// The tokenizer for a model spec: ByteTokenizer for "synthetic:*"; for a folder, an error that
// says to pass token ids (UNIMPLEMENTED).
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(const std::string& model_spec);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_TOKENIZER_H_
