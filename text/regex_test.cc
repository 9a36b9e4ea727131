#include "text/regex.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace carpool::text {
namespace {

std::vector<std::string> Matches(const Regex& re, const std::string& text) {
  std::vector<std::string> out;
  absl::Status s =
      re.ForEachMatch(text, [&](size_t b, size_t e) { out.push_back(text.substr(b, e - b)); });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(RegexTest, UnicodePropertiesAndCaseInsensitiveGroups) {
  auto re = Regex::Compile(R"((?i:'s|'t)|\p{L}+|\p{N}{1,3}|\s+)");
  ASSERT_TRUE(re.ok()) << re.status();
  EXPECT_EQ(Matches(**re, "IT'S 12345 héllo"),
            (std::vector<std::string>{"IT", "'S", " ", "123", "45", " ", "héllo"}));
}

TEST(RegexTest, EmptyMatchesMoveOnByOneCharacter) {
  auto re = Regex::Compile("x*");
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> spans;
  ASSERT_TRUE((*re)->ForEachMatch("é", [&](size_t b, size_t e) { spans.push_back({b, e}); }).ok());
  EXPECT_EQ(spans, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {2, 2}}));
  // No empty match right after a match: "a*" on "baa" is (0,0), (1,3), not also (3,3).
  auto a = Regex::Compile("a*");
  ASSERT_TRUE(a.ok());
  spans.clear();
  ASSERT_TRUE((*a)->ForEachMatch("baa", [&](size_t b, size_t e) { spans.push_back({b, e}); }).ok());
  EXPECT_EQ(spans, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 3}}));
}

TEST(RegexTest, BadPatternIsAnError) {
  auto re = Regex::Compile("(unclosed");
  ASSERT_FALSE(re.ok());
  EXPECT_NE(re.status().message().find("(unclosed"), std::string::npos);
}

TEST(RegexTest, CatastrophicBacktrackingFailsInsteadOfHanging) {
  RegexOptions options;
  options.match_limit = 100'000;
  auto re = Regex::Compile("(a+)+$", options);
  ASSERT_TRUE(re.ok());
  absl::Status s = (*re)->ForEachMatch(std::string(40, 'a') + "!", [](size_t, size_t) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(RegexTest, EscapeMatchesTheLiteral) {
  auto re = Regex::Compile(Regex::Escape("a.b\\E*"));
  ASSERT_TRUE(re.ok()) << re.status();
  EXPECT_EQ(Matches(**re, "a.b\\E* axb"), (std::vector<std::string>{"a.b\\E*"}));
}

}  // namespace
}  // namespace carpool::text

namespace carpool::text {
namespace {

TEST(RegexTest, WordAndSpaceClassesAreOniguruma) {
  // \w takes marks and the zero-width joiner (Oniguruma does; PCRE2's UCP \w does not).
  auto re = Regex::Compile(R"(\w+|[^\w\s]+|\s+)");
  ASSERT_TRUE(re.ok()) << re.status();
  EXPECT_EQ(Matches(**re, "नमस्ते 👩\u200d👩"),
            (std::vector<std::string>{"नमस्ते", " ", "👩", "\u200d", "👩"}));
  // Ruby syntax: \uHHHH is a code point, \h a hex digit.
  auto ruby = Regex::Compile(R"([\u3040-\u309F]+|\h+)");
  ASSERT_TRUE(ruby.ok()) << ruby.status();
  EXPECT_EQ(Matches(**ruby, "ひらがな 0xBEEF"),
            (std::vector<std::string>{"ひらがな", "0", "BEEF"}));
  // U+180E is not White_Space.
  EXPECT_EQ(Matches(**re, "a\u180e"), (std::vector<std::string>{"a", "\u180e"}));
}

}  // namespace
}  // namespace carpool::text
