#include "router/placement.h"

namespace carpool::router {

std::optional<int> PlaceLeastLoaded(const std::vector<WorkerSnapshot>& workers) {
  std::optional<int> best;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    if (workers[i].credit <= 0) continue;
    if (!best || workers[i].outstanding_tokens < workers[*best].outstanding_tokens) best = i;
  }
  return best;
}

}  // namespace carpool::router
