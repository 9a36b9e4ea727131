#include "router/placement_index.h"

#include <algorithm>

#include "router/worker_registry.h"

namespace carpool::router {
namespace {

// power_of_two: pairs drawn before it settles for the least loaded candidate.
constexpr int kPowerOfTwoDraws = 4;

// The next value of a splitmix64 sequence: power_of_two's further draws from one random input.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

PlacementIndex::PlacementIndex(std::vector<WorkerState*> workers)
    : workers_(std::move(workers)), slots_(workers_.size()) {
  for (size_t i = 0; i < workers_.size(); ++i) {
    positions_[workers_[i]->identity] = static_cast<int>(i);
    const int block_size = workers_[i]->info.block_size;
    if (std::find(block_sizes_.begin(), block_sizes_.end(), block_size) == block_sizes_.end()) {
      block_sizes_.push_back(block_size);
    }
    const int64_t capacity = workers_[i]->capacity_tokens();
    slots_[i].capacity = capacity;
    max_capacity_ = std::max(max_capacity_, capacity);
    any_unknown_ = any_unknown_ || capacity <= 0;
    Update(static_cast<int>(i));
  }
}

int PlacementIndex::PositionOf(const std::string& identity) const {
  auto it = positions_.find(identity);
  return it == positions_.end() ? -1 : it->second;
}

void PlacementIndex::Enter(Lane& lane, int lane_index, int position, int64_t load) {
  Slot& s = slots_[position];
  lane.by_load.insert({load, position});
  lane.positions.insert(position);
  s.member_at[lane_index] = static_cast<int>(lane.members.size());
  lane.members.push_back(position);
  s.in[lane_index] = true;
}

void PlacementIndex::Leave(Lane& lane, int lane_index, int position) {
  Slot& s = slots_[position];
  lane.by_load.erase({s.load, position});
  lane.positions.erase(position);
  const int at = s.member_at[lane_index];
  const int last = lane.members.back();
  lane.members[at] = last;
  slots_[last].member_at[lane_index] = at;
  lane.members.pop_back();
  s.member_at[lane_index] = -1;
  s.in[lane_index] = false;
}

void PlacementIndex::Update(int position) {
  Slot& s = slots_[position];
  const WorkerState& w = *workers_[position];
  const int64_t load = w.outstanding_tokens;
  for (int lane_index : {0, 1}) {
    Lane& lane = lanes_[lane_index];
    const bool in = w.credit(/*batch_job=*/lane_index == 1) > 0;
    if (s.in[lane_index] && !in) {
      Leave(lane, lane_index, position);
    } else if (!s.in[lane_index] && in) {
      Enter(lane, lane_index, position, load);
    } else if (in && load != s.load) {
      lane.by_load.erase({s.load, position});
      lane.by_load.insert({load, position});
    }
  }
  s.load = load;
}

int PlacementIndex::Resync() {
  int stale = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const WorkerState& w = *workers_[i];
    const Slot& s = slots_[i];
    if (s.load != w.outstanding_tokens || s.in[0] != (w.credit(false) > 0) ||
        s.in[1] != (w.credit(true) > 0)) {
      ++stale;
      Update(static_cast<int>(i));
    }
  }
  return stale;
}

bool PlacementIndex::IsCandidate(int position, const Query& q) const {
  const Slot& s = slots_[position];
  if (!s.in[q.batch_job]) return false;
  if (s.capacity <= 0 || s.load == 0) return true;
  return s.load + q.request_tokens <= s.capacity;
}

bool PlacementIndex::PastCapacity(int64_t load, int64_t request_tokens) const {
  return !any_unknown_ && load > 0 && load + request_tokens > max_capacity_;
}

bool PlacementIndex::Better(double score, int position, std::optional<int> best,
                            double best_score) const {
  if (!best) return true;
  if (score != best_score) return score > best_score;
  const int64_t load = slots_[position].load;
  const int64_t best_load = slots_[*best].load;
  if (load != best_load) return load < best_load;
  return position < *best;
}

std::optional<int> PlacementIndex::LeastLoaded(const Query& q) const {
  for (const auto& [load, position] : lanes_[q.batch_job].by_load) {
    if (PastCapacity(load, q.request_tokens)) break;
    if (IsCandidate(position, q)) return position;
  }
  return std::nullopt;
}

std::optional<int> PlacementIndex::RoundRobin(const Query& q) const {
  const Lane& lane = lanes_[q.batch_job];
  if (lane.positions.empty()) return std::nullopt;
  // Nothing fits anywhere: no walk round all of them.
  if (PastCapacity(lane.by_load.begin()->first, q.request_tokens)) return std::nullopt;
  const int start = static_cast<int>(q.cursor % workers_.size());
  for (auto it = lane.positions.lower_bound(start); it != lane.positions.end(); ++it) {
    if (IsCandidate(*it, q)) return *it;
  }
  for (auto it = lane.positions.begin(); it != lane.positions.end() && *it < start; ++it) {
    if (IsCandidate(*it, q)) return *it;
  }
  return std::nullopt;
}

std::optional<int> PlacementIndex::PowerOfTwo(const Query& q) const {
  const std::vector<int>& members = lanes_[q.batch_job].members;
  const uint64_t n = members.size();
  if (n >= 2) {
    std::optional<int> first;
    uint64_t r = q.random;
    for (int draw = 0; draw < kPowerOfTwoDraws; ++draw, r = Mix(r)) {
      // Two distinct members, as Place() draws two distinct candidates: an offset in [1, n).
      const int pair[2] = {members[r % n], members[(r % n + 1 + (r / n) % (n - 1)) % n]};
      for (int position : pair) {
        if (!IsCandidate(position, q)) continue;
        if (!first) {
          first = position;
        } else if (position != *first) {
          return slots_[position].load < slots_[*first].load ? position : *first;
        }
      }
    }
  }
  // One member, or the draws found fewer than two candidates: the least loaded of them all.
  return LeastLoaded(q);
}

std::optional<int> PlacementIndex::PrefixAffinity(const Query& q,
                                                  absl::Span<const Cached> cached) const {
  // A worker with nothing cached scores -weight * load: the best of them is the least loaded
  // candidate (weight >= 0), and it is a worker with something cached that beats it.
  std::optional<int> best = LeastLoaded(q);
  if (!best) return std::nullopt;
  double best_score = PrefixAffinityScore(0, slots_[*best].load, q.affinity_load_weight);
  for (const Cached& c : cached) {
    if (!IsCandidate(c.position, q)) continue;
    const double score =
        PrefixAffinityScore(c.tokens, slots_[c.position].load, q.affinity_load_weight);
    if (Better(score, c.position, best, best_score)) {
      best = c.position;
      best_score = score;
    }
  }
  return best;
}

}  // namespace carpool::router
