#include "text/pre_tokenizers.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace carpool::text {
namespace {

std::vector<std::string> Pieces(const std::string& json, const std::string& text) {
  auto p = ParsePreTokenizer(Json::parse(json));
  EXPECT_TRUE(p.ok()) << p.status();
  PreTokenized pre;
  pre.text = text;
  pre.pieces = {{0, static_cast<uint32_t>(text.size()), static_cast<uint32_t>(text.size())}};
  if (p.ok() && *p != nullptr) {
    EXPECT_TRUE((*p)->PreTokenize(&pre).ok());
  }
  std::vector<std::string> out;
  for (const Piece& piece : pre.pieces) out.emplace_back(pre.view(piece));
  return out;
}

using V = std::vector<std::string>;

std::string Split(const std::string& behavior, bool invert = false) {
  return R"({"type":"Split","pattern":{"String":"-"},"behavior":")" + behavior + R"(","invert":)" +
         (invert ? "true" : "false") + "}";
}

TEST(PreTokenizersTest, SplitBehaviors) {
  const std::string text = "a-b--c";
  EXPECT_EQ(Pieces(Split("Removed"), text), (V{"a", "b", "c"}));
  EXPECT_EQ(Pieces(Split("Isolated"), text), (V{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(Pieces(Split("MergedWithPrevious"), text), (V{"a-", "b-", "-", "c"}));
  EXPECT_EQ(Pieces(Split("MergedWithNext"), text), (V{"a", "-b", "-", "-c"}));
  EXPECT_EQ(Pieces(Split("Contiguous"), text), (V{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(Pieces(Split("Removed", true), text), (V{"-", "-", "-"}));
}

TEST(PreTokenizersTest, SplitRegexIsolated) {
  const std::string j =
      R"({"type":"Split","pattern":{"Regex":"\\p{L}+|\\p{N}{1,3}|\\s+"},"behavior":"Isolated"})";
  EXPECT_EQ(Pieces(j, "ab 12345"), (V{"ab", " ", "123", "45"}));
}

TEST(PreTokenizersTest, ByteLevelMapsBytesAndSplits) {
  EXPECT_EQ(
      Pieces(R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":true})", "Hello world"),
      (V{"ĠHello", "Ġworld"}));
  EXPECT_EQ(Pieces(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":false})", "é\n"),
            (V{"Ã©Ċ"}));
}

TEST(PreTokenizersTest, Metaspace) {
  EXPECT_EQ(
      Pieces(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always"})", "Hey  you"),
      (V{"▁Hey", "▁", "▁you"}));
  EXPECT_EQ(Pieces(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never",
                       "split":false})",
                   "a b"),
            (V{"a▁b"}));
}

// Pieces of `text` whose first `origin` bytes are aligned with the input's offset 0.
std::vector<std::string> PiecesWithOrigin(const std::string& json, const std::string& text,
                                          uint32_t origin) {
  auto p = ParsePreTokenizer(Json::parse(json));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok() || *p == nullptr) return {};
  EXPECT_TRUE((*p)->NeedsOrigin());
  PreTokenized pre;
  pre.text = text;
  pre.pieces = {{0, static_cast<uint32_t>(text.size()), origin}};
  EXPECT_TRUE((*p)->PreTokenize(&pre).ok());
  std::vector<std::string> out;
  for (const Piece& piece : pre.pieces) out.emplace_back(pre.view(piece));
  return out;
}

TEST(PreTokenizersTest, MetaspaceFirstDecidesByTheOriginalOffset) {
  const std::string whitespace_then_first = R"({"type":"Sequence","pretokenizers":[
      {"type":"Whitespace"},
      {"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true}]})";
  // A Prepend normalizer's space is aligned with "ab"'s a (bytes 0-1 at offset 0): the first
  // word still starts at offset 0 once Whitespace cuts the space off.
  EXPECT_EQ(PiecesWithOrigin(whitespace_then_first, " ab cd", 2), (V{"▁ab", "cd"}));
  // Stripped or replaced away: nothing is at offset 0, so nothing is prepended.
  EXPECT_EQ(PiecesWithOrigin(whitespace_then_first, "ab cd", 0), (V{"ab", "cd"}));
  const std::string first =
      R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true})";
  EXPECT_EQ(PiecesWithOrigin(first, "ab cd", 0), (V{"ab", "▁cd"}));
  EXPECT_EQ(PiecesWithOrigin(first, "ab cd", 1), (V{"▁ab", "▁cd"}));
  // Every piece starting inside the prefix is at offset 0 (Prepend "xy" before "z").
  const std::string chars_then_first = R"({"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":"."},"behavior":"Isolated"},
      {"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false}]})";
  EXPECT_EQ(PiecesWithOrigin(chars_then_first, "xyzw", 3), (V{"▁x", "▁y", "▁z", "w"}));
  // ByteLevel's prefix space and byte characters keep the alignment through to a later
  // Metaspace.
  const std::string byte_level_then_first = R"({"type":"Sequence","pretokenizers":[
      {"type":"ByteLevel","add_prefix_space":true,"use_regex":true},
      {"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false}]})";
  EXPECT_EQ(PiecesWithOrigin(byte_level_then_first, "ab cd", 1), (V{"▁Ġab", "Ġcd"}));
  EXPECT_EQ(PiecesWithOrigin(byte_level_then_first, "ab cd", 0), (V{"Ġab", "Ġcd"}));
}

TEST(PreTokenizersTest, DigitsWhitespaceSequence) {
  EXPECT_EQ(Pieces(R"({"type":"Digits","individual_digits":true})", "a123"),
            (V{"a", "1", "2", "3"}));
  EXPECT_EQ(Pieces(R"({"type":"Digits","individual_digits":false})", "a123b"),
            (V{"a", "123", "b"}));
  EXPECT_EQ(Pieces(R"({"type":"Whitespace"})", "Hi, you!"), (V{"Hi", ",", "you", "!"}));
  EXPECT_EQ(Pieces(R"({"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},
                       {"type":"Digits","individual_digits":true}]})",
                   "x1 y"),
            (V{"x", "1", "y"}));
}

TEST(PreTokenizersTest, UnsupportedIsNamed) {
  auto p = ParsePreTokenizer(Json::parse(R"({"type":"BertPreTokenizer"})"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "tokenizer.json: pre_tokenizer type \"BertPreTokenizer\" is not supported");
  EXPECT_FALSE(ParsePreTokenizer(Json::parse(R"({"type":"Split","pattern":{"String":"x"},
                                              "behavior":"Sideways"})"))
                   .ok());
}

}  // namespace
}  // namespace carpool::text
