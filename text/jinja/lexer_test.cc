#include "text/jinja/lexer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace carpool::text::jinja {
namespace {

// The tokens as one line each: "data:TEXT", "name:if", "op:(", "{%", "%}", "str:..", "int:3".
std::vector<std::string> Lex(absl::string_view source) {
  absl::StatusOr<std::vector<Token>> tokens = Tokenize(source);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  std::vector<std::string> out;
  if (!tokens.ok()) return out;
  for (const Token& t : *tokens) {
    switch (t.type) {
      case TokenType::kData:
        out.push_back("data:" + t.text);
        break;
      case TokenType::kVariableBegin:
        out.push_back("{{");
        break;
      case TokenType::kVariableEnd:
        out.push_back("}}");
        break;
      case TokenType::kBlockBegin:
        out.push_back("{%");
        break;
      case TokenType::kBlockEnd:
        out.push_back("%}");
        break;
      case TokenType::kName:
        out.push_back("name:" + t.text);
        break;
      case TokenType::kString:
        out.push_back("str:" + t.text);
        break;
      case TokenType::kInteger:
        out.push_back("int:" + std::to_string(t.integer_value));
        break;
      case TokenType::kFloat:
        out.push_back("float:" + std::to_string(t.float_value));
        break;
      case TokenType::kOperator:
        out.push_back("op:" + t.text);
        break;
      case TokenType::kEof:
        break;
    }
  }
  return out;
}

using V = std::vector<std::string>;

TEST(LexerTest, TrimBlocksDropsTheNewlineAfterABlockOrComment) {
  // Jinja2 (trim_blocks): "{% if x %}\nA\n{% endif %}\nB" -> data "A\n", then "B".
  EXPECT_EQ(Lex("{% if x %}\nA\n{% endif %}\nB"),
            (V{"{%", "name:if", "name:x", "%}", "data:A\n", "{%", "name:endif", "%}", "data:B"}));
  EXPECT_EQ(Lex("{# c #}\nB"), (V{"data:B"}));
  // A variable tag keeps the newline after it.
  EXPECT_EQ(Lex("{{ x }}\nB"), (V{"{{", "name:x", "}}", "data:\nB"}));
  // `+%}` keeps it too.
  EXPECT_EQ(Lex("{% if x +%}\nB"), (V{"{%", "name:if", "name:x", "%}", "data:\nB"}));
}

TEST(LexerTest, LstripBlocksDropsIndentBeforeABlockButNotBeforeAVariable) {
  EXPECT_EQ(Lex("a\n    {% if x %}"), (V{"data:a\n", "{%", "name:if", "name:x", "%}"}));
  EXPECT_EQ(Lex("a\n  \t{# c #}b"), (V{"data:a\n", "data:b"}));
  EXPECT_EQ(Lex("a\n    {{ x }}"), (V{"data:a\n    ", "{{", "name:x", "}}"}));
  // Not at a line start: kept.
  EXPECT_EQ(Lex("a  {% if x %}"), (V{"data:a  ", "{%", "name:if", "name:x", "%}"}));
  // `{%+` keeps the indent.
  EXPECT_EQ(Lex("  {%+ if x %}"), (V{"data:  ", "{%", "name:if", "name:x", "%}"}));
  // The start of the template is a line start; so is the text after a trimmed newline.
  EXPECT_EQ(Lex("  {% if x %}\n  {% endif %}"),
            (V{"{%", "name:if", "name:x", "%}", "{%", "name:endif", "%}"}));
}

TEST(LexerTest, MinusStripsAllWhitespaceOnItsSide) {
  EXPECT_EQ(Lex("a \n\t {{- x -}} \n b"), (V{"data:a", "{{", "name:x", "}}", "data:b"}));
  EXPECT_EQ(Lex("a \n {%- if x -%}\n\n b"),
            (V{"data:a", "{%", "name:if", "name:x", "%}", "data:b"}));
  // Python's str.isspace(): a no-break space is whitespace too.
  EXPECT_EQ(Lex("a\xc2\xa0 {{- x }}"), (V{"data:a", "{{", "name:x", "}}"}));
}

TEST(LexerTest, RawBlocksAreData) {
  EXPECT_EQ(Lex("{% raw %}{{ x }}{% if %}{% endraw %}"), (V{"data:{{ x }}{% if %}"}));
  EXPECT_EQ(Lex("{%- raw -%}  a  {%- endraw -%}  b"), (V{"data:a", "data:b"}));
}

TEST(LexerTest, NewlinesAreNormalizedAndOneTrailingNewlineGoes) {
  EXPECT_EQ(Lex("a\r\nb\rc\n"), (V{"data:a\nb\nc"}));
  EXPECT_EQ(Lex("a\n\n"), (V{"data:a\n"}));
}

TEST(LexerTest, LiteralsAndOperators) {
  EXPECT_EQ(Lex("{{ 'a\\n\\x41\\u00e9' \"b'\" 1_000 0x1F 0b11 2.5e1 x.0 a//b**c != d }}"),
            (V{"{{", "str:a\nA\xc3\xa9", "str:b'", "int:1000", "int:31", "int:3", "float:25.000000",
               "name:x", "op:.", "int:0", "name:a", "op://", "name:b", "op:**", "name:c",
               "op:!=", "name:d", "}}"}));
  // An unknown escape keeps its backslash; an octal escape is a code point.
  EXPECT_EQ(Lex("{{ '\\d\\101' }}"), (V{"{{", "str:\\dA", "}}"}));
}

TEST(LexerTest, BracesInsideATagDoNotEndIt) {
  EXPECT_EQ(Lex("{{ {'a':{'b':1}}}}"), (V{"{{", "op:{", "str:a", "op::", "op:{", "str:b",
                                          "op::", "int:1", "op:}", "op:}", "}}"}));
}

TEST(LexerTest, TokensCarryTheirLine) {
  absl::StatusOr<std::vector<Token>> tokens = Tokenize("a\nb\n{{ x\n+ y }}");
  ASSERT_TRUE(tokens.ok());
  ASSERT_GE(tokens->size(), 5u);
  EXPECT_EQ((*tokens)[0].line, 1);  // data
  EXPECT_EQ((*tokens)[1].line, 3);  // {{
  EXPECT_EQ((*tokens)[2].line, 3);  // x
  EXPECT_EQ((*tokens)[3].line, 4);  // +
}

TEST(LexerTest, RefusesWhatJinja2Refuses) {
  const std::pair<const char*, const char*> refused[] = {
      {"{# open", "line 1: missing end of comment tag"},
      {"a\n{% raw %} open", "line 2: missing end of raw directive"},
      {"{{ x ! y }}", "line 1: unexpected char '!'"},
      {"{{ (x] }}", "line 1: unexpected ']', expected ')'"},
      {"{{ x) }}", "line 1: unexpected ')'"},
      {"{{ '\\x4' }}", "line 1: truncated \\xXX escape"},
      {"{{ 99999999999999999999 }}", "line 1: integer literal '99999999999999999999' is too large"},
  };
  for (const auto& [source, message] : refused) {
    absl::StatusOr<std::vector<Token>> tokens = Tokenize(source);
    ASSERT_FALSE(tokens.ok()) << source;
    EXPECT_EQ(tokens.status().message(), message) << source;
  }
}

}  // namespace
}  // namespace carpool::text::jinja
