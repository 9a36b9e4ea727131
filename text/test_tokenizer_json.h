// A small byte-level BPE tokenizer.json for tests: the 256 byte characters (id = byte), merges
// "Ġ h" (256) and "Ġh i" (257), special tokens <|bos|> (258) and <|eos|> (259), the added token
// <tool> (260); BOS added by a TemplateProcessing post-processor; the GPT-2 split.
#ifndef CARPOOL_TEXT_TEST_TOKENIZER_JSON_H_
#define CARPOOL_TEXT_TEST_TOKENIZER_JSON_H_

#include <string>

#include "text/byte_level.h"
#include "text/json_util.h"

namespace carpool::text {

inline Json TestTokenizerJson() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteToChars(static_cast<uint8_t>(b))] = b;
  vocab["Ġh"] = 256;
  vocab["Ġhi"] = 257;
  return Json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       Json::array(
           {{{"id", 258}, {"content", "<|bos|>"}, {"special", true}, {"normalized", false}},
            {{"id", 259}, {"content", "<|eos|>"}, {"special", true}, {"normalized", false}},
            {{"id", 260}, {"content", "<tool>"}, {"special", false}, {"normalized", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", Json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", Json::array()},
        {"special_tokens",
         {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {258}}, {"tokens", {"<|bos|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({"Ġ h", "Ġh i"})}}}};
}

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_TEST_TOKENIZER_JSON_H_
