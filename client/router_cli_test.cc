// `carpool generate --router` and `carpool status` run as a user would, against a fake router;
// and `carpool generate --model DIR --prompt TEXT` in process, with a folder's tokenizer.json.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/carpool_client.h"
#include "client/fake_router_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"

namespace carpool {
namespace {

using nlohmann::json;
using testing::FakeRouter;
using ::testing::HasSubstr;

using testing::JsonLines;
using RunResult = testing::CommandResult;

RunResult RunCarpool(const std::string& args) {
  return testing::RunCommand(std::string(CARPOOL_BIN_DIR) + "/carpool " + args);
}

std::vector<GenerateInput> Generates(const FakeRouter& router) {
  std::vector<GenerateInput> out;
  for (const ClientMessage& m : router.Received()) {
    if (const auto* g = std::get_if<GenerateInput>(&m)) out.push_back(*g);
  }
  return out;
}

class RouterCliTest : public ::testing::Test {
 protected:
  std::string WriteFile(const std::string& name, const std::string& text) {
    return dir_.WriteFile(name, text);
  }

  testing::ScratchDir dir_{"carpool_router_cli_test"};
};

TEST_F(RouterCliTest, GenerateJsonSendsTextAndRequestFlags) {
  FakeRouter router;
  RunResult r = RunCarpool("generate --router " + router.endpoint() +
                           " --prompt hello --max-tokens 8 --logprobs 2 --json --priority "
                           "interactive --deadline-ms 500 --api-key k1 --timeout-ms 10000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> lines = JsonLines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  const json& j = lines[0];
  EXPECT_EQ(j["tokens"], json({'h', 'e', 'l', 'l', 'o'}));
  EXPECT_EQ(j["text"], "hello");
  EXPECT_EQ(j["logprobs"].size(), 5u);
  ASSERT_EQ(j["top_logprobs"].size(), 5u);
  EXPECT_EQ(j["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_DOUBLE_EQ(j["timings"]["total_ms"].get<double>(), 3.0);
  std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].has_text);
  EXPECT_EQ(sent[0].text, "hello");
  EXPECT_EQ(sent[0].priority, Priority::kInteractive);
  EXPECT_EQ(sent[0].deadline_ms, 500);
  EXPECT_EQ(sent[0].api_key, "k1");
  EXPECT_EQ(sent[0].sampling.max_tokens, 8);
  EXPECT_FALSE(sent[0].stream);
}

TEST_F(RouterCliTest, PromptIdsGoAsIds) {
  FakeRouter router;
  RunResult r = RunCarpool("generate --router " + router.endpoint() +
                           " --prompt-ids 1,2,3 --seed 9 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[1,2,3]"));  // no tokenizer text: the ids
  std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_FALSE(sent[0].has_text);
  EXPECT_EQ(sent[0].token_ids, std::vector<int32_t>({1, 2, 3}));
  EXPECT_TRUE(sent[0].sampling.has_seed);
  EXPECT_EQ(sent[0].sampling.seed, 9u);
}

TEST_F(RouterCliTest, StreamPrintsTextAsItArrives) {
  FakeRouter router;
  RunResult r = RunCarpool("generate --router " + router.endpoint() + " --prompt hello --stream");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "hello\n");
  ASSERT_EQ(Generates(router).size(), 1u);
  EXPECT_TRUE(Generates(router)[0].stream);
}

TEST_F(RouterCliTest, ServerErrorExitsOneWithReason) {
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    if (const auto* g = std::get_if<GenerateInput>(&m)) {
      r.Reply(peer, ErrorInfo{g->request_id, absl::StatusCode::kResourceExhausted,
                              reason::kQueueFull, "queue is full", 300});
    }
  });
  RunResult r = RunCarpool("generate --router " + router.endpoint() + " --prompt hi");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("queue is full"));
  EXPECT_THAT(r.output, HasSubstr("queue_full"));
  EXPECT_THAT(r.output, HasSubstr("300"));
}

