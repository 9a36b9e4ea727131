#include "worker/sampler/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/sampler/philox.h"
#include "common/sampling_params.h"

namespace carpool::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Probabilities of softmax(logits / temperature), in double.
std::vector<double> Softmax(const std::vector<float>& logits, double temperature = 1.0) {
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((logits[i] - max) / temperature);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  std::vector<double> p = Softmax(logits);
  for (double& x : p) x = std::log(x);
  return p;
}

// Pearson's statistic of `counts` against `probs` (cells with zero probability must be empty).
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs) {
  int total = 0;
  for (int c : counts) total += c;
  double chi = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has zero probability";
      continue;
    }
    const double expected = total * probs[i];
    chi += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi;
}

std::vector<float> RandomLogits(int vocab, uint32_t seed, float scale = 5.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(gen);
  return logits;
}

SamplingParams Seeded(float temperature, uint64_t seed = 1234) {
  SamplingParams params;
  params.temperature = temperature;
  params.has_seed = true;
  params.seed = seed;
  return params;
}

class SamplerTest : public ::testing::Test {
 protected:
  SampleResult Sample(const std::vector<float>& logits, const SamplingParams& params,
                      int64_t position = 0, std::vector<int32_t> prompt = {},
                      std::vector<int32_t> output = {}) {
    Sampler sampler(static_cast<int>(logits.size()));
    SampleInput input;
    input.logits = logits.data();
    input.params = &params;
    input.prompt_tokens = prompt;
    input.output_tokens = output;
    input.position = position;
    return sampler.Sample(input);
  }

  // How often each token is drawn at positions [0, draws).
  std::vector<int> Histogram(const std::vector<float>& logits, const SamplingParams& params,
                             int draws) {
    Sampler sampler(static_cast<int>(logits.size()));
    std::vector<int> counts(logits.size(), 0);
    SampleInput input;
    input.logits = logits.data();
    input.params = &params;
    for (int pos = 0; pos < draws; ++pos) {
      input.position = pos;
      ++counts[sampler.Sample(input).token];
    }
    return counts;
  }
};

// ---------------------------------------------------------------------------- Philox

TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  EXPECT_THAT(Philox4x32({0, 0, 0, 0}, {0, 0}),
              ElementsAre(0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u));
  EXPECT_THAT(
      Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      ElementsAre(0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu));
  EXPECT_THAT(
      Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      ElementsAre(0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u));
}

TEST(PhiloxTest, CounterUniformUsesSeedAsKeyAndPositionAsCounter) {
  const uint64_t seed = 0x299f31d0a4093822ull;
  const uint64_t position = 0x85a308d3243f6a88ull;
  const std::array<uint32_t, 4> block =
      Philox4x32({0x243f6a88u, 0x85a308d3u, 0, 0}, {0xa4093822u, 0x299f31d0u});
  const uint64_t bits = (static_cast<uint64_t>(block[0]) << 32 | block[1]) >> 11;
  EXPECT_EQ(CounterUniform(seed, position), static_cast<double>(bits) / 9007199254740992.0);
}

TEST(PhiloxTest, CounterUniformIsUniformInUnitInterval) {
  double sum = 0.0;
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) {
    const double u = CounterUniform(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);  // sd of the mean ~ 0.0009
  EXPECT_EQ(CounterUniform(7, 3), CounterUniform(7, 3));
  EXPECT_NE(CounterUniform(7, 3), CounterUniform(8, 3));
  EXPECT_NE(CounterUniform(7, 3), CounterUniform(7, 4));
  EXPECT_NE(CounterUniform(7, 3), CounterUniform(7, 3 + (1ull << 32)));
  EXPECT_NE(CounterUniform(7, 3), CounterUniform(7 + (1ull << 32), 3));
}

// ---------------------------------------------------------------------------- Validate

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams().Validate(10).ok()); }

