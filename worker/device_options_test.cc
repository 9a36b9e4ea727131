// DeviceOptions: the device flags' parsing and ranges, device resolution on this machine (with or
// without a GPU), the KV sizing arithmetic, and Engine::Create's answer to a device it cannot
// have, alone and as rank 0 of a tensor-parallel group. Runs everywhere; where a GPU is visible
// the resolution and engine tests check the GPU's answers.
#include "worker/device_options.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "cluster/communicator.h"
#include "common/flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine.h"
#include "worker/engine_flags.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

using ::testing::HasSubstr;

// Parses `args` (without the program name) into `options` through RegisterEngineFlags.
absl::Status ParseEngineFlags(std::vector<std::string> args, EngineOptions* options) {
  FlagParser parser;
  RegisterEngineFlags(&parser, options);
  std::vector<char*> argv = {const_cast<char*>("test")};
  for (std::string& a : args) argv.push_back(a.data());
  return parser.Parse(static_cast<int>(argv.size()), argv.data(), 1);
}

// Rank 0 of a group of two whose other rank is never heard from: AllGather answers as if every
// rank had sent this one's values (the ranks of a group agree); every other operation fails.
class EchoGroup : public cluster::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::Status AllReduceSum(float*, int64_t) override { return Unused(); }
  absl::Status AllGather(const float* send, int64_t count, float* recv) override {
    ++all_gathers_;
    for (int r = 0; r < size(); ++r) std::copy_n(send, count, recv + r * count);
    return absl::OkStatus();
  }
  absl::Status Gather(const float*, int64_t, float*, int) override { return Unused(); }
  absl::Status Broadcast(void*, int64_t, int, absl::Duration) override { return Unused(); }
  absl::Status Barrier() override { return Unused(); }
  absl::Duration timeout() const override { return absl::Seconds(1); }

  int all_gathers() const { return all_gathers_; }

 private:
  static absl::Status Unused() { return absl::UnimplementedError("not in this test"); }
  int all_gathers_ = 0;
};

