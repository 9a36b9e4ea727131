#include "cluster/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <time.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "cluster/mpi_util.h"
#include "common/status.h"

namespace carpool::cluster {
namespace {

// The one adapter from CUDA and NCCL errors to absl::Status.
absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

ncclDataType_t NcclType(DeviceElementType t) {
  switch (t) {
    case DeviceElementType::kBF16:
      return ncclBfloat16;
    case DeviceElementType::kF16:
      return ncclFloat16;
    case DeviceElementType::kF32:
      break;
  }
  return ncclFloat32;
}

}  // namespace

struct NcclCommunicator::Handles {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float, for Barrier
};

int NcclCommunicator::DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Handles> handles, int rank, int size,
                                   int device, absl::Duration timeout)
    : handles_(std::move(handles)), rank_(rank), size_(size), device_(device), timeout_(timeout) {}

NcclCommunicator::~NcclCommunicator() {
  if (handles_ == nullptr) return;
  cudaSetDevice(device_);
  if (handles_->comm != nullptr) {
    if (broken_) {
      ncclCommAbort(handles_->comm);
    } else {
      ncclCommDestroy(handles_->comm);
    }
  }
  if (handles_->scratch != nullptr) cudaFree(handles_->scratch);
  if (handles_->stream != nullptr) cudaStreamDestroy(handles_->stream);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::CreateOverMpi(
    MPI_Comm group, const NcclCommunicatorOptions& options) {
  int rank = 0, size = 0;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(group, &rank), "MPI_Comm_rank"));
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(group, &size), "MPI_Comm_size"));
  // Every rank takes part in the broadcast even when its own device is unusable, so that no
  // peer waits for it; errors come after.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  absl::Status id_status = absl::OkStatus();
  if (rank == 0) id_status = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Request request;
  RETURN_IF_ERROR(MpiStatus(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, group, &request),
                            "MPI_Ibcast(ncclUniqueId)"));
  RETURN_IF_ERROR(WaitRequest(&request, absl::Now() + options.timeout, "sharing the ncclUniqueId"));
  RETURN_IF_ERROR(id_status);

  auto handles = std::make_unique<Handles>();
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&handles->stream, cudaStreamNonBlocking),
                             "cudaStreamCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&handles->scratch, sizeof(float)), "cudaMalloc"));
  RETURN_IF_ERROR(
      NcclStatus(ncclCommInitRank(&handles->comm, size, id, rank), "ncclCommInitRank"));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(handles), rank, size, options.device, options.timeout));
}

absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::CreateLocal(
    const std::vector<int>& devices, absl::Duration timeout) {
  if (devices.empty()) return absl::InvalidArgumentError("CreateLocal: no devices");
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(n, nullptr);
  RETURN_IF_ERROR(NcclStatus(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll"));
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (int r = 0; r < n; ++r) {
    auto handles = std::make_unique<Handles>();
    handles->comm = comms[r];
    // Owned from here on, so an error below still releases every communicator.
    out.push_back(std::unique_ptr<NcclCommunicator>(
        new NcclCommunicator(std::move(handles), r, n, devices[r], timeout)));
  }
  for (auto& c : out) {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(c->device_), "cudaSetDevice"));
    RETURN_IF_ERROR(CudaStatus(
        cudaStreamCreateWithFlags(&c->handles_->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&c->handles_->scratch, sizeof(float)), "cudaMalloc"));
  }
  return out;
}

absl::Status NcclCommunicator::Sync(absl::Duration timeout, const char* what, void* stream) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream) : handles_->stream;
  for (int polls = 0;; ++polls) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return absl::OkStatus();
    absl::Status failure;
    if (e != cudaErrorNotReady) failure = CudaStatus(e, what);
    ncclResult_t async = ncclSuccess;
    if (failure.ok() && ncclCommGetAsyncError(handles_->comm, &async) == ncclSuccess &&
        async != ncclSuccess && async != ncclInProgress) {
      failure = NcclStatus(async, what);
    }
    if (failure.ok() && absl::Now() >= deadline) {
      failure = absl::DeadlineExceededError(
          absl::StrCat(what, ": peers did not arrive in time; the group is unusable"));
    }
    if (!failure.ok()) {
      broken_ = true;
      return failure;
    }
    if (polls > 1000) {
      const timespec pause = {0, 50'000};
      nanosleep(&pause, nullptr);
    }
  }
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t count) {
  if (broken_) return absl::FailedPreconditionError("NCCL communicator is broken");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  RETURN_IF_ERROR(NcclStatus(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat,
                                           ncclSum, handles_->comm, handles_->stream),
                             "ncclAllReduce"));
  return Sync(timeout_, "AllReduceSum");
}

