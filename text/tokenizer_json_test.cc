#include "text/tokenizer_json.h"

#include "gtest/gtest.h"
#include "text/test_tokenizer_json.h"

namespace carpool::text {
namespace {

std::string Message(const Json& j) {
  auto parsed = ParseTokenizerJson(j.dump());
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(TokenizerJsonTest, ReadsEveryComponent) {
  auto parsed = ParseTokenizerJson(TestTokenizerJson().dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->added_tokens.size(), 3u);
  EXPECT_EQ(parsed->normalizer, nullptr);
  EXPECT_NE(parsed->pre_tokenizer, nullptr);
  EXPECT_NE(parsed->post_processor, nullptr);
  EXPECT_NE(parsed->decoder, nullptr);
  EXPECT_EQ(parsed->model->vocab_size(), 258);
}

TEST(TokenizerJsonTest, RefusesWhatItCannotRunNamingIt) {
  Json j = TestTokenizerJson();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_EQ(Message(j), "tokenizer.json: normalizer type \"BertNormalizer\" is not supported");
  j = TestTokenizerJson();
  j["model"]["type"] = "WordPiece";
  EXPECT_EQ(Message(j), "tokenizer.json: model type \"WordPiece\" is not supported");
  j = TestTokenizerJson();
  j["truncation"] = {{"max_length", 512}};
  EXPECT_NE(Message(j).find("truncation"), std::string::npos);
  j = TestTokenizerJson();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(("}}}, {"behavior", "Isolated"}};
  EXPECT_NE(Message(j).find("does not compile"), std::string::npos);
  EXPECT_FALSE(ParseTokenizerJson("{\"model\": {\"type\": \"BPE\", \"vocab\": {").ok());
}

TEST(TokenizerJsonTest, ReadsTheConfig) {
  auto c = ParseTokenizerConfig(R"({"bos_token":"<s>","eos_token":{"content":"</s>"},
      "add_bos_token":true,"model_max_length":1000000000000000019884624838656,
      "tokenizer_class":"LlamaTokenizer"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_EQ(c->eos_token, "</s>");
  EXPECT_EQ(c->add_bos_token, true);
  EXPECT_FALSE(c->add_eos_token.has_value());
  EXPECT_FALSE(c->model_max_length.has_value());  // transformers' "no limit"
  EXPECT_EQ(ParseTokenizerConfig(R"({"model_max_length":4096})")->model_max_length, 4096);
  EXPECT_FALSE(ParseTokenizerConfig(R"({"bos_token":7})").ok());
  EXPECT_TRUE(ParseTokenizerConfig("").ok());
}

TEST(TokenizerJsonTest, ReadsGenerationEosIds) {
  EXPECT_EQ(*ParseGenerationEosIds(R"({"eos_token_id": [128001, 128009]})"),
            (std::vector<int32_t>{128001, 128009}));
  EXPECT_EQ(*ParseGenerationEosIds(R"({"eos_token_id": 2})"), (std::vector<int32_t>{2}));
  EXPECT_TRUE(ParseGenerationEosIds(R"({"bos_token_id": 1})")->empty());
  EXPECT_FALSE(ParseGenerationEosIds(R"({"eos_token_id": "x"})").ok());
}

}  // namespace
}  // namespace carpool::text