TEST(DeviceOptionsTest, ParsesDeviceKinds) {
  EXPECT_EQ(*ParseDeviceKind("cpu"), DeviceKind::kCpu);
  EXPECT_EQ(*ParseDeviceKind("cuda"), DeviceKind::kCuda);
  EXPECT_EQ(*ParseDeviceKind("CUDA"), DeviceKind::kCuda);
  EXPECT_EQ(*ParseDeviceKind("gpu"), DeviceKind::kCuda);
  EXPECT_EQ(*ParseDeviceKind("auto"), DeviceKind::kAuto);
  absl::StatusOr<DeviceKind> bad = ParseDeviceKind("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("--device"));
  EXPECT_THAT(bad.status().message(), HasSubstr("tpu"));
  EXPECT_STREQ(DeviceKindName(DeviceKind::kCuda), "cuda");
}

TEST(DeviceOptionsTest, ParsesStorageTypes) {
  EXPECT_EQ(*ParseStorageType("bfloat16"), StorageType::kBF16);
  EXPECT_EQ(*ParseStorageType("bf16"), StorageType::kBF16);
  EXPECT_EQ(*ParseStorageType("float16"), StorageType::kF16);
  EXPECT_EQ(*ParseStorageType("half"), StorageType::kF16);
  EXPECT_EQ(*ParseStorageType("float32"), StorageType::kF32);
  EXPECT_EQ(*ParseStorageType("FP32"), StorageType::kF32);
  absl::StatusOr<StorageType> bad = ParseStorageType("int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("--dtype"));
  for (StorageType t : {StorageType::kF32, StorageType::kBF16, StorageType::kF16}) {
    EXPECT_EQ(*ParseStorageType(StorageTypeFlagName(t)), t);
  }
}

TEST(DeviceOptionsTest, ParsesTheStorageFlags) {
  EXPECT_EQ(*ParseDtypeFlag("auto"), std::nullopt);
  EXPECT_EQ(*ParseDtypeFlag("bf16"), StorageType::kBF16);
  EXPECT_EQ(*ParseDtypeFlag("float32"), StorageType::kF32);
  absl::StatusOr<std::optional<StorageType>> bad = ParseDtypeFlag("int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("--dtype must be auto, bfloat16"));
  EXPECT_EQ(DtypeFlagName(std::nullopt), "auto");
  EXPECT_EQ(DtypeFlagName(StorageType::kBF16), "bfloat16");

  EXPECT_EQ(*ParseKvCacheDtypeFlag("AUTO"), std::nullopt);
  EXPECT_EQ(*ParseKvCacheDtypeFlag("bfloat16"), StorageType::kBF16);
  EXPECT_EQ(*ParseKvCacheDtypeFlag("fp32"), StorageType::kF32);
  for (const char* v : {"float16", "int8", ""}) {
    bad = ParseKvCacheDtypeFlag(v);
    ASSERT_FALSE(bad.ok()) << v;
    EXPECT_THAT(bad.status().message(), HasSubstr("--kv-cache-dtype must be auto, bfloat16 or "
                                                  "float32"));
  }

  EXPECT_EQ(*ParseQuantization("none"), Quantization::kNone);
  EXPECT_EQ(*ParseQuantization("INT8"), Quantization::kInt8);
  absl::StatusOr<Quantization> q = ParseQuantization("int4");
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("--quantization must be none or int8, got 'int4'"));
  EXPECT_STREQ(QuantizationName(Quantization::kInt8), "int8");
}

// Combinations no device takes fail Validate; what one kind refuses fails CheckDeviceStorage.
TEST(DeviceOptionsTest, StorageFlagsAreCheckedAgainstTheDevice) {
  DeviceOptions d;
  d.quantization = Quantization::kInt8;
  EXPECT_TRUE(d.Validate().ok());
  d.dtype = StorageType::kBF16;
  EXPECT_THAT(d.Validate().message(), HasSubstr("--quantization int8"));
  EXPECT_THAT(d.Validate().message(), HasSubstr("--dtype auto"));

  d = DeviceOptions();
  d.kind = DeviceKind::kCpu;
  EXPECT_TRUE(CheckDeviceStorage(d).ok());
  d.dtype = StorageType::kF16;
  absl::Status s = CheckDeviceStorage(d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--dtype float16"));
  d.dtype = StorageType::kBF16;
  d.kv_cache_dtype = StorageType::kF32;
  EXPECT_TRUE(CheckDeviceStorage(d).ok());

  d = DeviceOptions();
  d.kind = DeviceKind::kCuda;
  EXPECT_EQ(d.gpu_dtype(), StorageType::kBF16);  // auto on a GPU
  EXPECT_TRUE(CheckDeviceStorage(d).ok());
  d.kv_cache_dtype = StorageType::kBF16;
  EXPECT_TRUE(CheckDeviceStorage(d).ok());
  d.kv_cache_dtype = StorageType::kF32;
  EXPECT_THAT(CheckDeviceStorage(d).message(), HasSubstr("--kv-cache-dtype on a GPU"));
  d.kv_cache_dtype = std::nullopt;
  d.quantization = Quantization::kInt8;
  EXPECT_THAT(CheckDeviceStorage(d).message(), HasSubstr("CPU only"));

  // Through the engine: the CPU refuses float16 weights before loading anything.
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.device.dtype = StorageType::kF16;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("--dtype float16"));
}

TEST(DeviceOptionsTest, ValidateChecksRanges) {
  DeviceOptions d;
  EXPECT_TRUE(d.Validate().ok());
  d.gpu_memory_utilization = 1.0;
  EXPECT_TRUE(d.Validate().ok());
  for (double bad : {0.0, -0.5, 1.01, std::nan("")}) {
    d.gpu_memory_utilization = bad;
    absl::Status s = d.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("--gpu-memory-utilization"));
  }
  d = DeviceOptions();
  d.gpu_index = -2;
  EXPECT_THAT(d.Validate().message(), HasSubstr("--gpu"));
  d.gpu_index = 3;
  EXPECT_TRUE(d.Validate().ok());
}

TEST(DeviceOptionsTest, EngineFlagsCarryTheDeviceFlags) {
  EngineOptions o;
  EXPECT_EQ(o.device.kind, DeviceKind::kCpu);  // an engine built in code stays on the CPU
  EXPECT_EQ(o.device.dtype, StorageType::kF32);  // in fp32
  ASSERT_TRUE(ParseEngineFlags({"--model", "synthetic:tiny"}, &o).ok());
  EXPECT_EQ(o.device.kind, DeviceKind::kAuto);  // binaries default to auto
  EXPECT_EQ(o.device.gpu_index, -1);
  EXPECT_TRUE(o.device.cuda_graphs);

  EngineOptions p;
  ASSERT_TRUE(ParseEngineFlags({"--model", "synthetic:tiny", "--device", "cuda", "--gpu", "1",
                                "--dtype", "float32", "--gpu-memory-utilization", "0.5",
                                "--no-cuda-graphs"},
                               &p)
                  .ok());
  EXPECT_EQ(o.device.dtype, std::nullopt);  // auto
  EXPECT_EQ(o.device.quantization, Quantization::kNone);
  EXPECT_EQ(o.device.kv_cache_dtype, std::nullopt);
  EXPECT_EQ(p.device.kind, DeviceKind::kCuda);
  EXPECT_EQ(p.device.gpu_index, 1);
  EXPECT_EQ(p.device.dtype, StorageType::kF32);
  EXPECT_DOUBLE_EQ(p.device.gpu_memory_utilization, 0.5);
  EXPECT_FALSE(p.device.cuda_graphs);
  EXPECT_TRUE(p.Validate().ok());

  EngineOptions q;
  absl::Status s = ParseEngineFlags({"--device", "tpu"}, &q);
  EXPECT_THAT(s.message(), HasSubstr("--device"));
  s = ParseEngineFlags({"--dtype", "int4"}, &q);
  EXPECT_THAT(s.message(), HasSubstr("--dtype"));
  s = ParseEngineFlags({"--quantization", "q4"}, &q);
  EXPECT_THAT(s.message(), HasSubstr("--quantization"));
  s = ParseEngineFlags({"--kv-cache-dtype", "fp8"}, &q);
  EXPECT_THAT(s.message(), HasSubstr("--kv-cache-dtype"));
  EngineOptions r;
  ASSERT_TRUE(ParseEngineFlags({"--model", "x", "--dtype", "auto", "--quantization", "int8",
                                "--kv-cache-dtype", "float32"},
                               &r)
                  .ok());
  EXPECT_EQ(r.device.dtype, std::nullopt);
  EXPECT_EQ(r.device.quantization, Quantization::kInt8);
  EXPECT_EQ(r.device.kv_cache_dtype, StorageType::kF32);
  ASSERT_TRUE(ParseEngineFlags({"--model", "x", "--gpu-memory-utilization", "1.5"}, &q).ok());
  EXPECT_THAT(q.Validate().message(), HasSubstr("--gpu-memory-utilization"));
}

TEST(DeviceOptionsTest, ResolvesOnThisMachine) {
  DeviceOptions d;  // auto
  absl::StatusOr<DeviceOptions> r = ResolveDevice(d, /*local_rank=*/-1);
  ASSERT_TRUE(r.ok()) << r.status();
  const int count = CudaDeviceCount();
  if (!BuiltWithCuda()) {
    EXPECT_EQ(count, 0);
  }
  d.kind = DeviceKind::kCpu;
  EXPECT_EQ(ResolveDevice(d, 3)->kind, DeviceKind::kCpu);
  d.kind = DeviceKind::kCuda;
  if (count == 0) {
    EXPECT_EQ(r->kind, DeviceKind::kCpu);
    absl::StatusOr<DeviceOptions> cuda = ResolveDevice(d, -1);
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(cuda.status().message(), HasSubstr("--device cuda"));
    EXPECT_THAT(cuda.status().message(), HasSubstr("--device cpu"));
    return;
  }
  EXPECT_EQ(r->kind, DeviceKind::kCuda);
  EXPECT_EQ(r->gpu_index, 0);
  // Under a launcher the GPU is the local rank modulo the device count.
  EXPECT_EQ(ResolveDevice(d, count + 1)->gpu_index, 1 % count);
  d.gpu_index = 0;
  EXPECT_EQ(ResolveDevice(d, count + 1)->gpu_index, 0);  // --gpu wins
  d.gpu_index = count;
  EXPECT_EQ(ResolveDevice(d, -1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DeviceOptionsTest, InvalidOptionsFailResolution) {
  DeviceOptions d;
  d.gpu_memory_utilization = 2;
  EXPECT_EQ(ResolveDevice(d, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceOptionsTest, GpuMemoryFitErrorNamesWhatIsNeededAndWhatIsFree) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  // An 80 GiB GPU with 20 GiB held elsewhere: 0.9 allows 72 - 20 = 52 GiB; the model needs
  // 50 + 4 GiB and a 2 MiB block.
  const GpuMemoryInfo memory{81920 * kMiB, 61440 * kMiB};
  const absl::Status s =
      GpuMemoryFitError("cuda:0 (H200)", 0.9, memory, 51200 * kMiB, 4096 * kMiB, 2 * kMiB);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  const std::string m(s.message());
  EXPECT_THAT(m, HasSubstr("does not fit on cuda:0 (H200)"));
  EXPECT_THAT(m, HasSubstr("needs 55298 MiB (51200 MiB of weights, 4096 MiB for activations, "
                           "2 MiB for one KV block)"));
  EXPECT_THAT(m, HasSubstr("--gpu-memory-utilization 0.9 allows 53248 MiB of the GPU's "
                           "81920 MiB (61440 MiB free, 20480 MiB held by other processes)"));
  EXPECT_THAT(m, HasSubstr("--tp"));
}

TEST(DeviceOptionsTest, KvPoolBytesForUtilization) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  // 0.9 x 80 GiB = 72 GiB budget; 10 GiB in use (70 free); 2 GiB margin: 60 GiB.
  EXPECT_EQ(KvPoolBytesForUtilization(0.9, 80 * kGiB, 70 * kGiB, 2 * kGiB), 60 * kGiB);
  // Another process's memory counts as used.
  EXPECT_EQ(KvPoolBytesForUtilization(0.9, 80 * kGiB, 40 * kGiB, 2 * kGiB), 30 * kGiB);
  // Nothing left: 0, never negative.
  EXPECT_EQ(KvPoolBytesForUtilization(0.5, 80 * kGiB, 30 * kGiB, 2 * kGiB), 0);
  // Free above total (a driver's rounding) counts as nothing in use.
  EXPECT_EQ(KvPoolBytesForUtilization(1.0, 1000, 1200, 100), 900);
  // Monotone in the utilization.
  EXPECT_LT(KvPoolBytesForUtilization(0.5, 80 * kGiB, 70 * kGiB, 2 * kGiB),
            KvPoolBytesForUtilization(0.6, 80 * kGiB, 70 * kGiB, 2 * kGiB));
}

TEST(DeviceOptionsTest, ActivationMarginGrowsWithTokensAndStorage) {
  absl::StatusOr<ModelConfig> c = SyntheticConfig("8b");
  ASSERT_TRUE(c.ok());
  const int64_t base = int64_t{512} << 20;
  const int64_t bf16 = GpuActivationMarginBytes(*c, 2048, StorageType::kBF16);
  EXPECT_GT(bf16, base);
  EXPECT_GT(GpuActivationMarginBytes(*c, 4096, StorageType::kBF16), bf16);
  EXPECT_GT(GpuActivationMarginBytes(*c, 2048, StorageType::kF32), bf16);
  EXPECT_EQ(GpuActivationMarginBytes(*c, 0, StorageType::kBF16), base);
}

TEST(DeviceOptionsTest, CudaSupportsHeadDims64And128Only) {
  // The CUDA attention kernels take head_dim 64 or 128: 1b and 8b run there, tiny (16) does not.
  for (const char* preset : {"small", "1b", "8b"}) {
    absl::StatusOr<ModelConfig> c = SyntheticConfig(preset);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(CheckCudaSupportsModel(*c).ok()) << preset;
  }
  absl::StatusOr<ModelConfig> tiny = SyntheticConfig("tiny");
  ASSERT_TRUE(tiny.ok());
  const absl::Status s = CheckCudaSupportsModel(*tiny);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("head_dim"));
}

TEST(DeviceOptionsTest, EngineWithoutTheAskedDeviceFails) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible";
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.device.kind = DeviceKind::kCuda;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(e.status().message(), HasSubstr("--device cuda"));

  o.device.kind = DeviceKind::kAuto;  // no GPU: the CPU
  e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->model().device().name(), "cpu");
  EXPECT_GT((*e)->model().weights().ParameterBytes(), 0);  // the CPU keeps the host weights
}