TEST_F(RouterCliTest, PromptsFileKeepsOrderAndIsolatesBadLines) {
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    const auto* g = std::get_if<GenerateInput>(&m);
    if (g != nullptr && g->has_text && g->text == "boom") {
      r.Reply(peer, ErrorInfo{g->request_id, absl::StatusCode::kResourceExhausted,
                              reason::kQueueFull, "queue is full", 120});
      return;
    }
    FakeRouter::Echo(r, peer, m);
  });
  const std::string path = WriteFile("prompts.jsonl",
                                     "{\"prompt\": \"aa\"}\n"
                                     "not json\n"
                                     "\n"
                                     "{\"prompt\": \"boom\"}\n"
                                     "{\"prompt_ids\": [7, 8], \"max_tokens\": 1}\n"
                                     "{\"prompt\": \"zz\", \"top_p\": 0}\n"
                                     "{\"prompt\": \"last\"}\n");
  RunResult r = RunCarpool("generate --router " + router.endpoint() +
                           " --concurrency 3 --prompts-file " + path);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::vector<json> lines = JsonLines(r.output);
  ASSERT_EQ(lines.size(), 6u) << r.output;
  EXPECT_EQ(lines[0]["text"], "aa");
  EXPECT_EQ(lines[1]["line"], 2);
  EXPECT_THAT(lines[1]["error"]["message"].get<std::string>(), HasSubstr("JSON"));
  EXPECT_EQ(lines[2]["line"], 3);
  EXPECT_EQ(lines[2]["error"]["code"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(lines[2]["error"]["reason"], "queue_full");
  EXPECT_EQ(lines[2]["error"]["retry_after_ms"], 120);
  EXPECT_EQ(lines[3]["tokens"], json({7}));
  EXPECT_EQ(lines[4]["line"], 5);
  EXPECT_THAT(lines[4]["error"]["message"].get<std::string>(), HasSubstr("top_p"));
  EXPECT_EQ(lines[5]["text"], "last");
  EXPECT_EQ(Generates(router).size(), 4u);  // the bad lines never left the client
}

// Holds every generate until `n` are waiting, then answers them newest first: only a client
// with n requests in flight gets answers, and the output must still follow the input order.
FakeRouter::Handler HoldUntil(size_t n, std::vector<std::pair<std::string, GenerateInput>>* held) {
  return [n, held](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    const auto* g = std::get_if<GenerateInput>(&m);
    if (g == nullptr) return;
    held->emplace_back(peer, *g);
    if (held->size() < n) return;
    for (auto it = held->rbegin(); it != held->rend(); ++it) {
      FakeRouter::AnswerEcho(r, it->first, it->second);
    }
    held->clear();
  };
}

TEST_F(RouterCliTest, ConcurrencyKeepsRequestsInFlight) {
  std::vector<std::pair<std::string, GenerateInput>> held;  // router thread only
  FakeRouter router(HoldUntil(4, &held));
  const std::string path = WriteFile("four.jsonl",
                                     "{\"prompt\": \"one\"}\n{\"prompt\": \"two\"}\n"
                                     "{\"prompt\": \"three\"}\n{\"prompt\": \"four\"}\n");
  RunResult r = RunCarpool("generate --router " + router.endpoint() +
                           " --concurrency 4 --timeout-ms 20000 --prompts-file " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> lines = JsonLines(r.output);
  ASSERT_EQ(lines.size(), 4u) << r.output;
  EXPECT_EQ(lines[0]["text"], "one");
  EXPECT_EQ(lines[1]["text"], "two");
  EXPECT_EQ(lines[2]["text"], "three");
  EXPECT_EQ(lines[3]["text"], "four");
}

TEST_F(RouterCliTest, UnreachableRouterTimesOut) {
  RunResult r = RunCarpool("generate --router tcp://127.0.0.1:1 --prompt hi --timeout-ms 300");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("DEADLINE_EXCEEDED"));
  r = RunCarpool("status --router tcp://127.0.0.1:1 --timeout-ms 300");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tcp://127.0.0.1:1"));
}

TEST_F(RouterCliTest, LostRouterEndsEmbedAndGenerateAtOnce) {
  const std::vector<std::vector<std::string>> commands = {{"embed", "--input", "abc"},
                                                          {"generate", "--prompt-ids", "1,2"}};
  for (const std::vector<std::string>& command : commands) {
    auto router = std::make_unique<FakeRouter>(
        [](FakeRouter&, const std::string&, const ClientMessage&) {});  // never answers
    std::vector<std::string> argv = {std::string(CARPOOL_BIN_DIR) + "/carpool"};
    argv.insert(argv.end(), command.begin(), command.end());
    argv.insert(argv.end(), {"--router", router->endpoint(), "--timeout-ms", "30000"});
    testing::Subprocess cli(argv, dir_.WriteFile(command[0] + ".log", ""));
    ASSERT_TRUE(router->WaitFor([](const auto& ms) { return !ms.empty(); })) << cli.Log();
    const absl::Time start = absl::Now();
    router.reset();  // closes the connection, as a dying router's kernel does
    EXPECT_EQ(cli.Wait(3000), 1) << command[0] << ": " << cli.Log();
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
    EXPECT_THAT(cli.Log(), HasSubstr("router_lost")) << command[0];
  }
}

TEST_F(RouterCliTest, StatusPrintsTableAndJson) {
  FakeRouter router;
  RunResult r = RunCarpool("status --router " + router.endpoint());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("worker-1"));
  EXPECT_THAT(r.output, HasSubstr("250/1000"));
  EXPECT_THAT(r.output, HasSubstr("2/64"));
  EXPECT_THAT(r.output, HasSubstr("NO"));
  EXPECT_THAT(r.output, HasSubstr("4 waiting"));
  EXPECT_THAT(r.output, HasSubstr("queue_full 2"));
  r = RunCarpool("status --json --router " + router.endpoint());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> lines = JsonLines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0]["workers"].size(), 2u);
  EXPECT_EQ(lines[0]["workers"][0]["requests_served"], 17);
  EXPECT_EQ(lines[0]["queued"], 4);
  EXPECT_EQ(lines[0]["rejections_by_reason"]["token_budget"], 1);
}

