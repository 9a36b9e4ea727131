#include "worker/gpu_list.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace carpool::worker {

absl::StatusOr<std::vector<int>> ParseGpuList(absl::string_view text) {
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(
        "--gpus wants comma-separated device ordinals, one per rank (e.g. 2,3), got none");
  }
  std::vector<int> gpus;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int gpu;
    if (!absl::SimpleAtoi(entry, &gpu)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus ", text, ": '", entry, "' is not a device ordinal (an integer >= 0)"));
    }
    if (gpu < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus ", text, ": device ordinal ", gpu, " must be >= 0"));
    }
    if (std::find(gpus.begin(), gpus.end(), gpu) != gpus.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus ", text, ": device ordinal ", gpu,
                                                     " is listed twice (one GPU per rank)"));
    }
    gpus.push_back(gpu);
  }
  return gpus;
}

absl::StatusOr<int> GpuForLocalRank(absl::Span<const int> gpus, int group_size, int local_rank) {
  const std::string list = absl::StrJoin(gpus, ",");
  if (static_cast<int>(gpus.size()) != group_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus ", list, " lists ", gpus.size(), " GPU", gpus.size() == 1 ? "" : "s",
                     " for --tp ", group_size, ": it wants one per rank of the group"));
  }
  if (local_rank < 0) {
    if (group_size == 1) return gpus[0];
    return absl::FailedPreconditionError(absl::StrCat(
        "--gpus ", list,
        ": no local rank to choose an entry by (OMPI_COMM_WORLD_LOCAL_RANK, "
        "SLURM_LOCALID, MPI_LOCALRANKID or MV2_COMM_WORLD_LOCAL_RANK); start the group with "
        "mpirun"));
  }
  if (local_rank >= group_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--gpus ", list, ": local rank ", local_rank,
        " has no entry; --gpus is for a group that "
        "is its own mpirun job on one host (cluster/launch/plan.py); in a job of several groups "
        "leave it out (each rank takes its local rank's GPU)"));
  }
  return gpus[local_rank];
}

std::optional<std::string> VisibleDeviceName(int ordinal, const char* cuda_visible_devices) {
  if (ordinal < 0) return std::nullopt;
  if (cuda_visible_devices == nullptr) return absl::StrCat(ordinal);
  // CUDA reads the list up to its first invalid entry; an empty one (or an empty value) ends it.
  int index = 0;
  for (absl::string_view entry : absl::StrSplit(cuda_visible_devices, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) break;
    if (index++ == ordinal) return std::string(entry);
  }
  return std::nullopt;
}

}  // namespace carpool::worker
