// Runs the `carpool` binary as a user would and checks what it prints and how it exits.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/command.h"

namespace carpool {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using nlohmann::json;

using testing::JsonLines;
using RunResult = testing::CommandResult;

RunResult RunCarpool(const std::string& args) {
  return testing::RunCommand(std::string(CARPOOL_BIN_DIR) + "/carpool " + args);
}

class CliTest : public ::testing::Test {
 protected:
  std::string WriteFile(const std::string& name, const std::string& text) {
    return dir_.WriteFile(name, text);
  }

  testing::ScratchDir dir_{"carpool_cli_test"};
};

TEST_F(CliTest, GeneratesJsonForTextPrompt) {
  RunResult r = RunCarpool(
      "generate --model synthetic:tiny --prompt hello --max-tokens 8 --temperature 0 "
      "--logprobs 2 --json --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> lines = JsonLines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  const json& j = lines[0];
  EXPECT_EQ(j["tokens"].size(), 8u);
  EXPECT_EQ(j["logprobs"].size(), 8u);
  ASSERT_EQ(j["top_logprobs"].size(), 8u);
  EXPECT_EQ(j["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 6);  // BOS + "hello"
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_TRUE(j["text"].is_string());
  EXPECT_TRUE(j["timings"].contains("ttft_ms"));
  // The sampled token is the most likely one under greedy decoding.
  EXPECT_EQ(j["top_logprobs"][0][0]["token"], j["tokens"][0]);
  EXPECT_FLOAT_EQ(j["top_logprobs"][0][0]["logprob"].get<float>(),
                  j["logprobs"][0].get<float>());
}

TEST_F(CliTest, GreedyIsDeterministicAcrossRuns) {
  const std::string args =
      "generate --model synthetic:tiny --prompt-ids 256,1,2,3 --max-tokens 12 --temperature 0 "
      "--json --ignore-eos";
  RunResult a = RunCarpool(args);
  RunResult b = RunCarpool(args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(JsonLines(a.output)[0]["tokens"], JsonLines(b.output)[0]["tokens"]);
}

TEST_F(CliTest, PromptsFileKeepsOrderAndIsolatesBadLines) {
  const std::string path = WriteFile(
      "prompts.jsonl",
      "{\"prompt\": \"first\", \"max_tokens\": 3}\n"
      "{\"prompt_ids\": [256, 300000]}\n"
      "not json\n"
      "{\"prompt_ids\": [256, 5, 6], \"max_tokens\": 5, \"temperature\": 0.8, \"seed\": 3}\n"
      "{\"prompt\": \"x\", \"top_p\": 0}\n"
      "{\"prompt\": \"last\", \"max_tokens\": 2, \"ignore_eos\": true}\n");
  RunResult r = RunCarpool("generate --model synthetic:tiny --ignore-eos --prompts-file " + path);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::vector<json> lines = JsonLines(r.output);
  ASSERT_EQ(lines.size(), 6u) << r.output;
  EXPECT_EQ(lines[0]["tokens"].size(), 3u);
  EXPECT_EQ(lines[1]["line"], 2);
  EXPECT_THAT(lines[1]["error"]["message"].get<std::string>(), HasSubstr("vocabulary"));
  EXPECT_EQ(lines[2]["line"], 3);
  EXPECT_THAT(lines[2]["error"]["message"].get<std::string>(), HasSubstr("JSON"));
  EXPECT_EQ(lines[3]["tokens"].size(), 5u);
  EXPECT_THAT(lines[4]["error"]["message"].get<std::string>(), HasSubstr("top_p"));
  EXPECT_EQ(lines[5]["tokens"].size(), 2u);
}

struct BadInput {
  const char* args;
  const char* message;
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.args; }

class CliBadInputTest : public CliTest, public ::testing::WithParamInterface<BadInput> {};

TEST_P(CliBadInputTest, FailsWithClearMessage) {
  RunResult r = RunCarpool(GetParam().args);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(GetParam().message));
  EXPECT_EQ(r.output.find("Aborted"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Flags, CliBadInputTest,
    ::testing::Values(
        BadInput{"generate --model synthetic:tiny --prompt hi --bogus 1", "unknown flag --bogus"},
        BadInput{"frobnicate", "unknown command"},
        BadInput{"generate --model synthetic:tiny --prompt hi --max-tokens 0", "max_tokens"},
        BadInput{"generate --model synthetic:tiny --prompt hi --max-tokens x", "--max-tokens"},
        BadInput{"generate --model synthetic:tiny --prompt hi --temperature -1", "temperature"},
        BadInput{"generate --model synthetic:tiny --prompt hi --temperature nan", "temperature"},
        BadInput{"generate --model synthetic:tiny --prompt hi --top-p 0", "top_p"},
        BadInput{"generate --model synthetic:tiny --prompt hi --top-p 1.5", "top_p"},
        BadInput{"generate --model synthetic:tiny --prompt-ids 1,2,999", "vocabulary"},
        BadInput{"generate --model synthetic:tiny --prompt-ids 1,x", "not an integer"},
        BadInput{"generate --model synthetic:tiny --prompt hello --max-model-len 4",
                 "max_model_len"},
        BadInput{"generate --model synthetic:tiny --prompt hi --max-tokens 5000",
                 "max_model_len"},
        BadInput{"generate --model synthetic:nope --prompt hi", "nope"},
        BadInput{"generate --model /nonexistent/dir --prompt-ids 1,2", "/nonexistent/dir"},
        BadInput{"generate --model synthetic:tiny", "exactly one of"},
        BadInput{"generate --model synthetic:tiny --prompts-file /nonexistent.jsonl",
                 "cannot open"},
        BadInput{"generate --model synthetic:tiny --prompt hi --scheduler fifo", "--scheduler"},
        BadInput{"generate --model synthetic:tiny --prompt hi --device tpu", "--device"},
        BadInput{"generate --model synthetic:tiny --prompt hi --dtype int8", "--dtype"},
        BadInput{"generate --model synthetic:tiny --prompt hi --gpu-memory-utilization 1.5",
                 "--gpu-memory-utilization"},
        BadInput{"generate --router tcp://127.0.0.1:1 --prompt hi --device cpu", "--device"}));

// carpool-worker with devices it cannot have. CUDA_VISIBLE_DEVICES= hides every GPU, so these
// answer the same on a GPU machine; with no router to reach, a worker that went on would hang,
// so each one is bounded by `timeout`.
RunResult RunWorker(const std::string& args) {
  return testing::RunCommand("CUDA_VISIBLE_DEVICES= timeout 20 " + std::string(CARPOOL_BIN_DIR) +
                             "/carpool-worker --router tcp://127.0.0.1:1 " + args);
}

TEST(WorkerCliTest, DeviceCudaWithoutGpuExitsTwo) {
  RunResult r = RunWorker("--model synthetic:tiny --device cuda");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--device cuda"));
  EXPECT_THAT(r.output, HasSubstr("use --device cpu"));
}

// Tensor parallelism no longer refuses CUDA: without a GPU, --device cuda --tp 2 fails for want
// of a GPU, as it does alone, before it looks for mpirun.
TEST(WorkerCliTest, DeviceCudaUnderTensorParallelismWithoutGpuAsksForAGpu) {
  RunResult r = RunWorker("--model synthetic:tiny --tp 2 --device cuda");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--device cuda"));
  EXPECT_THAT(r.output, HasSubstr("use --device cpu"));
  EXPECT_THAT(r.output, Not(HasSubstr("NCCL")));
}

TEST(WorkerCliTest, BadDeviceFlagsExitTwo) {
  for (const char* flags : {"--device tpu", "--dtype int8", "--gpu-memory-utilization 0",
                            "--gpu -3"}) {
    RunResult r = RunWorker(absl::StrCat("--model synthetic:tiny ", flags));
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(std::string(flags).substr(0, std::string(flags).find(' '))))
        << flags;
  }
}

TEST(WorkerCliTest, GenerateWithDeviceCudaWithoutGpuFails) {
  RunResult r = testing::RunCommand("CUDA_VISIBLE_DEVICES= " + std::string(CARPOOL_BIN_DIR) +
                                    "/carpool generate --model synthetic:tiny --prompt hi "
                                    "--device cuda");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--device cuda"));
}

}  // namespace
}  // namespace carpool
