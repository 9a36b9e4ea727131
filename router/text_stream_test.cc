#include "router/text_stream.h"

#include <string>

#include "gtest/gtest.h"

namespace carpool::router {
namespace {

// Feeds `text` one byte at a time and returns everything emitted.
std::string FeedBytes(Utf8Stream& s, const std::string& text) {
  std::string out;
  for (char c : text) out += s.Feed(std::string(1, c));
  return out + s.Flush();
}

TEST(Utf8StreamTest, ValidTextPassesThrough) {
  EXPECT_EQ(SanitizeUtf8("héllo €𝄞"), "héllo €𝄞");
}

TEST(Utf8StreamTest, InvalidBytesBecomeReplacement) {
  EXPECT_EQ(SanitizeUtf8("a\xff" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(SanitizeUtf8("\xE2\x28" "x"), "\xEF\xBF\xBD(x");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(SanitizeUtf8("ok\xE2\x82"), "ok\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated at the end
}

TEST(Utf8StreamTest, HoldsIncompleteSequences) {
  Utf8Stream s;
  EXPECT_EQ(s.Feed("a\xE2"), "a");
  EXPECT_EQ(s.Feed("\x82"), "");
  EXPECT_EQ(s.Feed("\xAC" "b"), "€b");
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8StreamTest, SplitDoesNotChangeTheOutput) {
  const std::string bytes = "x\xF0\x9D\x84\x9E\xE2\x28\xA1\xC3\xA9\xFF\xF4\x90\x80\x80z\xE2\x82";
  Utf8Stream byte_by_byte;
  EXPECT_EQ(FeedBytes(byte_by_byte, bytes), SanitizeUtf8(bytes));
}

}  // namespace
}  // namespace carpool::router
