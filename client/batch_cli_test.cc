// `carpool batch` run as a user would, against a fake router with an in-memory batch store
// (client/fake_batch_store_test_util.h).
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/fake_batch_store_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/command.h"

namespace carpool {
namespace {

using nlohmann::json;
using testing::FakeBatchStore;
using testing::FakeRouter;
using ::testing::HasSubstr;
using ::testing::Not;

testing::CommandResult RunCarpool(const std::string& args) {
  return testing::RunCommand(std::string(CARPOOL_BIN_DIR) + "/carpool " + args);
}

std::string Line(const std::string& custom_id, const std::string& url = "/v1/embeddings") {
  return json({{"custom_id", custom_id},
               {"method", "POST"},
               {"url", url},
               {"body", {{"model", "m"}, {"input", "x"}}}})
             .dump() +
         "\n";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<BatchCallInfo> BatchCalls(const FakeRouter& router) {
  std::vector<BatchCallInfo> out;
  for (const ClientMessage& m : router.Received()) {
    if (const auto* b = std::get_if<BatchCallInfo>(&m)) out.push_back(*b);
  }
  return out;
}

class BatchCliTest : public ::testing::Test {
 protected:
  std::string Router() const { return " --router " + router_.endpoint(); }

  testing::ScratchDir dir_{"carpool_batch_cli_test"};
  FakeBatchStore store_;
  FakeRouter router_{store_.Handler()};
};

TEST_F(BatchCliTest, SubmitPrintsTheBatchAndTakesTheEndpointFromTheFile) {
  const std::string path = dir_.WriteFile("in.jsonl", Line("a") + Line("b"));
  testing::CommandResult r = RunCarpool("batch submit " + path + Router() +
                                        " --api-key k1 --metadata project=eval --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> lines = testing::JsonLines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0]["object"], "batch");
  EXPECT_EQ(lines[0]["status"], "in_progress");
  EXPECT_EQ(lines[0]["endpoint"], "/v1/embeddings");
  EXPECT_EQ(lines[0]["request_counts"]["total"], 2);
  EXPECT_EQ(lines[0]["metadata"]["project"], "eval");
  EXPECT_TRUE(lines[0]["output_file_id"].is_null());
  std::vector<BatchCallInfo> sent = BatchCalls(router_);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].op, BatchOp::kCreateFile);
  EXPECT_EQ(sent[0].filename, "in.jsonl");
  EXPECT_EQ(sent[0].content, Line("a") + Line("b"));
  EXPECT_EQ(sent[0].api_key, "k1");
  EXPECT_EQ(sent[1].op, BatchOp::kCreateBatch);
  EXPECT_EQ(sent[1].endpoint, "/v1/embeddings");
  EXPECT_EQ(sent[1].completion_window, "24h");

  // --endpoint overrides the file's url.
  r = RunCarpool("batch submit " + path + Router() + " --endpoint /v1/completions");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("in_progress  0/2 done  /v1/completions"));
}

TEST_F(BatchCliTest, SubmitWaitShowsProgressLinesAndWritesTheOutput) {
  const std::string path = dir_.WriteFile("in.jsonl", Line("a") + Line("bad-b") + Line("c"));
  const std::string out = (dir_.path() / "out.jsonl").string();
  const std::string errors = (dir_.path() / "errors.jsonl").string();
  testing::CommandResult r =
      RunCarpool("batch submit " + path + Router() + " --poll-ms 5 --output " + out +
                 " --errors-output " + errors);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Not a terminal: a line per change, no bar.
  EXPECT_THAT(r.output, HasSubstr("in_progress  1/3 done"));
  EXPECT_THAT(r.output, HasSubstr("in_progress  2/3 done (1 failed)"));
  EXPECT_THAT(r.output, HasSubstr("completed  3/3 done (1 failed)"));
  EXPECT_THAT(r.output, Not(HasSubstr("[#")));
  std::vector<std::string> output = absl::StrSplit(ReadFile(out), '\n', absl::SkipEmpty());
  ASSERT_EQ(output.size(), 2u);
  EXPECT_EQ(json::parse(output[0])["custom_id"], "a");
  EXPECT_EQ(json::parse(output[1])["custom_id"], "c");
  EXPECT_EQ(json::parse(ReadFile(errors))["custom_id"], "bad-b");
}

TEST_F(BatchCliTest, SubmitWaitOnATerminalDrawsAProgressBar) {
  if (!std::filesystem::exists("/usr/bin/script")) GTEST_SKIP() << "no script(1) for a pty";
  const std::string path = dir_.WriteFile("in.jsonl", Line("a") + Line("b"));
  testing::CommandResult r = testing::RunCommand(
      "/usr/bin/script -qec '" + std::string(CARPOOL_BIN_DIR) + "/carpool batch submit " + path +
      Router() + " --wait --poll-ms 5' /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\r[###############...............]  1/2  in_progress"));
  EXPECT_THAT(r.output, HasSubstr("\r[##############################]  2/2  completed"));
}

