// What the CUDA tests (worker/model/cuda_*_test.cc, label gpu) share: skipping where no CUDA
// device is visible, a small CUDA device, rounding to a storage type, and a suite fixture that
// writes one small Llama checkpoint the CUDA kernels take. Header-only: each test binary already
// links the CUDA device, the engine and carpool_testing. Where there is no GPU every test that
// uses these reports itself skipped.
#ifndef CARPOOL_TESTS_TESTING_CUDA_TEST_H_
#define CARPOOL_TESTS_TESTING_CUDA_TEST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/dtype.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "worker/model/cuda_device.h"

// Skips the running test (return from it) where no CUDA device is visible. A macro, because
// GTEST_SKIP() must be in the test's own body (or SetUp) to end it.
#define CARPOOL_SKIP_WITHOUT_CUDA()                     \
  do {                                                  \
    if (::carpool::kernels::cuda::DeviceCount() == 0) { \
      GTEST_SKIP() << "no CUDA device";                 \
    }                                                   \
  } while (false)

namespace carpool::testing {

// `x` as `t` stores it: bf16 and fp16 round to nearest even, fp32 is exact.
inline float RoundToStorage(worker::StorageType t, float x) {
  namespace kc = kernels::cuda;
  switch (t) {
    case worker::StorageType::kF32:
      return x;
    case worker::StorageType::kBF16:
      return kc::ToFloat(kc::ToBFloat16(x));
    case worker::StorageType::kF16:
      return kc::ToFloat(kc::ToHalf(x));
  }
  return x;
}

// The options of a small CUDA device for op-by-op tests: `storage`, errors reported (not
// aborting), steps of up to 64 tokens and 8 sequences, contexts of up to 512.
inline worker::CudaDeviceOptions SmallCudaDeviceOptions(worker::StorageType storage) {
  worker::CudaDeviceOptions o;
  o.storage = storage;
  o.abort_on_error = false;
  o.max_num_batched_tokens = 64;
  o.max_num_seqs = 8;
  o.max_context_len = 512;
  return o;
}

// A Llama of 3 layers, hidden 256, 4 heads over 2 KV heads of head_dim 64 (the CUDA attention
// kernels take head_dim 64, 128 or 256 only), vocab 512, BOS 1, EOS 2.
inline worker::ModelConfig SmallCudaLlamaConfig() {
  worker::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 320;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 512;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// A suite fixture: SetUpTestSuite writes an F32 checkpoint of SmallCudaLlamaConfig() with
// weights from Suite::kCheckpointSeed into a ScratchDir named Suite::kCheckpointPrefix (removed
// by TearDownTestSuite); SetUp skips each test where no CUDA device is visible. Suite derives
// from CudaCheckpointTest<Suite> (each suite has its own folder) and declares both constants
// public:
//   class MyTest : public testing::CudaCheckpointTest<MyTest> {
//    public:
//     static constexpr char kCheckpointPrefix[] = "carpool_my_test";
//     static constexpr uint64_t kCheckpointSeed = 17;
//   };
template <typename Suite>
class CudaCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir(Suite::kCheckpointPrefix);
    CheckpointSpec spec;
    spec.config = SmallCudaLlamaConfig();
    spec.seed = Suite::kCheckpointSeed;
    absl::StatusOr<CheckpointTensors> t = WriteCheckpoint(dir_->path().string(), spec);
    ASSERT_TRUE(t.ok()) << t.status();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { CARPOOL_SKIP_WITHOUT_CUDA(); }

  // The checkpoint's folder, for EngineOptions::model.
  static std::string checkpoint() { return dir_->path().string(); }

  static inline ScratchDir* dir_ = nullptr;
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_CUDA_TEST_H_
