#include "router/text_stream.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace carpool::router {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the sequence a lead byte starts (1 for ASCII); 0 for a byte that cannot lead.
int SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether `b` may follow `lead` as the sequence's second byte (no overlongs, no surrogates, no
// code points past U+10FFFF); later bytes only need to be continuation bytes.
bool ValidSecond(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;
    case 0xED:
      return b >= 0x80 && b <= 0x9F;
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;
    default:
      return b >= 0x80 && b <= 0xBF;
  }
}

}  // namespace

std::string Utf8Stream::Feed(std::string_view bytes) {
  held_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < held_.size()) {
    const auto lead = static_cast<uint8_t>(held_[i]);
    const int n = SequenceLength(lead);
    if (n == 1) {
      out.push_back(held_[i++]);
      continue;
    }
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // Check the bytes present; an incomplete but valid-so-far sequence waits at the end.
    int good = 1;
    while (good < n && i + good < held_.size()) {
      const auto b = static_cast<uint8_t>(held_[i + good]);
      const bool ok = good == 1 ? ValidSecond(lead, b) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++good;
    }
    if (good == n) {
      out.append(held_, i, n);
      i += n;
    } else if (i + good == held_.size()) {
      break;  // incomplete: hold it
    } else {
      out += kReplacement;  // the lead byte; what follows is read afresh
      ++i;
    }
  }
  held_.erase(0, i);
  return out;
}

std::string Utf8Stream::Flush() {
  std::string out;
  for (size_t i = 0; i < held_.size(); ++i) out += kReplacement;
  held_.clear();
  return out;
}

std::string SanitizeUtf8(std::string_view text) {
  Utf8Stream s;
  std::string out = s.Feed(text);
  return out + s.Flush();
}

}  // namespace carpool::router
