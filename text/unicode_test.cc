#include "text/unicode.h"

#include "gtest/gtest.h"

namespace carpool::text {
namespace {

TEST(UnicodeTest, FindsTheFirstInvalidByte) {
  EXPECT_EQ(FindInvalidUtf8("plain ascii"), std::string::npos);
  EXPECT_EQ(FindInvalidUtf8("h\xC3\xA9llo \xF0\x9F\x91\x8D"), std::string::npos);
  EXPECT_EQ(FindInvalidUtf8("ab\xFF"), 2u);
  EXPECT_EQ(FindInvalidUtf8("a\xC3"), 1u);          // truncated
  EXPECT_EQ(FindInvalidUtf8("a\xED\xA0\x80"), 1u);  // a surrogate
  EXPECT_EQ(FindInvalidUtf8("\xC0\xAF"), 0u);       // overlong
}

TEST(UnicodeTest, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
  // An incomplete 3-byte sequence is one U+FFFD; a stray continuation byte is another.
  EXPECT_EQ(Utf8Lossy("a\xE2\x82"
                      "b\x80"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x91"), "\xEF\xBF\xBD");
}

TEST(UnicodeTest, CharacterClassesFollowRust) {
  EXPECT_TRUE(IsWhitespace(U'\u3000'));
  EXPECT_TRUE(IsWhitespace(U'\u0085'));
  EXPECT_FALSE(IsWhitespace(U'\u200B'));  // zero width space is not White_Space
  EXPECT_TRUE(IsNumeric(U'\u0663'));      // Arabic-Indic three
  EXPECT_TRUE(IsNumeric(U'\u00BD'));      // ½ is No
  EXPECT_TRUE(IsWordChar(U'\u00E9'));
  EXPECT_TRUE(IsWordChar(U'_'));
  EXPECT_TRUE(IsWordChar(U'\u0301'));   // a mark
  EXPECT_TRUE(IsWordChar(U'\u200D'));   // ZWJ
  EXPECT_TRUE(IsWordChar(U'\u2167'));   // Ⅷ is Alphabetic
  EXPECT_FALSE(IsWordChar(U'\u00B2'));  // ² is No
  EXPECT_FALSE(IsWordChar(U'!'));
}

TEST(UnicodeTest, TrimsAndLowercases) {
  EXPECT_EQ(TrimStartWhitespace("\u3000 \tx "), "x ");
  EXPECT_EQ(TrimEndWhitespace(" x\u00A0\n"), " x");
  EXPECT_EQ(Lowercase("HeLLo ÀÉ ΣΑΣ"), "hello àé σασ");  // no final-sigma rule
  EXPECT_EQ(Lowercase("\u0130"), "i\u0307");             // full mapping
}

}  // namespace
}  // namespace carpool::text
