// A tensor-parallel group's GPUs as ordinals into the devices its ranks already see: the
// carpool-worker flag --gpus, which cluster/launch/plan.py writes for a group of --tp > 1.
//
//   ASSIGN_OR_RETURN(std::vector<int> gpus, ParseGpuList("2,3"));           // --gpus 2,3
//   ASSIGN_OR_RETURN(int gpu, GpuForLocalRank(gpus, /*group_size=*/2, local_rank));
//   // gpu is the rank's --gpu: local rank 0 takes ordinal 2, local rank 1 ordinal 3
//
// An ordinal k is the k-th device CUDA enumerates for the process: the k-th entry of
// CUDA_VISIBLE_DEVICES where that is set (Slurm sets it to the job's GPUs on a node shared
// between jobs without device cgroups, e.g. 4,5,6,7), else the node's device k. The launchers
// pass ordinals and leave CUDA_VISIBLE_DEVICES as they found it, so a group stays on its job's
// GPUs wherever the job's list starts. VisibleDeviceName says which device an ordinal is, for the
// worker's log.
#ifndef CARPOOL_WORKER_GPU_LIST_H_
#define CARPOOL_WORKER_GPU_LIST_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace carpool::worker {

// "2,3" -> {2, 3}: comma-separated device ordinals, each >= 0, none twice (two ranks of a group
// on one GPU is what NCCL refuses). INVALID_ARGUMENT naming --gpus and the bad entry otherwise
// (empty list or entry, not an integer, negative, repeated).
absl::StatusOr<std::vector<int>> ParseGpuList(absl::string_view text);

// The device ordinal of the rank with `local_rank` (its rank on its node, -1 when no launcher
// said) in a group of `group_size` ranks listed by `gpus`: gpus[local_rank]. The group must be its
// own launcher job on one host (what plan.py plans), so its local ranks are 0..group_size-1.
// INVALID_ARGUMENT when gpus does not hold exactly one entry per rank; FAILED_PRECONDITION when
// the local rank has no entry (unknown in a group of more than one rank, or past the list: the
// job holds more than this group on the node). A one-rank group with no local rank takes gpus[0].
absl::StatusOr<int> GpuForLocalRank(absl::Span<const int> gpus, int group_size, int local_rank);

// The device that ordinal `ordinal` (>= 0) is, as the node names it: with
// `cuda_visible_devices` (the variable's value, nullptr when unset) the ordinal-th entry of
// that comma-separated list, as written (an index, a GPU-UUID or a MIG name); unset, the ordinal
// itself. nullopt when the list has no such entry before its end or its first empty entry
// (CUDA then shows fewer devices).
std::optional<std::string> VisibleDeviceName(int ordinal, const char* cuda_visible_devices);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_GPU_LIST_H_
