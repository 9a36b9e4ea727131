#include "router/stop_strings.h"

#include <algorithm>
#include <utility>

namespace carpool::router {

StopStrings::StopStrings(std::vector<std::string> stops, bool include_stop)
    : include_stop_(include_stop) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopStrings::Feed(std::string_view text) {
  if (stopped_) return "";
  if (stops_.empty()) return std::string(text);
  pending_.append(text);
  size_t earliest = std::string::npos;
  const std::string* hit = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < earliest) {
      earliest = at;
      hit = &s;
    }
  }
  if (hit != nullptr) {
    stopped_ = true;
    matched_ = *hit;
    std::string out = pending_.substr(0, earliest + (include_stop_ ? hit->size() : 0));
    pending_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
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

std::string StopStrings::Flush() {
  if (stopped_) return "";
  return std::exchange(pending_, std::string());
}

}  // namespace carpool::router
