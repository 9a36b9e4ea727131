#include "router/prefix_index.h"

#include <algorithm>

namespace carpool::router {

void PrefixIndex::Apply(const std::string& worker, const KvEventsInfo& events,
                        int64_t max_hashes) {
  auto [it, inserted] = by_worker_.try_emplace(worker);
  Worker& w = it->second;
  if (inserted) {
    if (!free_ids_.empty()) {
      w.id = free_ids_.back();
      free_ids_.pop_back();
      names_[w.id] = worker;
    } else {
      w.id = static_cast<uint32_t>(names_.size());
      names_.push_back(worker);
    }
  }
  if (events.reset) {
    if (track_holders_) {
      for (uint64_t h : w.held) RemoveHolder(h, w.id);
    }
    w.held.clear();
  }
  for (uint64_t h : events.removed) {
    if (w.held.erase(h) > 0) RemoveHolder(h, w.id);
  }
  for (uint64_t h : events.stored) {
    if (static_cast<int64_t>(w.held.size()) >= max_hashes) break;
    if (w.held.insert(h).second) AddHolder(h, w.id);
  }
}

void PrefixIndex::RemoveWorker(const std::string& worker) {
  auto it = by_worker_.find(worker);
  if (it == by_worker_.end()) return;
  const uint32_t id = it->second.id;
  if (track_holders_) {
    for (uint64_t h : it->second.held) RemoveHolder(h, id);
  }
  names_[id].clear();
  free_ids_.push_back(id);
  by_worker_.erase(it);
}

void PrefixIndex::TrackHolders(bool on) {
  if (on == track_holders_) return;
  track_holders_ = on;
  absl::flat_hash_map<uint64_t, uint32_t>().swap(holders_);
  std::vector<std::vector<uint32_t>>().swap(many_);
  free_many_.clear();
  if (!on) return;
  for (const auto& [name, w] : by_worker_) {
    for (uint64_t h : w.held) AddHolder(h, w.id);
  }
}

void PrefixIndex::AddHolder(uint64_t hash, uint32_t id) {
  if (!track_holders_) return;
  auto [it, inserted] = holders_.try_emplace(hash, id + 1);
  if (inserted) return;
  if ((it->second & kMany) != 0) {
    many_[it->second & ~kMany].push_back(id);
    return;
  }
  uint32_t list = 0;
  if (!free_many_.empty()) {
    list = free_many_.back();
    free_many_.pop_back();
  } else {
    list = static_cast<uint32_t>(many_.size());
    many_.emplace_back();
  }
  many_[list] = {it->second - 1, id};
  it->second = kMany | list;
}

void PrefixIndex::RemoveHolder(uint64_t hash, uint32_t id) {
  if (!track_holders_) return;
  auto it = holders_.find(hash);
  if (it == holders_.end()) return;
  if ((it->second & kMany) == 0) {
    if (it->second == id + 1) holders_.erase(it);
    return;
  }
  const uint32_t list = it->second & ~kMany;
  std::vector<uint32_t>& ids = many_[list];
  auto pos = std::find(ids.begin(), ids.end(), id);
  if (pos == ids.end()) return;
  *pos = ids.back();
  ids.pop_back();
  if (ids.size() == 1) {
    it->second = ids[0] + 1;
    std::vector<uint32_t>().swap(ids);
    free_many_.push_back(list);
  }
}

int PrefixIndex::MatchedBlocks(const std::string& worker, absl::Span<const uint64_t> chain) const {
  auto it = by_worker_.find(worker);
  if (it == by_worker_.end()) return 0;
  int n = 0;
  while (n < static_cast<int>(chain.size()) && it->second.held.contains(chain[n])) ++n;
  return n;
}

int PrefixIndex::Size(const std::string& worker) const {
  auto it = by_worker_.find(worker);
  return it == by_worker_.end() ? 0 : static_cast<int>(it->second.held.size());
}

int PrefixIndex::Holders(uint64_t hash) const {
  auto it = holders_.find(hash);
  if (it == holders_.end()) return 0;
  if ((it->second & kMany) == 0) return 1;
  return static_cast<int>(many_[it->second & ~kMany].size());
}

int64_t PrefixIndex::MemoryBytes() const {
  // A flat table's slots plus one control byte per slot; the map's entries are padded to 16.
  int64_t bytes = static_cast<int64_t>(by_worker_.capacity()) *
                  static_cast<int64_t>(sizeof(std::pair<const std::string, Worker>) + 1);
  for (const auto& [name, w] : by_worker_) {
    bytes += static_cast<int64_t>(w.held.capacity()) * static_cast<int64_t>(sizeof(uint64_t) + 1);
    bytes += static_cast<int64_t>(name.capacity());
  }
  bytes += static_cast<int64_t>(holders_.capacity()) *
           static_cast<int64_t>(sizeof(std::pair<const uint64_t, uint32_t>) + 1);
  bytes += static_cast<int64_t>(many_.capacity() * sizeof(std::vector<uint32_t>));
  for (const std::vector<uint32_t>& ids : many_) {
    bytes += static_cast<int64_t>(ids.capacity() * sizeof(uint32_t));
  }
  bytes += static_cast<int64_t>(names_.capacity() * sizeof(std::string));
  return bytes;
}

}  // namespace carpool::router
