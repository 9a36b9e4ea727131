// Communicator over NCCL, for device memory: every pointer passed to it is a CUDA device pointer
// on options.device. Each operation is enqueued on the communicator's own stream and waited for
// by polling, so none waits longer than the timeout; a timeout or an asynchronous NCCL error
// aborts the NCCL communicator (ncclCommAbort) and the group is unusable.
//
//   // every rank of the MPI group, device = local rank:
//   ASSIGN_OR_RETURN(auto comm, NcclCommunicator::CreateOverMpi(job->tp_comm(),
//                                                               {.device = job->local_rank()}));
//
// Built only where CUDA and NCCL are found (CARPOOL_WITH_NCCL).
#ifndef CARPOOL_CLUSTER_NCCL_COMMUNICATOR_H_
#define CARPOOL_CLUSTER_NCCL_COMMUNICATOR_H_

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/communicator.h"

namespace carpool::cluster {

struct NcclCommunicatorOptions {
  // CUDA device of this rank. Default: 0.
  int device = 0;
  // How long an operation waits for its peers. Default: 60 s.
  absl::Duration timeout = absl::Seconds(60);
};

// Also a DeviceCommunicator: its *OnStream operations enqueue on the caller's stream (the
// model's step stream), with no wait, so they can be captured in a CUDA graph; WaitStream polls
// that stream as Sync polls its own.
class NcclCommunicator : public Communicator, public DeviceCommunicator {
 public:
  // Collective over `group`: its rank 0 creates the ncclUniqueId and broadcasts it over MPI.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateOverMpi(
      MPI_Comm group, const NcclCommunicatorOptions& options);
  // One process driving one rank per device of `devices` (ncclCommInitAll). Operations of the
  // returned communicators must run concurrently, one thread per rank.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> CreateLocal(
      const std::vector<int>& devices, absl::Duration timeout);
  ~NcclCommunicator() override;

  // CUDA devices this process can use; 0 without a GPU or a driver.
  static int DeviceCount();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* send, int64_t count, float* recv) override;
  absl::Status Gather(const float* send, int64_t count, float* recv, int root) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root, absl::Duration timeout) override;
  absl::Status Barrier() override;
  absl::Duration timeout() const override { return timeout_; }

  absl::Status AllReduceSumOnStream(void* data, int64_t count, DeviceElementType type,
                                    void* stream) override;
  absl::Status AllGatherOnStream(const void* send, int64_t count, DeviceElementType type,
                                 void* recv, void* stream) override;
  absl::Status WaitStream(void* stream) override;

 private:
  struct Handles;
  NcclCommunicator(std::unique_ptr<Handles> handles, int rank, int size, int device,
                   absl::Duration timeout);
  // Waits for `stream` (the communicator's own when null); aborts the communicator on timeout
  // or an asynchronous error.
  absl::Status Sync(absl::Duration timeout, const char* what, void* stream = nullptr);

  std::unique_ptr<Handles> handles_;  // ncclComm_t, cudaStream_t, scratch
  int rank_;
  int size_;
  int device_;
  absl::Duration timeout_;
  bool broken_ = false;
};

}  // namespace carpool::cluster

#endif  // CARPOOL_CLUSTER_NCCL_COMMUNICATOR_H_
