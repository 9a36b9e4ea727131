#include "router/placement_index.h"

#include <algorithm>
#include <cmath>

#include "absl/container/inlined_vector.h"
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
  // Blocks of about sqrt(N): a query reads each block's order once and scans one or two blocks.
  const int n = static_cast<int>(workers_.size());
  embed_block_size_ = std::max(8, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n)))));
  for (int first = 0; first < n; first += embed_block_size_) {
    EmbedBlock b;
    b.first = first;
    b.size = std::min(embed_block_size_, n - first);
    embed_blocks_.push_back(std::move(b));
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    const int queue = workers_[i]->info.embed_queue_size;
    if (queue > 0) ++embedders_;
    largest_embed_queue_ = std::max(largest_embed_queue_, queue);
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
  const int64_t old_load = s.load;
  s.load = load;
  UpdateEmbed(position, old_load);
}

void PlacementIndex::UpdateEmbed(int position, int64_t old_load) {
  Slot& s = slots_[position];
  const WorkerState& w = *workers_[position];
  const bool embeds = w.can_embed();
  const int64_t room = int64_t{w.info.embed_queue_size} - w.embed_inputs;
  const bool same = embeds == s.embeds && (!embeds || (room == s.embed_room && s.load == old_load));
  if (same) {
    s.embed_room = room;
    return;
  }
  EmbedBlock& b = embed_blocks_[position / embed_block_size_];
  std::vector<int>& order = b.by_room;
  size_t from = 0;  // the least loaded of each prefix from here on changes
  if (embeds && s.embeds && room == s.embed_room) {
    // Only its load: its place in the order stays.
    from = std::find(order.begin(), order.end(), position) - order.begin();
  } else {
    if (s.embeds) order.erase(std::find(order.begin(), order.end(), position));
    embed_members_ += static_cast<int>(embeds) - static_cast<int>(s.embeds);
    s.embeds = embeds;
    s.embed_room = room;
    if (embeds) {
      // After every member with at least this room: the order stays by room, most first.
      const auto at = std::partition_point(order.begin(), order.end(),
                                           [&](int p) { return slots_[p].embed_room >= room; });
      order.insert(at, position);
    }
    b.least.resize(order.size());
  }
  for (size_t i = from; i < order.size(); ++i) {
    b.least[i] = i == 0 || LessLoaded(order[i], b.least[i - 1]) ? order[i] : b.least[i - 1];
  }
}

int PlacementIndex::Resync() {
  int stale = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const WorkerState& w = *workers_[i];
    const Slot& s = slots_[i];
    if (s.load != w.outstanding_tokens || s.in[0] != (w.credit(false) > 0) ||
        s.in[1] != (w.credit(true) > 0) || s.embeds != w.can_embed() ||
        s.embed_room != int64_t{w.info.embed_queue_size} - w.embed_inputs) {
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

bool PlacementIndex::LessLoaded(int a, int b) const {
  const int64_t la = slots_[a].load;
  const int64_t lb = slots_[b].load;
  return la != lb ? la < lb : a < b;
}

bool PlacementIndex::IsEmbedCandidate(int position, int64_t inputs) const {
  const Slot& s = slots_[position];
  return s.embeds && s.embed_room >= inputs;
}

int PlacementIndex::EmbedCandidates(const EmbedBlock& b, int64_t inputs) const {
  const auto end = std::partition_point(b.by_room.begin(), b.by_room.end(),
                                        [&](int p) { return slots_[p].embed_room >= inputs; });
  return static_cast<int>(end - b.by_room.begin());
}

int PlacementIndex::FirstEmbedCandidate(const EmbedBlock& b, int from, int64_t inputs) const {
  if (EmbedCandidates(b, inputs) == 0) return -1;
  for (int p = std::max(from, b.first); p < b.first + b.size; ++p) {
    if (IsEmbedCandidate(p, inputs)) return p;
  }
  return -1;
}

int PlacementIndex::KthEmbedCandidate(int64_t k, int64_t inputs,
                                      absl::Span<const int> counts) const {
  for (size_t i = 0; i < embed_blocks_.size(); ++i) {
    const EmbedBlock& b = embed_blocks_[i];
    const int c = counts[i];
    if (k >= c) {
      k -= c;
      continue;
    }
    for (int p = b.first; p < b.first + b.size; ++p) {
      if (IsEmbedCandidate(p, inputs) && k-- == 0) return p;
    }
  }
  return -1;
}

std::optional<int> PlacementIndex::EmbedLeastLoaded(int64_t inputs) const {
  int best = -1;
  for (const EmbedBlock& b : embed_blocks_) {
    const int c = EmbedCandidates(b, inputs);
    if (c == 0) continue;
    const int candidate = b.least[c - 1];
    if (best < 0 || LessLoaded(candidate, best)) best = candidate;
  }
  if (best < 0) return std::nullopt;
  return best;
}

std::optional<int> PlacementIndex::EmbedRoundRobin(int64_t inputs, uint64_t cursor) const {
  if (embed_members_ == 0) return std::nullopt;
  // As Place(): the first candidate at or after cursor mod N, N every worker of the model.
  const int start = static_cast<int>(cursor % workers_.size());
  const int nb = static_cast<int>(embed_blocks_.size());
  const int at = start / embed_block_size_;
  if (const int p = FirstEmbedCandidate(embed_blocks_[at], start, inputs); p >= 0) return p;
  for (int k = 1; k < nb; ++k) {
    const EmbedBlock& b = embed_blocks_[(at + k) % nb];
    if (const int p = FirstEmbedCandidate(b, b.first, inputs); p >= 0) return p;
  }
  // Round to the start's block again: only its candidates before `start` are left.
  if (const int p = FirstEmbedCandidate(embed_blocks_[at], embed_blocks_[at].first, inputs);
      p >= 0) {
    return p;
  }
  return std::nullopt;
}

std::optional<int> PlacementIndex::EmbedPowerOfTwo(int64_t inputs, uint64_t random) const {
  // Each block's candidates, counted once for the count and both draws.
  absl::InlinedVector<int, 64> counts(embed_blocks_.size());
  uint64_t n = 0;
  for (size_t i = 0; i < embed_blocks_.size(); ++i) {
    counts[i] = EmbedCandidates(embed_blocks_[i], inputs);
    n += counts[i];
  }
  if (n == 0) return std::nullopt;
  if (n == 1) return KthEmbedCandidate(0, inputs, counts);
  // Place()'s two draws among the candidates ordered by position.
  const int a = KthEmbedCandidate(static_cast<int64_t>(random % n), inputs, counts);
  const int b = KthEmbedCandidate(
      static_cast<int64_t>((random % n + 1 + (random / n) % (n - 1)) % n), inputs, counts);
  return slots_[b].load < slots_[a].load ? b : a;
}

}  // namespace carpool::router
