#include "common/priority.h"

namespace carpool {

const char* PriorityName(Priority p) {
  switch (p) {
    case Priority::kInteractive:
      return "interactive";
    case Priority::kBatch:
      return "batch";
    case Priority::kDefault:
      break;
  }
  return "default";
}

std::optional<Priority> PriorityFromName(absl::string_view name) {
  for (Priority p : {Priority::kInteractive, Priority::kDefault, Priority::kBatch}) {
    if (name == PriorityName(p)) return p;
  }
  return std::nullopt;
}

}  // namespace carpool
