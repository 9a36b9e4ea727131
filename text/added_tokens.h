// A tokenizer.json's added tokens (special or not) and the matcher that finds them in text before
// anything else runs, with the library's rules: leftmost-longest match, `single_word` (no word
// character touching either side), `lstrip` / `rstrip` (the token swallows whitespace on that
// side).
//
// Thread safety: immutable after construction.
#ifndef CARPOOL_TEXT_ADDED_TOKENS_H_
#define CARPOOL_TEXT_ADDED_TOKENS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "text/json_util.h"

namespace carpool::text {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// The "added_tokens" list of a tokenizer.json. Errors name the bad entry.
absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& list);
// One AddedToken object (also the form tokenizer_config.json uses for bos_token / eos_token).
absl::StatusOr<AddedToken> ParseAddedToken(const Json& j, const std::string& where);

// A span of text: plain (id < 0) or an added token.
struct Segment {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is what to find for `tokens[i]` (its content, or its normalized content).
  AddedTokenMatcher(const std::vector<AddedToken>& tokens,
                    const std::vector<std::string>& patterns);
  bool empty() const { return tokens_.empty(); }

  // Cuts `text` into plain segments and token segments, in order, covering it (token segments
  // include the whitespace lstrip / rstrip swallowed). REQUIRES: valid UTF-8.
  void Split(std::string_view text, std::vector<Segment>* out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                       // index into tokens_
  };
  int32_t Child(int32_t node, unsigned char c) const;
  // The longest token starting at text[pos]: its index and length, or -1.
  int32_t LongestAt(std::string_view text, size_t pos, size_t* len) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_ADDED_TOKENS_H_
