// The model on the CPU's bf16 and int8 weights and bf16 KV cache (issue 17), chosen through the
// engine's device options, on a written BF16 checkpoint of testing::TinyTestConfig():
//   - bf16 weights: each greedy token is the float64 reference's (tests/testing/
//     reference_llama.h, on the same bf16 values) except at near-ties (the reference's top-2
//     gap under 0.05), and its logprob is within kBf16Tolerance of the reference's; the fp32
//     engine on those values gives the same tokens, except past one of its own near-ties;
//   - int8 weights, teacher-forced over 64 sequences of 128 tokens: the mean |logprob - the
//     fp32 model's| of the next token is under 0.05 and the top-1 agrees at >= 97% of positions;
//   - for every weight and KV type: a request batched with others equals it alone, bit for bit;
//   - tensor parallelism (two ranks over threads): each rank packs or quantizes its own slices
//     and the group gives the whole model's answers in the same types;
//   - what the types change: the host's tensors released, the bytes a decode reads, the KV
//     blocks a --kv-cache-memory holds, what --dtype auto picks.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster/communicator.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kernel_test_util.h"
#include "kernels/cpu/linear_bf16.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "tests/testing/reference_llama.h"
#include "worker/engine.h"
#include "worker/model/llama_model.h"
#include "worker/mpi_worker.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

// A token the engine picks over the reference's best must be within this of it (logprob).
constexpr double kNearTie = 0.05;
// The bf16 kernel's logprobs against the reference on the same weights. On the AVX2 path with
// an fp32 KV cache the kernel multiplies the exact (widened) weights by fp32 activations, so
// only fp32 rounding separates them (the fp32 parity tests allow 1e-3); the avx512_bf16 path
// also rounds activations to bf16, and a bf16 cache rounds keys and values: the 2e-2.
constexpr double kExactBf16Tolerance = 1e-3;
constexpr double kBf16Tolerance = 2e-2;

std::vector<int32_t> RandomTokens(std::mt19937* rng, int len, int vocab) {
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> t(len);
  for (int32_t& x : t) x = d(*rng);
  return t;
}

EngineRequest Request(std::vector<int32_t> prompt, int max_tokens, float temperature = 0,
                      uint64_t seed = 0) {
  EngineRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = 2;
  if (temperature > 0) {
    r.sampling.has_seed = true;
    r.sampling.seed = seed;
  }
  return r;
}

std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// One weight type and KV type, as the flags set them.
struct Types {
  const char* name;
  std::optional<StorageType> dtype;
  Quantization quantization;
  std::optional<StorageType> kv;
};

void PrintTo(const Types& t, std::ostream* os) { *os << t.name; }

class DtypeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScratchDir("carpool_model_dtype_test");
    testing::CheckpointSpec spec;
    spec.config = testing::TinyTestConfig();
    spec.dtype = DType::kBF16;
    spec.seed = 23;
    absl::StatusOr<testing::CheckpointTensors> tensors =
        testing::WriteCheckpoint(dir_->path().string(), spec);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    reference_ = new testing::ReferenceLlama(spec.config, testing::RawValues(*tensors));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete dir_;
  }

  static EngineOptions Options(const Types& t) {
    EngineOptions o;
    o.model = dir_->path().string();
    o.block_size = 4;
    o.num_kv_blocks = 512;
    o.scheduler.max_num_batched_tokens = 16;  // long prompts prefill in chunks
    o.scheduler.max_model_len = 192;
    o.num_threads = 2;
    o.device.dtype = t.dtype;
    o.device.quantization = t.quantization;
    o.device.kv_cache_dtype = t.kv;
    return o;
  }

  static std::vector<std::vector<int32_t>> Prompts() {
    std::mt19937 rng(5);
    return {{1}, RandomTokens(&rng, 7, 300), RandomTokens(&rng, 40, 300),
            RandomTokens(&rng, 23, 300)};
  }

  static testing::ScratchDir* dir_;
  static testing::ReferenceLlama* reference_;
};

testing::ScratchDir* DtypeTest::dir_ = nullptr;
testing::ReferenceLlama* DtypeTest::reference_ = nullptr;

