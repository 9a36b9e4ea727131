// Which prefix-cache blocks each worker holds, from its KV events (proto KvEvents): the
// router's input to prefix_affinity placement. Hashes are common/block_hash.h chains, so the
// router computes a prompt's chain itself (PromptBlockHashes) and asks how much of it each
// worker holds.
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

 private:
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> by_worker_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_PREFIX_INDEX_H_