TEST(SamplingParamsTest, RejectsEachBadField) {
  struct Case {
    void (*mutate)(SamplingParams&);
    const char* message;
  };
  const Case cases[] = {
      {[](SamplingParams& p) { p.temperature = std::nanf(""); },
       "temperature must be >= 0 and finite, got nan"},
      {[](SamplingParams& p) { p.temperature = -0.5f; }, "temperature must be >= 0"},
      {[](SamplingParams& p) { p.temperature = std::numeric_limits<float>::infinity(); },
       "temperature must be >= 0 and finite, got inf"},
      {[](SamplingParams& p) { p.top_k = -2; }, "top_k must be >= -1"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p must be in (0, 1], got 0"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1], got 1.5"},
      {[](SamplingParams& p) { p.top_p = std::nanf(""); }, "top_p must be in (0, 1], got nan"},
      {[](SamplingParams& p) { p.min_p = -0.1f; }, "min_p must be in [0, 1]"},
      {[](SamplingParams& p) { p.min_p = 1.1f; }, "min_p must be in [0, 1]"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty must be > 0"},
      {[](SamplingParams& p) { p.repetition_penalty = std::nanf(""); },
       "repetition_penalty must be > 0 and finite, got nan"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty must be in [-2, 2]"},
      {[](SamplingParams& p) { p.frequency_penalty = -2.5f; },
       "frequency_penalty must be in [-2, 2]"},
      {[](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens must be >= 1, got 0"},
      {[](SamplingParams& p) { p.logprobs = 21; }, "logprobs must be in [0, 20], got 21"},
      {[](SamplingParams& p) { p.logprobs = -1; }, "logprobs must be in [0, 20], got -1"},
      {[](SamplingParams& p) {
         p.stop_token_ids = {3, 10};
       },
       "stop_token_ids must be in [0, 10), got 10"},
      {[](SamplingParams& p) { p.stop_token_ids = {-1}; }, "stop_token_ids must be in [0, 10)"},
  };
  for (const Case& c : cases) {
    SamplingParams params;
    c.mutate(params);
    const absl::Status status = params.Validate(10);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(SamplingParamsTest, AcceptsBoundaryValues) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_k = -1;
  params.top_p = 1.0f;
  params.min_p = 1.0f;
  params.presence_penalty = -2.0f;
  params.frequency_penalty = 2.0f;
  params.max_tokens = 1;
  params.logprobs = kMaxLogprobs;
  params.stop_token_ids = {0, 9};
  EXPECT_TRUE(params.Validate(10).ok());
}

// ---------------------------------------------------------------------------- logprobs, greedy

TEST_F(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  const std::vector<float> logits = RandomLogits(1000, 1);
  const int32_t argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(Sample(logits, Seeded(0.0f)).token, argmax);
  EXPECT_EQ(Sample({1.0f, 3.0f, 2.0f, 3.0f}, Seeded(0.0f)).token, 1);
}

TEST_F(SamplerTest, LogprobsMatchDoubleLogSoftmax) {
  const std::vector<float> logits = RandomLogits(5000, 2, 8.0f);
  const std::vector<double> expected = LogSoftmax(logits);
  SamplingParams params = Seeded(1.0f);
  params.logprobs = kMaxLogprobs;
  for (int pos = 0; pos < 20; ++pos) {
    const SampleResult result = Sample(logits, params, pos);
    EXPECT_NEAR(result.logprob, expected[result.token], 1e-5);
    ASSERT_EQ(result.top_logprobs.size(), static_cast<size_t>(kMaxLogprobs));
    for (const TokenLogprob& entry : result.top_logprobs) {
      EXPECT_NEAR(entry.logprob, expected[entry.token], 1e-5);
    }
  }
}

TEST_F(SamplerTest, TopLogprobsAreTheMostLikelyInOrderWithTiesByLowerId) {
  const std::vector<float> logits = {0.0f, 2.0f, 5.0f, 2.0f, -1.0f, 5.0f, 1.0f};
  SamplingParams params = Seeded(0.0f);
  params.logprobs = 4;
  const SampleResult result = Sample(logits, params);
  std::vector<int32_t> tokens;
  for (const TokenLogprob& entry : result.top_logprobs) tokens.push_back(entry.token);
  EXPECT_THAT(tokens, ElementsAre(2, 5, 1, 3));
  EXPECT_EQ(result.top_logprobs[0].logprob, result.top_logprobs[1].logprob);
  EXPECT_GT(result.top_logprobs[1].logprob, result.top_logprobs[2].logprob);

  params.logprobs = 0;
  EXPECT_TRUE(Sample(logits, params).top_logprobs.empty());
  params.logprobs = 20;  // more than the vocabulary: all of it
  EXPECT_EQ(Sample(logits, params).top_logprobs.size(), logits.size());
}

TEST_F(SamplerTest, LogprobsAreFromTheRawDistribution) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f};
  const std::vector<double> expected = LogSoftmax(logits);
  SamplingParams params = Seeded(0.3f);
  params.logprobs = 3;
  params.repetition_penalty = 3.0f;
  params.frequency_penalty = 2.0f;
  params.top_k = 1;
  const SampleResult result = Sample(logits, params, 0, {1}, {1, 1});
  EXPECT_EQ(result.token, 0);  // token 1 penalized below token 0
  EXPECT_NEAR(result.logprob, expected[0], 1e-6);
  EXPECT_EQ(result.top_logprobs[0].token, 1);
  EXPECT_NEAR(result.top_logprobs[0].logprob, expected[1], 1e-6);
}

// ---------------------------------------------------------------------------- penalties
// Each case brackets the penalty: greedy flips at one strength and not at a slightly weaker one.

TEST_F(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams params = Seeded(0.0f);
  // 2.0 / 1.5 = 1.33 < 1.5, but 2.0 / 1.2 = 1.67 > 1.5.
  params.repetition_penalty = 1.5f;
  EXPECT_EQ(Sample({2.0f, 1.5f}, params, 0, {0}).token, 1);
  params.repetition_penalty = 1.2f;
  EXPECT_EQ(Sample({2.0f, 1.5f}, params, 0, {0}).token, 0);
  // -1.0 * 1.5 = -1.5 < -1.4, but -1.0 * 1.3 = -1.3 > -1.4. Output tokens count too.
  params.repetition_penalty = 1.5f;
  EXPECT_EQ(Sample({-1.0f, -1.4f}, params, 0, {}, {0}).token, 1);
  params.repetition_penalty = 1.3f;
  EXPECT_EQ(Sample({-1.0f, -1.4f}, params, 0, {}, {0}).token, 0);
  // < 1 encourages repeats.
  params.repetition_penalty = 0.5f;
  EXPECT_EQ(Sample({1.0f, 1.5f}, params, 0, {0}).token, 0);
}

TEST_F(SamplerTest, RepetitionPenaltyAppliesOncePerDistinctToken) {
  SamplingParams params = Seeded(0.0f);
  params.repetition_penalty = 1.2f;  // once: 1.67 > 1.5; three times: 1.16 < 1.5
  EXPECT_EQ(Sample({2.0f, 1.5f}, params, 0, {0, 0}, {0, 0}).token, 0);
  // Only tokens in the history are touched: penalizing token 2 leaves 0 vs 1 alone.
  params.repetition_penalty = 10.0f;
  EXPECT_EQ(Sample({2.0f, 1.5f, 3.0f}, params, 0, {2}).token, 0);
}

TEST_F(SamplerTest, FrequencyPenaltyScalesWithOutputCountAndIgnoresPrompt) {
  SamplingParams params = Seeded(0.0f);
  params.frequency_penalty = 0.4f;  // 1.0 - 2 * 0.4 = 0.2 > 0
  EXPECT_EQ(Sample({1.0f, 0.0f}, params, 0, {}, {0, 0}).token, 0);
  params.frequency_penalty = 0.6f;  // 1.0 - 2 * 0.6 = -0.2 < 0
  EXPECT_EQ(Sample({1.0f, 0.0f}, params, 0, {}, {0, 0}).token, 1);
  params.frequency_penalty = 2.0f;  // prompt occurrences do not count
  EXPECT_EQ(Sample({1.0f, 0.0f}, params, 0, {0, 0, 0}, {1}).token, 0);
  params.frequency_penalty = -0.6f;  // negative rewards repeats
  EXPECT_EQ(Sample({0.0f, 1.0f}, params, 0, {}, {0, 0}).token, 0);
}

TEST_F(SamplerTest, PresencePenaltyAppliesOnceIfInOutput) {
  SamplingParams params = Seeded(0.0f);
  params.presence_penalty = 0.9f;  // once: 0.1 > 0, even with three occurrences
  EXPECT_EQ(Sample({1.0f, 0.0f}, params, 0, {}, {0, 0, 0}).token, 0);
  params.presence_penalty = 1.1f;
  EXPECT_EQ(Sample({1.0f, 0.0f}, params, 0, {}, {0}).token, 1);
  params.presence_penalty = 2.0f;  // the prompt does not count
  EXPECT_EQ(Sample({1.0f, 0.0f}, params, 0, {0}, {}).token, 0);
}

TEST_F(SamplerTest, PenaltiesDoNotLeakBetweenCalls) {
  Sampler sampler(2);
  SamplingParams params = Seeded(0.0f);
  params.frequency_penalty = 2.0f;
  params.repetition_penalty = 2.0f;
  const std::vector<float> logits = {1.0f, 0.0f};
  const std::vector<int32_t> output = {0, 0, 5, -1};  // out-of-vocab ids are ignored
  SampleInput input{logits.data(), &params, {}, output, 0};
  EXPECT_EQ(sampler.Sample(input).token, 1);
  input.output_tokens = {};
  EXPECT_EQ(sampler.Sample(input).token, 0);
}

// ---------------------------------------------------------------------------- truncation

TEST_F(SamplerTest, TopKOneIsGreedy) {
  SamplingParams params = Seeded(1.5f);
  params.top_k = 1;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = RandomLogits(3000, seed, 1.0f);
    const int32_t argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(Sample(logits, params, seed).token, argmax);
  }
}

TEST_F(SamplerTest, TopKEqualsMaskingAllButTheTopK) {
  std::vector<float> logits = RandomLogits(500, 3, 1.0f);
  SamplingParams params = Seeded(1.0f);
  params.top_k = 5;
  std::vector<float> masked(logits.size(), kNegInf);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  for (int i = 0; i < 5; ++i) masked[order[i]] = logits[order[i]];
  SamplingParams unlimited = Seeded(1.0f);
  for (int pos = 0; pos < 300; ++pos) {
    const int32_t token = Sample(logits, params, pos).token;
    EXPECT_EQ(token, Sample(masked, unlimited, pos).token) << pos;
    EXPECT_NE(masked[token], kNegInf);
  }
  // top_k at or above the vocabulary size, 0 and -1 all disable it.
  for (int top_k : {-1, 500, 1000}) {
    params.top_k = top_k;
    for (int pos = 0; pos < 50; ++pos) {
      EXPECT_EQ(Sample(logits, params, pos).token, Sample(logits, unlimited, pos).token);
    }
  }
}

TEST_F(SamplerTest, TinyTopPKeepsOnlyTheTopToken) {
  const std::vector<float> logits = {0.1f, 0.3f, 0.2f, 0.25f};
  SamplingParams params = Seeded(1.0f);
  params.top_p = 1e-6f;
  EXPECT_THAT(Histogram(logits, params, 500), ElementsAre(0, 500, 0, 0));
}

TEST_F(SamplerTest, TopPKeepsTheSmallestSetReachingTheMass) {
  // Probabilities 0.5, 0.3, 0.2 (as logs). 0.75 needs {0, 1}; 0.85 needs all three.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.5f), std::log(0.2f)};
  SamplingParams params = Seeded(1.0f);
  params.top_p = 0.75f;
  std::vector<int> counts = Histogram(logits, params, 8000);
  EXPECT_LT(ChiSquare(counts, {3.0 / 8, 5.0 / 8, 0.0}), 15.0);  // df 1; p < 1e-4
  params.top_p = 0.85f;
  counts = Histogram(logits, params, 8000);
  EXPECT_LT(ChiSquare(counts, {0.3, 0.5, 0.2}), 20.0);
}

TEST_F(SamplerTest, MinPDropsTokensBelowAFractionOfTheTop) {
  // Probabilities 0.4, 0.3, 0.15, 0.1, 0.05; min_p 0.3 cuts at 0.12, keeping the first three.
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.1f), std::log(0.05f)};
  SamplingParams params = Seeded(1.0f);
  params.min_p = 0.3f;
  const std::vector<int> counts = Histogram(logits, params, 10000);
  EXPECT_LT(ChiSquare(counts, {0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0.0, 0.0}), 20.0);
  params.min_p = 1.0f;
  EXPECT_THAT(Histogram(logits, params, 200), ElementsAre(200, 0, 0, 0, 0));
}

