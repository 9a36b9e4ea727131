#include "router/stop_strings.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace carpool::router {
namespace {

// Feeds `text` split at random points; returns the output and whether it stopped.
std::string FeedSplit(StopStrings& s, const std::string& text, std::mt19937& rng) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t n = std::uniform_int_distribution<size_t>(1, 4)(rng);
    out += s.Feed(text.substr(at, n));
    at += n;
  }
  return out + s.Flush();
}

TEST(StopStringsTest, HoldsAPossibleStopAndEndsAtTheEarliest) {
  StopStrings s({"world", "lo w", ""}, /*include_stop=*/false);
  EXPECT_EQ(s.Feed("hel"), "he");  // "l" may start "lo w"
  EXPECT_EQ(s.Feed("lo"), "l");    // "lo" may
  EXPECT_EQ(s.Feed(" wor"), "");   // "lo w" starts before "world" could
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.matched(), "lo w");
  EXPECT_EQ(s.Feed("ld"), "");
  EXPECT_EQ(s.Flush(), "");
}

TEST(StopStringsTest, KeepsTheStopWhenAskedAndFlushesWhatNeverCompleted) {
  StopStrings keep({"xy"}, /*include_stop=*/true);
  EXPECT_EQ(keep.Feed("axyz"), "axy");
  EXPECT_EQ(keep.matched(), "xy");
  StopStrings held({"xy"}, /*include_stop=*/false);
  EXPECT_EQ(held.Feed("ax"), "a");
  EXPECT_EQ(held.Flush(), "x");
  EXPECT_FALSE(held.stopped());
  StopStrings none({}, false);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.Feed("any"), "any");
}

// The output does not depend on how the text was split.
TEST(StopStringsTest, AnySplitGivesTheSameText) {
  std::mt19937 rng(7);
  const std::vector<std::string> texts = {"the cat sat on the mat", "aaaaab", "no stop here",
                                          "ends with ab", "abababa"};
  for (const std::string& text : texts) {
    for (bool include : {false, true}) {
      StopStrings whole({"the m", "aab", "bab", "ab"}, include);
      const std::string want = whole.Feed(text) + whole.Flush();
      for (int trial = 0; trial < 50; ++trial) {
        StopStrings s({"the m", "aab", "bab", "ab"}, include);
        EXPECT_EQ(FeedSplit(s, text, rng), want) << text;
        EXPECT_EQ(s.matched(), whole.matched()) << text;
      }
    }
  }
}

}  // namespace
}  // namespace carpool::router
