// How the ranks of an MPI job divide into carpool's router and tensor-parallel worker groups. A
// pure function of what every rank said about itself, so every rank computes the same answer.
#ifndef CARPOOL_CLUSTER_JOB_LAYOUT_H_
#define CARPOOL_CLUSTER_JOB_LAYOUT_H_

#include <vector>

#include "absl/status/statusor.h"

namespace carpool::cluster {

enum class Role { kRouter, kWorker };

// What one rank says about itself.
struct RankInfo {
  Role role = Role::kWorker;
  int tensor_parallel = 1;  // workers
  int node = 0;             // any id shared by exactly the ranks of one node
};

struct JobLayout {
  int router_rank = -1;          // world rank of the router; -1 without one
  std::vector<int> worker_ranks;  // world ranks of the workers, ascending
  int tp_size = 1;
  // Worker group g is worker_ranks[g * tp_size, (g + 1) * tp_size): consecutive ranks.
  int num_groups() const { return static_cast<int>(worker_ranks.size()) / tp_size; }
  // World ranks of group g.
  std::vector<int> Group(int g) const;
};

// INVALID_ARGUMENT naming the ranks: more than one router, workers that disagree on
// tensor_parallel, tensor_parallel < 1, or a worker count tensor_parallel does not divide.
absl::StatusOr<JobLayout> PlanJobLayout(const std::vector<RankInfo>& ranks);

}  // namespace carpool::cluster

#endif  // CARPOOL_CLUSTER_JOB_LAYOUT_H_
