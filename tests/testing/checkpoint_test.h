// A test fixture for tests that write checkpoints: each test gets its own folder,
// <temp dir>/<prefix><suite>_<test>, empty when the test starts and removed when it ends.
#ifndef CARPOOL_TESTS_TESTING_CHECKPOINT_TEST_H_
#define CARPOOL_TESTS_TESTING_CHECKPOINT_TEST_H_

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"

namespace carpool::testing {

class CheckpointTest : public ::testing::Test {
 protected:
  explicit CheckpointTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = std::filesystem::path(::testing::TempDir()) / (prefix_ + name);
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // WriteCheckpoint into the test's folder; a failure fails the test and gives no tensors.
  CheckpointTensors Write(const CheckpointSpec& spec) {
    absl::StatusOr<CheckpointTensors> written = WriteCheckpoint(dir_.string(), spec);
    EXPECT_TRUE(written.ok()) << written.status();
    return written.ok() ? *written : CheckpointTensors{};
  }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_CHECKPOINT_TEST_H_
