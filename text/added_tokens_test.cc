#include "text/added_tokens.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace carpool::text {
namespace {

struct Cut {
  std::string text;
  int32_t id;
  bool operator==(const Cut& o) const { return text == o.text && id == o.id; }
};

std::vector<Cut> Split(const std::vector<AddedToken>& tokens, const std::string& text) {
  std::vector<std::string> patterns;
  for (const AddedToken& t : tokens) patterns.push_back(t.content);
  AddedTokenMatcher m(tokens, patterns);
  std::vector<Segment> segments;
  m.Split(text, &segments);
  std::vector<Cut> out;
  for (const Segment& s : segments) out.push_back({text.substr(s.begin, s.end - s.begin), s.id});
  return out;
}

AddedToken Token(int32_t id, std::string content) {
  AddedToken t;
  t.id = id;
  t.content = std::move(content);
  return t;
}

TEST(AddedTokensTest, LeftmostLongest) {
  const std::vector<AddedToken> tokens = {Token(1, "<a>"), Token(2, "<a><b>")};
  EXPECT_EQ(Split(tokens, "x<a><b>y<a>"),
            (std::vector<Cut>{{"x", -1}, {"<a><b>", 2}, {"y", -1}, {"<a>", 1}}));
}

TEST(AddedTokensTest, LstripRstrip) {
  AddedToken t = Token(7, "<m>");
  t.lstrip = true;
  t.rstrip = true;
  EXPECT_EQ(Split({t}, "a  <m>\n b"), (std::vector<Cut>{{"a", -1}, {"  <m>\n ", 7}, {"b", -1}}));
}

TEST(AddedTokensTest, SingleWordNeedsNonWordNeighbours) {
  AddedToken t = Token(3, "cat");
  t.single_word = true;
  EXPECT_EQ(Split({t}, "concat cat"), (std::vector<Cut>{{"concat ", -1}, {"cat", 3}}));
  EXPECT_EQ(Split({t}, "cats"), (std::vector<Cut>{{"cats", -1}}));
  // Word characters as a regex \w has them: '_' and marks touch, '²' and '-' do not.
  EXPECT_EQ(Split({t}, "cat_"), (std::vector<Cut>{{"cat_", -1}}));
  EXPECT_EQ(Split({t}, "cat\u0301"), (std::vector<Cut>{{"cat\u0301", -1}}));
  EXPECT_EQ(Split({t}, "cat\u00b2"), (std::vector<Cut>{{"cat", 3}, {"\u00b2", -1}}));
}

TEST(AddedTokensTest, ParsesTheFileForm) {
  auto tokens = ParseAddedTokens(Json::parse(
      R"([{"id":5,"content":"<s>","single_word":false,"lstrip":false,"rstrip":true,
           "normalized":false,"special":true}])"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 1u);
  EXPECT_EQ((*tokens)[0].id, 5);
  EXPECT_TRUE((*tokens)[0].rstrip);
  EXPECT_FALSE((*tokens)[0].normalized);
  EXPECT_TRUE((*tokens)[0].special);
  EXPECT_FALSE(ParseAddedTokens(Json::parse(R"([{"content":"<s>"}])")).ok());  // no id
}

}  // namespace
}  // namespace carpool::text
