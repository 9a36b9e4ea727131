// Collective operations over one tensor-parallel group: the interface the model shards talk
// through, with an MPI implementation (cluster/mpi_communicator.h, host memory) and an NCCL one
// (cluster/nccl_communicator.h, device memory).
//
// Every rank of the group calls the same operations in the same order with the same counts.
// An operation that fails (a peer died, the transport broke, the timeout passed) leaves the
// group unusable: its peers may be stuck in a collective this rank abandoned. Callers treat any
// error as the end of the group (see FailGroup).
//
// Thread-compatible: one thread drives a Communicator.
#ifndef CARPOOL_CLUSTER_COMMUNICATOR_H_
#define CARPOOL_CLUSTER_COMMUNICATOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace carpool::cluster {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] = sum over ranks of data[i], in place. `count` floats on every rank.
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
  // recv[r * count + i] = send[i] of rank r, on every rank. recv holds size() * count floats and
  // may not alias send.
  virtual absl::Status AllGather(const float* send, int64_t count, float* recv) = 0;
  // Like AllGather, but only `root` receives; recv is ignored (and may be null) elsewhere.
  virtual absl::Status Gather(const float* send, int64_t count, float* recv, int root) = 0;
  // `bytes` bytes at `data` from `root` to every rank. Waits at most `timeout`
  // (absl::InfiniteDuration(): for as long as it takes, e.g. a follower waiting for the next step).
  virtual absl::Status Broadcast(void* data, int64_t bytes, int root, absl::Duration timeout) = 0;
  virtual absl::Status Barrier() = 0;

  // The limit every operation but a Broadcast with its own timeout waits for its peers.
  virtual absl::Duration timeout() const = 0;
};

// Exit code of a process whose tensor-parallel group broke.
inline constexpr int kGroupFailedExitCode = 75;

// Ends the process at once: logs "carpool: tensor-parallel group failed: <status>" to stderr and
// _exits with kGroupFailedExitCode, without running destructors or MPI_Finalize (its peers may
// never arrive). The fail-fast policy of every carpool process that serves a group: a rank that
// cannot finish a step must disappear, so that its router sees one dead worker instead of a hung
// one.
[[noreturn]] void FailGroup(const absl::Status& status);

}  // namespace carpool::cluster

#endif  // CARPOOL_CLUSTER_COMMUNICATOR_H_
