// The asynchronous step on a GPU (--async-step, worker/engine.h): the engine with async on and
// off on the same CUDA device type, fp32 storage, CUDA graphs on, sampling on the device, must
// give the same tokens for greedy, seeded, penalized and stop-token requests that finish at
// different steps; async on must have overlapped (the engine launched steps ahead), and the
// penalized requests must have made it finish steps first (the GPU does not gather pending
// penalty tokens). Label gpu: every test skips itself where no CUDA device is visible. Not yet
// run on a GPU (docs/gpu.md).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/cuda_test.h"
#include "worker/engine.h"
#include "worker/model/cuda_device.h"

namespace carpool::worker {
namespace {

// The suite's checkpoint: testing::SmallCudaLlamaConfig() (tests/testing/cuda_test.h).
class CudaAsyncTest : public testing::CudaCheckpointTest<CudaAsyncTest> {
 public:
  static constexpr char kCheckpointPrefix[] = "carpool_cuda_async_test";
  static constexpr uint64_t kCheckpointSeed = 23;

 protected:
  static EngineOptions Options(AsyncStep async) {
    EngineOptions o;
    o.model = checkpoint();
    o.block_size = 16;
    o.num_kv_blocks = 256;
    o.scheduler.max_num_batched_tokens = 64;
    o.scheduler.max_num_seqs = 16;
    o.scheduler.max_model_len = 256;
    o.device.kind = DeviceKind::kCuda;
    o.device.dtype = StorageType::kF32;
    o.device.cuda_graphs = true;
    o.async_step = async;
    return o;
  }

  static std::vector<EngineRequest> Requests(int n) {
    std::vector<EngineRequest> rs;
    for (int i = 0; i < n; ++i) {
      EngineRequest r;
      for (int j = 0; j < 5 + 11 * i; ++j) r.prompt_tokens.push_back(3 + (i * 37 + j * 11) % 500);
      r.sampling.max_tokens = 6 + (i * 5) % 13;
      r.sampling.has_seed = true;
      r.sampling.seed = 100 + i;
      r.sampling.ignore_eos = true;
      switch (i % 4) {
        case 0:
          r.sampling.temperature = 0;
          break;
        case 1:
          r.sampling.temperature = 0.9f;
          r.sampling.top_k = 40;
          break;
        case 2:
          r.sampling.temperature = 0;
          r.sampling.repetition_penalty = 1.3f;
          r.sampling.frequency_penalty = 0.5f;
          break;
        default:
          r.sampling.temperature = 1.0f;
          for (int t = 0; t < 512; t += 11) r.sampling.stop_token_ids.push_back(t);
          r.sampling.max_tokens = 24;
          break;
      }
      rs.push_back(std::move(r));
    }
    return rs;
  }

  static std::vector<Completion> Run(AsyncStep async, std::unique_ptr<Engine>* kept) {
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(Options(async));
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return {};
    std::vector<Completion> out;
    for (absl::StatusOr<Completion>& c : (*e)->Generate(Requests(12))) {
      EXPECT_TRUE(c.ok()) << c.status();
      if (c.ok()) out.push_back(std::move(*c));
    }
    *kept = std::move(*e);
    return out;
  }
};

TEST_F(CudaAsyncTest, AsyncOnEqualsOffTokenForToken) {
  std::unique_ptr<Engine> off_engine, on_engine;
  const std::vector<Completion> off = Run(AsyncStep::kOff, &off_engine);
  const std::vector<Completion> on = Run(AsyncStep::kOn, &on_engine);
  ASSERT_NE(on_engine, nullptr);
  EXPECT_TRUE(on_engine->steps_async());
  EXPECT_FALSE(off_engine->steps_async());
  ASSERT_EQ(on.size(), off.size());
  for (size_t i = 0; i < off.size(); ++i) {
    EXPECT_EQ(on[i].tokens, off[i].tokens) << "request " << i;
    EXPECT_EQ(on[i].finish_reason, off[i].finish_reason) << "request " << i;
  }
  EXPECT_GT(on_engine->drained_steps(), 0);  // the penalized requests
  auto* cuda = dynamic_cast<CudaDevice*>(&on_engine->model().device());
  ASSERT_NE(cuda, nullptr);
  EXPECT_TRUE(cuda->status().ok()) << cuda->status();
}

TEST_F(CudaAsyncTest, AutoIsOnForAGpuThatSamples) {
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(Options(AsyncStep::kAuto));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE((*e)->samples_on_device());
  EXPECT_TRUE((*e)->steps_async());
}

}  // namespace
}  // namespace carpool::worker
