#include "text/normalizers.h"

#include "gtest/gtest.h"

namespace carpool::text {
namespace {

std::string Normalize(const std::string& json, std::string text) {
  auto n = ParseNormalizer(Json::parse(json));
  EXPECT_TRUE(n.ok()) << n.status();
  if (!n.ok() || *n == nullptr) return text;
  EXPECT_TRUE((*n)->Normalize(&text).ok());
  return text;
}

TEST(NormalizersTest, UnicodeForms) {
  EXPECT_EQ(Normalize(R"({"type":"NFC"})", "e\u0301"), "\u00e9");
  EXPECT_EQ(Normalize(R"({"type":"NFKC"})", "\uFB01 \uFF21"), "fi A");
  EXPECT_EQ(Normalize(R"({"type":"NFC"})", "ascii"), "ascii");
}

TEST(NormalizersTest, CharactersNewerThanUnicodeNineStayPut) {
  // U+1AC0 (Unicode 14, class 220) would move before U+1DF0 (class 230) with today's data; the
  // library's Unicode 9 data does not know it, so neither moves.
  EXPECT_EQ(Normalize(R"({"type":"NFC"})", "a\u1df0\u1ac0"), "a\u1df0\u1ac0");
  EXPECT_EQ(Normalize(R"({"type":"NFC"})", "a\u0301\u1ac0e\u0301"), "\u00e1\u1ac0\u00e9");
  // Known characters still reorder: U+0316 (220) before U+0301 (230).
  EXPECT_EQ(Normalize(R"({"type":"NFC"})", "x\u0301\u0316"), "x\u0316\u0301");
}

TEST(NormalizersTest, LlamaTwoSequence) {
  const std::string seq = R"({"type":"Sequence","normalizers":[
      {"type":"Prepend","prepend":"▁"},
      {"type":"Replace","pattern":{"String":" "},"content":"▁"}]})";
  EXPECT_EQ(Normalize(seq, "Hi  there"), "▁Hi▁▁there");
  EXPECT_EQ(Normalize(seq, ""), "");  // Prepend leaves an empty text empty
}

TEST(NormalizersTest, RegexReplaceLowercaseStrip) {
  EXPECT_EQ(Normalize(R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "})", "a \n\tb"),
            "a b");
  EXPECT_EQ(Normalize(R"({"type":"Lowercase"})", "ÀB"), "àb");
  EXPECT_EQ(Normalize(R"({"type":"Strip","strip_left":true,"strip_right":false})", "  x  "), "x  ");
  EXPECT_EQ(Normalize("null", "same"), "same");
}

TEST(NormalizersTest, UnsupportedTypeIsNamed) {
  auto n = ParseNormalizer(Json::parse(R"({"type":"BertNormalizer"})"));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().message(),
            "tokenizer.json: normalizer type \"BertNormalizer\" is not supported");
}

}  // namespace
}  // namespace carpool::text
