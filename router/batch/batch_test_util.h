// Helpers the batch tests share: input lines the simulated worker can run, and a fresh state
// folder per test.
#ifndef CARPOOL_ROUTER_BATCH_BATCH_TEST_UTIL_H_
#define CARPOOL_ROUTER_BATCH_BATCH_TEST_UTIL_H_

#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/testing/sim_worker.h"

namespace carpool::router::batch {

// One /v1/completions line with a token prompt tagged `tag` (the simulated worker has no
// tokenizer), ending in a newline.
inline std::string CompletionLine(const std::string& custom_id, int max_tokens, int tag = 1) {
  nlohmann::json body = {
      {"model", "sim"}, {"prompt", testing::TaggedPrompt(tag)}, {"max_tokens", max_tokens}};
  return nlohmann::json(
             {{"custom_id", custom_id}, {"method", "POST"}, {"url", "/v1/completions"},
              {"body", body}})
             .dump() +
         "\n";
}

// temp/<prefix>_<test name>_<pid>, removed if it is there: the running test's own folder.
inline std::filesystem::path FreshTestDir(const std::string& prefix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              absl::StrCat(prefix, "_", info->name(), "_", ::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace carpool::router::batch

#endif  // CARPOOL_ROUTER_BATCH_BATCH_TEST_UTIL_H_
