#include "tests/testing/command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace carpool::testing {

CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

ScratchDir::ScratchDir(const std::string& prefix) {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::temp_directory_path() /
          (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string ScratchDir::WriteFile(const std::string& name, const std::string& text) const {
  const std::string file = (path_ / name).string();
  std::ofstream(file) << text;
  return file;
}

TestDir::TestDir(const std::string& prefix) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  path_ = std::filesystem::temp_directory_path() /
          (prefix + "_" + std::to_string(::getpid()) + "_" +
           (test != nullptr ? test->name() : "no_test"));
  std::filesystem::create_directories(path_);
}

TestDir::~TestDir() {
  if (::testing::Test::HasFailure()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TestDir::Log(const std::string& name) const {
  return (path_ / (name + ".log")).string();
}

}  // namespace carpool::testing
