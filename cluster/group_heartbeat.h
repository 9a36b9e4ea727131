// Liveness inside one tensor-parallel group, independent of the work: the leader (rank 0) and
// every follower send each other a small message every `interval` over their own communicator.
// A peer silent for `timeout` is dead, even where MPI itself would wait forever (a peer killed
// inside a shared-memory collective, a stopped process, a runtime that keeps the job going).
// Peers on the same node are also watched by process id: one that exited is dead at the next
// Poll, without waiting for the timeout (mpirun itself only signals the survivors a second
// after a rank died).
//
//   ASSIGN_OR_RETURN(auto beats, GroupHeartbeat::Create(job->tp_comm(), {}));
//   while (running) { if (auto s = beats->Poll(); !s.ok()) FailGroup(s); sleep(interval / 2); }
//   beats->Leave();
//
// Star topology: followers watch the leader, the leader watches every follower; a follower's
// death reaches the other followers through the leader's exit. Thread-compatible: one thread
// polls (concurrently with other threads' MPI calls on other communicators).
#ifndef CARPOOL_CLUSTER_GROUP_HEARTBEAT_H_
#define CARPOOL_CLUSTER_GROUP_HEARTBEAT_H_

#include <mpi.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace carpool::cluster {

struct GroupHeartbeatOptions {
  // Between two beats to each peer. Default: 100 ms.
  absl::Duration interval = absl::Milliseconds(100);
  // A peer silent this long is dead. Default: 1 s.
  absl::Duration timeout = absl::Seconds(1);

  absl::Status Validate() const;
};

class GroupHeartbeat {
 public:
  // Duplicates `group` and starts listening. Collective over `group`.
  static absl::StatusOr<std::unique_ptr<GroupHeartbeat>> Create(MPI_Comm group,
                                                                const GroupHeartbeatOptions& options);
  // Stops listening without telling the peers: unless Leave() ran, they see this rank go silent
  // (as they should when it failed).
  ~GroupHeartbeat();
  GroupHeartbeat(const GroupHeartbeat&) = delete;
  GroupHeartbeat& operator=(const GroupHeartbeat&) = delete;

  // Takes the beats that arrived, sends a beat to each peer when one is due, then checks the
  // peers: UNAVAILABLE, naming the group rank and how long it has been silent, when a peer that
  // has not left has been silent longer than the timeout (or MPI reports an error). Call at
  // least every interval. After an error the heartbeat is unusable.
  absl::Status Poll();

  // Replaces the timeout from the next Poll on (e.g. a shorter one once the job is being torn
  // down, when a silent peer is almost surely dead).
  void SetTimeout(absl::Duration timeout) { options_.timeout = timeout; }

  // Tells the peers this rank leaves on purpose (they stop expecting its beats) and stops
  // listening. Idempotent.
  void Leave();

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct Peer {
    int rank = 0;
    int message = 0;                          // receive buffer
    MPI_Request recv = MPI_REQUEST_NULL;
    absl::Time last_seen;
    bool left = false;
    int pid = 0;  // on this node; 0 elsewhere
  };
  GroupHeartbeat(MPI_Comm comm, int rank, int size, const GroupHeartbeatOptions& options);
  absl::Status Post(Peer* peer);
  absl::Status Send(int message);
  void CancelReceives();

  MPI_Comm comm_;
  int rank_;
  int size_;
  GroupHeartbeatOptions options_;
  std::vector<Peer> peers_;
  absl::Time next_send_;
  bool left_ = false;
  bool broken_ = false;
};

}  // namespace carpool::cluster

#endif  // CARPOOL_CLUSTER_GROUP_HEARTBEAT_H_
