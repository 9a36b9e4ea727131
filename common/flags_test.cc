// FlagParser: Help() shows each flag's default as its destination held it when the flag was
// added, in the form a user would type it back; parsing still fills the destinations.
#include "common/flags.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Status ParseArgs(FlagParser* parser, std::vector<std::string> args) {
  std::vector<char*> argv = {const_cast<char*>("test")};
  for (std::string& a : args) argv.push_back(a.data());
  return parser->Parse(static_cast<int>(argv.size()), argv.data(), 1);
}

TEST(FlagParserTest, HelpShowsTheDefaultOfEachKind) {
  std::string endpoint = "tcp://127.0.0.1:5555";
  std::string empty;
  int seqs = 256;
  int negative = -1;
  int64_t timeout_ms = 30000;
  float utilization = 0.9f;
  double weight = 1.0;
  bool on = true;
  bool off = false;
  int64_t body = 1 << 20;
  int64_t header = 16 << 10;
  int64_t pool = 3LL << 30;
  int64_t odd = 1000;
  int64_t zero = 0;
  FlagParser p;
  p.AddString("frontend", &endpoint, "client endpoint");
  p.AddString("tenants", &empty, "API keys");
  p.AddInt("max-num-seqs", &seqs, "Max sequences per step");
  p.AddInt("gpu", &negative, "device index");
  p.AddInt64("timeout-ms", &timeout_ms, "how long");
  p.AddFloat("gpu-memory-utilization", &utilization, "share of memory");
  p.AddDouble("weight", &weight, "load weight");
  p.AddBool("drain-workers", &on, "drain too");
  p.AddBool("stream", &off, "stream chunks");
  p.AddBytes("max-body-bytes", &body, "largest body");
  p.AddBytes("max-header-bytes", &header, "largest header");
  p.AddBytes("kv-cache-memory", &pool, "KV pool");
  p.AddBytes("odd-bytes", &odd, "not a round unit");
  p.AddBytes("auto-bytes", &zero, "0: sized automatically");
  p.AddCustom(
      "priority", [](const std::string&) { return absl::OkStatus(); },
      "interactive | default | batch", "default");
  p.AddCustom(
      "input", [](const std::string&) { return absl::OkStatus(); }, "a text, repeatable");
  const std::string help = p.Help();
  EXPECT_THAT(help,
              HasSubstr("  --frontend  client endpoint (default: \"tcp://127.0.0.1:5555\")\n"));
  EXPECT_THAT(help, HasSubstr("  --tenants  API keys (default: none)\n"));
  EXPECT_THAT(help, HasSubstr("  --max-num-seqs  Max sequences per step (default: 256)\n"));
  EXPECT_THAT(help, HasSubstr("  --gpu  device index (default: -1)\n"));
  EXPECT_THAT(help, HasSubstr("  --timeout-ms  how long (default: 30000)\n"));
  EXPECT_THAT(help, HasSubstr("  --gpu-memory-utilization  share of memory (default: 0.9)\n"));
  EXPECT_THAT(help, HasSubstr("  --weight  load weight (default: 1)\n"));
  EXPECT_THAT(help, HasSubstr("  --drain-workers  drain too (default: true)\n"));
  EXPECT_THAT(help, HasSubstr("  --stream  stream chunks (default: false)\n"));
  EXPECT_THAT(help, HasSubstr("  --max-body-bytes  largest body (default: 1MiB)\n"));
  EXPECT_THAT(help, HasSubstr("  --max-header-bytes  largest header (default: 16KiB)\n"));
  EXPECT_THAT(help, HasSubstr("  --kv-cache-memory  KV pool (default: 3GiB)\n"));
  EXPECT_THAT(help, HasSubstr("  --odd-bytes  not a round unit (default: 1000)\n"));
  EXPECT_THAT(help, HasSubstr("  --auto-bytes  0: sized automatically (default: 0)\n"));
  EXPECT_THAT(help, HasSubstr("  --priority  interactive | default | batch (default: default)\n"));
  // A custom flag without a default text shows none.
  EXPECT_THAT(help, HasSubstr("  --input  a text, repeatable\n"));
}