// ---------------------------------------------------------------------------- randomness

TEST_F(SamplerTest, SameSeedAndPositionGiveTheSameToken) {
  const std::vector<float> logits = RandomLogits(2000, 4, 1.0f);
  Sampler sampler(2000);
  SamplingParams params = Seeded(1.0f, 99);
  SampleInput input{logits.data(), &params, {}, {}, 17};
  const int32_t first = sampler.Sample(input).token;
  // Unrelated calls in between (different logits, params, positions) change nothing.
  const std::vector<float> other = RandomLogits(2000, 5, 3.0f);
  SamplingParams other_params = Seeded(0.7f, 3);
  other_params.top_p = 0.5f;
  other_params.top_k = 10;
  for (int pos = 0; pos < 10; ++pos) {
    sampler.Sample({other.data(), &other_params, {}, {}, pos});
  }
  EXPECT_EQ(sampler.Sample(input).token, first);
  EXPECT_EQ(Sample(logits, params, 17).token, first);

  // Different seeds give different streams.
  int differences = 0;
  SamplingParams other_seed = Seeded(1.0f, 100);
  for (int pos = 0; pos < 50; ++pos) {
    differences += Sample(logits, params, pos).token != Sample(logits, other_seed, pos).token;
  }
  EXPECT_GT(differences, 25);
}

