// The engine's greedy generations against the float64 reference (reference_llama.h), as the
// parity tests of tests/integration run them: prompts around a sliding window, their requests
// (greedy, EOS ignored, the chosen token's logprob), the reference's continuation of each, and
// the comparison of what the engine returned with it.
#ifndef CARPOOL_TESTS_TESTING_REFERENCE_PARITY_H_
#define CARPOOL_TESTS_TESTING_REFERENCE_PARITY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/testing/reference_llama.h"
#include "worker/engine.h"

namespace carpool::testing {

// Prompts of 1, window - 1, window, window + 1 and 3 * window + 5 tokens, drawn from `rng`
// among 3 .. vocab_size - 1.
std::vector<std::vector<int32_t>> WindowPrompts(std::mt19937& rng, int vocab_size, int window);

// Engine::Create(options); a failure fails the running test and gives nullptr.
std::unique_ptr<worker::Engine> MakeEngine(const worker::EngineOptions& options);

class ReferenceParity {
 public:
  // `window`: what generation lengths are measured against (the sliding window, or a length of
  // the test's choosing where no layer slides). Logprobs must be within `logprob_tolerance`.
  ReferenceParity(ReferenceLlama reference, std::vector<std::vector<int32_t>> prompts, int window,
                  double logprob_tolerance);

  const ReferenceLlama& reference() const { return reference_; }
  const std::vector<std::vector<int32_t>>& prompts() const { return prompts_; }

  // Generations run past the window too: 2 windows + 3 tokens for even prompts, 6 for odd.
  int MaxTokens(size_t prompt) const { return prompt % 2 == 0 ? 2 * window_ + 3 : 6; }
  // One request per prompt, in order.
  std::vector<worker::EngineRequest> Requests() const;

  // The reference's greedy continuation of prompt i (computed once).
  const ReferenceLlama::Greedy& Expected(size_t prompt);

  // One completion per prompt, in order, against the reference: the same tokens, logprobs within
  // the tolerance. `what` names the run in failures.
  void ExpectMatches(const std::vector<absl::StatusOr<worker::Completion>>& got, const char* what);

 private:
  ReferenceLlama reference_;
  std::vector<std::vector<int32_t>> prompts_;
  int window_;
  double logprob_tolerance_;
  std::map<size_t, ReferenceLlama::Greedy> expected_;
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_REFERENCE_PARITY_H_
