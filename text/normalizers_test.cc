#include "text/normalizers.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "text/unicode.h"

namespace carpool::text {
namespace {

size_t Utf8LengthOfFirst(const std::string& s) {
  return Utf8Length(static_cast<unsigned char>(s[0]));
}

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

// The normalized text and how many of its first bytes are aligned with the input's offset 0,
// for an input whose first character is there (`segment_at_origin`) or not.
std::pair<std::string, size_t> NormalizeWithOrigin(const std::string& json, std::string text,
                                                   bool segment_at_origin = true) {
  auto n = ParseNormalizer(Json::parse(json));
  EXPECT_TRUE(n.ok()) << n.status();
  OriginPrefix origin;
  origin.segment_at_origin = segment_at_origin;
  if (segment_at_origin && !text.empty()) origin.bytes = Utf8LengthOfFirst(text);
  if (n.ok() && *n != nullptr) {
    EXPECT_TRUE((*n)->Normalize(&text, &origin).ok());
  }
  return {text, origin.bytes};
}

using P = std::pair<std::string, size_t>;

TEST(NormalizersTest, OriginAfterRemovingTheFirstCharacters) {
  // What was at offset 0 is gone: nothing left is aligned there.
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Strip","strip_left":true,"strip_right":true})",
                                "  ab "),
            (P{"ab", 0}));
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Strip","strip_left":false,"strip_right":true})",
                                "ab "),
            (P{"ab", 1}));
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Replace","pattern":{"String":" "},"content":""})",
                                " ab"),
            (P{"ab", 0}));
  // The content takes the alignment of the match's last character (offset 1 here).
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":"#"})",
                                "  ab"),
            (P{"#ab", 0}));
  // A match of the first character alone: its content is aligned with offset 0.
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":"#"})",
                                " ab"),
            (P{"#ab", 1}));
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Replace","pattern":{"String":"a"},"content":"xyz"})",
                                "ab"),
            (P{"xyzb", 3}));
}

TEST(NormalizersTest, OriginAfterPrepend) {
  // Prepended characters take the first character's alignment.
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Prepend","prepend":" "})", "ab"), (P{" ab", 2}));
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Prepend","prepend":"▁"})", "ab", false),
            (P{"▁ab", 0}));
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Sequence","normalizers":[
                                    {"type":"Strip","strip_left":true,"strip_right":false},
                                    {"type":"Prepend","prepend":" "}]})",
                                " ab"),
            (P{" ab", 0}));
  // An empty match at 0 inserts before everything: aligned with where the text starts.
  const std::string at_start = R"({"type":"Sequence","normalizers":[
      {"type":"Strip","strip_left":true,"strip_right":false},
      {"type":"Replace","pattern":{"Regex":"^"},"content":"x"}]})";
  EXPECT_EQ(NormalizeWithOrigin(at_start, " ab"), (P{"xab", 1}));
  EXPECT_EQ(NormalizeWithOrigin(at_start, " ab", false), (P{"xab", 0}));
}

TEST(NormalizersTest, OriginThroughLowercaseAndUnicodeForms) {
  // U+0130 lowercases to i + U+0307 (3 bytes), all from the first character.
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"Lowercase"})", "\u0130X"), (P{"i\u0307x", 3}));
  // NFKC: U+FB01 becomes "fi", both from the first character.
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"NFKC"})", "\uFB01x"), (P{"fix", 2}));
  // NFC composes e + U+0301 into one character aligned with the e: the prefix reaches into it.
  const auto [text, bytes] = NormalizeWithOrigin(R"({"type":"NFC"})", "e\u0301x");
  EXPECT_EQ(text, "\u00e9x");
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, 2u);
  EXPECT_EQ(NormalizeWithOrigin(R"({"type":"NFC"})", "ab"), (P{"ab", 1}));
}

TEST(NormalizersTest, UnsupportedTypeIsNamed) {
  auto n = ParseNormalizer(Json::parse(R"({"type":"BertNormalizer"})"));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().message(),
            "tokenizer.json: normalizer type \"BertNormalizer\" is not supported");
}

}  // namespace
}  // namespace carpool::text