TEST_F(RouterCliTest, StatusLiveTableRefreshesWithRates) {
  FakeRouter router;
  RunResult r = RunCarpool("status --watch --count 3 --interval-ms 50 --router " +
                           router.endpoint());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t screens = 0;
  for (size_t at = r.output.find("\x1b[H\x1b[2J"); at != std::string::npos;
       at = r.output.find("\x1b[H\x1b[2J", at + 1)) {
    ++screens;
  }
  EXPECT_EQ(screens, 3u) << r.output;
  EXPECT_THAT(r.output, HasSubstr("carpool status  " + router.endpoint()));
  EXPECT_THAT(r.output, HasSubstr("kv %"));
  EXPECT_THAT(r.output, HasSubstr("25.0%"));  // worker-1: 250 of 1000 blocks
  // From the second screen on, rates between snapshots (the fake's counters stand still).
  EXPECT_THAT(r.output, HasSubstr("now: 0.0 tokens/s generated, 0.0 refusals/s"));
  // Not a terminal and no --watch: one plain table.
  r = RunCarpool("status --router " + router.endpoint());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("\x1b["), std::string::npos) << r.output;
  r = RunCarpool("status --once --router " + router.endpoint());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("worker-1"));
}

struct BadInput {
  const char* args;
  const char* message;
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.args; }

class RouterCliBadInputTest : public RouterCliTest,
                              public ::testing::WithParamInterface<BadInput> {};

