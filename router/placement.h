// Placement: which worker takes a request. Pure functions of worker snapshots.
#ifndef CARPOOL_ROUTER_PLACEMENT_H_
#define CARPOOL_ROUTER_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace carpool::router {

struct WorkerSnapshot {
  int credit = 0;                  // requests it can still take; candidates need > 0
  int64_t outstanding_tokens = 0;  // tokens still to process for what it already holds
};

// The candidate with the fewest outstanding tokens (ties: lowest index); nullopt when no
// worker has credit.
std::optional<int> PlaceLeastLoaded(const std::vector<WorkerSnapshot>& workers);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_PLACEMENT_H_