absl::Status NcclCommunicator::AllGather(const float* send, int64_t count, float* recv) {
  if (broken_) return absl::FailedPreconditionError("NCCL communicator is broken");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  RETURN_IF_ERROR(NcclStatus(ncclAllGather(send, recv, static_cast<size_t>(count), ncclFloat,
                                           handles_->comm, handles_->stream),
                             "ncclAllGather"));
  return Sync(timeout_, "AllGather");
}

absl::Status NcclCommunicator::Gather(const float* send, int64_t count, float* recv, int root) {
  if (broken_) return absl::FailedPreconditionError("NCCL communicator is broken");
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("Gather: root ", root, " outside the group"));
  }
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  const size_t n = static_cast<size_t>(count);
  RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart"));
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      if (r == root) continue;
      RETURN_IF_ERROR(NcclStatus(
          ncclRecv(recv + r * n, n, ncclFloat, r, handles_->comm, handles_->stream), "ncclRecv"));
    }
  } else {
    RETURN_IF_ERROR(
        NcclStatus(ncclSend(send, n, ncclFloat, root, handles_->comm, handles_->stream), "ncclSend"));
  }
  RETURN_IF_ERROR(NcclStatus(ncclGroupEnd(), "ncclGroupEnd"));
  if (rank_ == root) {
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(recv + root * n, send, n * sizeof(float),
                                               cudaMemcpyDeviceToDevice, handles_->stream),
                               "cudaMemcpyAsync"));
  }
  return Sync(timeout_, "Gather");
}

absl::Status NcclCommunicator::Broadcast(void* data, int64_t bytes, int root,
                                         absl::Duration timeout) {
  if (broken_) return absl::FailedPreconditionError("NCCL communicator is broken");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  RETURN_IF_ERROR(NcclStatus(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root,
                                           handles_->comm, handles_->stream),
                             "ncclBroadcast"));
  return Sync(timeout, "Broadcast");
}

absl::Status NcclCommunicator::Barrier() {
  if (broken_) return absl::FailedPreconditionError("NCCL communicator is broken");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  RETURN_IF_ERROR(NcclStatus(ncclAllReduce(handles_->scratch, handles_->scratch, 1, ncclFloat,
                                           ncclSum, handles_->comm, handles_->stream),
                             "ncclAllReduce(barrier)"));
  return Sync(timeout_, "Barrier");
}

absl::Status NcclCommunicator::AllReduceSumOnStream(void* data, int64_t count,
                                                   DeviceElementType type, void* stream) {
  if (broken_) return absl::FailedPreconditionError("NCCL communicator is broken");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  return NcclStatus(ncclAllReduce(data, data, static_cast<size_t>(count), NcclType(type), ncclSum,
                                  handles_->comm, static_cast<cudaStream_t>(stream)),
                    "ncclAllReduce");
}

absl::Status NcclCommunicator::AllGatherOnStream(const void* send, int64_t count,
                                                DeviceElementType type, void* recv,
                                                void* stream) {
  if (broken_) return absl::FailedPreconditionError("NCCL communicator is broken");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  return NcclStatus(ncclAllGather(send, recv, static_cast<size_t>(count), NcclType(type),
                                  handles_->comm, static_cast<cudaStream_t>(stream)),
                    "ncclAllGather");
}

absl::Status NcclCommunicator::WaitStream(void* stream) {
  if (broken_) return absl::FailedPreconditionError("NCCL communicator is broken");
  if (stream == nullptr) return absl::InvalidArgumentError("WaitStream: no stream");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  return Sync(timeout_, "the step's collectives", stream);
}

}  // namespace carpool::cluster
