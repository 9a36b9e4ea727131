// DeviceSamplingRows (the host side of the CUDA sampler's rows) on the CPU: the penalty entries
// it lists for hand-made requests, and, over random rows of every mode, that applying its
// entries as the CUDA kernel does (sampling.cu's Penalize, emulated here with the same fma) and
// sampling the result without penalties gives the token worker::Sampler gives with them.
#include "worker/model/device_sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/sampler/sampler.h"

namespace carpool::worker {
namespace {

namespace kc = kernels::cuda;

std::vector<std::pair<int32_t, int32_t>> Entries(const DeviceSamplingRows& rows, int r) {
  const kc::SamplingRow& row = rows.rows()[r];
  std::vector<std::pair<int32_t, int32_t>> out;
  for (int i = 0; i < row.num_penalty_tokens; ++i) {
    const kc::PenaltyToken& e = rows.penalties()[row.penalty_begin + i];
    out.emplace_back(e.token, e.count);
  }
  return out;
}

TEST(DeviceSamplingRowsTest, ListsWhatThePenaltiesTouch) {
  const int vocab = 50;
  SamplingParams plain;
  plain.temperature = 0.5f;
  plain.top_k = 7;
  plain.top_p = 0.8f;
  plain.min_p = 0.1f;
  plain.logprobs = 3;  // no seed: 0, as on the CPU
  SamplingParams all;
  all.has_seed = true;
  all.seed = 99;
  all.repetition_penalty = 1.2f;
  all.frequency_penalty = 0.5f;
  all.presence_penalty = -0.25f;
  SamplingParams frequency_only;
  frequency_only.frequency_penalty = 1.0f;
  SamplingParams repetition_only;
  repetition_only.repetition_penalty = 0.9f;

  const std::vector<int32_t> prompt = {3, 7, 7, 1, 60, 5};
  const std::vector<int32_t> output = {5, 3, 5, -1, 9, 5};
  const std::vector<int32_t> none;
  std::vector<SampleRequest> requests = {
      {&plain, prompt, output, 12},          // no penalties: no entries
      {&all, prompt, output, 13},            // outputs with counts, then prompt-only tokens
      {&frequency_only, prompt, none, 6},    // frequency without output: nothing to touch
      {&frequency_only, prompt, output, 9},  // outputs only (no repetition: prompt untouched)
      {&repetition_only, prompt, none, 6},   // the prompt's distinct tokens
  };
  DeviceSamplingRows rows;
  for (int pass = 0; pass < 2; ++pass) {  // the same again: the scratch counts were reset
    SCOPED_TRACE("pass " + std::to_string(pass));
    rows.Pack(requests, vocab);
    ASSERT_EQ(rows.rows().size(), requests.size());
    const kc::SamplingRow& p = rows.rows()[0];
    EXPECT_EQ(p.seed, 0u);
    EXPECT_EQ(p.position, 12);
    EXPECT_EQ(p.temperature, 0.5f);
    EXPECT_EQ(p.top_k, 7);
    EXPECT_EQ(p.top_p, 0.8f);
    EXPECT_EQ(p.min_p, 0.1f);
    EXPECT_EQ(p.num_top_logprobs, 3);
    EXPECT_EQ(p.num_penalty_tokens, 0);
    EXPECT_EQ(rows.rows()[1].seed, 99u);
    EXPECT_EQ(rows.rows()[1].repetition_penalty, 1.2f);
    EXPECT_EQ(rows.rows()[1].frequency_penalty, 0.5f);
    EXPECT_EQ(rows.rows()[1].presence_penalty, -0.25f);
    using E = std::vector<std::pair<int32_t, int32_t>>;
    EXPECT_EQ(Entries(rows, 1), (E{{5, 3}, {3, 1}, {9, 1}, {7, 0}, {1, 0}}));
    EXPECT_EQ(Entries(rows, 2), E{});
    EXPECT_EQ(Entries(rows, 3), (E{{5, 3}, {3, 1}, {9, 1}}));
    EXPECT_EQ(Entries(rows, 4), (E{{3, 0}, {7, 0}, {1, 0}, {5, 0}}));
    EXPECT_EQ(rows.num_penalized(), 3);
    EXPECT_EQ(rows.rows()[1].penalized_row, 0);
    EXPECT_EQ(rows.rows()[3].penalized_row, 1);
    EXPECT_EQ(rows.rows()[4].penalized_row, 2);
  }
}

TEST(DeviceSamplingRowsTest, ResultsKeepTheRequestedTopLogprobs) {
  kc::SampledToken t;
  t.token = 4;
  t.logprob = -0.5f;
  for (int i = 0; i < kc::kMaxTopLogprobs; ++i) {
    t.top_tokens[i] = 100 + i;
    t.top_logprobs[i] = -1.0f - i;
  }
  const SampleResult r = ToSampleResult(t, 2);
  EXPECT_EQ(r.token, 4);
  EXPECT_EQ(r.logprob, -0.5f);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[1].token, 101);
  EXPECT_EQ(r.top_logprobs[1].logprob, -2.0f);
  EXPECT_TRUE(ToSampleResult(t, 0).top_logprobs.empty());
}

// sampling.cu's SampleKernel steps 1-2 on the host: the sanitized row, then each entry.
std::vector<float> PenalizeLikeTheKernel(const float* logits, int vocab, const kc::SamplingRow& p,
                                         const std::vector<kc::PenaltyToken>& entries) {
  constexpr float kMax = std::numeric_limits<float>::max();
  std::vector<float> row(vocab);
  bool all_masked = true;
  for (int i = 0; i < vocab; ++i) {
    row[i] = std::isnan(logits[i]) ? -INFINITY : std::min(logits[i], kMax);
    all_masked = all_masked && row[i] == -INFINITY;
  }
  if (all_masked) std::fill(row.begin(), row.end(), 0.0f);
  for (int j = 0; j < p.num_penalty_tokens; ++j) {
    const kc::PenaltyToken& e = entries[p.penalty_begin + j];
    float v = row[e.token];
    if (p.repetition_penalty != 1.0f) {
      v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
    if (e.count > 0) {
      v = std::fma(-p.frequency_penalty, static_cast<float>(e.count), v);
      v = v - p.presence_penalty;
    }
    row[e.token] = kMax < v ? kMax : v;
  }
  return row;
}

TEST(DeviceSamplingRowsTest, KernelRuleOnTheEntriesGivesTheCpuSamplersTokens) {
  const int vocab = 500;
  const int num_rows = 600;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> logit(-3.0f, 3.0f);
  std::uniform_int_distribution<int> len(0, 40);
  std::uniform_int_distribution<int> token(0, 60);  // histories repeat tokens
  std::vector<float> logits(static_cast<size_t>(num_rows) * vocab);
  for (float& l : logits) l = logit(rng);
  std::vector<SamplingParams> params(num_rows);
  std::vector<std::vector<int32_t>> prompts(num_rows), outputs(num_rows);
  std::vector<SampleRequest> requests(num_rows);
  for (int r = 0; r < num_rows; ++r) {
    float* row = &logits[static_cast<size_t>(r) * vocab];
    for (int j = 0; j < 6; ++j) row[token(rng)] += 4.0f;  // the history's tokens are likely
    if (r % 50 == 7) row[3] = std::numeric_limits<float>::quiet_NaN();
    if (r % 50 == 8) row[4] = INFINITY;
    if (r % 50 == 9) std::fill(row, row + vocab, -INFINITY);
    SamplingParams& q = params[r];
    q.has_seed = true;
    q.seed = 500 + r;
    switch (r % 6) {
      case 0:
        q.temperature = 0.0f;
        break;
      case 1:
        q.temperature = 0.8f;
        break;
      case 2:
        q.top_k = 10;
        break;
      case 3:
        q.top_p = 0.6f;
        break;
      case 4:
        q.min_p = 0.05f;
        q.temperature = 1.3f;
        break;
      default:
        q.top_k = 30;
        q.top_p = 0.9f;
        break;
    }
    switch ((r / 6) % 5) {
      case 0:
        q.repetition_penalty = 1.4f;
        break;
      case 1:
        q.frequency_penalty = 0.9f;
        break;
      case 2:
        q.presence_penalty = 1.5f;
        break;
      case 3:
        q.repetition_penalty = 0.6f;
        q.frequency_penalty = -1.1f;
        q.presence_penalty = 0.3f;
        break;
      default:
        q.repetition_penalty = 1.1f;
        q.frequency_penalty = 2.0f;
        q.presence_penalty = -2.0f;
        break;
    }
    for (int j = len(rng); j > 0; --j) prompts[r].push_back(token(rng));
    for (int j = len(rng); j > 0; --j) outputs[r].push_back(token(rng));
    requests[r] = {&q, prompts[r], outputs[r], 1000 + r};
  }
  DeviceSamplingRows rows;
  rows.Pack(requests, vocab);
  Sampler sampler(vocab);
  int penalized = 0;
  for (int r = 0; r < num_rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const float* raw = &logits[static_cast<size_t>(r) * vocab];
    SampleInput with;
    with.logits = raw;
    with.params = &params[r];
    with.prompt_tokens = prompts[r];
    with.output_tokens = outputs[r];
    with.position = requests[r].position;
    const int32_t want = sampler.Sample(with).token;

    const kc::SamplingRow& p = rows.rows()[r];
    penalized += p.num_penalty_tokens > 0;
    const std::vector<float> copy = PenalizeLikeTheKernel(raw, vocab, p, rows.penalties());
    SamplingParams without = params[r];
    without.repetition_penalty = 1.0f;
    without.frequency_penalty = 0.0f;
    without.presence_penalty = 0.0f;
    SampleInput in;
    in.logits = copy.data();
    in.params = &without;
    in.position = p.position;
    EXPECT_EQ(sampler.Sample(in).token, want);
  }
  EXPECT_GT(penalized, num_rows / 2);
}

}  // namespace
}  // namespace carpool::worker
