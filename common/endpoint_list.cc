#include "common/endpoint_list.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace carpool {

std::vector<std::string> SplitEndpointList(absl::string_view list) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    out.emplace_back(absl::StripAsciiWhitespace(part));
  }
  return out;
}

}  // namespace carpool