TEST_F(BatchCliTest, AWaitedBatchThatDoesNotCompleteExitsOneNamingItsStatus) {
  const std::string bad = dir_.WriteFile("bad.jsonl", Line("a") + "not json\n");
  testing::CommandResult r =
      RunCarpool("batch submit " + bad + Router() + " --endpoint /v1/embeddings --wait");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("ended failed"));
  EXPECT_THAT(r.output, HasSubstr("line 2: invalid_json"));

  const std::string path = dir_.WriteFile("in.jsonl", Line("a"));
  r = RunCarpool("batch submit " + path + Router() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string id = testing::JsonLines(r.output).at(0)["id"];
  r = RunCarpool("batch cancel " + id + Router());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(id + "  cancelling"));
  r = RunCarpool("batch status " + id + Router());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cancelled"));
  r = RunCarpool("batch cancel " + id + Router());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("FAILED_PRECONDITION"));

  r = RunCarpool("batch status " + id + Router() + " --wait --poll-ms 5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("ended cancelled"));

  // A batch past its window.
  r = RunCarpool("batch submit " + path + Router() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string late = testing::JsonLines(r.output).at(0)["id"];
  store_.SetStatus(late, "expired");
  r = RunCarpool("batch status " + late + Router() + " --wait --poll-ms 5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("batch " + late + " ended expired"));
}

TEST_F(BatchCliTest, StatusResultsAndList) {
  const std::string path = dir_.WriteFile("in.jsonl", Line("a") + Line("bad-b"));
  testing::CommandResult r = RunCarpool("batch submit " + path + Router() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string id = testing::JsonLines(r.output).at(0)["id"];

  // Each poll of the fake store answers one more request.
  r = RunCarpool("batch results " + id + Router());
  EXPECT_EQ(r.exit_code, 1) << r.output;  // still running
  EXPECT_THAT(r.output, HasSubstr("in_progress"));

  r = RunCarpool("batch status " + id + Router());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("status             in_progress"));
  EXPECT_THAT(r.output, HasSubstr("requests           2/2 done, 1 failed"));
  EXPECT_THAT(r.output, HasSubstr("created_at         2023-11-14T22:13:"));
  for (int i = 0; i < 3; ++i) ASSERT_EQ(RunCarpool("batch status " + id + Router()).exit_code, 0);

  r = RunCarpool("batch results " + id + Router());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> lines = testing::JsonLines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0]["custom_id"], "a");
  EXPECT_EQ(lines[0]["response"]["status_code"], 200);
  r = RunCarpool("batch results " + id + Router() + " --errors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  lines = testing::JsonLines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0]["custom_id"], "bad-b");

  ASSERT_EQ(RunCarpool("batch submit " + path + Router()).exit_code, 0);
  r = RunCarpool("batch list" + Router() + " --limit 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr(id + "  ")));  // the newest only
  EXPECT_THAT(r.output, HasSubstr("more: carpool batch list --after"));
  r = RunCarpool("batch list" + Router());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(id + "  completed  2/2 done (1 failed)  /v1/embeddings"));
}

TEST_F(BatchCliTest, BadUsageExitsTwo) {
  struct Case {
    std::string args;
    const char* message;
  };
  const Case cases[] = {
      {"batch frobnicate" + Router(), "unknown subcommand 'frobnicate'"},
      {"batch status" + Router(), "status takes one batch ID"},
      {"batch submit /no/such/file.jsonl" + Router(), "cannot open /no/such/file.jsonl"},
      {"batch list", "--router is required"},
      {"batch submit " + dir_.WriteFile("x.jsonl", "not json\n") + Router(), "first line"},
      {"batch submit x --metadata nokey" + Router(), "expected KEY=VALUE"},
  };
  for (const Case& c : cases) {
    testing::CommandResult r = RunCarpool(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
  }
  EXPECT_TRUE(BatchCalls(router_).empty());  // none of them reached the router
  testing::CommandResult help = RunCarpool("batch --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("submit FILE.jsonl"));
}

TEST_F(BatchCliTest, TheRoutersRefusalExitsOneWithItsReason) {
  testing::CommandResult r = RunCarpool("batch status batch_nope" + Router());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no batch 'batch_nope' (NOT_FOUND, reason not_found)"));
}

}  // namespace
}  // namespace carpool