TEST_F(SamplerTest, MissingSeedMeansSeedZero) {
  const std::vector<float> logits = RandomLogits(100, 6, 1.0f);
  SamplingParams unseeded;
  SamplingParams zero = Seeded(1.0f, 0);
  for (int pos = 0; pos < 50; ++pos) {
    EXPECT_EQ(Sample(logits, unseeded, pos).token, Sample(logits, zero, pos).token);
  }
}

TEST_F(SamplerTest, DrawsFollowTheSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
  const std::vector<int> counts = Histogram(logits, Seeded(1.0f), 20000);
  EXPECT_LT(ChiSquare(counts, Softmax(logits)), 25.0);  // df 4; p ~ 5e-5
}

TEST_F(SamplerTest, TemperatureSharpensOrFlattens) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
  const std::vector<int> cold = Histogram(logits, Seeded(0.5f), 20000);
  const std::vector<int> hot = Histogram(logits, Seeded(2.0f), 20000);
  EXPECT_LT(ChiSquare(cold, Softmax(logits, 0.5)), 25.0);
  EXPECT_LT(ChiSquare(hot, Softmax(logits, 2.0)), 25.0);
  EXPECT_GT(cold[2], hot[2]);
  EXPECT_LT(cold[3], hot[3]);
}

TEST_F(SamplerTest, LargeVocabularyNucleus) {
  constexpr int kVocab = 128 * 1024;
  const std::vector<float> logits = RandomLogits(kVocab, 7, 3.0f);
  const std::vector<double> probs = Softmax(logits);
  std::vector<int32_t> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
  std::vector<bool> in_nucleus(kVocab, false);
  double mass = 0.0;
  for (int32_t t : order) {
    in_nucleus[t] = true;
    mass += probs[t];
    if (mass >= 0.9) break;
  }
  SamplingParams params = Seeded(1.0f);
  params.top_p = 0.9f;
  Sampler sampler(kVocab);
  for (int pos = 0; pos < 100; ++pos) {
    const int32_t token = sampler.Sample({logits.data(), &params, {}, {}, pos}).token;
    EXPECT_TRUE(in_nucleus[token]) << token;
  }
}

