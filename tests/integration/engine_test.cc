// End-to-end engine tests: parity with an independent float64 model, batch invariance,
// preemption, prefix caching. Each test writes the checkpoints it needs.
#include "worker/engine.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "tests/testing/reference_llama.h"

namespace carpool {
namespace {

using worker::Completion;
using worker::Engine;
using worker::EngineOptions;
using worker::EngineRequest;
using worker::ModelConfig;


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

std::vector<int32_t> RandomTokens(std::mt19937* rng, int len, int vocab) {
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> t(len);
  for (auto& x : t) x = d(*rng);
  return t;
}

std::unique_ptr<Engine> MakeEngine(EngineOptions o) {
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// --- Parity with the float64 reference -------------------------------------------------------

struct ParityCase {
  const char* name;
  worker::DType dtype;
  bool tied;
  int num_kv_heads;
  const char* architecture;
  int num_shards;
};

void PrintTo(const ParityCase& p, std::ostream* os) { *os << p.name; }

class ParityTest : public ::testing::TestWithParam<ParityCase> {};

TEST_P(ParityTest, GreedyTokensAndLogprobsMatchFloat64Reference) {
  const ParityCase& p = GetParam();
  testing::ScratchDir dir("carpool_engine_test");
  testing::CheckpointSpec spec;
  spec.config = testing::TinyTestConfig();
  spec.config.architecture = p.architecture;
  spec.config.tie_word_embeddings = p.tied;
  spec.config.num_kv_heads = p.num_kv_heads;
  spec.config.attention_bias = std::string(p.architecture) == "Qwen2ForCausalLM";
  spec.dtype = p.dtype;
  spec.num_shards = p.num_shards;
  spec.seed = 42;
  auto tensors = testing::WriteCheckpoint(dir.path().string(), spec);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::map<std::string, std::vector<float>> values;
  for (auto& [name, t] : *tensors) values[name] = t.values;
  const testing::ReferenceLlama reference(spec.config, std::move(values));

  EngineOptions o;
  o.model = dir.path().string();
  o.block_size = 4;                           // sequences span many blocks
  o.scheduler.max_num_batched_tokens = 16;    // long prompts prefill in chunks
  o.scheduler.max_model_len = 128;
  auto engine = MakeEngine(o);
  ASSERT_NE(engine, nullptr);

  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts = {
      {1}, RandomTokens(&rng, 7, 300), RandomTokens(&rng, 40, 300)};
  std::vector<EngineRequest> requests;
  for (const auto& prompt : prompts) requests.push_back(Request(prompt, 10));
  auto results = engine->Generate(std::move(requests));
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    const auto expected = reference.Generate(prompts[i], 10, /*ignore_eos=*/true);
    EXPECT_EQ(results[i]->tokens, expected.tokens) << "prompt " << i;
    ASSERT_EQ(results[i]->logprobs.size(), expected.logprobs.size());
    for (size_t j = 0; j < expected.logprobs.size(); ++j) {
      EXPECT_NEAR(results[i]->logprobs[j].logprob, expected.logprobs[j], 1e-3)
          << "prompt " << i << " token " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoints, ParityTest,
    ::testing::Values(
        ParityCase{"F32Gqa", worker::DType::kF32, false, 2, "LlamaForCausalLM", 1},
        ParityCase{"Bf16TiedMha", worker::DType::kBF16, true, 4, "LlamaForCausalLM", 1},
        ParityCase{"F16MistralMqaSharded", worker::DType::kF16, false, 1, "MistralForCausalLM",
                   3},
        ParityCase{"Qwen2Bias", worker::DType::kF32, true, 2, "Qwen2ForCausalLM", 1}),
    [](const auto& info) { return std::string(info.param.name); });

// --- Batch invariance ------------------------------------------------------------------------

EngineOptions TinyOptions() {
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.scheduler.max_model_len = 512;
  return o;
}

std::vector<EngineRequest> MixedRequests(int n, float temperature) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> len(1, 120);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < n; ++i) {
    requests.push_back(Request(RandomTokens(&rng, len(rng), 258), 16, temperature, 1000 + i));
  }
  return requests;
}

class BatchInvarianceTest : public ::testing::TestWithParam<float> {};

TEST_P(BatchInvarianceTest, TogetherEqualsAlone) {
  const float temperature = GetParam();
  EngineOptions batched = TinyOptions();
  batched.scheduler.max_num_batched_tokens = 256;  // mixed chunked prefill and decode steps
  auto together = MakeEngine(batched)->Generate(MixedRequests(32, temperature));

  EngineOptions single = TinyOptions();
  single.enable_prefix_caching = false;
  auto engine = MakeEngine(single);
  std::vector<EngineRequest> requests = MixedRequests(32, temperature);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone = engine->Generate({requests[i]});
    ASSERT_TRUE(alone[0].ok() && together[i].ok());
    EXPECT_EQ(together[i]->tokens, alone[0]->tokens) << "prompt " << i;
    EXPECT_EQ(together[i]->tokens.size(), 16u);
  }
}

INSTANTIATE_TEST_SUITE_P(Sampling, BatchInvarianceTest, ::testing::Values(0.0f, 0.8f),
                         [](const auto& info) {
                           return info.param == 0 ? std::string("Greedy")
                                                  : std::string("Seeded");
                         });

// --- Preemption ------------------------------------------------------------------------------

TEST(EnginePreemptionTest, SmallPoolGivesSameOutputsAndFreesEveryBlock) {
  std::mt19937 rng(3);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 16; ++i) {
    requests.push_back(Request(RandomTokens(&rng, 20 + i, 258), 40, i % 2 ? 0.7f : 0.0f, i));
  }
  auto unconstrained = MakeEngine(TinyOptions())->Generate(requests);

