#include "router/placement.h"

#include "absl/strings/str_cat.h"

namespace carpool::router {
namespace {

bool Candidate(const WorkerSnapshot& w, int64_t request_tokens) {
  return IsCandidate(w, request_tokens);
}

std::optional<int> LeastLoaded(const std::vector<WorkerSnapshot>& workers, int64_t tokens) {
  std::optional<int> best;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    if (!Candidate(workers[i], tokens)) continue;
    if (!best || workers[i].outstanding_tokens < workers[*best].outstanding_tokens) best = i;
  }
  return best;
}

std::optional<int> RoundRobin(const std::vector<WorkerSnapshot>& workers, const PlacementInput& in) {
  const int n = static_cast<int>(workers.size());
  for (int k = 0; k < n; ++k) {
    const int i = static_cast<int>((in.cursor + k) % n);
    if (Candidate(workers[i], in.request_tokens)) return i;
  }
  return std::nullopt;
}

std::optional<int> PowerOfTwo(const std::vector<WorkerSnapshot>& workers, const PlacementInput& in) {
  std::vector<int> candidates;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    if (Candidate(workers[i], in.request_tokens)) candidates.push_back(i);
  }
  if (candidates.empty()) return std::nullopt;
  const uint64_t n = candidates.size();
  if (n == 1) return candidates[0];
  const int a = candidates[in.random % n];
  // The second draw differs from the first: offset in [1, n).
  const int b = candidates[(in.random % n + 1 + (in.random / n) % (n - 1)) % n];
  return workers[b].outstanding_tokens < workers[a].outstanding_tokens ? b : a;
}

std::optional<int> PrefixAffinity(const std::vector<WorkerSnapshot>& workers,
                                  const PlacementInput& in) {
  std::optional<int> best;
  double best_score = 0;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    const WorkerSnapshot& w = workers[i];
    if (!Candidate(w, in.request_tokens)) continue;
    const double score =
        PrefixAffinityScore(w.cached_prefix_tokens, w.outstanding_tokens, in.affinity_load_weight);
    if (!best || score > best_score ||
        (score == best_score && w.outstanding_tokens < workers[*best].outstanding_tokens)) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

}  // namespace

bool IsCandidate(const WorkerSnapshot& w, int64_t request_tokens) {
  if (w.credit <= 0) return false;
  if (w.capacity_tokens <= 0 || w.outstanding_tokens == 0) return true;
  return w.outstanding_tokens + request_tokens <= w.capacity_tokens;
}

absl::StatusOr<PlacementPolicy> ParsePlacementPolicy(std::string_view name) {
  if (name == "round_robin") return PlacementPolicy::kRoundRobin;
  if (name == "least_loaded") return PlacementPolicy::kLeastLoaded;
  if (name == "power_of_two") return PlacementPolicy::kPowerOfTwo;
  if (name == "prefix_affinity") return PlacementPolicy::kPrefixAffinity;
  return absl::InvalidArgumentError(
      absl::StrCat("--placement must be round_robin, least_loaded, power_of_two or "
                   "prefix_affinity, got '", std::string(name), "'"));
}

const char* PlacementPolicyName(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kRoundRobin:
      return "round_robin";
    case PlacementPolicy::kPowerOfTwo:
      return "power_of_two";
    case PlacementPolicy::kPrefixAffinity:
      return "prefix_affinity";
    default:
      return "least_loaded";
  }
}

std::optional<int> Place(PlacementPolicy policy, const std::vector<WorkerSnapshot>& workers,
                         const PlacementInput& input) {
  switch (policy) {
    case PlacementPolicy::kRoundRobin:
      return RoundRobin(workers, input);
    case PlacementPolicy::kPowerOfTwo:
      return PowerOfTwo(workers, input);
    case PlacementPolicy::kPrefixAffinity:
      return PrefixAffinity(workers, input);
    default:
      return LeastLoaded(workers, input.request_tokens);
  }
}

std::optional<int> PlaceLeastLoaded(const std::vector<WorkerSnapshot>& workers) {
  return LeastLoaded(workers, 0);
}

}  // namespace carpool::router
