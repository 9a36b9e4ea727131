// Running carpool's binaries from tests the way a user's shell would.
#ifndef CARPOOL_TESTS_TESTING_COMMAND_H_
#define CARPOOL_TESTS_TESTING_COMMAND_H_

#include <filesystem>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace carpool::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the command did not exit normally
  std::string output;  // stdout and stderr together
};

// Runs `command` through /bin/sh and waits for it.
CommandResult RunCommand(const std::string& command);

// The lines of `text` that start with '{', parsed as JSON.
std::vector<nlohmann::json> JsonLines(const std::string& text);

// A fresh folder under the system temp dir, removed with everything in it on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Writes `text` to a file in the folder and returns its path.
  std::string WriteFile(const std::string& name, const std::string& text) const;

 private:
  std::filesystem::path path_;
};

// A folder for the running test's logs and files, <prefix>_<pid>_<test name> under the system
// temp dir. Removed with everything in it on destruction unless the test has failed, so a
// failure leaves its logs to read. Construct it inside a test (e.g. as a fixture member).
class TestDir {
 public:
  explicit TestDir(const std::string& prefix);
  ~TestDir();
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // <path>/<name>.log
  std::string Log(const std::string& name) const;

 private:
  std::filesystem::path path_;
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_COMMAND_H_
