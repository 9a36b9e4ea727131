// Placement: which worker takes a request. Pure functions of the request's needs and the workers'
// snapshots; any state a policy needs (a round-robin cursor, random draws) comes in as input.
//
// Candidates are the workers with credit (a free sequence slot, not draining) whose free token
// capacity holds the request, or that hold nothing at all. Among them:
//   round_robin      the first candidate at or after `cursor` (mod the number of workers);
//   least_loaded     the fewest outstanding tokens (ties: lowest index);
//   power_of_two     two candidates drawn at random (`random`), the less loaded of the two;
//   prefix_affinity  the highest score
//                      cached_prefix_tokens - affinity_load_weight * outstanding_tokens,
//                    where cached_prefix_tokens are the request's leading prompt tokens whose
//                    KV blocks the worker reported holding (router/prefix_index.h). Outstanding
//                    tokens count only uncached work, so a worker keeps winning its prefixes
//                    until the work queued on it outweighs what the cache saves. Ties: fewer
//                    outstanding tokens, then lowest index.
#ifndef CARPOOL_ROUTER_PLACEMENT_H_
#define CARPOOL_ROUTER_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace carpool::router {

enum class PlacementPolicy { kRoundRobin, kLeastLoaded, kPowerOfTwo, kPrefixAffinity };

// "round_robin" | "least_loaded" | "power_of_two" | "prefix_affinity".
absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(std::string_view name);
const char* PlacementPolicyName(PlacementPolicy policy);

struct WorkerSnapshot {
  int credit = 0;                    // requests it can still take; candidates need > 0
  int64_t outstanding_tokens = 0;    // tokens still to process for what it already holds
  int64_t capacity_tokens = 0;       // its KV cache in tokens; 0: unknown (no limit)
  int64_t cached_prefix_tokens = 0;  // of this request's prompt (prefix_affinity only)
};

struct PlacementInput {
  int64_t request_tokens = 0;        // what the request adds to outstanding_tokens
  uint64_t cursor = 0;               // round_robin: placements made so far
  uint64_t random = 0;               // power_of_two: any uniformly random value
  double affinity_load_weight = 1.0;
};

// Whether `w` is a candidate for a request adding `request_tokens`: credit, and its free
// capacity holds the request (or its capacity is unknown, or it holds nothing).
bool IsCandidate(const WorkerSnapshot& w, int64_t request_tokens);

// prefix_affinity's score of a worker (higher wins; ties: fewer outstanding tokens, then the
// lower index).
inline double PrefixAffinityScore(int64_t cached_prefix_tokens, int64_t outstanding_tokens,
                                  double affinity_load_weight) {
  return static_cast<double>(cached_prefix_tokens) -
         affinity_load_weight * static_cast<double>(outstanding_tokens);
}

// The chosen worker's index, or nullopt when no worker is a candidate.
std::optional<int> Place(PlacementPolicy policy, const std::vector<WorkerSnapshot>& workers,
                         const PlacementInput& input);

// least_loaded, kept for callers that need no request.
std::optional<int> PlaceLeastLoaded(const std::vector<WorkerSnapshot>& workers);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_PLACEMENT_H_
