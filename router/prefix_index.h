// Which prefix-cache blocks each worker holds, from its KV events (proto KvEventsInfo): the
// router's input to prefix_affinity placement. Hashes are common/block_hash.h chains, so the
// router computes a prompt's chain itself (PromptBlockHashes) and asks how much of it each
// worker holds.
//
// Two views of the same facts, kept in step by Apply and RemoveWorker: each worker's set of
// hashes (MatchedBlocks), and each hash's holders (ForEachHolder), so placement visits only the
// workers that hold a prompt's first block instead of every worker. Only prefix_affinity asks
// for holders: the router keeps them only under that policy (TrackHolders).
//
// Memory: a worker never holds more than the `max_hashes` Apply is given (its KV cache's size),
// so both views are bounded by the sum of the workers' caches: 9 bytes per slot of each
// worker's set and 17 per slot of the holder map (a hash and a 32-bit holder; a hash held by
// several workers adds a list of their ids), a table having between 8/7 and 16/7 slots per
// entry (MemoryBytes() counts them).
//
// Thread-compatible: owned by the router's event loop.
#ifndef CARPOOL_ROUTER_PREFIX_INDEX_H_
#define CARPOOL_ROUTER_PREFIX_INDEX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "common/block_hash.h"
#include "common/messages.h"

namespace carpool::router {

class PrefixIndex {
 public:
  // Applies a worker's events. A worker never holds more than `max_hashes` blocks (its KV
  // cache's size): stored hashes beyond that are ignored, so a faulty worker cannot grow the
  // index without bound.
  void Apply(const std::string& worker, const KvEventsInfo& events, int64_t max_hashes);
  void RemoveWorker(const std::string& worker);

  // How many leading hashes of `chain` the worker holds.
  int MatchedBlocks(const std::string& worker, absl::Span<const uint64_t> chain) const;
  int Size(const std::string& worker) const;

  // Whether it keeps each hash's holders (on when made). Turning it off frees them; on again
  // builds them from the workers' sets.
  void TrackHolders(bool on);
  bool tracks_holders() const { return track_holders_; }

  // Calls f(const std::string& worker) once for each worker holding `hash`, in no particular
  // order. REQUIRES: tracks_holders().
  template <typename F>
  void ForEachHolder(uint64_t hash, F&& f) const {
    auto it = holders_.find(hash);
    if (it == holders_.end()) return;
    if ((it->second & kMany) == 0) {
      f(names_[it->second - 1]);
      return;
    }
    for (uint32_t id : many_[it->second & ~kMany]) f(names_[id]);
  }
  // How many workers hold `hash`. REQUIRES: tracks_holders().
  int Holders(uint64_t hash) const;

  // The bytes its tables take (their capacity, not only what they hold).
  int64_t MemoryBytes() const;

 private:
  // holders_' value: the holder's id + 1 when it is the only one; else kMany | its list in many_.
  static constexpr uint32_t kMany = 0x80000000u;

  struct Worker {
    uint32_t id = 0;
    absl::flat_hash_set<uint64_t> held;
  };

  void AddHolder(uint64_t hash, uint32_t id);
  void RemoveHolder(uint64_t hash, uint32_t id);

  bool track_holders_ = true;
  absl::flat_hash_map<std::string, Worker> by_worker_;
  absl::flat_hash_map<uint64_t, uint32_t> holders_;
  std::vector<std::vector<uint32_t>> many_;  // holder ids (unordered) of hashes with several
  std::vector<uint32_t> free_many_;          // unused entries of many_
  std::vector<std::string> names_;           // by id ("" when free)
  std::vector<uint32_t> free_ids_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_PREFIX_INDEX_H_
