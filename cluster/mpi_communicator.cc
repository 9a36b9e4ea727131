#include "cluster/mpi_communicator.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "cluster/mpi_util.h"
#include "common/status.h"

namespace carpool::cluster {
namespace {

absl::Status CheckCount(int64_t count, const char* what) {
  if (count < 0 || count > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": count ", count, " is outside [0, ", INT_MAX, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    MPI_Comm group, const MpiCommunicatorOptions& options) {
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("MpiCommunicator: timeout must be positive");
  }
  MPI_Comm comm = MPI_COMM_NULL;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(group, &comm), "MPI_Comm_dup"));
  int rank = 0, size = 0;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank"));
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(comm, &size), "MPI_Comm_size"));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(comm, rank, size, options));
}

MpiCommunicator::~MpiCommunicator() {
  // Freeing a communicator with abandoned operations could wait for peers that never come;
  // after MPI_Finalize nothing may be freed (and nothing needs to be).
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!broken_ && !finalized) MPI_Comm_free(&comm_);
}

absl::Status MpiCommunicator::Wait(MPI_Request* request, absl::Duration timeout,
                                   const char* what) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  absl::Status s = WaitRequest(request, deadline, what);
  if (!s.ok()) broken_ = true;
  return s;
}

absl::Status MpiCommunicator::AllReduceSum(float* data, int64_t count) {
  RETURN_IF_ERROR(CheckCount(count, "AllReduceSum"));
  if (size_ == 1 || count == 0) return absl::OkStatus();
  MPI_Request request;
  RETURN_IF_ERROR(MpiStatus(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT,
                                           MPI_SUM, comm_, &request),
                            "MPI_Iallreduce"));
  return Wait(&request, options_.timeout, "AllReduceSum");
}

absl::Status MpiCommunicator::AllGather(const float* send, int64_t count, float* recv) {
  RETURN_IF_ERROR(CheckCount(count, "AllGather"));
  MPI_Request request;
  RETURN_IF_ERROR(MpiStatus(MPI_Iallgather(send, static_cast<int>(count), MPI_FLOAT, recv,
                                           static_cast<int>(count), MPI_FLOAT, comm_, &request),
                            "MPI_Iallgather"));
  return Wait(&request, options_.timeout, "AllGather");
}

absl::Status MpiCommunicator::Gather(const float* send, int64_t count, float* recv, int root) {
  RETURN_IF_ERROR(CheckCount(count, "Gather"));
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("Gather: root ", root, " outside the group"));
  }
  MPI_Request request;
  RETURN_IF_ERROR(MpiStatus(MPI_Igather(send, static_cast<int>(count), MPI_FLOAT, recv,
                                        static_cast<int>(count), MPI_FLOAT, root, comm_, &request),
                            "MPI_Igather"));
  return Wait(&request, options_.timeout, "Gather");
}

absl::Status MpiCommunicator::Broadcast(void* data, int64_t bytes, int root,
                                        absl::Duration timeout) {
  RETURN_IF_ERROR(CheckCount(bytes, "Broadcast"));
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " outside the group"));
  }
  if (size_ == 1) return absl::OkStatus();
  MPI_Request request;
  RETURN_IF_ERROR(MpiStatus(
      MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &request), "MPI_Ibcast"));
  return Wait(&request, timeout, "Broadcast");
}

absl::Status MpiCommunicator::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  MPI_Request request;
  RETURN_IF_ERROR(MpiStatus(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier"));
  return Wait(&request, options_.timeout, "Barrier");
}

}  // namespace carpool::cluster