// The pipeline written the obvious way: full sort, double precision.
int32_t ReferenceSample(const std::vector<float>& logits, const SamplingParams& params,
                        int64_t position) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  if (params.top_k > 0 && params.top_k < vocab) order.resize(params.top_k);
  const double max = logits[order[0]];
  std::vector<double> weights;
  double total = 0.0;
  for (int32_t t : order) {
    weights.push_back(std::exp((logits[t] - max) / params.temperature));
    total += weights.back();
  }
  size_t kept = order.size();
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
      mass += weights[i];
      if (mass >= params.top_p * total) {
        kept = i + 1;
        break;
      }
    }
  }
  while (kept > 1 && weights[kept - 1] < params.min_p) --kept;
  double kept_mass = 0.0;
  for (size_t i = 0; i < kept; ++i) kept_mass += weights[i];
  const double target = CounterUniform(params.seed, position) * kept_mass;
  double mass = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    mass += weights[i];
    if (mass > target) return order[i];
  }
  return order[kept - 1];
}

TEST_F(SamplerTest, MatchesSortingReference) {
  // Covers the heap and selection paths for top-k, the heavy/light split, top-p and min-p.
  // The sampler orders by float probability (then id) and sums floats in another order, so
  // two nearly tied tokens can swap places; only a few such near-tie swaps are tolerated.
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  const Case cases[] = {
      {1.0f, 0, 1.0f, 0.0f},    {0.7f, 0, 1.0f, 0.0f},     {1.0f, 0, 0.9f, 0.0f},
      {1.3f, 0, 0.5f, 0.0f},    {1.0f, 0, 1.0f, 0.02f},    {1.0f, 0, 0.95f, 1e-4f},
      {1.0f, 40, 1.0f, 0.0f},   {0.8f, 40, 0.8f, 0.0f},    {1.0f, 2000, 1.0f, 0.0f},
      {1.0f, 2000, 0.9f, 0.0f}, {1.0f, 2000, 0.9f, 0.01f}, {1.0f, 0, 0.2f, 0.5f},
  };
  int near_ties = 0;
  for (float scale : {0.5f, 2.0f, 5.0f}) {
    const std::vector<float> logits = RandomLogits(3000, 11, scale);
    Sampler sampler(3000);
    for (const Case& c : cases) {
      SamplingParams params = Seeded(c.temperature, 5);
      params.top_k = c.top_k;
      params.top_p = c.top_p;
      params.min_p = c.min_p;
      for (int pos = 0; pos < 100; ++pos) {
        const int32_t token = sampler.Sample({logits.data(), &params, {}, {}, pos}).token;
        const int32_t expected = ReferenceSample(logits, params, pos);
        if (token == expected) continue;
        ++near_ties;
        EXPECT_NEAR(logits[token], logits[expected], 1e-4f)
            << "scale " << scale << " T " << c.temperature << " k " << c.top_k << " p " << c.top_p
            << " min_p " << c.min_p << " pos " << pos;
      }
    }
  }
  EXPECT_LE(near_ties, 5);
}

TEST_F(SamplerTest, NanLogitsAreNeverChosenAndAllMaskedIsUniform) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int> counts = Histogram({nan, 0.0f, nan, 0.0f}, Seeded(1.0f), 400);
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_GT(counts[1], 100);
  EXPECT_GT(counts[3], 100);
  const std::vector<int> uniform = Histogram({kNegInf, kNegInf, kNegInf}, Seeded(1.0f), 3000);
  EXPECT_LT(ChiSquare(uniform, {1.0 / 3, 1.0 / 3, 1.0 / 3}), 20.0);
}

}  // namespace
}  // namespace carpool::worker
