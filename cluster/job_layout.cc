#include "cluster/job_layout.h"

#include "absl/strings/str_cat.h"

namespace carpool::cluster {

std::vector<int> JobLayout::Group(int g) const {
  return std::vector<int>(worker_ranks.begin() + g * tp_size,
                          worker_ranks.begin() + (g + 1) * tp_size);
}

absl::StatusOr<JobLayout> PlanJobLayout(const std::vector<RankInfo>& ranks) {
  JobLayout layout;
  int first_worker = -1;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const RankInfo& info = ranks[r];
    if (info.role == Role::kRouter) {
      if (layout.router_rank >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("world ranks ", layout.router_rank, " and ", r,
                         " are both carpool-router; an MPI job holds at most one router"));
      }
      layout.router_rank = r;
      continue;
    }
    if (info.tensor_parallel < 1) {
      return absl::InvalidArgumentError(absl::StrCat("world rank ", r, " has --tp ",
                                                     info.tensor_parallel, "; it must be >= 1"));
    }
    if (first_worker < 0) {
      first_worker = r;
      layout.tp_size = info.tensor_parallel;
    } else if (info.tensor_parallel != layout.tp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("workers disagree on --tp: world rank ", first_worker, " has ",
                       layout.tp_size, ", world rank ", r, " has ", info.tensor_parallel));
    }
    layout.worker_ranks.push_back(r);
  }
  const int workers = static_cast<int>(layout.worker_ranks.size());
  if (workers % layout.tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", layout.tp_size, " does not divide the job's ", workers,
        " worker ranks (a tensor-parallel group is --tp consecutive worker ranks)"));
  }
  return layout;
}

}  // namespace carpool::cluster
