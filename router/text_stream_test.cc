#include "router/text_stream.h"

#include <string>

#include "gtest/gtest.h"

namespace carpool::router {
namespace {

// Feeds `text` one byte at a time and returns everything emitted.
std::string FeedBytes(TextStream& s, const std::string& text) {
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
  TextStream byte_by_byte({});
  EXPECT_EQ(FeedBytes(byte_by_byte, bytes), SanitizeUtf8(bytes));
}

TEST(StopMatcherTest, CutsAtTheEarliestStop) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.Feed("hello wor"), "hello wor");
  EXPECT_EQ(m.Feed("ld\n"), "ld");  // "\n" may start "\n\n"
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Feed("E"), "\n");      // no longer "\n\n"; "E" may start "END"
  EXPECT_EQ(m.Feed("ND and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Feed("later"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, HeldTextIsReleasedWhenItCannotMatch) {
  StopMatcher m({"stop"});
  EXPECT_EQ(m.Feed("a st"), "a ");
  EXPECT_EQ(m.Feed("o"), "");
  EXPECT_EQ(m.Feed("x"), "stox");
  EXPECT_EQ(m.Feed("sto"), "");
  EXPECT_EQ(m.Flush(), "sto");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, StreamedEqualsWhole) {
  const std::string text = "one two\nthree<|eot|>four";
  TextStream whole({"<|eot|>", "zzz"});
  std::string a = whole.Feed(text);
  a += whole.Flush();
  TextStream pieces({"<|eot|>", "zzz"});
  EXPECT_EQ(FeedBytes(pieces, text), a);
  EXPECT_EQ(a, "one two\nthree");
  EXPECT_TRUE(pieces.stopped());
}

TEST(StopMatcherTest, NamesTheMatchAndCanKeepIt) {
  StopMatcher cut({"xyz", "b"});
  EXPECT_EQ(cut.matched(), "");
  EXPECT_EQ(cut.Feed("aaxyzb"), "aa");  // "xyz" starts first although "b" is listed later
  EXPECT_EQ(cut.matched(), "xyz");
  StopMatcher keep({"END", "\n"}, /*include_stop=*/true);
  EXPECT_EQ(keep.Feed("one E"), "one ");
  EXPECT_EQ(keep.Feed("ND two"), "END");
  EXPECT_TRUE(keep.stopped());
  EXPECT_EQ(keep.matched(), "END");
  EXPECT_EQ(keep.Flush(), "");
  TextStream streamed({"<|eot|>"}, /*include_stop=*/true);
  EXPECT_EQ(FeedBytes(streamed, "a<|eot|>b"), "a<|eot|>");
  EXPECT_EQ(streamed.matched(), "<|eot|>");
}

TEST(StopMatcherTest, NoStopsPassesEverything) {
  StopMatcher m({});
  EXPECT_EQ(m.Feed("abc"), "abc");
  EXPECT_EQ(m.Flush(), "");
}

}  // namespace
}  // namespace carpool::router
