// A malformed or hostile tokenizer.json fails at load with an error that says what is wrong; it
// never crashes or hangs (issue 13, "Bad input"). The router loads a worker's tokenizer.json
// off its event loop, but a hang or a crash there would still take the router down.
#include <chrono>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "text/hf_tokenizer.h"
#include "text/test_tokenizer_json.h"

namespace carpool::text {
namespace {

TEST(HostileTokenizerTest, EveryTruncationIsRefusedByName) {
  const std::string whole = TestTokenizerJson().dump();
  ASSERT_TRUE(HfTokenizer::FromJson(whole, "").ok());
  std::mt19937 rng(13);
  for (int i = 0; i < 200; ++i) {
    const size_t cut = i < 100 ? whole.size() * i / 100 : rng() % whole.size();
    auto t = HfTokenizer::FromJson(whole.substr(0, cut), "");
    ASSERT_FALSE(t.ok()) << "cut at " << cut;
    EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos) << t.status();
  }
}

TEST(HostileTokenizerTest, WrongShapesAreRefusedNotCrashedOn) {
  const Json base = TestTokenizerJson();
  const std::vector<std::pair<std::string, Json>> cases = {
      {"model", 5},
      {"model", Json::array()},
      {"model", {{"type", "BPE"}, {"vocab", Json::array({1, 2})}, {"merges", Json::array()}}},
      {"model", {{"type", "BPE"}, {"vocab", {{"a", "zero"}}}, {"merges", Json::array()}}},
      {"model", {{"type", "BPE"}, {"vocab", {{"a", -7}}}, {"merges", Json::array()}}},
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", "a b"}}},
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", Json::array({42})}}},
      {"added_tokens", {{"id", 1}}},
      {"added_tokens", Json::array({{{"id", "x"}, {"content", 7}}})},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", 3}}},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "("}}}}},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", 9}, {"behavior", "Isolated"}}},
      {"decoder", {{"type", "Replace"}}},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", "oops"}}},
  };
  for (const auto& [field, value] : cases) {
    Json j = base;
    j[field] = value;
    auto t = HfTokenizer::FromJson(j.dump(), "");
    EXPECT_FALSE(t.ok()) << field << " = " << value.dump();
    if (!t.ok()) {
      EXPECT_FALSE(t.status().message().empty());
    }
  }
}

TEST(HostileTokenizerTest, MergesOfUnknownTokensAreRefusedNamingTheMerge) {
  Json j = TestTokenizerJson();
  j["model"]["merges"] = Json::array({"Ġ h", "Ġh i", "q zz"});
  auto t = HfTokenizer::FromJson(j.dump(), "");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("merge 2"), std::string::npos) << t.status();
}

TEST(HostileTokenizerTest, AHugeMergesListLoadsInBoundedTime) {
  // 300,000 merges (most repeat; a later duplicate takes the later rank, as in the library).
  Json j = TestTokenizerJson();
  Json merges = Json::array();
  for (int i = 0; i < 300000; ++i) merges.push_back(i % 2 == 0 ? "Ġ h" : "Ġh i");
  j["model"]["merges"] = std::move(merges);
  const std::string text = j.dump();
  const auto start = std::chrono::steady_clock::now();
  auto t = HfTokenizer::FromJson(text, "");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_LT(seconds, 30.0);  // ~0.1 s here; the bound only catches quadratic work
  auto ids = (*t)->Encode(" hi", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, std::vector<int32_t>({257}));
}

TEST(HostileTokenizerTest, DeepNestingAndBadBytesAreRefused) {
  // Nesting 200,000 deep must not blow the stack (of the parser or of the tree's destructor).
  std::string deep(200000, '[');
  deep += std::string(200000, ']');
  auto t = HfTokenizer::FromJson(deep, "");
  EXPECT_FALSE(t.ok());
  const std::string nested_model = "{\"model\": " + deep + "}";
  EXPECT_FALSE(HfTokenizer::FromJson(nested_model, "").ok());
  // Bytes that are not UTF-8 inside a JSON string.
  std::string bad = TestTokenizerJson().dump();
  bad.insert(bad.find("Ġh"), "\xFF\xFE");
  EXPECT_FALSE(HfTokenizer::FromJson(bad, "").ok());
  EXPECT_FALSE(HfTokenizer::FromJson("", "").ok());
  EXPECT_FALSE(HfTokenizer::FromJson(TestTokenizerJson().dump(), "{not json").ok());
}

}  // namespace
}  // namespace carpool::text
