// Collective operations over one tensor-parallel group: the interface the model shards talk
// through, with an MPI implementation (cluster/mpi_communicator.h, host memory) and an NCCL one
// (cluster/nccl_communicator.h, device memory). DeviceCommunicator (below) is the NCCL one's
// stream-ordered face, which the model's collectives on a GPU's buffers use.
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

// The element type of a device collective's buffers.
enum class DeviceElementType { kF32, kBF16, kF16 };

// Collectives on device buffers (CUDA device pointers), enqueued on a stream the caller passes
// (a cudaStream_t, as void* so that this header needs no CUDA): they run in order with the
// caller's kernels on that stream, and a CUDA graph captured on it records them. The same rules
// as Communicator: every rank of the group the same operations, in the same order, with the
// same counts and types. An enqueue returns once the operation is queued; a peer that never
// arrives or an asynchronous error shows in WaitStream, which then leaves the group unusable.
// bf16 and fp16 are summed in their own type, as NCCL sums them.
//
// Thread-compatible: one thread drives a DeviceCommunicator.
class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] = sum over ranks of data[i], in place: `count` elements of `type` on every rank.
  virtual absl::Status AllReduceSumOnStream(void* data, int64_t count, DeviceElementType type,
                                            void* stream) = 0;
  // recv[r * count + i] = send[i] of rank r, on every rank: recv holds size() * count elements
  // and may not alias send.
  virtual absl::Status AllGatherOnStream(const void* send, int64_t count, DeviceElementType type,
                                         void* recv, void* stream) = 0;
  // Waits, at most the group's timeout, until everything enqueued on `stream` so far is done.
  // DEADLINE_EXCEEDED (a peer did not arrive) or UNAVAILABLE (a CUDA or NCCL error); the group
  // is unusable after either.
  virtual absl::Status WaitStream(void* stream) = 0;
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
