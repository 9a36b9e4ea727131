// Streaming detokenization: token ids in, one at a time, text out, such that
//   - a chunk never ends inside a UTF-8 sequence, and never with a U+FFFD that more tokens could
//     still turn into a character (a byte-level token holding part of a character);
//   - the chunks, concatenated, equal Decode(all the ids) byte for byte.
//
// How: the decoder keeps a window [prefix, read) of ids whose text it has already emitted and
// decodes [prefix, end) and [prefix, read) each time; what the longer adds is the new text. Both
// start at the same id, so a decoder that treats the start of its input specially (Metaspace and
// Strip drop a leading space) treats them alike. New text ending in U+FFFD is held until a later
// id completes it or Finish. The window moves forward with every emission, so each id costs a
// decode of a few ids, not of the whole output. Finish decodes everything once and emits what the
// chunks lack, so the concatenation is exact even for a decoder whose output is not
// prefix-stable (then some text arrives only at Finish).
//
// Thread-compatible; the tokenizer must outlive the decoder.
#ifndef CARPOOL_TEXT_STREAM_DECODER_H_
#define CARPOOL_TEXT_STREAM_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/tokenizer.h"

namespace carpool::text {

class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer* tokenizer, bool skip_special_tokens);

  // The text that `id` completes (often empty while a character or a word is incomplete).
  std::string Add(int32_t id);
  // The same for several ids at once: the concatenation of Add's results.
  std::string Add(absl::Span<const int32_t> ids);
  // The rest: Decode(every id added) minus what was emitted. The decoder is done afterwards.
  std::string Finish();

  const std::vector<int32_t>& ids() const { return ids_; }
  // Everything emitted so far.
  const std::string& text() const { return emitted_; }

 private:
  std::string DecodeRange(size_t from, size_t to) const;

  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0;  // the window's first id
  size_t read_ = 0;    // ids before this one are in emitted_
  std::string emitted_;
  // True once a window's texts disagreed (not prefix-stable): from then on text waits for Finish.
  bool diverged_ = false;
};

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_STREAM_DECODER_H_
