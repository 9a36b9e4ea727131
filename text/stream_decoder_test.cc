#include "text/stream_decoder.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace carpool::text {
namespace {

// Ids are bytes; Decode is lossy like a byte-level BPE decoder: an incomplete or invalid UTF-8
// sequence becomes one U+FFFD.
class LossyByteTokenizer : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, bool) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string Decode(absl::Span<const int32_t> ids, bool) const override {
    std::string bytes;
    for (int32_t id : ids) bytes.push_back(static_cast<char>(id));
    std::string out;
    for (size_t i = 0; i < bytes.size();) {
      const unsigned char c = static_cast<unsigned char>(bytes[i]);
      const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                   : (c & 0xF8) == 0xF0 ? 4 : 0;
      size_t ok = n > 0 && i + n <= bytes.size() ? 1 : 0;
      for (size_t k = 1; ok && k < n; ++k) {
        ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
      }
      if (ok) {
        out.append(bytes, i, n);
        i += n;
      } else {
        out += "\xEF\xBF\xBD";
        ++i;
        while (i < bytes.size() && (static_cast<unsigned char>(bytes[i]) & 0xC0) == 0x80) ++i;
      }
    }
    return out;
  }
};

// Pieces where "_" stands for a space; the decode drops one leading space, as a Metaspace
// decoder does. Id 0 is a special token, dropped when skipping.
class PieceTokenizer : public Tokenizer {
 public:
  explicit PieceTokenizer(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string&, bool) const override {
    return absl::UnimplementedError("not needed");
  }
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id == 0 && skip_special) continue;
      out += pieces_[id];
    }
    out = absl::StrReplaceAll(out, {{"_", " "}});
    if (!out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

 private:
  std::vector<std::string> pieces_;
};

// A decoder whose text is not prefix-stable: it reverses the whole output.
class ReversingTokenizer : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string&, bool) const override {
    return absl::UnimplementedError("not needed");
  }
  std::string Decode(absl::Span<const int32_t> ids, bool) const override {
    std::string out;
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) out.push_back(static_cast<char>(*it));
    return out;
  }
};

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

// Feeds `ids` one at a time; checks every chunk and that the chunks add up to the whole decode.
void ExpectStreamsExactly(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                          bool skip_special) {
  StreamDecoder decoder(&tokenizer, skip_special);
  std::string joined;
  for (int32_t id : ids) {
    const std::string chunk = decoder.Add(id);
    EXPECT_FALSE(EndsWithReplacement(chunk)) << "a chunk may not end with a U+FFFD";
    joined += chunk;
  }
  joined += decoder.Finish();
  EXPECT_EQ(joined, tokenizer.Decode(ids, skip_special));
  EXPECT_EQ(decoder.text(), joined);
}

std::vector<int32_t> Bytes(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(StreamDecoderTest, ByteTokenizerChunksNeverSplitACharacter) {
  const ByteTokenizer bytes;
  const std::string text = "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80!";  // é, €, 😀
  StreamDecoder decoder(&bytes, /*skip_special_tokens=*/true);
  std::vector<std::string> chunks;
  for (int32_t id : Bytes(text)) chunks.push_back(decoder.Add(id));
  EXPECT_EQ(chunks[1], "");                  // first byte of é
  EXPECT_EQ(chunks[2], "\xC3\xA9");          // é completes
  EXPECT_EQ(chunks[9], "\xE2\x82\xAC");      // € after its third byte
  EXPECT_EQ(chunks[14], "\xF0\x9F\x98\x80");  // 😀 after its fourth
  EXPECT_EQ(decoder.Finish(), "");
  EXPECT_EQ(decoder.text(), text);
}

TEST(StreamDecoderTest, LossyDecodeHoldsAReplacementUntilTheCharacterCompletes) {
  const LossyByteTokenizer lossy;
  StreamDecoder decoder(&lossy, false);
  EXPECT_EQ(decoder.Add('a'), "a");
  EXPECT_EQ(decoder.Add(0xE2), "");
  EXPECT_EQ(decoder.Add(0x82), "");
  EXPECT_EQ(decoder.Add(0xAC), "\xE2\x82\xAC");
  // A byte that never completes is not held back forever: the next character decides it.
  EXPECT_EQ(decoder.Add(0xE2), "");
  EXPECT_EQ(decoder.Add('b'), "\xEF\xBF\xBD" "b");
  // ... and one at the very end comes out at Finish, as the whole decode has it.
  EXPECT_EQ(decoder.Add(0xF0), "");
  EXPECT_EQ(decoder.Finish(), "\xEF\xBF\xBD");
}

TEST(StreamDecoderTest, RandomByteStreamsAddUpToTheWholeDecode) {
  const LossyByteTokenizer lossy;
  const ByteTokenizer bytes;
  std::mt19937 rng(7);
  const std::vector<std::string> pieces = {"a", " ", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                                           "\n", "\xE2", "\x82", "\xFF", "z"};
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int n = std::uniform_int_distribution<int>(0, 30)(rng);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    ExpectStreamsExactly(lossy, Bytes(text), false);
    ExpectStreamsExactly(bytes, Bytes(text), true);
  }
}

TEST(StreamDecoderTest, LeadingSpaceRulesApplyOnlyAtTheStartOfTheWholeText) {
  const PieceTokenizer pieces({"<s>", "_Hello", "_world", ",", "_how", "_are", "_you"});
  StreamDecoder decoder(&pieces, /*skip_special_tokens=*/true);
  EXPECT_EQ(decoder.Add(0), "");
  EXPECT_EQ(decoder.Add(1), "Hello");
  EXPECT_EQ(decoder.Add(2), " world");  // its space is kept: it is not at the start
  EXPECT_EQ(decoder.Add(3), ",");
  EXPECT_EQ(decoder.Add({4, 5, 6}), " how are you");
  EXPECT_EQ(decoder.Finish(), "");
  ExpectStreamsExactly(pieces, {0, 1, 2, 3, 4, 5, 6, 2}, true);
  ExpectStreamsExactly(pieces, {0, 1, 2, 3, 4, 5, 6, 2}, false);
  ExpectStreamsExactly(pieces, {2, 2, 0, 3}, false);
}

TEST(StreamDecoderTest, TextThatIsNotPrefixStableArrivesWholeAtFinish) {
  const ReversingTokenizer reversing;
  StreamDecoder decoder(&reversing, false);
  EXPECT_EQ(decoder.Add('a'), "a");
  EXPECT_EQ(decoder.Add('b'), "");  // "ba" does not extend "a": nothing more is safe to emit
  EXPECT_EQ(decoder.Add('c'), "");
  // The whole decode is "cba"; "a" went out first, which no later text can take back, so the
  // chunks cannot add up here. What Finish can do is not emit anything inconsistent.
  EXPECT_EQ(decoder.Finish(), "");
  StreamDecoder fresh(&reversing, false);
  EXPECT_EQ(fresh.Finish(), "");
}

}  // namespace
}  // namespace carpool::text
