#include "cluster/group_heartbeat.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <string>

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

bool Finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// Exists and is not a zombie (a dead rank whose launcher has not reaped it yet).
bool ProcessAlive(int pid) {
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// Every group rank's pid if it runs on this node, else 0. Collective over `comm`.
absl::StatusOr<std::vector<int>> LocalPids(MPI_Comm comm, int size) {
  MPI_Comm node = MPI_COMM_NULL;
  int rank = 0;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank"));
  RETURN_IF_ERROR(MpiStatus(
      MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
      "MPI_Comm_split_type"));
  int node_id = rank;  // the group rank of the node's first rank
  RETURN_IF_ERROR(MpiStatus(MPI_Bcast(&node_id, 1, MPI_INT, 0, node), "MPI_Bcast"));
  MPI_Comm_free(&node);
  const int mine[2] = {node_id, static_cast<int>(getpid())};
  std::vector<int> all(2 * size);
  RETURN_IF_ERROR(
      MpiStatus(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm), "MPI_Allgather"));
  std::vector<int> pids(size, 0);
  for (int r = 0; r < size; ++r) {
    if (all[2 * r] == node_id) pids[r] = all[2 * r + 1];
  }
  return pids;
}

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
  ASSIGN_OR_RETURN(const std::vector<int> pids, LocalPids(comm, size));
  std::unique_ptr<GroupHeartbeat> beats(new GroupHeartbeat(comm, rank, size, options));
  for (Peer& peer : beats->peers_) {
    peer.pid = pids[peer.rank];
    RETURN_IF_ERROR(beats->Post(&peer));
  }
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
      if (!peer.left && peer.pid != 0 && !ProcessAlive(peer.pid)) {
        return absl::UnavailableError(absl::StrCat("tensor-parallel rank ", peer.rank, " (pid ",
                                                   peer.pid, ", this node) has exited"));
      }
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
  if (Finalized()) return;
  if (!broken_) (void)Send(kLeave);
  CancelReceives();
}

void GroupHeartbeat::CancelReceives() {
  if (Finalized()) return;  // MPI_Finalize has released everything
  for (Peer& peer : peers_) {
    if (peer.recv == MPI_REQUEST_NULL) continue;
    // A cancelled receive completes at once; one that matched a message completes too.
    MPI_Cancel(&peer.recv);
    MPI_Wait(&peer.recv, MPI_STATUS_IGNORE);
  }
}

}  // namespace carpool::cluster
