// A Unicode regular expression from a tokenizer.json (PCRE2 with UTF, UCP and JIT), with bounded
// matching work so a catastrophic pattern fails with an error instead of hanging.
//
// Thread safety: a compiled Regex is immutable; any number of threads may match at once.
#ifndef CARPOOL_TEXT_REGEX_H_
#define CARPOOL_TEXT_REGEX_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace carpool::text {

struct RegexOptions {
  // Backtracking steps one match attempt may take before it fails with RESOURCE_EXHAUSTED.
  // Default: 10,000,000.
  uint32_t match_limit = 10'000'000;
};

class Regex {
 public:
  // INVALID_ARGUMENT naming the pattern and PCRE2's message when it does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern,
                                                        const RegexOptions& options = {});
  // A pattern that matches `literal` exactly.
  static std::string Escape(std::string_view literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for each non-overlapping match, left to right, as Oniguruma's
  // iterator does: an empty match right where the previous match ended is not reported. REQUIRES:
  // `text` is valid UTF-8. Errors: RESOURCE_EXHAUSTED when a match attempt passes the match limit.
  absl::Status ForEachMatch(std::string_view text,
                            absl::FunctionRef<void(size_t, size_t)> on_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  explicit Regex(std::unique_ptr<Impl> impl, std::string pattern);
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_REGEX_H_
