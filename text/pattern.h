// The {"String": ...} / {"Regex": ...} pattern of Split, Replace (normalizer and decoder).
#ifndef CARPOOL_TEXT_PATTERN_H_
#define CARPOOL_TEXT_PATTERN_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "text/json_util.h"
#include "text/regex.h"

namespace carpool::text {

// One span of a string: a match of the pattern or the text between matches.
struct PatternSpan {
  size_t begin;
  size_t end;
  bool is_match;
};

class Pattern {
 public:
  // From {"String": s} (a literal) or {"Regex": r}. Errors name `where`.
  static absl::StatusOr<Pattern> FromJson(const Json& j, const std::string& where);
  static absl::StatusOr<Pattern> FromRegex(std::string_view regex);
  static Pattern FromLiteral(std::string literal);

  // Covers `text` with spans, alternating runs of non-matching text and matches, as the
  // library's Pattern::find_matches does (an empty text gives one empty non-match).
  absl::Status Spans(std::string_view text, std::vector<PatternSpan>* out) const;
  // `text` with every match replaced by `content`.
  absl::StatusOr<std::string> ReplaceAll(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // null: literal_
};

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_PATTERN_H_