TEST_F(DtypeTest, Bf16WeightsFollowTheReferenceOnTheirValues) {
  for (const StorageType kv : {StorageType::kF32, StorageType::kBF16}) {
    SCOPED_TRACE(StorageTypeName(kv));
    std::unique_ptr<Engine> engine =
        MakeEngine(Options({"bf16", StorageType::kBF16, Quantization::kNone, kv}));
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->model().device().weight_type(), "bf16");
    EXPECT_EQ(engine->model().device().kv_storage_type(), kv);
    const bool exact =
        kv == StorageType::kF32 && std::string(kernels::cpu::LinearBf16Path()) != "avx512_bf16";
    const double tolerance = exact ? kExactBf16Tolerance : kBf16Tolerance;

    const std::vector<std::vector<int32_t>> prompts = Prompts();
    std::vector<EngineRequest> requests;
    for (const std::vector<int32_t>& p : prompts) requests.push_back(Request(p, 12));
    const std::vector<absl::StatusOr<Completion>> got = engine->Generate(std::move(requests));
    double worst = 0;
    int ties = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      // Teacher-forced on the engine's own tokens, so one near-tie does not end the comparison.
      std::vector<int32_t> context = prompts[i];
      for (size_t j = 0; j < got[i]->tokens.size(); ++j) {
        const int32_t token = got[i]->tokens[j];
        const std::vector<double> want = reference_->NextLogprobs(context);
        const int32_t best =
            static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
        if (token != best) {
          ++ties;
          EXPECT_LT(want[best] - want[token], kNearTie) << "prompt " << i << " token " << j;
        }
        const double error = std::abs(got[i]->logprobs[j].logprob - want[token]);
        worst = std::max(worst, error);
        EXPECT_LT(error, tolerance) << "prompt " << i << " token " << j;
        context.push_back(token);
      }
    }
    std::printf("bf16 weights, %s KV: worst logprob error %.2e (tolerance %.0e), %d near-ties\n",
                StorageTypeName(kv), worst, tolerance, ties);
  }
}

// The fp32 engine on the checkpoint's bf16 values (converted exactly at load): the same greedy
// tokens, until a step where the fp32 engine's own top two are within kNearTie.
TEST_F(DtypeTest, Bf16WeightsGiveTheFp32EnginesTokensExceptAtNearTies) {
  std::unique_ptr<Engine> fp32 =
      MakeEngine(Options({"fp32", StorageType::kF32, Quantization::kNone, StorageType::kF32}));
  ASSERT_NE(fp32, nullptr);
  EXPECT_EQ(fp32->model().device().weight_type(), "fp32");
  std::mt19937 rng(8);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(Request(RandomTokens(&rng, 5 + 9 * i, 300), 24));
  const std::vector<absl::StatusOr<Completion>> want = fp32->Generate(requests);
  for (const StorageType kv : {StorageType::kF32, StorageType::kBF16}) {
    SCOPED_TRACE(StorageTypeName(kv));
    std::unique_ptr<Engine> bf16 =
        MakeEngine(Options({"bf16", StorageType::kBF16, Quantization::kNone, kv}));
    ASSERT_NE(bf16, nullptr);
    const std::vector<absl::StatusOr<Completion>> got = bf16->Generate(requests);
    int same = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(got[i].ok() && want[i].ok());
      const std::vector<int32_t>& a = got[i]->tokens;
      const std::vector<int32_t>& b = want[i]->tokens;
      ASSERT_EQ(a.size(), b.size());
      const size_t j = std::mismatch(a.begin(), a.end(), b.begin()).first - a.begin();
      if (j == a.size()) {
        ++same;
        continue;
      }
      const std::vector<TokenLogprob>& top = want[i]->logprobs[j].top_logprobs;
      ASSERT_GE(top.size(), 2u);
      EXPECT_LT(top[0].logprob - top[1].logprob, kNearTie)
          << "request " << i << " differs at token " << j << " where fp32 is not near a tie";
    }
    std::printf("bf16 weights, %s KV: %d of %zu greedy sequences equal fp32's\n",
                StorageTypeName(kv), same, requests.size());
  }
}

