// tokenizer.json decoders: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence.
// A decoder rewrites the list of token strings; the decoded text is their concatenation, as in
// the Hugging Face `tokenizers` library.
//
// Thread safety: immutable after parsing.
#ifndef CARPOOL_TEXT_DECODERS_H_
#define CARPOOL_TEXT_DECODERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "text/json_util.h"

namespace carpool::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings in place. Output is valid UTF-8 when the input is, and for the
  // byte-producing decoders (ByteLevel, ByteFallback) whatever the bytes.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// The decoder a tokenizer.json "decoder" value describes; nullptr for null. A type this build
// does not run is INVALID_ARGUMENT naming it.
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_DECODERS_H_
