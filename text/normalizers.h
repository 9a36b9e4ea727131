// tokenizer.json normalizers: NFC, NFKC, Prepend, Replace, Lowercase, Strip, Sequence.
// Each rewrites a string as the Hugging Face `tokenizers` normalizer of the same name does (only
// the text matters here: carpool does not track offsets).
//
// Thread safety: immutable after parsing; Normalize may run on many threads at once.
#ifndef CARPOOL_TEXT_NORMALIZERS_H_
#define CARPOOL_TEXT_NORMALIZERS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "text/json_util.h"

namespace carpool::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites *text in place. REQUIRES: *text is valid UTF-8. Errors: regex work limits.
  virtual absl::Status Normalize(std::string* text) const = 0;
};

// The normalizer a tokenizer.json "normalizer" value describes; nullptr for null. A type this
// build does not run is INVALID_ARGUMENT naming it.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_NORMALIZERS_H_
