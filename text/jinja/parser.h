// The Jinja2 parser: tokens to a Program, with Jinja2 3.1's grammar and precedence (lowest
// first): `x if c else y`, or, and, not, comparisons (== != < <= > >= in, not in; chained),
// + and -, ~, * / // %, **, unary - and +, then postfix (.attr, [key], [a:b:c], calls) with
// filters (`|f(args)`) and tests (`is [not] t args`) binding at the same level.
//
// It refuses, with "line N: ...", syntax errors and what carpool does not support: the tags
// extends, block, include, import, from, autoescape and any unknown tag;
// filters and tests that neither carpool nor Jinja2 has (outside an `if` or an inline if, as
// Jinja2 does; inside one Jinja2 fails only when the filter runs, and so does carpool), and the
// Jinja2 filters and tests carpool lacks (always); nesting deeper than kMaxParseDepth.
#ifndef CARPOOL_TEXT_JINJA_PARSER_H_
#define CARPOOL_TEXT_JINJA_PARSER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/ast.h"

namespace carpool::text::jinja {

// Deepest nesting of expressions and statements the parser accepts (Jinja2 itself fails at
// about 100 nested parentheses, on Python's recursion limit).
inline constexpr int kMaxParseDepth = 256;

absl::StatusOr<std::unique_ptr<Program>> ParseProgram(absl::string_view source);

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_PARSER_H_
