#include "cluster/group_heartbeat.h"

#include "absl/strings/str_cat.h"
#include "cluster/mpi_util.h"
#include "common/status.h"

namespace carpool::cluster {
namespace {

constexpr int kTag = 7101;
constexpr int kBeat = 1;
constexpr int kLeave = 2;
// Sent with MPI_Isend + MPI_Request_free: the buffers must outlive the sends.
const int kMessages[3] = {0, kBeat, kLeave};

}  // namespace

absl::Status GroupHeartbeatOptions::Validate() const {
  if (interval <= absl::ZeroDuration() || timeout <= interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor-parallel heartbeats need 0 < interval < timeout, got interval ",
        absl::FormatDuration(interval), ", timeout ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GroupHeartbeat>> GroupHeartbeat::Create(
    MPI_Comm group, const GroupHeartbeatOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  MPI_Comm comm = MPI_COMM_NULL;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(group, &comm), "MPI_Comm_dup"));
  int rank = 0, size = 0;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank"));
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(comm, &size), "MPI_Comm_size"));
  std::unique_ptr<GroupHeartbeat> beats(new GroupHeartbeat(comm, rank, size, options));
  for (Peer& peer : beats->peers_) RETURN_IF_ERROR(beats->Post(&peer));
  return beats;
}

GroupHeartbeat::GroupHeartbeat(MPI_Comm comm, int rank, int size,
                               const GroupHeartbeatOptions& options)
    : comm_(comm), rank_(rank), size_(size), options_(options) {
  const absl::Time now = absl::Now();
  if (rank == 0) {
    for (int r = 1; r < size; ++r) peers_.push_back(Peer{.rank = r, .last_seen = now});
  } else {
    peers_.push_back(Peer{.rank = 0, .last_seen = now});
  }
  next_send_ = now;
}

GroupHeartbeat::~GroupHeartbeat() {
  left_ = true;
  CancelReceives();
}

absl::Status GroupHeartbeat::Post(Peer* peer) {
  return MpiStatus(MPI_Irecv(&peer->message, 1, MPI_INT, peer->rank, kTag, comm_, &peer->recv),
                   "MPI_Irecv(heartbeat)");
}

absl::Status GroupHeartbeat::Send(int message) {
  for (const Peer& peer : peers_) {
    if (peer.left) continue;
    MPI_Request request;
    RETURN_IF_ERROR(MpiStatus(
        MPI_Isend(&kMessages[message], 1, MPI_INT, peer.rank, kTag, comm_, &request),
        "MPI_Isend(heartbeat)"));
    RETURN_IF_ERROR(MpiStatus(MPI_Request_free(&request), "MPI_Request_free"));
  }
  return absl::OkStatus();
}

absl::Status GroupHeartbeat::Poll() {
  if (left_) return absl::OkStatus();
  if (broken_) return absl::FailedPreconditionError("heartbeat already failed");
  absl::Status status = [&]() -> absl::Status {
    for (Peer& peer : peers_) {
      // Every message that arrived since the last poll.
      while (!peer.left && peer.recv != MPI_REQUEST_NULL) {
        int done = 0;
        RETURN_IF_ERROR(MpiStatus(MPI_Test(&peer.recv, &done, MPI_STATUS_IGNORE), "MPI_Test"));
        if (!done) break;
        if (peer.message == kLeave) {
          peer.left = true;
          break;
        }
        peer.last_seen = absl::Now();
        RETURN_IF_ERROR(Post(&peer));
      }
    }
    const absl::Time now = absl::Now();
    if (now >= next_send_) {
      RETURN_IF_ERROR(Send(kBeat));
      next_send_ = now + options_.interval;
    }
    for (const Peer& peer : peers_) {
      if (!peer.left && now - peer.last_seen > options_.timeout) {
        return absl::UnavailableError(absl::StrCat(
            "tensor-parallel rank ", peer.rank, " has been silent for ",
            absl::FormatDuration(absl::Trunc(now - peer.last_seen, absl::Milliseconds(1))),
            " (timeout ", absl::FormatDuration(options_.timeout), ")"));
      }
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) broken_ = true;
  return status;
}

void GroupHeartbeat::Leave() {
  if (left_) return;
  left_ = true;
  if (!broken_) (void)Send(kLeave);
  CancelReceives();
}

void GroupHeartbeat::CancelReceives() {
  for (Peer& peer : peers_) {
    if (peer.recv == MPI_REQUEST_NULL) continue;
    // A cancelled receive completes at once; one that matched a message completes too.
    MPI_Cancel(&peer.recv);
    MPI_Wait(&peer.recv, MPI_STATUS_IGNORE);
  }
}

}  // namespace carpool::cluster
