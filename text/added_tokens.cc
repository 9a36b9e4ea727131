#include "text/added_tokens.h"

#include <algorithm>

#include "common/status.h"
#include "text/unicode.h"

namespace carpool::text {

absl::StatusOr<AddedToken> ParseAddedToken(const Json& j, const std::string& where) {
  AddedToken t;
  if (!j.is_object()) return JsonError(where, "expected an object");
  auto content = j.find("content");
  if (content == j.end() || !content->is_string()) return JsonError(where, "has no \"content\"");
  t.content = content->get<std::string>();
  if (t.content.empty()) return JsonError(where, "has an empty \"content\"");
  if (FindInvalidUtf8(t.content) != std::string::npos) {
    return JsonError(where, "\"content\" is not valid UTF-8");
  }
  int64_t id = 0;
  RETURN_IF_ERROR(ReadInt(j, "id", where, &id));
  if (id < 0 || id > (1 << 30)) return JsonError(where, "\"id\" must be in [0, 2^30]");
  t.id = static_cast<int32_t>(id);
  RETURN_IF_ERROR(ReadBool(j, "single_word", where, &t.single_word));
  RETURN_IF_ERROR(ReadBool(j, "lstrip", where, &t.lstrip));
  RETURN_IF_ERROR(ReadBool(j, "rstrip", where, &t.rstrip));
  RETURN_IF_ERROR(ReadBool(j, "normalized", where, &t.normalized));
  RETURN_IF_ERROR(ReadBool(j, "special", where, &t.special));
  return t;
}

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& list) {
  std::vector<AddedToken> out;
  if (list.is_null()) return out;
  if (!list.is_array()) return JsonError("added_tokens", "must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].contains("id")) {
      return JsonError(absl::StrCat("added_tokens[", i, "]"), "has no \"id\"");
    }
    ASSIGN_OR_RETURN(AddedToken t, ParseAddedToken(list[i], absl::StrCat("added_tokens[", i, "]")));
    out.push_back(std::move(t));
  }
  return out;
}

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens,
                                     const std::vector<std::string>& patterns)
    : tokens_(tokens) {
  nodes_.emplace_back();
  for (size_t t = 0; t < patterns.size(); ++t) {
    const std::string& p = patterns[t];
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t node = 0;
    for (unsigned char c : p) {
      int32_t next = Child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& children = nodes_[node].children;
        children.insert(
            std::lower_bound(children.begin(), children.end(), std::make_pair(c, int32_t{-1})),
            {c, next});
      }
      node = next;
    }
    // The first of two equal patterns wins, as in the library's pattern order.
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, unsigned char c) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(c, int32_t{-1}));
  return it != children.end() && it->first == c ? it->second : -1;
}

int32_t AddedTokenMatcher::LongestAt(std::string_view text, size_t pos, size_t* len) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    node = Child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) {
      best = nodes_[node].token;
      *len = i + 1 - pos;
    }
  }
  return best;
}

namespace {

bool EndsWithWordChar(std::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return IsWordChar(NextCodePoint(s, &start));
}

bool StartsWithWordChar(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return IsWordChar(NextCodePoint(s, &i));
}

}  // namespace

void AddedTokenMatcher::Split(std::string_view text, std::vector<Segment>* out) const {
  out->clear();
  size_t start_offset = 0;
  if (!tokens_.empty()) {
    size_t pos = 0;
    while (pos < text.size()) {
      if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
        ++pos;
        continue;
      }
      size_t len = 0;
      const int32_t t = LongestAt(text, pos, &len);
      if (t < 0) {
        ++pos;
        continue;
      }
      // The automaton reports non-overlapping matches; the next search starts after this one
      // whether or not the rules below keep it.
      size_t start = pos, stop = pos + len;
      pos = stop;
      const AddedToken& token = tokens_[t];
      if (token.single_word) {
        const bool space_before = start == 0 || !EndsWithWordChar(text.substr(0, start));
        const bool space_after = stop == text.size() || !StartsWithWordChar(text.substr(stop));
        if (!space_before || !space_after) continue;
      }
      if (token.lstrip) {
        start = std::max(TrimEndWhitespace(text.substr(0, start)).size(), start_offset);
      }
      if (token.rstrip) {
        const std::string_view rest = text.substr(stop);
        stop += rest.size() - TrimStartWhitespace(rest).size();
      }
      if (start_offset < start) out->push_back({start_offset, start, -1});
      out->push_back({start, stop, token.id});
      start_offset = stop;
    }
  }
  if (start_offset < text.size()) out->push_back({start_offset, text.size(), -1});
}

}  // namespace carpool::text
