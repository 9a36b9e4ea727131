// What the engine's CPU tests of its step modes share (worker/engine_async_test.cc,
// worker/engine_device_sampling_test.cc): parsing the engine's flags, and comparing two runs'
// completions request by request. Header-only: the tests link carpool_engine.
#ifndef CARPOOL_TESTS_TESTING_ENGINE_CHECKS_H_
#define CARPOOL_TESTS_TESTING_ENGINE_CHECKS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "worker/engine.h"
#include "worker/engine_flags.h"

namespace carpool::testing {

// RegisterEngineFlags into a fresh parser, then parses `args` (as after the program's name) into
// *options.
inline absl::Status ParseEngineFlags(std::vector<std::string> args,
                                     worker::EngineOptions* options) {
  FlagParser parser;
  worker::RegisterEngineFlags(&parser, options);
  std::vector<char*> argv = {const_cast<char*>("test")};
  for (std::string& a : args) argv.push_back(a.data());
  return parser.Parse(static_cast<int>(argv.size()), argv.data(), 1);
}

// What ExpectSameCompletions compares beyond every request's status, tokens, and each token's
// id, logprob and top-logprob ids.
struct SameCompletions {
  // Completion::finish_reason and Completion::prompt_tokens.
  bool finish_reason_and_prompt_tokens = false;
  // The top logprobs' values too, not only their token ids.
  bool top_logprob_values = false;
};

// `got` equals `want` request by request (both all ok), bit for bit in what `what` names.
inline void ExpectSameCompletions(const std::vector<absl::StatusOr<worker::Completion>>& want,
                                  const std::vector<absl::StatusOr<worker::Completion>>& got,
                                  const SameCompletions& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_TRUE(want[i].ok()) << want[i].status();
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(got[i]->tokens, want[i]->tokens);
    if (what.finish_reason_and_prompt_tokens) {
      EXPECT_EQ(got[i]->finish_reason, want[i]->finish_reason);
      EXPECT_EQ(got[i]->prompt_tokens, want[i]->prompt_tokens);
    }
    ASSERT_EQ(got[i]->logprobs.size(), want[i]->logprobs.size());
    for (size_t j = 0; j < want[i]->logprobs.size(); ++j) {
      const SampleResult& a = want[i]->logprobs[j];
      const SampleResult& b = got[i]->logprobs[j];
      EXPECT_EQ(b.token, a.token) << "token " << j;
      EXPECT_EQ(b.logprob, a.logprob) << "token " << j;
      ASSERT_EQ(b.top_logprobs.size(), a.top_logprobs.size()) << "token " << j;
      for (size_t k = 0; k < a.top_logprobs.size(); ++k) {
        EXPECT_EQ(b.top_logprobs[k].token, a.top_logprobs[k].token) << "token " << j;
        if (what.top_logprob_values) {
          EXPECT_EQ(b.top_logprobs[k].logprob, a.top_logprobs[k].logprob) << "token " << j;
        }
      }
    }
  }
}

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_ENGINE_CHECKS_H_
