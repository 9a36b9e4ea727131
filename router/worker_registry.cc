#include "router/worker_registry.h"

#include <algorithm>

namespace carpool::router {
namespace {

bool ByIdentity(const WorkerState* a, const WorkerState* b) { return a->identity < b->identity; }

}  // namespace

uint64_t WorkerRegistry::Register(const std::string& identity, const RegisterInfo& info,
                                  int64_t now_micros, std::vector<uint64_t>* orphaned) {
  std::string old_model;
  auto it = workers_.find(identity);
  if (it != workers_.end()) {
    for (uint64_t id : it->second->requests) orphaned->push_back(id);
    for (uint64_t id : it->second->embeds) orphaned->push_back(id);
    old_model = it->second->info.model;
    if (it->second->info.embed_queue_size > 0) --embedders_;
  } else {
    it = workers_.emplace(identity, std::make_unique<WorkerState>()).first;
  }
  const bool moved = it->second->placement != nullptr && old_model != info.model;
  WorkerState& w = *it->second;
  w = WorkerState();
  w.identity = identity;
  w.info = info;
  if (info.embed_queue_size > 0) ++embedders_;
  w.epoch = next_epoch_++;
  w.last_seen_micros = now_micros;
  if (moved) Rebuild(old_model);
  Rebuild(info.model);
  return w.epoch;
}

WorkerState* WorkerRegistry::Find(const std::string& identity, uint64_t epoch) {
  WorkerState* w = Find(identity);
  return w != nullptr && w->epoch == epoch ? w : nullptr;
}

WorkerState* WorkerRegistry::Find(const std::string& identity) {
  auto it = workers_.find(identity);
  return it == workers_.end() ? nullptr : it->second.get();
}

std::vector<uint64_t> WorkerRegistry::Remove(const std::string& identity) {
  std::vector<uint64_t> held;
  auto it = workers_.find(identity);
  if (it == workers_.end()) return held;
  held.assign(it->second->requests.begin(), it->second->requests.end());
  held.insert(held.end(), it->second->embeds.begin(), it->second->embeds.end());
  std::sort(held.begin(), held.end());
  const std::string model = it->second->info.model;
  if (it->second->info.embed_queue_size > 0) --embedders_;
  workers_.erase(it);
  Rebuild(model);
  return held;
}

std::vector<std::string> WorkerRegistry::Silent(int64_t now_micros,
                                                int64_t timeout_micros) const {
  std::vector<std::string> silent;
  for (const auto& [identity, w] : workers_) {
    if (now_micros - w->last_seen_micros > timeout_micros) silent.push_back(identity);
  }
  return silent;
}

std::vector<const WorkerState*> WorkerRegistry::All() const {
  std::vector<const WorkerState*> all;
  all.reserve(workers_.size());
  for (const auto& [identity, w] : workers_) all.push_back(w.get());
  std::sort(all.begin(), all.end(), ByIdentity);
  return all;
}

std::vector<WorkerState*> WorkerRegistry::Mutable() {
  std::vector<WorkerState*> all;
  all.reserve(workers_.size());
  for (auto& [identity, w] : workers_) all.push_back(w.get());
  std::sort(all.begin(), all.end(), ByIdentity);
  return all;
}

const PlacementIndex* WorkerRegistry::Model(const std::string& model) const {
  auto it = models_.find(model);
  return it == models_.end() ? nullptr : it->second.get();
}

void WorkerRegistry::Changed(WorkerState* w) {
  if (w->placement != nullptr) w->placement->Update(w->position);
}

int WorkerRegistry::ResyncPlacement() {
  int stale = 0;
  for (auto& [model, index] : models_) stale += index->Resync();
  return stale;
}

void WorkerRegistry::Rebuild(const std::string& model) {
  std::vector<WorkerState*> workers;
  for (auto& [identity, w] : workers_) {
    if (w->info.model == model) workers.push_back(w.get());
  }
  if (workers.empty()) {
    models_.erase(model);
    return;
  }
  std::sort(workers.begin(), workers.end(), ByIdentity);
  for (size_t i = 0; i < workers.size(); ++i) workers[i]->position = static_cast<int>(i);
  std::unique_ptr<PlacementIndex>& index = models_[model];
  index = std::make_unique<PlacementIndex>(std::move(workers));
  for (WorkerState* w : index->workers()) w->placement = index.get();
}

}  // namespace carpool::router
