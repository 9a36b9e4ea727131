// Communicator over MPI, for host memory (the CPU model). Nonblocking collectives completed by
// polling, so no operation waits longer than its timeout.
//
//   ASSIGN_OR_RETURN(auto comm, MpiCommunicator::Create(job->tp_comm(), {}));
//   RETURN_IF_ERROR(comm->AllReduceSum(partial.data(), partial.size()));
//
// REQUIRES: MPI initialized with at least MPI_THREAD_SERIALIZED (MpiJob asks for
// MPI_THREAD_MULTIPLE) and MPI_ERRORS_RETURN on `group` (inherited from MPI_COMM_WORLD).
#ifndef CARPOOL_CLUSTER_MPI_COMMUNICATOR_H_
#define CARPOOL_CLUSTER_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <memory>

#include "absl/status/statusor.h"
#include "cluster/communicator.h"

namespace carpool::cluster {

struct MpiCommunicatorOptions {
  // How long an operation waits for its peers before it gives up (DEADLINE_EXCEEDED). A backstop:
  // a dead peer is normally noticed sooner by the group's heartbeats (cluster/group_heartbeat.h).
  // Default: 60 s.
  absl::Duration timeout = absl::Seconds(60);
};

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `group` (the communicator's traffic never mixes with anyone else's). Collective:
  // every rank of `group` calls it.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm group,
                                                                 const MpiCommunicatorOptions& options);
  // Frees the duplicate, unless an operation failed (the group is broken) or MPI is finalized.
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* send, int64_t count, float* recv) override;
  absl::Status Gather(const float* send, int64_t count, float* recv, int root) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root, absl::Duration timeout) override;
  absl::Status Barrier() override;
  absl::Duration timeout() const override { return options_.timeout; }

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size, const MpiCommunicatorOptions& options)
      : comm_(comm), rank_(rank), size_(size), options_(options) {}
  absl::Status Wait(MPI_Request* request, absl::Duration timeout, const char* what);

  MPI_Comm comm_;
  int rank_;
  int size_;
  MpiCommunicatorOptions options_;
  bool broken_ = false;  // an operation failed: the group is unusable
};

}  // namespace carpool::cluster

#endif  // CARPOOL_CLUSTER_MPI_COMMUNICATOR_H_