// Teacher forcing: `sequences` (equal lengths) go through `model` one position per step, all
// together; returns, for every sequence and position p < L - 1, the log-softmax row of the
// logits after tokens [0, p], which predicts token p + 1.
std::vector<std::vector<std::vector<double>>> TeacherForced(
    LlamaModel* model, const std::vector<std::vector<int32_t>>& sequences) {
  const int block_size = model->kv_shape().block_size;
  const int len = static_cast<int>(sequences[0].size());
  const int per_seq = (len + block_size - 1) / block_size;
  const int vocab = model->config().vocab_size;
  std::vector<std::vector<std::vector<double>>> out(sequences.size());
  std::vector<float> logits;
  for (int p = 0; p + 1 < len; ++p) {
    StepPlan step;
    for (size_t i = 0; i < sequences.size(); ++i) {
      StepPlan::Seq s;
      s.seq_id = static_cast<int64_t>(i);
      s.start_position = p;
      s.num_tokens = 1;
      s.sample = true;
      for (int b = 0; b <= p / block_size; ++b) {
        s.block_table.push_back(static_cast<int32_t>(i) * per_seq + b);
      }
      step.seqs.push_back(std::move(s));
      step.token_ids.push_back(sequences[i][p]);
    }
    model->Forward(step, &logits);
    for (size_t i = 0; i < sequences.size(); ++i) {
      const float* row = logits.data() + static_cast<int64_t>(i) * vocab;
      double top = row[0];
      for (int v = 1; v < vocab; ++v) top = std::max(top, static_cast<double>(row[v]));
      double sum = 0;
      for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - top);
      std::vector<double> lp(vocab);
      for (int v = 0; v < vocab; ++v) lp[v] = row[v] - top - std::log(sum);
      out[i].push_back(std::move(lp));
    }
  }
  return out;
}

std::unique_ptr<LlamaModel> Model(const std::string& dir, const CpuDeviceOptions& device,
                                  int sequences, int len) {
  LoadOptions load;
  load.keep_bf16 = device.weights != WeightFormat::kF32;
  absl::StatusOr<std::unique_ptr<LlamaWeights>> w =
      LoadWeights(dir, TensorParallelRank{}, kernels::test_util::TestPool(), load);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  const int block_size = 16;
  absl::StatusOr<std::unique_ptr<LlamaModel>> m =
      LlamaModel::Create(std::move(*w), {sequences * ((len + 15) / 16), block_size}, nullptr,
                         CreateCpuDevice(device));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// The measure of int8 weights: 64 prompts of 128 tokens, teacher-forced. The sequences
// are the fp32 engine's own greedy continuations of random 16-token prompts, so they are what
// the model would say, not noise.
TEST_F(DtypeTest, Int8WeightsStayCloseToFp32TeacherForced) {
  constexpr int kSequences = 64, kLen = 128, kPrompt = 16;
  std::unique_ptr<Engine> fp32_engine =
      MakeEngine(Options({"fp32", StorageType::kF32, Quantization::kNone, StorageType::kF32}));
  ASSERT_NE(fp32_engine, nullptr);
  std::mt19937 rng(31);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < kSequences; ++i) {
    requests.push_back(Request(RandomTokens(&rng, kPrompt, 300), kLen - kPrompt));
  }
  std::vector<std::vector<int32_t>> sequences;
  for (absl::StatusOr<Completion>& c : fp32_engine->Generate(requests)) {
    ASSERT_TRUE(c.ok()) << c.status();
    sequences.push_back(requests[sequences.size()].prompt_tokens);
    sequences.back().insert(sequences.back().end(), c->tokens.begin(), c->tokens.end());
  }
  fp32_engine.reset();

  CpuDeviceOptions fp32;
  fp32.pool = kernels::test_util::TestPool();
  const std::string dir = dir_->path().string();
  std::unique_ptr<LlamaModel> base = Model(dir, fp32, kSequences, kLen);
  ASSERT_NE(base, nullptr);
  const auto want = TeacherForced(base.get(), sequences);
  base.reset();
  for (const StorageType kv : {StorageType::kBF16, StorageType::kF32}) {
    SCOPED_TRACE(StorageTypeName(kv));
    CpuDeviceOptions int8 = fp32;
    int8.weights = WeightFormat::kInt8;
    int8.kv_cache = kv;
    std::unique_ptr<LlamaModel> model = Model(dir, int8, kSequences, kLen);
    ASSERT_NE(model, nullptr);
    const auto got = TeacherForced(model.get(), sequences);
    double error = 0;
    int64_t agree = 0, positions = 0;
    for (int i = 0; i < kSequences; ++i) {
      for (int p = 0; p + 1 < kLen; ++p) {
        const std::vector<double>& a = got[i][p];
        const std::vector<double>& b = want[i][p];
        error += std::abs(a[sequences[i][p + 1]] - b[sequences[i][p + 1]]);
        agree += std::max_element(a.begin(), a.end()) - a.begin() ==
                 std::max_element(b.begin(), b.end()) - b.begin();
        ++positions;
      }
    }
    const double mean = error / positions;
    const double agreement = static_cast<double>(agree) / positions;
    std::printf("int8 weights, %s KV, %lld positions: mean |logprob error| %.4f, top-1 "
                "agreement %.2f%%\n",
                StorageTypeName(kv), static_cast<long long>(positions), mean, 100 * agreement);
    EXPECT_LT(mean, 0.05);
    EXPECT_GE(agreement, 0.97);
  }
}

