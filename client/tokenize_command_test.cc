#include "client/tokenize_command.h"

#include <sstream>

#include "gtest/gtest.h"

namespace carpool::client {
namespace {

struct Output {
  std::string out;
  std::string err;
};

Output RunLines(const TokenizeLinesOptions& options, const std::string& input) {
  ByteTokenizer tokenizer;
  std::istringstream in(input);
  std::ostringstream out, err;
  TokenizeJsonLines(tokenizer, options, in, out, err);
  return {out.str(), err.str()};
}

TEST(TokenizeCommandTest, TokenizesJsonLinesAndReportsBadOnesInPlace) {
  TokenizeLinesOptions o;
  o.json = true;
  const Output r = RunLines(o, "{\"text\": \"AB\"}\n\nnot json\n{\"txt\": 1}\n{\"text\": \"\"}\n");
  EXPECT_EQ(r.out,
            "{\"ids\":[256,65,66]}\n"
            "{\"line\":3,\"error\":\"not a JSON object\"}\n"
            "{\"line\":4,\"error\":\"expected {\\\"text\\\": \\\"...\\\"}\"}\n"
            "{\"ids\":[256]}\n");
  o.add_special_tokens = false;
  EXPECT_EQ(RunLines(o, "{\"text\": \"AB\"}\n").out, "{\"ids\":[65,66]}\n");
  o.json = false;
  EXPECT_EQ(RunLines(o, "{\"text\": \"AB\"}\n").out, "65 66\n");
}

TEST(TokenizeCommandTest, DetokenizesWithAndWithoutSpecialTokens) {
  TokenizeLinesOptions o;
  o.decode = true;
  o.json = true;
  EXPECT_EQ(RunLines(o, "{\"ids\": [256, 104, 105, 257]}\n").out,
            "{\"text\":\"<|256|>hi<|257|>\"}\n");
  o.skip_special_tokens = true;
  EXPECT_EQ(RunLines(o, "{\"ids\": [256, 104, 105, 257]}\n").out, "{\"text\":\"hi\"}\n");
  EXPECT_EQ(RunLines(o, "{\"ids\": [1, -2]}\n").out,
            "{\"line\":1,\"error\":\"ids[1] is not a token id (an integer in [0, 2^31))\"}\n");
  o.json = false;
  const Output plain = RunLines(o, "{\"ids\": \"x\"}\n{\"ids\": [104]}\n");
  EXPECT_EQ(plain.out, "h\n");
  EXPECT_EQ(plain.err, "line 1: expected {\"ids\": [...]}\n");
}

}  // namespace
}  // namespace carpool::client