TEST_P(RouterCliBadInputTest, FailsWithClearMessage) {
  RunResult r = RunCarpool(GetParam().args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Flags, RouterCliBadInputTest,
    ::testing::Values(
        BadInput{"generate --router tcp://127.0.0.1:1 --model synthetic:tiny --prompt hi",
                 "--model is not allowed with --router"},
        BadInput{"generate --router tcp://127.0.0.1:1 --threads 2 --prompt hi",
                 "--threads is not allowed with --router"},
        BadInput{"generate --model synthetic:tiny --prompt hi --stream", "--stream needs --router"},
        BadInput{"generate --model synthetic:tiny --prompt hi --concurrency 2",
                 "--concurrency needs --router"},
        BadInput{"generate --router tcp://127.0.0.1:1 --prompt hi --priority urgent", "--priority"},
        BadInput{"generate --router tcp://127.0.0.1:1 --prompt hi --concurrency 0",
                 "--concurrency"},
        BadInput{"generate --router tcp://127.0.0.1:1 --prompt hi --top-p 2", "top_p"},
        BadInput{"generate --router tcp://127.0.0.1:1", "exactly one of"},
        BadInput{"generate --router bogus://x --prompt hi", "bogus://x"},
        BadInput{"status --router tcp://127.0.0.1:1 --bogus", "unknown flag --bogus"},
        BadInput{"status --router tcp://127.0.0.1:1 --once --watch", "exclude each other"},
        BadInput{"status --router tcp://127.0.0.1:1 --watch --interval-ms 0", "--interval-ms"},
        BadInput{"status --router tcp://127.0.0.1:1 --watch --json", "--json prints once"}));

// ---- text: a folder's tokenizer in process, stop strings and the model through the router

// A byte-level BPE tokenizer.json: the 256 byte characters (id = byte, GPT-2's byte-to-char
// map), the merges "Ġ h" (256) and "Ġh i" (257), <|bos|> (258, added first by the
// post-processor) and <|eos|> (259).
std::string TinyTokenizerJson() {
  json vocab = json::object();
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : 256 + extra++;
    std::string ch;
    if (cp < 0x80) {
      ch = std::string(1, static_cast<char>(cp));
    } else {
      ch = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    vocab[ch] = b;
  }
  vocab["\xc4\xa0h"] = 256;
  vocab["\xc4\xa0hi"] = 257;
  const auto special = [](int id, const char* content) {
    return json{{"id", id}, {"content", content}, {"special", true}, {"normalized", false}};
  };
  json j = {
      {"version", "1.0"},
      {"added_tokens", json::array({special(258, "<|bos|>"), special(259, "<|eos|>")})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array()},
        {"special_tokens",
         {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {258}}, {"tokens", {"<|bos|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"Ġ h", "Ġh i"})}}}};
  return j.dump();
}

class GenerateTextCliTest : public RouterCliTest {
 protected:
  // A tiny Llama checkpoint (vocabulary 300) with the tokenizer above beside it.
  std::string Folder(bool with_tokenizer) {
    const std::string dir = (dir_.path() / (with_tokenizer ? "hf" : "ids_only")).string();
    carpool::testing::CheckpointSpec spec;
    spec.config = carpool::testing::TinyTestConfig();
    EXPECT_TRUE(carpool::testing::WriteCheckpoint(dir, spec).ok());
    if (with_tokenizer) {
      EXPECT_TRUE(carpool::testing::WriteFile(dir + "/tokenizer.json", TinyTokenizerJson()).ok());
      EXPECT_TRUE(carpool::testing::WriteFile(dir + "/tokenizer_config.json",
                                              R"({"eos_token": "<|eos|>"})")
                      .ok());
    }
    return dir;
  }
};

TEST_F(GenerateTextCliTest, InProcessTextPromptUsesTheFoldersTokenizer) {
  const std::string dir = Folder(/*with_tokenizer=*/true);
  RunResult r = RunCarpool("generate --model " + dir +
                           " --prompt ' hi' --max-tokens 3 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> lines = JsonLines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0]["usage"]["prompt_tokens"], 2);  // <|bos|> and " hi" (one merge)
  EXPECT_EQ(lines[0]["tokens"].size(), 3u);
  EXPECT_TRUE(lines[0]["text"].is_string());
  r = RunCarpool("generate --model " + dir +
                 " --prompt ' hi' --no-add-bos --max-tokens 1 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(JsonLines(r.output)[0]["usage"]["prompt_tokens"], 1);
}

TEST_F(GenerateTextCliTest, FolderWithoutTokenizerSaysToPassIds) {
  const std::string dir = Folder(/*with_tokenizer=*/false);
  RunResult r = RunCarpool("generate --model " + dir + " --prompt hi --max-tokens 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tokenizer.json"));
  EXPECT_THAT(r.output, HasSubstr("--prompt-ids"));
  r = RunCarpool("generate --model " + dir + " --prompt-ids 1,2 --max-tokens 1 --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(GenerateTextCliTest, RouterGetsTheTextModelAndStops) {
  FakeRouter router([](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    const auto* g = std::get_if<GenerateInput>(&m);
    if (g == nullptr) return FakeRouter::Echo(r, peer, m);
    GenerateFinalOut f;
    f.request_id = g->request_id;
    f.text = "one ";
    f.finish_reason = "stop";
    f.stop_string = g->stop.empty() ? "" : g->stop.back();
    r.Reply(peer, f);
  });
  RunResult r = RunCarpool("generate --router " + router.endpoint() +
                           " --prompt 'count:' --model-name llama --stop two --stop 'THREE, 3'"
                           " --include-stop-str-in-output --no-skip-special-tokens --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> lines = JsonLines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_EQ(lines[0]["finish_reason"], "stop");
  EXPECT_EQ(lines[0]["stop_string"], "THREE, 3");
  EXPECT_EQ(lines[0]["text"], "one ");
  const std::string file = WriteFile("p.jsonl", "{\"prompt\": \"a\", \"stop\": \"x\"}\n"
                                                "{\"prompt\": \"b\"}\n");
  r = RunCarpool("generate --router " + router.endpoint() + " --stop y --prompts-file " + file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<GenerateInput> sent = Generates(router);
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_TRUE(sent[0].has_text);
  EXPECT_EQ(sent[0].text, "count:");
  EXPECT_EQ(sent[0].model, "llama");
  EXPECT_EQ(sent[0].stop, (std::vector<std::string>{"two", "THREE, 3"}));
  EXPECT_TRUE(sent[0].include_stop_str_in_output);
  EXPECT_FALSE(sent[0].skip_special_tokens);
  // A line's own "stop" replaces the flags'; the other lines keep them.
  for (const GenerateInput& g : {sent[1], sent[2]}) {
    EXPECT_EQ(g.stop, (std::vector<std::string>{g.text == "a" ? "x" : "y"})) << g.text;
    EXPECT_TRUE(g.skip_special_tokens);
    EXPECT_EQ(g.model, "");
  }
}

TEST_F(GenerateTextCliTest, StopNeedsTheRouter) {
  RunResult r = RunCarpool("generate --model synthetic:tiny --prompt hi --stop x");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--stop needs --router"));
  const std::string file = WriteFile("s.jsonl", "{\"prompt\": \"a\", \"stop\": [\"x\"]}\n");
  r = RunCarpool("generate --model synthetic:tiny --prompts-file " + file);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("needs --router"));
}

// The tokenizer handover end to end: a carpool-worker serving the folder hands its
// tokenizer.json to a carpool-router, which tokenizes and detokenizes with it for the SDK and
// the CLI, with no copy of the folder of its own.
TEST_F(GenerateTextCliTest, WorkerHandsItsTokenizerToTheRouter) {
  const std::string bin = CARPOOL_BIN_DIR;
  if (!std::filesystem::exists(bin + "/carpool-router") ||
      !std::filesystem::exists(bin + "/carpool-worker")) {
    GTEST_SKIP() << "build carpool-router and carpool-worker for this test";
  }
  const std::string dir = Folder(/*with_tokenizer=*/true);
  carpool::testing::Subprocess router(
      {bin + "/carpool-router", "--frontend", "tcp://127.0.0.1:*", "--backend",
       "tcp://127.0.0.1:*"},
      WriteFile("router.log", ""));
  carpool::testing::RouterEndpoints ep;
  ASSERT_TRUE(carpool::testing::WaitForRouterEndpoints(router, &ep)) << router.Log();
  carpool::testing::Subprocess worker({bin + "/carpool-worker", "--router", ep.backend, "--model",
                                       dir, "--worker-id", "hf-w", "--threads", "1"},
                                      WriteFile("worker.log", ""));
  ClientOptions o;
  o.router_endpoint = ep.frontend;
  o.default_timeout_ms = 20000;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  for (;;) {
    absl::StatusOr<StatsOut> stats = (*client)->Stats(1000);
    if (stats.ok() && !stats->workers.empty()) break;
    ASSERT_TRUE(absl::Now() < until && worker.running()) << "no worker registered\n"
                                                         << worker.Log();
    absl::SleepFor(absl::Milliseconds(20));
  }
  absl::StatusOr<TokenizeResult> t = (*client)->Tokenize(" hi");
  ASSERT_TRUE(t.ok()) << t.status() << "\n" << router.Log() << worker.Log();
  EXPECT_THAT(t->token_ids, ::testing::ElementsAre(258, 257));
  absl::StatusOr<std::string> text = (*client)->Detokenize({258, 257, 33});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<|bos|> hi!");

  GenerateInput g;
  g.has_text = true;
  g.text = " hi";
  g.sampling.max_tokens = 4;
  g.sampling.temperature = 0;
  g.sampling.ignore_eos = true;
  absl::StatusOr<GenerateResult> r = (*client)->Generate(g);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->usage.prompt_tokens, 2);
  DetokenizeOptions skip;
  skip.skip_special_tokens = true;
  text = (*client)->Detokenize(r->TokenIds(), skip);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(r->text, *text);  // the router's streaming decode equals the whole decode

  RunResult cli = RunCarpool("generate --router " + ep.frontend +
                             " --prompt ' hi' --max-tokens 2 --temperature 0 --json");
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_EQ(JsonLines(cli.output)[0]["usage"]["prompt_tokens"], 2);
  client->reset();
  EXPECT_EQ(worker.Terminate(), 0) << worker.Log();
  EXPECT_EQ(router.Terminate(), 0) << router.Log();
}

}  // namespace
}  // namespace carpool
