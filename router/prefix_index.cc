#include "router/prefix_index.h"

namespace carpool::router {

void PrefixIndex::Apply(const std::string& worker, const KvEventsInfo& events,
                        int64_t max_hashes) {
  absl::flat_hash_set<uint64_t>& held = by_worker_[worker];
  if (events.reset) held.clear();
  for (uint64_t h : events.removed) held.erase(h);
  for (uint64_t h : events.stored) {
    if (static_cast<int64_t>(held.size()) >= max_hashes) break;
    held.insert(h);
  }
}

void PrefixIndex::RemoveWorker(const std::string& worker) { by_worker_.erase(worker); }

int PrefixIndex::MatchedBlocks(const std::string& worker, absl::Span<const uint64_t> chain) const {
  auto it = by_worker_.find(worker);
  if (it == by_worker_.end()) return 0;
  int n = 0;
  while (n < static_cast<int>(chain.size()) && it->second.contains(chain[n])) ++n;
  return n;
}

int PrefixIndex::Size(const std::string& worker) const {
  auto it = by_worker_.find(worker);
  return it == by_worker_.end() ? 0 : static_cast<int>(it->second.size());
}

}  // namespace carpool::router
