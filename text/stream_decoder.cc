#include "text/stream_decoder.h"

#include "absl/strings/match.h"

namespace carpool::text {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// Whether `s` ends inside a UTF-8 sequence: a lead byte whose continuation bytes have not all
// arrived. (Decoders that return raw bytes, such as the byte tokenizer's, can end so.)
bool EndsInsideUtf8Sequence(const std::string& s) {
  size_t continuation = 0;
  for (size_t i = s.size(); i > 0 && continuation < 4; --i) {
    const unsigned char c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) == 0x80) {
      ++continuation;
      continue;
    }
    size_t length = 1;
    if ((c & 0xE0) == 0xC0) {
      length = 2;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4;
    }
    return length > continuation + 1;
  }
  return false;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer* tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::DecodeRange(size_t from, size_t to) const {
  return tokenizer_->Decode(absl::MakeConstSpan(ids_).subspan(from, to - from), skip_special_);
}

std::string StreamDecoder::Add(int32_t id) {
  ids_.push_back(id);
  if (diverged_) return "";
  const std::string before = DecodeRange(prefix_, read_);
  const std::string now = DecodeRange(prefix_, ids_.size());
  if (!absl::StartsWith(now, before)) {
    // The window's text changed under the new id: only a whole decode can say what is right.
    diverged_ = true;
    return "";
  }
  std::string added = now.substr(before.size());
  if (absl::EndsWith(added, kReplacement) || EndsInsideUtf8Sequence(added)) return "";
  emitted_ += added;
  if (!added.empty()) prefix_ = read_;
  read_ = ids_.size();
  return added;
}

std::string StreamDecoder::Add(absl::Span<const int32_t> ids) {
  std::string out;
  for (int32_t id : ids) out += Add(id);
  return out;
}

std::string StreamDecoder::Finish() {
  const std::string all = DecodeRange(0, ids_.size());
  std::string rest;
  if (absl::StartsWith(all, emitted_)) rest = all.substr(emitted_.size());
  emitted_ += rest;
  prefix_ = read_ = ids_.size();
  diverged_ = true;
  return rest;
}

}  // namespace carpool::text
