// main() for the GoogleTest stand-in (compat/googletest/gtest/gtest.h). Runs every registered test,
// or those matching --gtest_filter=POSITIVE[:POSITIVE...][-NEGATIVE[:NEGATIVE...]] ('*' and '?'
// wildcards), prints GoogleTest-style lines and a summary. Exit status: 0 when all ran tests
// passed, 1 when any failed, kAllSkipped when every test that ran skipped itself (CTest reports
// that as skipped through SKIP_RETURN_CODE).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace {

constexpr int kAllSkipped = 77;

bool Glob(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*') return Glob(pattern + 1, text) || (*text != '\0' && Glob(pattern, text + 1));
  if (*text == '\0') return false;
  return (*pattern == '?' || *pattern == *text) && Glob(pattern + 1, text + 1);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= s.size()) {
    const size_t end = s.find(':', begin);
    const std::string part =
        s.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (!part.empty()) parts.push_back(part);
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return parts;
}

bool Selected(const std::string& name, const std::string& filter) {
  const size_t dash = filter.find('-');
  std::vector<std::string> positive = Split(filter.substr(0, dash));
  const std::vector<std::string> negative =
      dash == std::string::npos ? std::vector<std::string>{} : Split(filter.substr(dash + 1));
  if (positive.empty()) positive.push_back("*");
  bool selected = false;
  for (const std::string& p : positive) selected = selected || Glob(p.c_str(), name.c_str());
  for (const std::string& n : negative) selected = selected && !Glob(n.c_str(), name.c_str());
  return selected;
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter = "*";
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--gtest_filter=", 15) == 0) filter = argv[i] + 15;
    if (std::strcmp(argv[i], "--gtest_list_tests") == 0) list = true;
  }
  using ::testing::internal::Current;
  using ::testing::internal::Registry;
  int passed = 0;
  int skipped = 0;
  std::vector<std::string> failed;
  std::printf("[==========] GoogleTest stand-in (tests/gpu/compat)\n");
  for (const auto& info : Registry()) {
    const std::string name = info.suite + "." + info.name;
    if (!Selected(name, filter)) continue;
    if (list) {
      std::printf("%s\n", name.c_str());
      continue;
    }
    std::printf("[ RUN      ] %s\n", name.c_str());
    std::fflush(stdout);
    Current() = {};
    std::unique_ptr<::testing::Test> test(info.factory());
    test->SetUp();
    if (!Current().skipped && !Current().failed) test->TestBody();
    test->TearDown();
    if (Current().failed) {
      std::printf("[  FAILED  ] %s\n", name.c_str());
      failed.push_back(name);
    } else if (Current().skipped) {
      std::printf("[  SKIPPED ] %s\n", name.c_str());
      ++skipped;
    } else {
      std::printf("[       OK ] %s\n", name.c_str());
      ++passed;
    }
    std::fflush(stdout);
  }
  if (list) return 0;
  std::printf("[==========] %d tests ran.\n", passed + skipped + static_cast<int>(failed.size()));
  std::printf("[  PASSED  ] %d tests.\n", passed);
  if (skipped > 0) std::printf("[  SKIPPED ] %d tests.\n", skipped);
  if (!failed.empty()) {
    std::printf("[  FAILED  ] %zu tests, listed below:\n", failed.size());
    for (const std::string& name : failed) std::printf("[  FAILED  ] %s\n", name.c_str());
    return 1;
  }
  return passed == 0 && skipped > 0 ? kAllSkipped : 0;
}
