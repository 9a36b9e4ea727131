#include "text/decoders.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace carpool::text {
namespace {

std::string Decode(const std::string& json, std::vector<std::string> tokens) {
  auto d = ParseDecoder(Json::parse(json));
  EXPECT_TRUE(d.ok()) << d.status();
  if (d.ok() && *d != nullptr) (*d)->DecodeChain(&tokens);
  return absl::StrJoin(tokens, "");
}

TEST(DecodersTest, ByteLevel) {
  EXPECT_EQ(Decode(R"({"type":"ByteLevel"})", {"ĠHello", "Ġw", "Ã©", "<|eot|>"}),
            " Hello wé<|eot|>");
  EXPECT_EQ(Decode(R"({"type":"ByteLevel"})", {"Ã"}), "\xEF\xBF\xBD");  // half a character
}

TEST(DecodersTest, LlamaTwoSequence) {
  const std::string j = R"({"type":"Sequence","decoders":[
      {"type":"Replace","pattern":{"String":"▁"},"content":" "},
      {"type":"ByteFallback"},{"type":"Fuse"},
      {"type":"Strip","content":" ","start":1,"stop":0}]})";
  EXPECT_EQ(Decode(j, {"▁Hello", "▁", "<0xC3>", "<0xA9>", "!"}), "Hello é!");
  EXPECT_EQ(Decode(j, {"▁a", "<0xC3>", "b"}),
            "a\xEF\xBF\xBD"
            "b");  // one U+FFFD per byte
}

TEST(DecodersTest, MetaspaceAndStrip) {
  EXPECT_EQ(Decode(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always"})",
                   {"▁Hey", "▁friend"}),
            "Hey friend");
  EXPECT_EQ(Decode(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never"})", {"▁Hey"}),
            " Hey");
  EXPECT_EQ(Decode(R"({"type":"Strip","content":"x","start":2,"stop":1})", {"xxxaxx"}), "xax");
}

TEST(DecodersTest, UnsupportedIsNamed) {
  auto d = ParseDecoder(Json::parse(R"({"type":"WordPiece"})"));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "tokenizer.json: decoder type \"WordPiece\" is not supported");
}

}  // namespace
}  // namespace carpool::text
