// A request's priority class: the one scale the SDKs, the router's admission and the worker's
// scheduler all use.
#ifndef CARPOOL_COMMON_PRIORITY_H_
#define CARPOOL_COMMON_PRIORITY_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace carpool {

// Lower value = more urgent. The values index per-class arrays (admission queues, stats).
enum class Priority : int { kInteractive = 0, kDefault = 1, kBatch = 2 };
inline constexpr int kNumPriorities = 3;

// "interactive", "default" or "batch".
const char* PriorityName(Priority p);
// The priority a name stands for; nullopt for anything but the three names above.
std::optional<Priority> PriorityFromName(absl::string_view name);

}  // namespace carpool

#endif  // CARPOOL_COMMON_PRIORITY_H_
