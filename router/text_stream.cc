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

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::Feed(std::string_view text) {
  if (stopped_) return "";
  pending_.append(text);
  size_t earliest = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < earliest) {
      earliest = at;
      matched_ = s;
    }
  }
  if (earliest != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, earliest + (include_stop_ ? matched_.size() : 0));
    pending_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) ==
          std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  if (stopped_) return "";
  return std::exchange(pending_, std::string());
}

}  // namespace carpool::router
