#include "router/prefix_index.h"

#include "worker/kv_cache/kv_cache_manager.h"

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

std::vector<uint64_t> PromptBlockHashes(absl::Span<const int32_t> prompt, int block_size,
                                        uint64_t salt) {
  std::vector<uint64_t> chain;
  if (block_size <= 0 || prompt.empty()) return chain;
  const size_t blocks = (prompt.size() - 1) / block_size;
  uint64_t parent = worker::kRootBlockHash;
  for (size_t b = 0; b < blocks; ++b) {
    parent = worker::BlockHash(parent, prompt.subspan(b * block_size, block_size), salt);
    chain.push_back(parent);
  }
  return chain;
}

}  // namespace carpool::router
