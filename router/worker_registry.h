// The router's view of its workers: registrations, epochs, liveness, load and the requests each
// one runs. Owned by the router's event loop; not thread-safe.
#ifndef CARPOOL_ROUTER_WORKER_REGISTRY_H_
#define CARPOOL_ROUTER_WORKER_REGISTRY_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/messages.h"
#include "router/placement_index.h"

namespace carpool::router {

// What placement reads of a worker: serving() (draining, stalled), credit() (requests,
// batch_jobs, info.max_num_seqs), outstanding_tokens, capacity_tokens() and, for embeds,
// embed_inputs. Whoever changes any of them calls WorkerRegistry::Changed before the next
// placement, which reads them through the model's PlacementIndex.
struct WorkerState {
  std::string identity;          // ZeroMQ routing id
  RegisterInfo info;
  uint64_t epoch = 0;
  int64_t last_seen_micros = 0;
  WorkerLoad load;
  absl::flat_hash_set<uint64_t> requests;  // dispatched, not finished
  // Those of `requests` that are batch jobs' generations: they run at the batch class, and the
  // worker suspends them (keeping their KV) to give their slots to more urgent sequences.
  absl::flat_hash_set<uint64_t> batch_jobs;
  int64_t outstanding_tokens = 0;          // sum over requests of tokens still to process
  int64_t requests_served = 0;
  int64_t migrations_in = 0;               // resumed requests dispatched to it
  int64_t tokens_generated = 0;            // output tokens relayed from it
  bool draining = false;
  // Embed requests dispatched and not answered (not in `requests`: they take no sequence slot)
  // and the sum of their inputs, against info.embed_queue_size.
  absl::flat_hash_set<uint64_t> embeds;
  int embed_inputs = 0;
  // Progress watchdog (router_workers.cc, CheckStalls): when it last showed progress (a step, an
  // embed answer, a failure report, or a change of its KV use) or, idle before, got work; the
  // measured time between two progress events while it held work (an average, micros); and
  // whether it is stalled: it held work and showed no progress for the stall timeout. A stalled
  // worker takes nothing until it shows progress again.
  int64_t last_progress_micros = 0;
  double step_micros = 0;
  bool stalled = false;

  bool busy() const { return !requests.empty() || !embeds.empty(); }
  // Whether it serves new work at all: not draining, not stalled.
  bool serving() const { return !draining && !stalled; }
  // Requests this worker can still take now. A batch job's request needs a slot nothing holds;
  // any other request only one that no request but a batch job's holds (the worker suspends a
  // batch job's sequence for it).
  int credit(bool batch_job = false) const {
    if (!serving()) return 0;
    const auto held = static_cast<int>(requests.size() - (batch_job ? 0 : batch_jobs.size()));
    return std::max(0, info.max_num_seqs - held);
  }
  // Its KV cache in tokens; 0: unknown.
  int64_t capacity_tokens() const {
    return int64_t{info.num_kv_blocks} * std::max(0, info.block_size);
  }
  bool can_embed() const { return info.embed_queue_size > 0 && serving(); }
  // Whether it can take an embed request of `inputs` inputs now: they fit its embed queue
  // beside the inputs it already holds.
  bool HasEmbedCredit(int inputs) const {
    return can_embed() && embed_inputs + inputs <= info.embed_queue_size;
  }

  // Set by WorkerRegistry: its model's placement index and its position there.
  PlacementIndex* placement = nullptr;
  int position = -1;
};

class WorkerRegistry {
 public:
  // Registers (or re-registers) a worker under a new epoch. A re-registration replaces the old
  // one: the requests the old registration held (embeds included) are returned in `orphaned`.
  uint64_t Register(const std::string& identity, const RegisterInfo& info, int64_t now_micros,
                    std::vector<uint64_t>* orphaned);

  // The worker with this identity whose current epoch is `epoch`; null otherwise (unknown
  // worker, or a message from an old registration).
  WorkerState* Find(const std::string& identity, uint64_t epoch);
  WorkerState* Find(const std::string& identity);

  // Removes a worker; returns the requests it held, embeds included.
  std::vector<uint64_t> Remove(const std::string& identity);

  // Identities of workers not heard from within timeout_micros.
  std::vector<std::string> Silent(int64_t now_micros, int64_t timeout_micros) const;

  // Every worker, ordered by identity: O(N log N), for the rare passes over all of them.
  std::vector<const WorkerState*> All() const;
  std::vector<WorkerState*> Mutable();
  // Every worker in no set order: O(N) without the sort, for the periodic passes whose result
  // does not depend on the order (capacity sums, gauges, the stall check's first look).
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [identity, w] : workers_) f(static_cast<const WorkerState&>(*w));
  }
  bool empty() const { return workers_.empty(); }
  // Whether any registered worker serves embeddings (embed_queue_size > 0, draining or not).
  // O(1): a count kept by Register and Remove, so an embed request's admission does not read
  // every worker.
  bool any_embedder() const { return embedders_ > 0; }

  // The placement index of `model`'s workers (PlacementIndex::workers(): ordered by identity,
  // built again only when one of them registers or leaves); null when none serves it. O(1).
  const PlacementIndex* Model(const std::string& model) const;

  // `w` (one of this registry's) changed what placement reads of it (see WorkerState): its
  // model's index reads it again. O(log N).
  void Changed(WorkerState* w);
  // Reads every worker again, as a safety net; returns how many had changed without Changed.
  int ResyncPlacement();

 private:
  // Builds `model`'s list and index again from the registered workers.
  void Rebuild(const std::string& model);

  // Owned one by one: the placement indexes keep pointers to them.
  absl::flat_hash_map<std::string, std::unique_ptr<WorkerState>> workers_;
  absl::flat_hash_map<std::string, std::unique_ptr<PlacementIndex>> models_;
  uint64_t next_epoch_ = 1;
  int embedders_ = 0;  // registered workers with embed_queue_size > 0
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_WORKER_REGISTRY_H_
