#include "text/bpe.h"

#include <vector>

#include "gtest/gtest.h"

namespace carpool::text {
namespace {

std::unique_ptr<BpeModel> Model(const std::string& json) {
  auto m = BpeModel::FromJson(Json::parse(json));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> Tokenize(const BpeModel& m, const std::string& piece) {
  std::vector<int32_t> ids;
  m.Tokenize(piece, &ids);
  return ids;
}

using V = std::vector<int32_t>;

TEST(BpeTest, MergesLowestRankFirstInBothFormats) {
  // "a b" ranks before "b c": "abc" -> "ab" + "c", not "a" + "bc".
  const std::string vocab = R"("vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4,"abc":5})";
  auto strings = Model("{" + vocab + R"(,"merges":["a b","b c"]})");
  auto pairs = Model("{" + vocab + R"(,"merges":[["b","c"],["a","b"]]})");
  EXPECT_EQ(Tokenize(*strings, "abc"), (V{3, 2}));
  EXPECT_EQ(Tokenize(*pairs, "abc"), (V{0, 4}));
  EXPECT_EQ(Tokenize(*strings, "abc"), (V{3, 2}));  // again, from the cache
}

TEST(BpeTest, TiesGoLeftmost) {
  auto m = Model(R"({"vocab":{"a":0,"aa":1},"merges":["a a"]})");
  EXPECT_EQ(Tokenize(*m, "aaa"), (V{1, 0}));
}

TEST(BpeTest, ByteFallbackAndFusedUnknowns) {
  auto m = Model(R"({"vocab":{"<unk>":0,"<0xC3>":1,"<0xA9>":2,"x":3},"merges":[],
                     "unk_token":"<unk>","fuse_unk":true,"byte_fallback":true})");
  EXPECT_EQ(Tokenize(*m, "xé"), (V{3, 1, 2}));
  auto unk = Model(R"({"vocab":{"<unk>":0,"x":1},"merges":[],"unk_token":"<unk>",
                       "fuse_unk":true})");
  EXPECT_EQ(Tokenize(*unk, "x??x?"), (V{1, 0, 1, 0}));
  auto no_unk = Model(R"({"vocab":{"x":0},"merges":[]})");
  EXPECT_EQ(Tokenize(*no_unk, "x?x"), (V{0, 0}));  // dropped, as the library does
}

TEST(BpeTest, IgnoreMergesTakesWholeVocabEntries) {
  auto m = Model(R"({"vocab":{"a":0,"b":1,"ab":2,"abb":3},"merges":["a b"],
                     "ignore_merges":true})");
  EXPECT_EQ(Tokenize(*m, "abb"), (V{3}));
  EXPECT_EQ(Tokenize(*m, "abbb"), (V{2, 1, 1}));
}

TEST(BpeTest, ContinuingSubwordPrefix) {
  auto m = Model(R"({"vocab":{"a":0,"##b":1,"ab":2},"merges":["a ##b"],
                     "continuing_subword_prefix":"##"})");
  EXPECT_EQ(Tokenize(*m, "ab"), (V{2}));
}

TEST(BpeTest, BadFilesAreRefused) {
  EXPECT_FALSE(BpeModel::FromJson(Json::parse(R"({"vocab":{"a":0},"merges":["a z"]})")).ok());
  EXPECT_FALSE(BpeModel::FromJson(Json::parse(R"({"vocab":{"a":0},"merges":["aa"]})")).ok());
  EXPECT_FALSE(
      BpeModel::FromJson(Json::parse(R"({"vocab":{"a":0},"merges":[],"dropout":0.1})")).ok());
  EXPECT_FALSE(
      BpeModel::FromJson(Json::parse(R"({"vocab":{"a":0},"merges":[],"unk_token":"<unk>"})")).ok());
}

}  // namespace
}  // namespace carpool::text

namespace carpool::text {
namespace {

TEST(BpeTest, LongSentencepieceTextsAreCutBetweenWordsWithTheSameResult) {
  // No token has "▁" after another character, so "▁ab▁ab" may be cut before the second "▁"; a
  // vocabulary with "b▁" may not be cut (the merge "b ▁" joins across).
  const std::string base = R"("▁":0,"a":1,"b":2,"▁a":3,"▁ab":4)";
  auto cut = Model("{\"vocab\":{" + base + R"(},"merges":["▁ a","▁a b"]})");
  EXPECT_EQ(Tokenize(*cut, "▁ab▁ab▁▁a"), (V{4, 4, 0, 3}));
  auto joined = Model("{\"vocab\":{" + base + R"(,"b▁":5},"merges":["b ▁","▁ a"]})");
  EXPECT_EQ(Tokenize(*joined, "▁ab▁a"), (V{3, 5, 1}));
}

}  // namespace
}  // namespace carpool::text
