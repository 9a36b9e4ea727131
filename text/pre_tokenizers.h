// tokenizer.json pre-tokenizers: Split, ByteLevel, Metaspace, Digits, Whitespace,
// WhitespaceSplit, Sequence. A pre-tokenizer cuts (and for ByteLevel and Metaspace rewrites) the
// normalized text into the pieces the model tokenizes one by one, as the Hugging Face
// `tokenizers` pre-tokenizer of the same name does.
//
// Thread safety: immutable after parsing; PreTokenize may run on many threads at once.
#ifndef CARPOOL_TEXT_PRE_TOKENIZERS_H_
#define CARPOOL_TEXT_PRE_TOKENIZERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "text/json_util.h"

namespace carpool::text {

// One piece: text[begin, end) of its PreTokenized. `origin`: how many of its first bytes are
// aligned with offset 0 of the original input (see OriginPrefix in normalizers.h; only kept when
// some pre-tokenizer NeedsOrigin(), 0 otherwise). Metaspace's prepend_scheme "first" prepends to
// a piece whose first byte is: at_origin().
struct Piece {
  uint32_t begin;
  uint32_t end;
  uint32_t origin;
  bool at_origin() const { return origin > 0; }
};

struct PreTokenized {
  std::string text;
  std::vector<Piece> pieces;  // in order, none empty
  std::string_view view(const Piece& p) const {
    return std::string_view(text).substr(p.begin, p.end - p.begin);
  }
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces the pieces (and possibly the text) of *p. Errors: regex work limits.
  virtual absl::Status PreTokenize(PreTokenized* p) const = 0;
  // Whether it looks at Piece::origin (Metaspace with prepend_scheme "first"); when none does,
  // the caller may leave every origin 0 and skip tracking it.
  virtual bool NeedsOrigin() const { return false; }
};

// The pre-tokenizer a tokenizer.json "pre_tokenizer" value describes; nullptr for null. A type
// (or a Split behavior) this build does not run is INVALID_ARGUMENT naming it.
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& j);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_PRE_TOKENIZERS_H_