  EngineOptions small = TinyOptions();
  small.num_kv_blocks = 12;  // 192 slots; the requests want ~16 x 68
  auto engine = MakeEngine(small);
  auto constrained = engine->Generate(requests);
  EXPECT_GT(engine->scheduler().num_preemptions(), 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(constrained[i].ok()) << constrained[i].status();
    EXPECT_EQ(constrained[i]->tokens, unconstrained[i]->tokens) << "request " << i;
  }
  EXPECT_EQ(engine->kv_cache().num_used_blocks(), 0);
  EXPECT_EQ(engine->kv_cache().num_free_blocks(), engine->kv_cache().num_blocks());
}

// Issue 16: batch-class sequences holding every slot step aside for an interactive one that
// arrives while they run, keeping their KV blocks; each output equals its request run alone.
TEST(EngineSuspensionTest, BatchSequencesStepAsideAndResumeWithTheirTokens) {
  std::mt19937 rng(5);
  std::vector<EngineRequest> requests = {Request(RandomTokens(&rng, 30, 258), 24),
                                         Request(RandomTokens(&rng, 41, 258), 24, 0.7f, 2),
                                         Request(RandomTokens(&rng, 25, 258), 8, 0.7f, 3)};
  requests[0].priority = requests[1].priority = Priority::kBatch;
  requests[2].priority = Priority::kInteractive;

  EngineOptions o = TinyOptions();
  o.scheduler.max_num_seqs = 2;
  auto engine = MakeEngine(o);
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::vector<int64_t> ids;
  const auto step = [&] {
    for (const worker::EngineEvent& e : engine->Step()) {
      if (e.has_token) tokens[e.seq_id].push_back(e.sample.token);
    }
  };
  for (int i : {0, 1}) ids.push_back(*engine->Add(requests[i]));
  for (int i = 0; i < 6; ++i) step();
  ids.push_back(*engine->Add(requests[2]));
  step();
  // The interactive request's prompt ran in the very next step, beside one batch sequence.
  EXPECT_EQ(tokens[ids[2]].size(), 1u);
  EXPECT_EQ(engine->scheduler().num_suspensions(), 1);
  while (engine->has_unfinished()) step();
  EXPECT_EQ(engine->scheduler().num_preemptions(), 0);

  EngineOptions single = TinyOptions();
  single.enable_prefix_caching = false;
  auto alone_engine = MakeEngine(single);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone = alone_engine->Generate({requests[i]});
    ASSERT_TRUE(alone[0].ok());
    EXPECT_EQ(tokens[ids[i]], alone[0]->tokens) << "request " << i;
  }
  EXPECT_EQ(engine->kv_cache().num_used_blocks(), 0);
}

// --- Prefix caching, static policy, validation -----------------------------------------------

TEST(EnginePrefixCacheTest, RepeatedPromptHitsCacheWithSameOutput) {
  auto engine = MakeEngine(TinyOptions());
  std::mt19937 rng(8);
  const std::vector<int32_t> prompt = RandomTokens(&rng, 70, 258);
  auto first = engine->Generate({Request(prompt, 8)});
  auto second = engine->Generate({Request(prompt, 8)});
  ASSERT_TRUE(first[0].ok() && second[0].ok());
  EXPECT_EQ(first[0]->cached_prompt_tokens, 0);
  EXPECT_EQ(second[0]->cached_prompt_tokens, 64);  // four full blocks of 16
  EXPECT_EQ(first[0]->tokens, second[0]->tokens);
}

TEST(EngineStaticPolicyTest, SameGreedyOutputsAsContinuous) {
  EngineOptions o = TinyOptions();
  o.scheduler.policy = worker::SchedulerPolicy::kStatic;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.static_batch_timeout_micros = 0;
  auto static_results = MakeEngine(o)->Generate(MixedRequests(10, 0));
  auto continuous = MakeEngine(TinyOptions())->Generate(MixedRequests(10, 0));
  for (size_t i = 0; i < static_results.size(); ++i) {
    ASSERT_TRUE(static_results[i].ok());
    EXPECT_EQ(static_results[i]->tokens, continuous[i]->tokens);
  }
}

TEST(EngineValidationTest, BadRequestsAreRejectedWithoutDisturbingOthers) {
  auto engine = MakeEngine(TinyOptions());
  std::vector<EngineRequest> requests;
  requests.push_back(Request({256, 5}, 4));
  requests.push_back(Request({}, 4));                       // empty prompt
  requests.push_back(Request({256, 258}, 4));               // id outside the vocabulary
  requests.push_back(Request(std::vector<int32_t>(600, 7), 4));  // longer than max_model_len
  EngineRequest bad_top_p = Request({256, 5}, 4);
  bad_top_p.sampling.top_p = 0;
  requests.push_back(bad_top_p);
  requests.push_back(Request({256, 6}, 4));
  auto results = engine->Generate(std::move(requests));
  EXPECT_TRUE(results[0].ok());
  EXPECT_THAT(results[1].status().message(), ::testing::HasSubstr("empty"));
  EXPECT_THAT(results[2].status().message(), ::testing::HasSubstr("vocabulary"));
  EXPECT_THAT(results[3].status().message(), ::testing::HasSubstr("max_model_len"));
  EXPECT_THAT(results[4].status().message(), ::testing::HasSubstr("top_p"));
  EXPECT_TRUE(results[5].ok());
  EXPECT_EQ(results[5]->tokens.size(), 4u);
  EXPECT_EQ(engine->kv_cache().num_used_blocks(), 0);
}

}  // namespace
}  // namespace carpool