// ---- batched equals alone, per type -----------------------------------------------------------

class DtypeBatchInvarianceTest : public DtypeTest,
                                 public ::testing::WithParamInterface<Types> {};

// Mixed prompt lengths with prefill chunks beside decodes, greedy and seeded: every token and
// logprob of a request batched equals the request alone, bit for bit.
TEST_P(DtypeBatchInvarianceTest, TogetherEqualsAlone) {
  const Types& types = GetParam();
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> len(1, 90);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 12; ++i) {
    requests.push_back(
        Request(RandomTokens(&rng, len(rng), 300), 10, i % 2 == 0 ? 0.0f : 0.8f, 1000 + i));
  }
  EngineOptions batched = Options(types);
  batched.scheduler.max_num_batched_tokens = 64;
  std::unique_ptr<Engine> together_engine = MakeEngine(batched);
  ASSERT_NE(together_engine, nullptr);
  const std::vector<absl::StatusOr<Completion>> together = together_engine->Generate(requests);

  EngineOptions single = Options(types);
  single.enable_prefix_caching = false;
  std::unique_ptr<Engine> engine = MakeEngine(single);
  ASSERT_NE(engine, nullptr);
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::vector<absl::StatusOr<Completion>> alone = engine->Generate({requests[i]});
    ASSERT_TRUE(alone[0].ok() && together[i].ok());
    EXPECT_EQ(together[i]->tokens, alone[0]->tokens) << "request " << i;
    ASSERT_EQ(together[i]->logprobs.size(), alone[0]->logprobs.size());
    for (size_t j = 0; j < alone[0]->logprobs.size(); ++j) {
      EXPECT_EQ(together[i]->logprobs[j].logprob, alone[0]->logprobs[j].logprob)
          << "request " << i << " token " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, DtypeBatchInvarianceTest,
    ::testing::Values(
        Types{"Fp32Bf16Kv", StorageType::kF32, Quantization::kNone, StorageType::kBF16},
        Types{"Bf16Fp32Kv", StorageType::kBF16, Quantization::kNone, StorageType::kF32},
        Types{"Bf16Bf16Kv", StorageType::kBF16, Quantization::kNone, StorageType::kBF16},
        Types{"Int8Fp32Kv", std::nullopt, Quantization::kInt8, StorageType::kF32},
        Types{"Int8Bf16Kv", std::nullopt, Quantization::kInt8, StorageType::kBF16}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- tensor parallelism ----------------------------------------------------------------------

// The ranks of one in-process group, one thread each: every collective is an exchange where
// each rank posts its buffer, waits for all, reads the others' (summing in rank order) and
// waits again before it leaves, so no buffer is reused while a peer still reads it.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), posted_(size) {}
  int size() const { return size_; }

  void Exchange(int rank, const void* mine,
                const std::function<void(const std::vector<const void*>&)>& read) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted_[rank] = mine;
    }
    Barrier();
    read(posted_);
    Barrier();
  }

  void Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<const void*> posted_;
};

