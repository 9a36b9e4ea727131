// A CpuDevice that hides its host memory (HostData() is null), so LlamaModel takes the paths of a
// device with memory of its own, as a GPU: logits, pooled embeddings and every tensor-parallel
// collective go ToHost -> host -> FromHost instead of working in place. The arithmetic is the
// CPU's, so results can be compared with a plain CpuDevice on machines without a GPU.
// Header-only; link carpool_model (or anything above it, such as carpool_engine).
#ifndef CARPOOL_TESTS_TESTING_NO_HOST_MEMORY_DEVICE_H_
#define CARPOOL_TESTS_TESTING_NO_HOST_MEMORY_DEVICE_H_

#include "worker/model/cpu_device.h"

namespace carpool::testing {

class NoHostMemoryDevice : public worker::CpuDevice {
 public:
  // `pool`: CpuDeviceOptions::pool (null: the kernels on the calling thread).
  explicit NoHostMemoryDevice(ThreadPool* pool = nullptr) : worker::CpuDevice(On(pool)) {}
  float* HostData(const worker::DeviceArray&) override { return nullptr; }

 private:
  static worker::CpuDeviceOptions On(ThreadPool* pool) {
    worker::CpuDeviceOptions o;
    o.pool = pool;
    return o;
  }
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_NO_HOST_MEMORY_DEVICE_H_
