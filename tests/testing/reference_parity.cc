#include "tests/testing/reference_parity.h"

#include <utility>

#include "gtest/gtest.h"

namespace carpool::testing {

std::vector<std::vector<int32_t>> WindowPrompts(std::mt19937& rng, int vocab_size, int window) {
  std::uniform_int_distribution<int32_t> token(3, vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {1, window - 1, window, window + 1, 3 * window + 5}) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = token(rng);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

std::unique_ptr<worker::Engine> MakeEngine(const worker::EngineOptions& options) {
  absl::StatusOr<std::unique_ptr<worker::Engine>> engine = worker::Engine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

ReferenceParity::ReferenceParity(ReferenceLlama reference,
                                 std::vector<std::vector<int32_t>> prompts, int window,
                                 double logprob_tolerance)
    : reference_(std::move(reference)),
      prompts_(std::move(prompts)),
      window_(window),
      logprob_tolerance_(logprob_tolerance) {}

std::vector<worker::EngineRequest> ReferenceParity::Requests() const {
  std::vector<worker::EngineRequest> requests;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    worker::EngineRequest r;
    r.prompt_tokens = prompts_[i];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = MaxTokens(i);
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 1;
    requests.push_back(std::move(r));
  }
  return requests;
}

const ReferenceLlama::Greedy& ReferenceParity::Expected(size_t prompt) {
  auto it = expected_.find(prompt);
  if (it == expected_.end()) {
    it = expected_
             .emplace(prompt, reference_.Generate(prompts_[prompt], MaxTokens(prompt),
                                                  /*ignore_eos=*/true))
             .first;
  }
  return it->second;
}

void ReferenceParity::ExpectMatches(const std::vector<absl::StatusOr<worker::Completion>>& got,
                                    const char* what) {
  ASSERT_EQ(got.size(), prompts_.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << what << ", request " << i << ": " << got[i].status();
    const ReferenceLlama::Greedy& want = Expected(i);
    EXPECT_EQ(got[i]->tokens, want.tokens) << what << ", request " << i;
    ASSERT_EQ(got[i]->logprobs.size(), want.logprobs.size()) << what << ", request " << i;
    for (size_t j = 0; j < want.logprobs.size(); ++j) {
      EXPECT_NEAR(got[i]->logprobs[j].logprob, want.logprobs[j], logprob_tolerance_)
          << what << ", request " << i << ", token " << j;
    }
  }
}

}  // namespace carpool::testing