class ThreadCommunicator : public cluster::Communicator {
 public:
  ThreadCommunicator(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduceSum(float* data, int64_t count) override {
    std::vector<float> sum(count, 0.0f);
    group_->Exchange(rank_, data, [&](const std::vector<const void*>& all) {
      for (const void* p : all) {
        for (int64_t i = 0; i < count; ++i) sum[i] += static_cast<const float*>(p)[i];
      }
    });
    std::copy(sum.begin(), sum.end(), data);
    return absl::OkStatus();
  }
  absl::Status AllGather(const float* send, int64_t count, float* recv) override {
    group_->Exchange(rank_, send, [&](const std::vector<const void*>& all) {
      for (size_t r = 0; r < all.size(); ++r) {
        std::memcpy(recv + r * count, all[r], count * sizeof(float));
      }
    });
    return absl::OkStatus();
  }
  absl::Status Gather(const float* send, int64_t count, float* recv, int root) override {
    if (rank_ == root) return AllGather(send, count, recv);
    group_->Exchange(rank_, send, [](const std::vector<const void*>&) {});
    return absl::OkStatus();
  }
  absl::Status Broadcast(void* data, int64_t bytes, int root, absl::Duration) override {
    group_->Exchange(rank_, data, [&](const std::vector<const void*>& all) {
      if (rank_ != root) std::memcpy(data, all[root], bytes);
    });
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    group_->Barrier();
    return absl::OkStatus();
  }
  absl::Duration timeout() const override { return absl::Seconds(60); }

 private:
  ThreadGroup* const group_;
  const int rank_;
};

// Two ranks, each packing or quantizing its own slices, against the whole model in the same
// types: bf16 slices are the whole model's values, so only the order of the sums over ranks
// differs (logprobs within kExactBf16Tolerance with an fp32 KV cache where activations stay
// fp32, kBf16Tolerance where the avx512_bf16 path rounds them); int8 column slices are
// quantized in groups of their own (a rank's part of o_proj is narrower than a group), so they
// are the int8 criterion's distance apart. Tokens equal but past a near-tie of the whole model.
TEST_F(DtypeTest, TensorParallelRanksPackTheirOwnSlices) {
  const std::vector<Types> cases = {
      {"bf16", StorageType::kBF16, Quantization::kNone, StorageType::kF32},
      {"int8", std::nullopt, Quantization::kInt8, StorageType::kBF16}};
  std::mt19937 rng(12);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(Request(RandomTokens(&rng, 4 + 11 * i, 300), 12));
  for (const Types& types : cases) {
    SCOPED_TRACE(types.name);
    std::unique_ptr<Engine> whole = MakeEngine(Options(types));
    ASSERT_NE(whole, nullptr);
    const std::vector<absl::StatusOr<Completion>> want = whole->Generate(requests);

    ThreadGroup group(2);
    ThreadCommunicator leader_comm(&group, 0), follower_comm(&group, 1);
    EngineOptions o = Options(types);
    o.num_threads = 1;
    std::thread follower([&] {
      EngineOptions fo = o;
      fo.tensor_parallel_group = &follower_comm;
      std::unique_ptr<Engine> engine = MakeEngine(fo);
      ASSERT_NE(engine, nullptr);
      EXPECT_TRUE(RunFollower(&engine->model(), &follower_comm).ok());
    });
    o.tensor_parallel_group = &leader_comm;
    std::unique_ptr<Engine> leader = MakeEngine(o);
    if (leader == nullptr) {
      follower.detach();  // its engine failed the same way; nothing runs on it
      return;
    }
    EXPECT_EQ(leader->model().device().weight_type(), whole->model().device().weight_type());
    EXPECT_EQ(leader->model().weights().ParameterBytes(), 0);  // released after packing
    const std::vector<absl::StatusOr<Completion>> got = leader->Generate(requests);
    EXPECT_TRUE(StopFollowers(&leader_comm).ok());
    follower.join();

    const bool bf16_activations =
        std::string(kernels::cpu::LinearBf16Path()) == "avx512_bf16";
    const double tolerance = types.quantization == Quantization::kInt8 ? 0.05
                             : bf16_activations                       ? kBf16Tolerance
                                                                      : kExactBf16Tolerance;
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(got[i].ok() && want[i].ok());
      for (size_t j = 0; j < want[i]->tokens.size(); ++j) {
        if (got[i]->tokens[j] != want[i]->tokens[j]) {
          const std::vector<TokenLogprob>& top = want[i]->logprobs[j].top_logprobs;
          EXPECT_LT(top[0].logprob - top[1].logprob, kNearTie)
              << "request " << i << " differs at token " << j << " away from a near-tie";
          break;
        }
        EXPECT_NEAR(got[i]->logprobs[j].logprob, want[i]->logprobs[j].logprob, tolerance)
            << "request " << i << " token " << j;
      }
    }
  }
}

// ---- what the types change --------------------------------------------------------------------