TEST(FlagParserTest, HelpShowsTheValueAtRegistrationNotAfterParsing) {
  int seqs = 256;
  seqs = 64;  // a main that changes a default before adding the flag: 64 is the default shown
  std::string model = "synthetic:tiny";
  FlagParser p;
  p.AddInt("max-num-seqs", &seqs, "Max sequences");
  p.AddString("model", &model, "model");
  model = "changed after registration";
  ASSERT_TRUE(ParseArgs(&p, {"--max-num-seqs", "8"}).ok());
  EXPECT_EQ(seqs, 8);
  const std::string help = p.Help();
  EXPECT_THAT(help, HasSubstr("--max-num-seqs  Max sequences (default: 64)\n"));
  EXPECT_THAT(help, HasSubstr("--model  model (default: \"synthetic:tiny\")\n"));
  EXPECT_THAT(help, Not(HasSubstr("256")));
  EXPECT_THAT(help, Not(HasSubstr("(default: 8)")));
  EXPECT_THAT(help, Not(HasSubstr("changed")));
}

TEST(FlagParserTest, ShownByteDefaultsParseBackToTheirValue) {
  for (int64_t bytes : {int64_t{0}, int64_t{1000}, int64_t{1} << 10, int64_t{1536} << 10,
                        int64_t{1} << 20, int64_t{512} << 20, int64_t{5} << 30}) {
    int64_t parsed = -1;
    FlagParser p;
    p.AddBytes("b", &parsed, "");
    ASSERT_TRUE(ParseArgs(&p, {"--b=" + FormatBytes(bytes)}).ok()) << FormatBytes(bytes);
    EXPECT_EQ(parsed, bytes) << FormatBytes(bytes);
  }
  EXPECT_EQ(FormatBytes(1536 << 10), "1536KiB");
  EXPECT_EQ(FormatBytes(512 << 20), "512MiB");
}

TEST(FlagParserTest, AnEmptyHelpStillShowsTheDefault) {
  int n = 4;
  FlagParser p;
  p.AddInt("n", &n, "");
  EXPECT_EQ(p.Help(), "  --n  (default: 4)\n");
}

TEST(FlagParserTest, ParsesEveryKindAndNamesBadValues) {
  std::string s;
  int i = 0;
  int64_t l = 0;
  float f = 0;
  double d = 0;
  bool b = true;
  int64_t bytes = 0;
  FlagParser p;
  p.AddString("s", &s, "");
  p.AddInt("i", &i, "");
  p.AddInt64("l", &l, "");
  p.AddFloat("f", &f, "");
  p.AddDouble("d", &d, "");
  p.AddBool("b", &b, "");
  p.AddBytes("bytes", &bytes, "");
  ASSERT_TRUE(ParseArgs(&p, {"--s", "x", "--i=3", "--l", "-4", "--f=0.5", "--d", "2.5", "--no-b",
                             "--bytes=2MiB", "pos"})
                  .ok());
  EXPECT_EQ(s, "x");
  EXPECT_EQ(i, 3);
  EXPECT_EQ(l, -4);
  EXPECT_FLOAT_EQ(f, 0.5f);
  EXPECT_DOUBLE_EQ(d, 2.5);
  EXPECT_FALSE(b);
  EXPECT_EQ(bytes, 2 << 20);
  EXPECT_TRUE(p.WasSet("bytes"));
  EXPECT_THAT(p.positionals(), ::testing::ElementsAre("pos"));

  FlagParser q;
  q.AddInt("i", &i, "");
  absl::Status bad = ParseArgs(&q, {"--i=x"});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--i"));
  EXPECT_THAT(ParseArgs(&q, {"--nope"}).message(), HasSubstr("unknown flag --nope"));
}

}  // namespace
}  // namespace carpool
