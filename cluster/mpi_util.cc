#include "cluster/mpi_util.h"

#include <sched.h>
#include <time.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace carpool::cluster {
namespace {

// Spin first (a peer a few microseconds behind costs nothing), then yield the core between polls
// (a rank sharing its core with the peer it waits for lets that peer run at once), then sleep
// with a growing pause (an idle follower waiting for the next step costs almost no CPU).
constexpr absl::Duration kSpinFor = absl::Microseconds(20);
constexpr absl::Duration kYieldFor = absl::Milliseconds(2);
constexpr int64_t kMinSleepNanos = 20'000;
constexpr int64_t kMaxSleepNanos = 1'000'000;

}  // namespace

absl::Status MpiStatus(int rc, absl::string_view what) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  return absl::UnavailableError(
      absl::StrCat(what, ": ", length > 0 ? absl::string_view(text, length) : "MPI error ", rc));
}

absl::Status WaitRequest(MPI_Request* request, absl::Time deadline, absl::string_view what) {
  int64_t sleep_nanos = kMinSleepNanos;
  const absl::Time start = absl::Now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return MpiStatus(rc, what);
    if (done) return absl::OkStatus();
    if (polls % 64 != 63) continue;  // read the clock now and then only
    const absl::Time now = absl::Now();
    if (now - start < kSpinFor) continue;
    if (deadline != absl::InfiniteFuture() && now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": peers did not arrive in time; the group is unusable"));
    }
    if (now - start < kYieldFor) {
      sched_yield();
      continue;
    }
    const timespec pause = {0, static_cast<long>(sleep_nanos)};
    nanosleep(&pause, nullptr);
    sleep_nanos = std::min(sleep_nanos * 2, kMaxSleepNanos);
  }
}

}  // namespace carpool::cluster
