// The KV cache's sliding-window release through the real engine (CPU): a Mistral checkpoint,
// whose every layer slides, computes as the float64 reference while its blocks behind the
// window go back to the pool (the attention kernels never read them), through chunked prefill
// across the window boundary, prefix hits on released blocks and preemption; a model whose
// layers only partly slide keeps every block.
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "tests/testing/reference_llama.h"
#include "worker/engine.h"

namespace carpool::worker {
namespace {

constexpr int kWindow = 8;
constexpr int kBlockSize = 4;

EngineRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = 1;
  return r;
}

std::vector<int32_t> RandomTokens(std::mt19937* rng, int len) {
  std::uniform_int_distribution<int32_t> d(3, 299);
  std::vector<int32_t> t(len);
  for (auto& x : t) x = d(*rng);
  return t;
}

// A Mistral checkpoint of the small test model with a window of kWindow on every layer, and
// the reference that computes it.
class SlidingEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::CheckpointSpec spec;
    spec.config = testing::TinyTestConfig();
    spec.config.architecture = "MistralForCausalLM";
    spec.config.sliding_window = kWindow;
    spec.seed = 7;
    auto tensors = testing::WriteCheckpoint(dir_.path().string(), spec);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    std::map<std::string, std::vector<float>> values;
    for (auto& [name, t] : *tensors) values[name] = t.values;
    reference_ = std::make_unique<testing::ReferenceLlama>(spec.config, std::move(values));
  }

  EngineOptions Options(int num_kv_blocks) const {
    EngineOptions o;
    o.model = dir_.path().string();
    o.block_size = kBlockSize;
    o.num_kv_blocks = num_kv_blocks;
    o.scheduler.max_model_len = 128;
    o.scheduler.max_num_batched_tokens = 16;
    return o;
  }

  void ExpectReference(const std::vector<int32_t>& prompt, const Completion& got) const {
    const auto want = reference_->Generate(prompt, static_cast<int>(got.tokens.size()), true);
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    for (size_t j = 0; j < want.logprobs.size(); ++j) {
      EXPECT_NEAR(got.logprobs[j].logprob, want.logprobs[j], 1e-4) << "token " << j;
    }
  }

  testing::ScratchDir dir_{"carpool_sliding_engine_test"};
  std::unique_ptr<testing::ReferenceLlama> reference_;
};

TEST_F(SlidingEngineTest, FourWindowGenerationHoldsAtMostTheWindow) {
  // The pool holds exactly the bound: window / block_size + 2 blocks. The generation's 36
  // computed tokens would take 9 kept whole. Admission counts what a chunk and its window need
  // at once (KvCacheManager::PeakBlocks), so chunks here are of at most 4 tokens.
  constexpr int kBound = kWindow / kBlockSize + 2;
  EngineOptions o = Options(kBound);
  o.scheduler.max_num_batched_tokens = 4;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->kv_cache().sliding_window(), kWindow);
  std::mt19937 rng(1);
  const std::vector<int32_t> prompt = RandomTokens(&rng, 5);
  ASSERT_TRUE((*engine)->Add(Greedy(prompt, 4 * kWindow)).ok());
  std::shared_ptr<Completion> done;
  int steps = 0;
  while ((*engine)->has_unfinished()) {
    for (EngineEvent& e : (*engine)->Step()) {
      if (e.finished) done = e.completion;
    }
    ASSERT_LE((*engine)->kv_cache().num_used_blocks(), kBound) << "step " << steps;
    ASSERT_LT(++steps, 1000);
  }
  ASSERT_NE(done, nullptr);
  EXPECT_EQ(done->tokens.size(), 4u * kWindow);
  EXPECT_EQ((*engine)->scheduler().num_preemptions(), 0);
  ExpectReference(prompt, *done);
  EXPECT_EQ((*engine)->kv_cache().num_used_blocks(), 0);
}

// Prompts of 30 tokens, the first 20 shared, that prefill in chunks of 6 across the window
// boundary.
std::vector<std::vector<int32_t>> SharedPrefixPrompts(int n) {
  std::mt19937 rng(2);
  const std::vector<int32_t> shared = RandomTokens(&rng, 20);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt = shared;
    for (int32_t t : RandomTokens(&rng, 10)) prompt.push_back(t);
    prompts.push_back(prompt);
  }
  return prompts;
}

TEST_F(SlidingEngineTest, PrefixHitsOnReleasedBlocksMatchTheReference) {
  // The pool holds the first sequence's 11 blocks, so the ones its window released are still
  // cached (evictable) when the others look up the shared prefix.
  EngineOptions o = Options(16);
  o.scheduler.max_num_batched_tokens = 6;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto prompts = SharedPrefixPrompts(4);
  auto first = (*engine)->Generate({Greedy(prompts[0], 12)});
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  ExpectReference(prompts[0], *first[0]);
  std::vector<EngineRequest> rest;
  for (int i = 1; i < 4; ++i) rest.push_back(Greedy(prompts[i], 12));
  auto results = (*engine)->Generate(std::move(rest));
  for (int i = 1; i < 4; ++i) {
    ASSERT_TRUE(results[i - 1].ok()) << results[i - 1].status();
    SCOPED_TRACE(i);
    ExpectReference(prompts[i], *results[i - 1]);
  }
  // The shared 20 tokens fill 5 blocks: each of the three finds them cached, and adopts only
  // the two its window (from position 20 - 7) reaches.
  EXPECT_EQ(results[0]->cached_prompt_tokens, 20);
  EXPECT_EQ((*engine)->kv_cache().prefix_cache_hits(), 3 * 20);
  EXPECT_EQ((*engine)->kv_cache().num_used_blocks(), 0);
}

TEST_F(SlidingEngineTest, PreemptedSequencesRecomputeAsTheReference) {
  // Each sequence holds up to 5 blocks while prefilling and 3 while decoding: three do not fit
  // in 7 at once.
  EngineOptions o = Options(7);
  o.scheduler.max_num_batched_tokens = 6;
  o.enable_prefix_caching = false;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto prompts = SharedPrefixPrompts(3);
  std::vector<EngineRequest> requests;
  for (const auto& prompt : prompts) requests.push_back(Greedy(prompt, 20));
  auto results = (*engine)->Generate(std::move(requests));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    SCOPED_TRACE(i);
    ExpectReference(prompts[i], *results[i]);
  }
  EXPECT_GT((*engine)->scheduler().num_preemptions(), 0);
  EXPECT_EQ((*engine)->kv_cache().num_used_blocks(), 0);
}

TEST(SlidingMixedEngineTest, PartlySlidingModelKeepsEveryBlock) {
  // gemma3-tiny: local and global layers share one block table, and the global ones read every
  // position.
  EngineOptions o;
  o.model = "synthetic:gemma3-tiny";
  o.block_size = kBlockSize;
  o.num_kv_blocks = 64;
  o.scheduler.max_model_len = 128;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_GT((*engine)->model_config().sliding_window, 0);
  EXPECT_EQ((*engine)->kv_cache().sliding_window(), 0);
  ASSERT_TRUE((*engine)->Add(Greedy({5, 6, 7}, 40)).ok());
  int most = 0;
  while ((*engine)->has_unfinished()) {
    (*engine)->Step();
    most = std::max(most, (*engine)->kv_cache().num_used_blocks());
  }
  EXPECT_EQ(most, (3 + 40 - 1 + kBlockSize - 1) / kBlockSize);  // every computed token's block
}

}  // namespace
}  // namespace carpool::worker
