// Placement in time sub-linear in the number of workers: for one model's workers, those that can
// take work now, kept in the orders the policies of router/placement.h look at them, so that a
// placement visits a few workers instead of every one. It chooses what Place() over every
// worker's snapshot chooses, given the same input: exactly for round_robin, least_loaded and
// prefix_affinity; for power_of_two, the less loaded of two distinct candidates drawn at random
// (`random`, then values derived from it; after a few draws that found no two candidates, the
// least loaded one).
//
// Positions are indices into the model's workers ordered by identity (WorkerRegistry builds the
// index, and builds it again when a worker of the model registers or leaves). The index reads a
// worker's state (serving, credit, outstanding tokens) only when told that it changed: Update,
// through WorkerRegistry::Changed, after every change and before the next placement.
//
// Costs, for N workers of which M can take work: an update O(log M); least_loaded O(log M) plus
// the workers it passes over for lack of KV room; round_robin the same from the cursor;
// power_of_two O(1) expected; prefix_affinity (router/generate_kind.cc) O(log M) plus the
// workers that hold the prompt's first block, or, when many do, a walk from the least loaded
// that stops where load outweighs the most any worker could have cached.
//
// Embed requests (router/embed_kind.h) have a lane of their own: the workers serving with
// embed_queue_size > 0, each with its free embed room (embed_queue_size - embed_inputs) and load.
// A request of `inputs` inputs has as candidates the members whose room holds them (Place()'s
// credit, WorkerState::HasEmbedCredit), and no KV capacity check. The lane is cut by position
// into blocks of about sqrt(N) workers, each kept sorted by room with the least loaded of every
// prefix of that order, so that each policy chooses exactly what Place() chooses (power_of_two
// included: the same two draws among the candidates by position) in O(sqrt(N) log N) at worst
// for any `inputs`; an update of an embedding worker is O(sqrt(N)).
//
// Thread-compatible: owned by the router's event loop.
#ifndef CARPOOL_ROUTER_PLACEMENT_INDEX_H_
#define CARPOOL_ROUTER_PLACEMENT_INDEX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "router/placement.h"

namespace carpool::router {

struct WorkerState;

class PlacementIndex {
 public:
  // What a placement asks, as PlacementInput, and which credit it takes.
  struct Query {
    bool batch_job = false;  // WorkerState::credit(batch_job)
    int64_t request_tokens = 0;
    uint64_t cursor = 0;
    uint64_t random = 0;
    double affinity_load_weight = 1.0;
  };
  // A worker's cached tokens of the request's prompt (prefix_affinity).
  struct Cached {
    int position = 0;
    int64_t tokens = 0;
  };

  // The model's workers, ordered by identity; not owned, they outlive the index.
  explicit PlacementIndex(std::vector<WorkerState*> workers);
  PlacementIndex(const PlacementIndex&) = delete;
  PlacementIndex& operator=(const PlacementIndex&) = delete;

  const std::vector<WorkerState*>& workers() const { return workers_; }
  // The position of the worker of this identity; -1 when it is none of these.
  int PositionOf(const std::string& identity) const;
  // The distinct block sizes of the workers (prefix_affinity hashes a prompt for each).
  const std::vector<int>& block_sizes() const { return block_sizes_; }

  // Reads the worker at `position` again.
  void Update(int position);
  // Reads every worker again; returns how many had changed since their last Update (0 when no
  // change was missed).
  int Resync();

  // Place()'s candidate rule for the worker at `position`, from the state last read.
  bool IsCandidate(int position, const Query& q) const;
  int64_t outstanding(int position) const { return slots_[position].load; }

  std::optional<int> RoundRobin(const Query& q) const;
  std::optional<int> LeastLoaded(const Query& q) const;
  std::optional<int> PowerOfTwo(const Query& q) const;
  // prefix_affinity when `cached` holds every worker with a cached prefix (any others hold
  // none); positions may repeat and non-candidates are skipped.
  std::optional<int> PrefixAffinity(const Query& q, absl::Span<const Cached> cached) const;
  // prefix_affinity by a walk over the candidates from the least loaded: cached(position) gives
  // a worker's cached tokens, none of which exceeds `max_cached`. The walk stops where even
  // `max_cached` no longer beats the best so far, so it visits the workers whose load is within
  // max_cached / weight of the best.
  template <typename CachedOf>
  std::optional<int> PrefixAffinityByLoad(const Query& q, int64_t max_cached,
                                          CachedOf&& cached) const;

  // The workers that can take a request of either credit, by load (tests).
  int members(bool batch_job) const { return static_cast<int>(lanes_[batch_job].members.size()); }

