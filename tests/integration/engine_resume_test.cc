// Resumed streams: a request that carries tokens already generated elsewhere continues exactly
// as the original engine would have (the router's failover relies on it).
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine.h"

namespace carpool {
namespace {

using ::testing::ElementsAreArray;
using worker::Completion;
using worker::Engine;
using worker::EngineOptions;
using worker::EngineRequest;

constexpr int kTotal = 20;
constexpr int kFirst = 8;

struct ResumeCase {
  const char* name;
  float temperature;
  uint64_t seed;
};

void PrintTo(const ResumeCase& c, std::ostream* os) { *os << c.name; }

class EngineResumeTest : public ::testing::TestWithParam<ResumeCase> {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.model = "synthetic:tiny";
    o.num_threads = 1;
    o.scheduler.max_model_len = 128;
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  // Penalties on the output tokens only (presence, frequency): output and prompt are not
  // interchangeable, so a resume that confused them would diverge.
  EngineRequest Request(int max_tokens) const {
    EngineRequest r;
    r.prompt_tokens = {256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};
    r.sampling.temperature = GetParam().temperature;
    r.sampling.has_seed = true;
    r.sampling.seed = GetParam().seed;
    r.sampling.presence_penalty = 1.5f;
    r.sampling.frequency_penalty = 0.7f;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 3;
    r.sampling.max_tokens = max_tokens;
    return r;
  }

  Completion Run(EngineRequest request) {
    std::vector<EngineRequest> batch;
    batch.push_back(std::move(request));
    auto results = engine_->Generate(std::move(batch));
    EXPECT_TRUE(results[0].ok()) << results[0].status();
    return results[0].ok() ? std::move(*results[0]) : Completion{};
  }

  std::unique_ptr<Engine> engine_;
};

TEST_P(EngineResumeTest, ResumedStreamContinuesExactly) {
  const Completion full = Run(Request(kTotal));
  ASSERT_EQ(full.tokens.size(), static_cast<size_t>(kTotal));
  const Completion first = Run(Request(kFirst));
  ASSERT_EQ(first.tokens.size(), static_cast<size_t>(kFirst));
  ASSERT_THAT(first.tokens, ElementsAreArray(full.tokens.begin(), full.tokens.begin() + kFirst));

  EngineRequest resume = Request(kTotal);
  resume.output_tokens = first.tokens;
  const Completion rest = Run(std::move(resume));
  EXPECT_THAT(rest.tokens, ElementsAreArray(full.tokens.begin() + kFirst, full.tokens.end()));
  EXPECT_EQ(rest.finish_reason, FinishReason::kLength);
  ASSERT_EQ(rest.logprobs.size(), static_cast<size_t>(kTotal - kFirst));
  for (int i = 0; i < kTotal - kFirst; ++i) {
    const SampleResult& want = full.logprobs[kFirst + i];
    const SampleResult& got = rest.logprobs[i];
    EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "token " << kFirst + i;
    ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size());
    for (size_t k = 0; k < want.top_logprobs.size(); ++k) {
      EXPECT_EQ(got.top_logprobs[k].token, want.top_logprobs[k].token);
    }
  }
}

// The control: the same tokens appended to the prompt instead give another continuation, so the
// test above would notice a resume that lost the output/prompt distinction.
TEST_P(EngineResumeTest, GeneratedTokensAreNotPromptTokens) {
  const Completion full = Run(Request(kTotal));
  EngineRequest as_prompt = Request(kTotal - kFirst);
  as_prompt.prompt_tokens.insert(as_prompt.prompt_tokens.end(), full.tokens.begin(),
                                 full.tokens.begin() + kFirst);
  const Completion other = Run(std::move(as_prompt));
  EXPECT_NE(other.tokens, std::vector<int32_t>(full.tokens.begin() + kFirst, full.tokens.end()));
}

INSTANTIATE_TEST_SUITE_P(Sampling, EngineResumeTest,
                         ::testing::Values(ResumeCase{"greedy", 0.0f, 0},
                                           ResumeCase{"seeded_temperature_0_8", 0.8f, 1234}),
                         [](const auto& info) { return std::string(info.param.name); });

class EngineResumeValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.model = "synthetic:tiny";
    o.num_threads = 1;
    o.scheduler.max_model_len = 64;
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }
  EngineRequest Request() const {
    EngineRequest r;
    r.prompt_tokens = {1, 2, 3, 4};
    r.output_tokens = {5, 6};
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 4;
    return r;
  }
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineResumeValidationTest, AcceptsOutputShorterThanMaxTokens) {
  EXPECT_TRUE(engine_->ValidateRequest(Request()).ok());
}

TEST_F(EngineResumeValidationTest, RejectsOutputThatLeavesNothingToGenerate) {
  EngineRequest r = Request();
  r.sampling.max_tokens = 2;
  const absl::Status s = engine_->ValidateRequest(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("max_tokens"));
}

TEST_F(EngineResumeValidationTest, RejectsOutputTokenOutsideVocabulary) {
  EngineRequest r = Request();
  r.output_tokens[1] = 258;
  const absl::Status s = engine_->ValidateRequest(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("output token 1"));
}

TEST_F(EngineResumeValidationTest, MaxTokensCountsTheGeneratedTokensAgainstMaxModelLen) {
  EngineRequest r = Request();
  r.prompt_tokens.assign(60, 7);
  r.sampling.max_tokens = 5;  // 60 + 5 > 64, although only 3 are left to generate
  EXPECT_EQ(engine_->ValidateRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.sampling.max_tokens = 4;
  EXPECT_TRUE(engine_->ValidateRequest(r).ok());
}

}  // namespace
}  // namespace carpool