// Tensor parallelism takes the device it is asked for: `cuda` is not refused for being under a
// group (without a GPU it fails for want of one, as alone), and `auto` picks the GPU when one is
// visible. The GPU then sizes the rank's KV pool, and the group agrees on it (one all-gather).
TEST(DeviceOptionsTest, TensorParallelRanksTakeTheirDevice) {
  EchoGroup group;
  const bool gpu = CudaDeviceCount() > 0;
  EngineOptions o;
  // On a GPU, a model the CUDA kernels support (tiny's head_dim 16 is refused there).
  o.model = gpu ? "synthetic:small" : "synthetic:tiny";
  o.tensor_parallel_group = &group;
  o.device.gpu_memory_utilization = 0.2;

  o.device.kind = DeviceKind::kCuda;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  if (gpu) {
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->model().device().name(), "cuda:0");
    EXPECT_EQ((*e)->model().weights().tp.size, 2);
    EXPECT_EQ(group.all_gathers(), 1);
    EXPECT_GT((*e)->kv_cache().num_blocks(), 0);
  } else {
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
    EXPECT_THAT(e.status().message(), HasSubstr("--device cuda"));
    EXPECT_EQ(group.all_gathers(), 0);
  }
  e = absl::UnknownError("reset");  // one engine's GPU memory at a time

  o.device.kind = DeviceKind::kAuto;
  e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->model().device().name(), gpu ? "cuda:0" : "cpu");
  EXPECT_EQ((*e)->model().weights().tp.size, 2);
  EXPECT_EQ(group.all_gathers(), gpu ? 2 : 0);  // the CPU's pool is not sized by memory

  // A pool set by --num-kv-blocks needs no agreement (the ranks compare it later).
  e = absl::UnknownError("reset");
  o.num_kv_blocks = 64;
  e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->kv_cache().num_blocks(), 64);
  EXPECT_EQ(group.all_gathers(), gpu ? 2 : 0);
}

TEST(DeviceOptionsTest, EngineValidatesTheDeviceOptions) {
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.device.gpu_memory_utilization = 0;
  EXPECT_EQ(Engine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace carpool::worker