  // Embed placement, for a request of `inputs` inputs: what Place() chooses over
  // EmbedKind::Place's snapshots. O(1): the model's workers that embed at all (draining or
  // not), and the largest embed_queue_size among them (both fixed until the index is rebuilt).
  int embedders() const { return embedders_; }
  int largest_embed_queue() const { return largest_embed_queue_; }
  // HasEmbedCredit(inputs) of the worker at `position`, from the state last read.
  bool IsEmbedCandidate(int position, int64_t inputs) const;
  std::optional<int> EmbedLeastLoaded(int64_t inputs) const;
  std::optional<int> EmbedRoundRobin(int64_t inputs, uint64_t cursor) const;
  std::optional<int> EmbedPowerOfTwo(int64_t inputs, uint64_t random) const;
  // The workers serving with embed_queue_size > 0 (tests).
  int embed_members() const { return embed_members_; }

 private:
  // The workers with credit of one kind (interactive: credit(false) > 0; batch: credit(true) > 0),
  // serving.
  struct Lane {
    absl::btree_set<std::pair<int64_t, int>> by_load;  // (outstanding tokens, position)
    absl::btree_set<int> positions;
    std::vector<int> members;  // for random draws; a slot's member_at is its place here
  };
  struct Slot {
    bool in[2] = {false, false};
    int member_at[2] = {-1, -1};
    int64_t load = 0;
    int64_t capacity = 0;  // tokens; 0: unknown
    bool embeds = false;     // serving with embed_queue_size > 0
    int64_t embed_room = 0;  // embed_queue_size - embed_inputs
  };
  // The embed lane's members among positions [first, first + size), by room (most first).
  struct EmbedBlock {
    int first = 0;
    int size = 0;
    std::vector<int> by_room;  // positions
    std::vector<int> least;    // least[i]: the least loaded (then lowest) of by_room[0..i]
  };

  void Enter(Lane& lane, int lane_index, int position, int64_t load);
  void Leave(Lane& lane, int lane_index, int position);
  // Whether no later worker of a walk by load from `load` up can be a candidate.
  bool PastCapacity(int64_t load, int64_t request_tokens) const;
  // prefix_affinity's order: whether (score, position) beats the best so far.
  bool Better(double score, int position, std::optional<int> best, double best_score) const;
  // Whether the worker at `a` is less loaded than at `b`, or as loaded and lower.
  bool LessLoaded(int a, int b) const;
  // Reads the embed fields of the worker at `position` again (its slot's load already read;
  // `old_load` the one before).
  void UpdateEmbed(int position, int64_t old_load);
  // The block's members with room for `inputs`: a prefix of by_room, this long.
  int EmbedCandidates(const EmbedBlock& b, int64_t inputs) const;
  // The block's candidate of lowest position at or after `from`; -1: none.
  int FirstEmbedCandidate(const EmbedBlock& b, int from, int64_t inputs) const;
  // The k-th (from 0) candidate by position; counts[i]: EmbedCandidates of block i.
  int KthEmbedCandidate(int64_t k, int64_t inputs, absl::Span<const int> counts) const;

  std::vector<WorkerState*> workers_;
  absl::flat_hash_map<std::string, int> positions_;
  std::vector<int> block_sizes_;
  std::vector<Slot> slots_;
  Lane lanes_[2];
  int64_t max_capacity_ = 0;   // the largest capacity of the model's workers
  bool any_unknown_ = false;   // whether one has no capacity (takes anything)
  std::vector<EmbedBlock> embed_blocks_;  // every position in one, in order
  int embed_block_size_ = 1;
  int embed_members_ = 0;
  int embedders_ = 0;
  int largest_embed_queue_ = 0;
};

template <typename CachedOf>
std::optional<int> PlacementIndex::PrefixAffinityByLoad(const Query& q, int64_t max_cached,
                                                        CachedOf&& cached) const {
  std::optional<int> best;
  double best_score = 0;
  for (const auto& [load, position] : lanes_[q.batch_job].by_load) {
    if (PastCapacity(load, q.request_tokens)) break;
    // Every later worker has at least this load: at most this score, and it loses a tie.
    if (best && PrefixAffinityScore(max_cached, load, q.affinity_load_weight) <= best_score) break;
    if (!IsCandidate(position, q)) continue;
    const double score = PrefixAffinityScore(cached(position), load, q.affinity_load_weight);
    if (Better(score, position, best, best_score)) {
      best = position;
      best_score = score;
    }
  }
  return best;
}

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_PLACEMENT_INDEX_H_
