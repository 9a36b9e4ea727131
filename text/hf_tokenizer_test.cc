#include "text/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include "gtest/gtest.h"
#include "text/test_tokenizer_json.h"
#include "text/tokenizer_factory.h"

namespace carpool::text {
namespace {

using V = std::vector<int32_t>;

std::unique_ptr<HfTokenizer> Make(const Json& j, const std::string& config = "") {
  auto t = HfTokenizer::FromJson(j.dump(), config);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(HfTokenizerTest, EncodesLikeTheLibrary) {
  auto t = Make(TestTokenizerJson());
  // " hi" merges to 257; "!" is byte 33; the special token is found before pre-tokenizing.
  EXPECT_EQ(*t->Encode(" hi!<|eos|>", true), (V{258, 257, 33, 259}));
  EXPECT_EQ(*t->Encode(" hi!<|eos|>", false), (V{257, 33, 259}));
  EXPECT_EQ(*t->Encode("", true), (V{258}));
  EXPECT_EQ(*t->Encode("a<tool>b", false), (V{'a', 260, 'b'}));
}

// Metaspace with prepend_scheme "first" after `normalizer`, over a vocabulary of single
// characters: ▁ 0, a 1, b 2, # 3.
std::unique_ptr<HfTokenizer> MetaspaceFirst(const Json& normalizer, const Json& pre_before) {
  Json pre = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"},
              {"split", true}};
  if (!pre_before.is_null()) {
    pre = {{"type", "Sequence"}, {"pretokenizers", Json::array({pre_before, pre})}};
  }
  return Make(Json{{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", Json::array()},
                   {"normalizer", normalizer},
                   {"pre_tokenizer", pre},
                   {"post_processor", nullptr},
                   {"decoder", nullptr},
                   {"model",
                    {{"type", "BPE"},
                     {"vocab", {{"▁", 0}, {"a", 1}, {"b", 2}, {"#", 3}}},
                     {"merges", Json::array()}}}});
}

TEST(HfTokenizerTest, MetaspaceFirstLooksAtTheOriginalOffset) {
  // The normalizer removed what was at offset 0: the library prepends nothing.
  auto strip = MetaspaceFirst(Json::parse(R"({"type":"Strip","strip_left":true,"strip_right":true})"),
                              nullptr);
  EXPECT_EQ(*strip->Encode("  ab", false), (V{1, 2}));
  EXPECT_EQ(*strip->Encode("ab", false), (V{0, 1, 2}));
  auto removed = MetaspaceFirst(
      Json::parse(R"({"type":"Replace","pattern":{"String":"b"},"content":""})"), nullptr);
  EXPECT_EQ(*removed->Encode("ba", false), (V{1}));
  auto hash = MetaspaceFirst(
      Json::parse(R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":"#"})"), nullptr);
  EXPECT_EQ(*hash->Encode("  ab", false), (V{3, 1, 2}));
  EXPECT_EQ(*hash->Encode(" ab", false), (V{0, 3, 1, 2}));
  // Prepend's space is aligned with the first character, so the first word Whitespace leaves
  // still starts at offset 0.
  auto prepend = MetaspaceFirst(Json::parse(R"({"type":"Prepend","prepend":" "})"),
                                Json::parse(R"({"type":"Whitespace"})"));
  EXPECT_EQ(*prepend->Encode("ab a", false), (V{0, 1, 2, 1}));
}

TEST(HfTokenizerTest, DecodesWithAndWithoutSpecialTokens) {
  auto t = Make(TestTokenizerJson());
  EXPECT_EQ(t->Decode({258, 257, 33, 259}, false), "<|bos|> hi!<|eos|>");
  EXPECT_EQ(t->Decode({258, 257, 33, 259}, true), " hi!");
  EXPECT_EQ(t->Decode({260, 99999}, true), "<tool>");  // not special; unknown ids left out
  EXPECT_TRUE(t->IsSpecial(258));
  EXPECT_FALSE(t->IsSpecial(260));
  EXPECT_EQ(t->IdToToken(257), "Ġhi");
  EXPECT_EQ(t->TokenToId("<|eos|>"), 259);
  EXPECT_EQ(t->vocab_size(), 261);
}

TEST(HfTokenizerTest, EncodesFromManyThreadsAtOnce) {
  auto t = Make(TestTokenizerJson());
  const std::string text = " hi there, hi again!<|eos|> hi";
  const V want = *t->Encode(text, true);
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 500; ++i) {
        t->Encode(text + std::string(i % 7, ' '), true).IgnoreError();  // fills the cache
        if (*t->Encode(text, true) != want) ++wrong[k];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST(HfTokenizerTest, InvalidUtf8NamesTheOffset) {
  auto t = Make(TestTokenizerJson());
  auto ids = t->Encode("ab\xFF", true);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ids.status().message().find("byte offset 2"), std::string::npos);
}

TEST(HfTokenizerTest, ConfigGivesSpecialIdsAndOverridesForLlama) {
  const std::string config = R"({"bos_token":"<|bos|>","eos_token":{"content":"<|eos|>"},
      "add_bos_token":false,"add_eos_token":true,"model_max_length":4096,
      "tokenizer_class":"LlamaTokenizer"})";
  auto t = Make(TestTokenizerJson(), config);
  EXPECT_EQ(t->bos_token_id(), 258);
  EXPECT_EQ(t->eos_token_id(), 259);
  EXPECT_EQ(t->model_max_length(), 4096);
  EXPECT_EQ(t->stop_token_ids(), (V{259}));  // no generation_config.json: the eos token
  EXPECT_EQ(*t->Encode(" hi", true), (V{257, 259}));
  // Other classes keep the file's post-processor.
  auto other = Make(TestTokenizerJson(), R"({"add_bos_token":false,"tokenizer_class":"X"})");
  EXPECT_EQ(*other->Encode(" hi", true), (V{258, 257}));
}

TEST(HfTokenizerTest, CatastrophicRegexFailsAtLoad) {
  Json j = TestTokenizerJson();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(a+)+$"}}}, {"behavior", "Isolated"}};
  auto t = HfTokenizer::FromJson(j.dump(), "");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("(a+)+$"), std::string::npos) << t.status();
}

TEST(HfTokenizerTest, LoadsFoldersAndExplainsSentencepieceOnes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "hf_tokenizer_test";
  fs::remove_all(dir);
  fs::create_directories(dir / "hf");
  fs::create_directories(dir / "sp");
  std::ofstream(dir / "hf" / "tokenizer.json") << TestTokenizerJson().dump();
  std::ofstream(dir / "hf" / "tokenizer_config.json") << R"({"eos_token":"<|eos|>"})";
  std::ofstream(dir / "hf" / "generation_config.json") << R"({"eos_token_id":[259,258]})";
  std::ofstream(dir / "sp" / "tokenizer.model") << "not read";

  auto folder = HfTokenizer::Load((dir / "hf").string());
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ((*folder)->eos_token_id(), 259);
  EXPECT_EQ((*folder)->stop_token_ids(), (V{259, 258}));
  auto file = HfTokenizer::Load((dir / "hf" / "tokenizer.json").string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE((*file)->eos_token_id().has_value());  // a file alone has no config

  auto sp = HfTokenizer::Load((dir / "sp").string());
  ASSERT_FALSE(sp.ok());
  EXPECT_NE(sp.status().message().find("no tokenizer.json"), std::string::npos);
  EXPECT_NE(sp.status().message().find("sentencepiece"), std::string::npos);

  auto byte = LoadTokenizer("synthetic:tiny");
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ(*(*byte)->Encode("A", true), (V{ByteTokenizer::kBos, 'A'}));
  auto hf = LoadTokenizer((dir / "hf").string());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(*(*hf)->Encode(" hi", false), (V{257}));
  fs::remove_all(dir);
}

TEST(HfTokenizerTest, AddedTokenIdsComeFromTheVocabLikeTheLibrary) {
  Json j = TestTokenizerJson();
  // The file's ids are not used: "a" is in the vocabulary (97); a new token follows the others.
  j["added_tokens"].push_back({{"id", 5}, {"content", "a"}, {"special", false}});
  j["added_tokens"].push_back({{"id", 7}, {"content", "<new>"}, {"special", true}});
  auto t = Make(j);
  EXPECT_EQ(t->TokenToId("a"), 97);
  EXPECT_EQ(t->TokenToId("<new>"), 261);
  EXPECT_EQ(*t->Encode("ba<new>", false), (V{'b', 97, 261}));
}

}  // namespace
}  // namespace carpool::text
