#include "kernels/cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "kernels/cuda/cuda_status.h"

namespace carpool::kernels::cuda {

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls do not report it
    return 0;
  }
  return count;
}

absl::Status Synchronize(Stream stream) {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

absl::Status CopyOnDevice(void* device_dst, const void* device_src, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream));
  return absl::OkStatus();
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer.data_, bytes));
  buffer.size_ = bytes;
  return buffer;
}

void DeviceBuffer::Reset() {
  if (data_ == nullptr) return;
  // cudaFree synchronizes the device. It fails only when the context is already broken by an
  // earlier fault, which that fault's caller has been told about.
  if (cudaFree(data_) != cudaSuccess) (void)cudaGetLastError();
  data_ = nullptr;
  size_ = 0;
}

}  // namespace carpool::kernels::cuda
