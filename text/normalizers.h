// tokenizer.json normalizers: NFC, NFKC, Prepend, Replace, Lowercase, Strip, Sequence.
// Each rewrites a string as the Hugging Face `tokenizers` normalizer of the same name does.
//
// Offsets. The library's NormalizedString aligns every normalized byte with the original range
// it came from; carpool does not track offsets, except the one thing Metaspace's prepend_scheme
// "first" looks at: whether a piece's first byte is aligned with offset 0 of the original input.
// Under the library's rules (an inserted character takes the alignment of the byte before it, or
// the NormalizedString's own start when nothing is before it; a replaced or kept character keeps
// its own; a removed one leaves nothing) the bytes aligned with offset 0 always form a prefix of
// the normalized text, so its length says it all: OriginPrefix.
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

// The bytes of a normalized text aligned with offset 0 of the original input.
struct OriginPrefix {
  // Bytes [0, bytes) of the text are aligned with original offset 0 (0: none). May end inside a
  // character, which then counts as aligned.
  size_t bytes = 0;
  // The text starts at original offset 0 (the raw segment it was cut from does): a character
  // inserted before every other one is aligned there.
  bool segment_at_origin = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites *text in place; with `origin` non-null, also updates *origin from *text before to
  // *text after. REQUIRES: *text is valid UTF-8. Errors: regex work limits.
  virtual absl::Status Normalize(std::string* text, OriginPrefix* origin) const = 0;
  absl::Status Normalize(std::string* text) const { return Normalize(text, nullptr); }
};

// The normalizer a tokenizer.json "normalizer" value describes; nullptr for null. A type this
// build does not run is INVALID_ARGUMENT naming it.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_NORMALIZERS_H_
