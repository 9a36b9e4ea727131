// `carpool bench serve` run as a user would, against a fake router that streams one token per
// chunk: what goes on the wire, the JSON result, the report, and the errors.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/fake_router_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"

namespace carpool {
namespace {

using nlohmann::json;
using testing::FakeRouter;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Lt;

testing::CommandResult RunBench(const std::string& args) {
  return testing::RunCommand(std::string(CARPOOL_BIN_DIR) + "/carpool bench serve " + args);
}

// Streams max_tokens chunks of one token (id 7) and a final with the usage; canned stats.
void Streamer(FakeRouter& r, const std::string& peer, const ClientMessage& m) {
  const auto* g = std::get_if<GenerateInput>(&m);
  if (g == nullptr) return FakeRouter::Echo(r, peer, m);
  for (int k = 0; k < g->sampling.max_tokens; ++k) {
    r.Reply(peer, GenerateChunkOut{g->request_id, k, {SampleResult{7, -0.5f, {}, ""}}, ""});
  }
  GenerateFinalOut f;
  f.request_id = g->request_id;
  f.finish_reason = "length";
  f.usage.prompt_tokens = g->has_text ? static_cast<int>(g->text.size()) + 1
                                      : static_cast<int>(g->token_ids.size());
  f.usage.completion_tokens = g->sampling.max_tokens;
  r.Reply(peer, f);
}

std::vector<GenerateInput> Generates(const FakeRouter& router) {
  std::vector<GenerateInput> out;
  for (const ClientMessage& m : router.Received()) {
    if (const auto* g = std::get_if<GenerateInput>(&m)) out.push_back(*g);
  }
  return out;
}

json LastJson(const std::string& output) {
  const size_t brace = output.find('{');
  if (brace == std::string::npos) return json();
  return json::parse(output.substr(brace), nullptr, /*allow_exceptions=*/false);
}

TEST(BenchServeCliTest, RandomWorkloadJsonResult) {
  FakeRouter router(Streamer);
  const testing::CommandResult r = RunBench(
      "--router " + router.endpoint() +
      " --num-prompts 6 --input-len 8 --output-len 3 --max-concurrency 2 --num-warmups 1"
      " --goodput ttft:60000 tpot:60000 --seed 4 --stats-interval-ms 20 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = LastJson(r.output);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_input_tokens"], 48);
  EXPECT_EQ(j["total_output_tokens"], 18);
  EXPECT_EQ(j["max_concurrency"], 2);
  EXPECT_LE(j["max_concurrent_requests"].get<int>(), 2);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["good_completed"], 6);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), j["request_throughput"].get<double>());
  EXPECT_DOUBLE_EQ(j["goodput_slo"]["tpot_ms"].get<double>(), 60000);
  EXPECT_GT(j["median_ttft_ms"].get<double>(), 0);
  EXPECT_EQ(j["dataset"], "random input=fixed:8 output=fixed:3");
  // Only healthy workers count: the canned stats' worker-1.
  EXPECT_EQ(j["server"]["peak_running"], 2);
  EXPECT_EQ(j["server"]["num_kv_blocks"], 1000);
  EXPECT_EQ(j["server"]["peak_kv_used_blocks"], 250);
  const std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 7u);  // one warmup
  for (const GenerateInput& g : sent) {
    EXPECT_TRUE(g.stream);
    EXPECT_FALSE(g.has_text);
    EXPECT_EQ(g.token_ids.size(), 8u);
    EXPECT_THAT(g.token_ids, Each(Lt(256)));
    EXPECT_EQ(g.sampling.max_tokens, 3);
    EXPECT_TRUE(g.sampling.ignore_eos);
    EXPECT_EQ(g.sampling.temperature, 0);
  }
}

TEST(BenchServeCliTest, JsonlDatasetReportAndDetailedResultFile) {
  FakeRouter router(Streamer);
  testing::ScratchDir dir("carpool_bench_serve_cli_test");
  const std::string prompts = dir.WriteFile(
      "prompts.jsonl", "{\"prompt\": \"hello\", \"max_tokens\": 2}\n{\"prompt_ids\": [1, 2]}\n");
  const std::string result = (dir.path() / "result.json").string();
  const testing::CommandResult r =
      RunBench("--router " + router.endpoint() + " --dataset jsonl --dataset-path " + prompts +
               " --output-len 4 --request-rate 50 --burstiness 0.5 --save-detailed"
               " --result-file " + result);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Serving Benchmark Result"));
  EXPECT_THAT(r.output, HasSubstr("Successful requests:                     2"));
  EXPECT_THAT(r.output, HasSubstr("Traffic request rate:                    50.00"));
  EXPECT_THAT(r.output, HasSubstr("Median ITL (ms):"));
  const testing::CommandResult cat = testing::RunCommand("cat " + result);
  const json j = LastJson(cat.output);
  ASSERT_TRUE(j.is_object()) << cat.output;
  EXPECT_EQ(j["input_lens"], json({6, 2}));  // "hello" + BOS, as the server counted
  EXPECT_EQ(j["output_lens"], json({2, 4}));
  EXPECT_EQ(j["itls"][0].size(), 1u);
  EXPECT_EQ(j["itls"][1].size(), 3u);
  EXPECT_EQ(j["ttfts"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["burstiness"].get<double>(), 0.5);
  EXPECT_TRUE(j["request_goodput"].is_null());
  const std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_TRUE(sent[0].has_text);
  EXPECT_EQ(sent[0].text, "hello");
}

TEST(BenchServeCliTest, HttpBackendWithoutAGatewayFailsItsRequests) {
  const testing::CommandResult r = RunBench(absl::StrCat(
      "--backend http --url http://127.0.0.1:", testing::FreePort(), " --router tcp://127.0.0.1:",
      testing::FreePort(), " --num-prompts 2 --no-progress"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("2 requests failed"));
}

TEST(BenchServeCliTest, BadFlagsExit2NamingTheProblem) {
  struct Case {
    const char* args;
    const char* message;
  };
  for (const Case& c : {Case{"--output-len poisson:3", "unknown distribution 'poisson'"},
                        Case{"--goodput itl:5", "unknown metric 'itl'"},
                        Case{"--request-rate 0", "--request-rate"},
                        Case{"--burstiness -1", "--burstiness"},
                        Case{"--dataset sharegpt", "--dataset"},
                        Case{"--dataset jsonl", "--dataset-path"},
                        Case{"--num-prompts 0", "--num-prompts"},
                        Case{"--backend grpc", "--backend"}}) {
    const testing::CommandResult r = RunBench(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
  }
}

TEST(BenchServeCliTest, NoRouterExits1) {
  const testing::CommandResult r =
      RunBench(absl::StrCat("--router tcp://127.0.0.1:", testing::FreePort(), " --num-prompts 1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no router answered"));
}

}  // namespace
}  // namespace carpool