TEST_F(DtypeTest, PackedWeightsReleaseTheHostTensorsAndReadFewerBytes) {
  std::unique_ptr<Engine> fp32 =
      MakeEngine(Options({"fp32", StorageType::kF32, Quantization::kNone, std::nullopt}));
  std::unique_ptr<Engine> bf16 =
      MakeEngine(Options({"bf16", StorageType::kBF16, Quantization::kNone, std::nullopt}));
  std::unique_ptr<Engine> int8 =
      MakeEngine(Options({"int8", std::nullopt, Quantization::kInt8, std::nullopt}));
  ASSERT_TRUE(fp32 && bf16 && int8);
  // The fp32 device borrows the host's tensors; the others hold their own arrays (bf16 ones
  // used in place keep their part of the mapping alive themselves).
  EXPECT_GT(fp32->model().weights().ParameterBytes(), 0);
  EXPECT_EQ(bf16->model().weights().ParameterBytes(), 0);
  EXPECT_EQ(int8->model().weights().ParameterBytes(), 0);
  // --kv-cache-dtype auto follows the weights.
  EXPECT_EQ(fp32->model().device().kv_storage_type(), StorageType::kF32);
  EXPECT_EQ(bf16->model().device().kv_storage_type(), StorageType::kBF16);
  EXPECT_EQ(int8->model().device().kv_storage_type(), StorageType::kBF16);
  // Half, and a little over a quarter (a scale per group), of fp32's bytes; the norms stay fp32.
  const double f = static_cast<double>(fp32->model().DecodeWeightBytes());
  const double b = bf16->model().DecodeWeightBytes() / f;
  const double q = int8->model().DecodeWeightBytes() / f;
  EXPECT_GT(b, 0.5);
  EXPECT_LT(b, 0.52);
  EXPECT_GT(q, 0.25);
  EXPECT_LT(q, 0.32);
  // Released weights still compute.
  std::vector<absl::StatusOr<Completion>> r = int8->Generate({Request({1, 5, 9}, 4)});
  ASSERT_TRUE(r[0].ok()) << r[0].status();
  EXPECT_EQ(r[0]->tokens.size(), 4u);
}

TEST_F(DtypeTest, KvCacheMemoryHoldsTwiceTheBlocksInBf16) {
  EngineOptions o = Options({"fp32", StorageType::kF32, Quantization::kNone, StorageType::kF32});
  o.num_kv_blocks = 0;
  o.kv_cache_memory_bytes = int64_t{1} << 20;
  std::unique_ptr<Engine> fp32 = MakeEngine(o);
  o.device.kv_cache_dtype = StorageType::kBF16;
  std::unique_ptr<Engine> bf16 = MakeEngine(o);
  ASSERT_TRUE(fp32 && bf16);
  const ModelConfig& c = fp32->model_config();
  EXPECT_EQ(fp32->kv_cache().num_blocks(),
            o.kv_cache_memory_bytes / LlamaModel::KvBytesPerBlock(c, o.block_size));
  EXPECT_EQ(bf16->kv_cache().num_blocks(), 2 * fp32->kv_cache().num_blocks());
  EXPECT_EQ(bf16->model().kv_shape().num_blocks, bf16->kv_cache().num_blocks());
}

TEST_F(DtypeTest, AutoTakesABf16CheckpointAsBf16WhereThatIsFaster) {
  std::unique_ptr<Engine> checkpoint =
      MakeEngine(Options({"auto", std::nullopt, Quantization::kNone, std::nullopt}));
  ASSERT_NE(checkpoint, nullptr);
  const bool bf16 = CpuAutoDtypeIsBf16();
  EXPECT_EQ(bf16, std::string(kernels::cpu::LinearBf16Path()) != "portable");
  EXPECT_EQ(checkpoint->model().device().weight_type(), bf16 ? "bf16" : "fp32");
  EXPECT_EQ(checkpoint->model().device().kv_storage_type(),
            bf16 ? StorageType::kBF16 : StorageType::kF32);
  // A synthetic model is fp32, not a BF16 checkpoint.
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.num_kv_blocks = 16;
  o.device.dtype = std::nullopt;
  std::unique_ptr<Engine> synthetic = MakeEngine(o);
  ASSERT_NE(synthetic, nullptr);
  EXPECT_EQ(synthetic->model().device().weight_type(), "fp32");
  // An engine built in code without asking is fp32.
  EngineOptions in_code;
  EXPECT_EQ(in_code.device.dtype, StorageType::kF32);
  in_code.model = dir_->path().string();
  in_code.num_kv_blocks = 16;
  in_code.scheduler.max_model_len = 192;
  std::unique_ptr<Engine> plain = MakeEngine(in_code);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->model().device().weight_type(), "fp32");
  EXPECT_EQ(plain->model().device().kv_storage_type(), StorageType::kF32);
}

}  // namespace
}  // namespace carpool::worker
