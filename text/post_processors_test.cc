#include "text/post_processors.h"

#include <vector>

#include "gtest/gtest.h"

namespace carpool::text {
namespace {

std::vector<int32_t> Process(const std::string& json, std::vector<int32_t> ids) {
  auto p = ParsePostProcessor(Json::parse(json));
  EXPECT_TRUE(p.ok()) << p.status();
  if (p.ok() && *p != nullptr) (*p)->Process(&ids);
  return ids;
}

using V = std::vector<int32_t>;

TEST(PostProcessorsTest, TemplateProcessing) {
  const std::string j = R"({"type":"TemplateProcessing",
      "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},
                {"SpecialToken":{"id":"</s>","type_id":0}}],
      "pair":[],
      "special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]},
                        "</s>":{"id":"</s>","ids":[2],"tokens":["</s>"]}}})";
  EXPECT_EQ(Process(j, {7, 8}), (V{1, 7, 8, 2}));
}

TEST(PostProcessorsTest, ByteLevelBertSequence) {
  EXPECT_EQ(Process(R"({"type":"ByteLevel","add_prefix_space":true})", {5}), (V{5}));
  EXPECT_EQ(Process(R"({"type":"BertProcessing","sep":["[SEP]",102],"cls":["[CLS]",101]})", {5}),
            (V{101, 5, 102}));
  EXPECT_EQ(Process(R"({"type":"Sequence","processors":[{"type":"ByteLevel"},
      {"type":"RobertaProcessing","sep":["</s>",2],"cls":["<s>",0]}]})",
                    {5}),
            (V{0, 5, 2}));
}

TEST(PostProcessorsTest, RefusesUnknownTypesAndTokens) {
  auto p = ParsePostProcessor(Json::parse(R"({"type":"Mystery"})"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "tokenizer.json: post_processor type \"Mystery\" is not supported");
  EXPECT_FALSE(ParsePostProcessor(Json::parse(R"({"type":"TemplateProcessing",
      "single":[{"SpecialToken":{"id":"<x>","type_id":0}}],"special_tokens":{}})"))
                   .ok());
}

}  // namespace
}  // namespace carpool::text
