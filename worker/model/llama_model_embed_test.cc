// LlamaModel::Embed: parity with the float64 reference, batch invariance, input errors (refused
// before any collective under tensor parallelism), and that embeddings leave the generation KV
// pool alone. TP=2 against TP=1 is tests/integration/tp_equivalence_test.cc (under mpirun).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kernel_test_util.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/reference_llama.h"
#include "worker/engine.h"
#include "worker/model/llama_model.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

using ::testing::HasSubstr;


std::vector<int32_t> RandomTokens(std::mt19937* rng, int len, int vocab) {
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> t(len);
  for (auto& x : t) x = d(*rng);
  return t;
}

EmbeddingInput Input(std::vector<int32_t> tokens, Pooling pooling, bool normalize) {
  EmbeddingInput in;
  in.tokens = std::move(tokens);
  in.pooling = pooling;
  in.normalize = normalize;
  return in;
}

std::vector<const EmbeddingInput*> Pointers(const std::vector<EmbeddingInput>& inputs) {
  std::vector<const EmbeddingInput*> p;
  for (const EmbeddingInput& in : inputs) p.push_back(&in);
  return p;
}

// A checkpoint written once for the whole suite, with its reference model.
class EmbedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((std::filesystem::temp_directory_path() /
                            ("carpool_embed_test_" + std::to_string(::getpid())))
                               .string());
    testing::CheckpointSpec spec;
    spec.config = testing::TinyTestConfig();
    spec.seed = 7;
    auto tensors = testing::WriteCheckpoint(*dir_, spec);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    std::map<std::string, std::vector<float>> values;
    for (auto& [name, t] : *tensors) values[name] = t.values;
    reference_ = new testing::ReferenceLlama(spec.config, std::move(values));
  }
  static void TearDownTestSuite() {
    delete reference_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  std::unique_ptr<LlamaModel> MakeModel() {
    auto weights = LoadWeights(*dir_, TensorParallelRank{});
    EXPECT_TRUE(weights.ok()) << weights.status();
    if (!weights.ok()) return nullptr;
    auto model = LlamaModel::Create(std::move(*weights), KvCacheShape{4, 16}, nullptr,
                                    CreateCpuDevice(kernels::test_util::TestPool()));
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  static std::string* dir_;
  static testing::ReferenceLlama* reference_;
};

std::string* EmbedTest::dir_ = nullptr;
testing::ReferenceLlama* EmbedTest::reference_ = nullptr;

struct PoolingCase {
  const char* name;
  Pooling pooling;
  bool normalize;
};

void PrintTo(const PoolingCase& p, std::ostream* os) { *os << p.name; }

class EmbedParityTest : public EmbedTest, public ::testing::WithParamInterface<PoolingCase> {};

// fp32 through two layers against float64: the pooled values (|x| ~ 1) differ by at most
// ~5e-7 here (up to 130 tokens); 1e-5 leaves room for other vector widths.
TEST_P(EmbedParityTest, MatchesFloat64Reference) {
  const PoolingCase& p = GetParam();
  auto model = MakeModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(3);
  std::vector<EmbeddingInput> inputs;
  for (int len : {1, 2, 7, 40, 130}) {
    inputs.push_back(Input(RandomTokens(&rng, len, 300), p.pooling, p.normalize));
  }
  std::vector<std::vector<float>> out;
  ASSERT_TRUE(model->Embed(Pointers(inputs), &out).ok());
  ASSERT_EQ(out.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<double> expected =
        reference_->Embedding(inputs[i].tokens, p.pooling, p.normalize);
    ASSERT_EQ(out[i].size(), expected.size());
    double max_diff = 0.0, norm = 0.0;
    for (size_t j = 0; j < expected.size(); ++j) {
      max_diff = std::max(max_diff, std::abs(out[i][j] - expected[j]));
      norm += static_cast<double>(out[i][j]) * out[i][j];
    }
    EXPECT_LE(max_diff, 1e-5) << "input " << i << " (" << inputs[i].tokens.size() << " tokens)";
    if (p.normalize) {
      EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-5) << "input " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Pooling, EmbedParityTest,
                         ::testing::Values(PoolingCase{"Mean", Pooling::kMean, false},
                                           PoolingCase{"MeanNormalized", Pooling::kMean, true},
                                           PoolingCase{"Last", Pooling::kLast, false},
                                           PoolingCase{"LastNormalized", Pooling::kLast, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// 50 inputs of different lengths and poolings in one batch, in passes of a token budget, and
// one by one: the kernels are batch-invariant, so the results agree bit for bit (the contract
// asks for 1e-5).
TEST_F(EmbedTest, BatchedEqualsOneByOne) {
  auto model = MakeModel();
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> len(1, 90);
  std::vector<EmbeddingInput> inputs;
  for (int i = 0; i < 50; ++i) {
    inputs.push_back(Input(RandomTokens(&rng, len(rng), 300),
                           i % 3 == 0 ? Pooling::kLast : Pooling::kMean, i % 2 == 0));
  }
  std::vector<std::vector<float>> together, in_passes;
  ASSERT_TRUE(model->Embed(Pointers(inputs), &together).ok());
  ASSERT_TRUE(model->Embed(Pointers(inputs), &in_passes, /*max_tokens_per_pass=*/100).ok());
  ASSERT_EQ(together.size(), inputs.size());
  ASSERT_EQ(in_passes.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<float>> alone;
    const EmbeddingInput* one = &inputs[i];
    ASSERT_TRUE(model->Embed({&one, 1}, &alone).ok());
    ASSERT_EQ(alone.size(), 1u);
    ASSERT_EQ(together[i].size(), alone[0].size());
    double max_diff = 0.0;
    for (size_t j = 0; j < alone[0].size(); ++j) {
      max_diff = std::max<double>(max_diff, std::abs(together[i][j] - alone[0][j]));
      max_diff = std::max<double>(max_diff, std::abs(in_passes[i][j] - alone[0][j]));
    }
    EXPECT_LE(max_diff, 1e-5) << "input " << i;
    EXPECT_EQ(together[i], alone[0]) << "input " << i << " is not bit-identical";
  }
}

TEST_F(EmbedTest, RejectsEmptyAndOutOfVocabularyInputs) {
  auto model = MakeModel();
  ASSERT_NE(model, nullptr);
  std::vector<EmbeddingInput> inputs = {Input({5, 6}, Pooling::kMean, true),
                                        Input({}, Pooling::kMean, true)};
  std::vector<std::vector<float>> out;
  absl::Status s = model->Embed(Pointers(inputs), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("embedding input 1 is empty"));

  inputs[1] = Input({5, 300}, Pooling::kMean, true);
  s = model->Embed(Pointers(inputs), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("embedding input 1: token 1 has id 300"));

  inputs[1] = Input({-1}, Pooling::kMean, true);
  EXPECT_EQ(model->Embed(Pointers(inputs), &out).code(), absl::StatusCode::kInvalidArgument);

  inputs[1] = Input(std::vector<int32_t>(257, 5), Pooling::kMean, true);
  s = model->Embed(Pointers(inputs), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max_position_embeddings"));
}

// A group of two whose collectives never run: enough to construct either rank's model.
class IdleGroup : public cluster::Communicator {
 public:
  explicit IdleGroup(int rank) : rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  absl::Status AllReduceSum(float*, int64_t) override { return Unexpected(); }
  absl::Status AllGather(const float*, int64_t, float*) override { return Unexpected(); }
  absl::Status Gather(const float*, int64_t, float*, int) override { return Unexpected(); }
  absl::Status Broadcast(void*, int64_t, int, absl::Duration) override { return Unexpected(); }
  absl::Status Barrier() override { return Unexpected(); }
  absl::Duration timeout() const override { return absl::Seconds(1); }

 private:
  static absl::Status Unexpected() {
    ADD_FAILURE() << "Embed must refuse before any collective";
    return absl::InternalError("unexpected collective");
  }
  const int rank_;
};

std::unique_ptr<LlamaModel> RankModel(const std::string& dir, IdleGroup* group) {
  auto weights = LoadWeights(dir, TensorParallelRank{group->rank(), 2});
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return nullptr;
  auto model = LlamaModel::Create(std::move(*weights), KvCacheShape{4, 16}, group);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// A bad input is refused on the leader before its pass reaches the followers, so the group's
// collectives stay in step.
TEST_F(EmbedTest, LeaderRefusesBadInputsBeforeBroadcasting) {
  IdleGroup group(0);
  std::unique_ptr<LlamaModel> model = RankModel(*dir_, &group);
  ASSERT_NE(model, nullptr);
  const EmbeddingInput good = Input({5, 6, 7}, Pooling::kMean, true);
  const EmbeddingInput empty = Input({}, Pooling::kMean, true);
  const std::vector<const EmbeddingInput*> inputs = {&good, &empty};
  std::vector<std::vector<float>> out;
  const absl::Status s = model->Embed(inputs, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("input 1"));
}

// A follower embeds only as its leader's embed steps (LlamaModel::Follow).
TEST_F(EmbedTest, FollowerDoesNotEmbedOnItsOwn) {
  IdleGroup group(1);
  std::unique_ptr<LlamaModel> model = RankModel(*dir_, &group);
  ASSERT_NE(model, nullptr);
  const EmbeddingInput input = Input({5, 6, 7}, Pooling::kMean, true);
  const EmbeddingInput* one = &input;
  std::vector<std::vector<float>> out;
  const absl::Status s = model->Embed({&one, 1}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("follower"));
}

// Embeddings between generation steps change nothing in the generated tokens or logprobs:
// their keys and values never touch the KV pool, and the engine gives them no blocks.
TEST_F(EmbedTest, EmbeddingsBetweenStepsLeaveGenerationUnchanged) {
  EngineOptions o;
  o.model = *dir_;
  o.block_size = 4;
  o.num_kv_blocks = 64;
  o.scheduler.max_num_batched_tokens = 16;
  o.scheduler.max_model_len = 128;
  auto make_request = [] {
    EngineRequest r;
    r.prompt_tokens = {1, 17, 42, 99, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    r.sampling.max_tokens = 12;
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 1;
    return r;
  };
  auto plain = Engine::Create(o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<absl::StatusOr<Completion>> expected =
      (*plain)->Generate({make_request(), make_request()});

  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Add(make_request()).ok());
  ASSERT_TRUE((*engine)->Add(make_request()).ok());
  std::mt19937 rng(5);
  std::vector<EmbeddingInput> inputs;
  for (int len : {3, 33, 80})
    inputs.push_back(Input(RandomTokens(&rng, len, 300), Pooling::kMean, true));
  std::map<int64_t, std::vector<SampleResult>> got;
  while ((*engine)->has_unfinished()) {
    const int used = (*engine)->kv_cache().num_used_blocks();
    auto embeddings = (*engine)->Embed(Pointers(inputs));
    ASSERT_TRUE(embeddings.ok()) << embeddings.status();
    EXPECT_EQ((*engine)->kv_cache().num_used_blocks(), used);
    for (EngineEvent& e : (*engine)->Step()) {
      if (e.has_token) got[e.seq_id].push_back(e.sample);
    }
  }
  ASSERT_EQ(got.size(), 2u);
  int i = 0;
  for (const auto& [id, samples] : got) {
    ASSERT_TRUE(expected[i].ok());
    ASSERT_EQ(samples.size(), expected[i]->logprobs.size());
    for (size_t j = 0; j < samples.size(); ++j) {
      EXPECT_EQ(samples[j].token, expected[i]->logprobs[j].token);
      EXPECT_EQ(samples[j].logprob, expected[i]->logprobs[j].logprob);
    }
    ++i;
  }
}

TEST_F(EmbedTest, EngineRefusesInputsLongerThanMaxModelLen) {
  EngineOptions o;
  o.model = *dir_;
  o.num_kv_blocks = 16;
  o.scheduler.max_model_len = 32;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const EmbeddingInput input = Input(std::vector<int32_t>(33, 5), Pooling::kMean, true);
  const EmbeddingInput* one = &input;
  auto out = (*engine)->Embed({&one, 1});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("max_model_len"));
}

}  // namespace
}  // namespace carpool::worker
