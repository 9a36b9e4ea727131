#include "router/worker_registry.h"

#include <algorithm>

namespace carpool::router {

uint64_t WorkerRegistry::Register(const std::string& identity, const RegisterInfo& info,
                                  int64_t now_micros, std::vector<uint64_t>* orphaned) {
  auto it = workers_.find(identity);
  if (it != workers_.end()) {
    for (uint64_t id : it->second.requests) orphaned->push_back(id);
    for (uint64_t id : it->second.embeds) orphaned->push_back(id);
  }
  WorkerState& w = workers_[identity];
  w = WorkerState();
  w.identity = identity;
  w.info = info;
  w.epoch = next_epoch_++;
  w.last_seen_micros = now_micros;
  return w.epoch;
}

WorkerState* WorkerRegistry::Find(const std::string& identity, uint64_t epoch) {
  WorkerState* w = Find(identity);
  return w != nullptr && w->epoch == epoch ? w : nullptr;
}

WorkerState* WorkerRegistry::Find(const std::string& identity) {
  auto it = workers_.find(identity);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<uint64_t> WorkerRegistry::Remove(const std::string& identity) {
  std::vector<uint64_t> held;
  auto it = workers_.find(identity);
  if (it == workers_.end()) return held;
  held.assign(it->second.requests.begin(), it->second.requests.end());
  held.insert(held.end(), it->second.embeds.begin(), it->second.embeds.end());
  std::sort(held.begin(), held.end());
  workers_.erase(it);
  return held;
}

std::vector<std::string> WorkerRegistry::Silent(int64_t now_micros,
                                                int64_t timeout_micros) const {
  std::vector<std::string> silent;
  for (const auto& [identity, w] : workers_) {
    if (now_micros - w.last_seen_micros > timeout_micros) silent.push_back(identity);
  }
  return silent;
}

std::vector<const WorkerState*> WorkerRegistry::All() const {
  std::vector<const WorkerState*> all;
  for (const auto& [identity, w] : workers_) all.push_back(&w);
  std::sort(all.begin(), all.end(),
            [](const WorkerState* a, const WorkerState* b) { return a->identity < b->identity; });
  return all;
}

std::vector<WorkerState*> WorkerRegistry::Mutable() {
  std::vector<WorkerState*> all;
  for (auto& [identity, w] : workers_) all.push_back(&w);
  std::sort(all.begin(), all.end(),
            [](const WorkerState* a, const WorkerState* b) { return a->identity < b->identity; });
  return all;
}

}  // namespace carpool::router
