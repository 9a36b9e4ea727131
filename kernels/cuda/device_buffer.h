// Device memory: an owning buffer, copies between host and device, and the device query that
// the GPU tests use to skip themselves.
//
// Errors come back as absl::Status (see cuda_status.h for the codes). Not thread-safe per
// object; distinct buffers may be used from distinct threads.
#ifndef CARPOOL_KERNELS_CUDA_DEVICE_BUFFER_H_
#define CARPOOL_KERNELS_CUDA_DEVICE_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_kernel_params.h"  // Stream

namespace carpool::kernels::cuda {

// Number of CUDA devices this process can use; 0 (not an error) when there is no driver or no
// device.
int DeviceCount();

// Waits for all work on `stream`.
absl::Status Synchronize(Stream stream);

// Copies `bytes` bytes; each enqueues on `stream` and may return before the copy is done
// (pageable host memory makes the host side synchronous). nullptr stream: the default stream.
absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                          Stream stream = nullptr);
absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes,
                        Stream stream = nullptr);
absl::Status CopyOnDevice(void* device_dst, const void* device_src, size_t bytes,
                          Stream stream = nullptr);

// An owning allocation of device memory (cudaMalloc: 256-byte aligned). Move-only; frees on
// destruction. An empty buffer has data() == nullptr.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // RESOURCE_EXHAUSTED when the device is out of memory. bytes == 0 gives an empty buffer.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  // A buffer holding a copy of `values` (synchronous).
  template <typename T>
  static absl::StatusOr<DeviceBuffer> FromHost(const std::vector<T>& values) {
    absl::StatusOr<DeviceBuffer> buffer = Allocate(values.size() * sizeof(T));
    if (!buffer.ok() || values.empty()) return buffer;
    absl::Status copied = CopyToDevice(buffer->data(), values.data(), buffer->size());
    if (!copied.ok()) return copied;
    return buffer;
  }

  // The first n elements as a host vector (synchronous). REQUIRES: n * sizeof(T) <= size().
  template <typename T>
  absl::StatusOr<std::vector<T>> ToHost(size_t n) const {
    std::vector<T> values(n);
    if (n == 0) return values;
    absl::Status copied = CopyToHost(values.data(), data_, n * sizeof(T));
    if (!copied.ok()) return copied;
    absl::Status done = Synchronize(nullptr);
    if (!done.ok()) return done;
    return values;
  }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  void Reset();

  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace carpool::kernels::cuda

#endif  // CARPOOL_KERNELS_CUDA_DEVICE_BUFFER_H_
