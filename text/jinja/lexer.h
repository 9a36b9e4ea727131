// The Jinja2 lexer, configured as transformers configures chat templates: the default
// delimiters, trim_blocks and lstrip_blocks on, keep_trailing_newline off.
//
// Whitespace control, as Jinja2 3.1 does it: `{%-`, `{{-`, `{#-` strip all whitespace before the
// tag and `-%}`, `-}}`, `-#}` all whitespace after; trim_blocks drops the first newline after a
// `%}` or `#}`; lstrip_blocks drops spaces and tabs between a line's start and a `{%` or `{#`,
// unless the tag opens with `{%+`/`{#+`; `+%}` keeps the newline after a block. `{% raw %}`
// bodies are data. Newlines (\r\n, \r, \n) become \n, and one trailing newline of the source is
// dropped.
#ifndef CARPOOL_TEXT_JINJA_LEXER_H_
#define CARPOOL_TEXT_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace carpool::text::jinja {

enum class TokenType {
  kData,           // template text between tags (text holds it)
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // an identifier (keywords such as `if`, `and`, `true` are names too)
  kString,         // a string literal, escapes decoded (text holds the value)
  kInteger,        // integer_value
  kFloat,          // float_value
  kOperator,       // text holds the operator: + - * / // % ** ~ [ ] ( ) { } == != > >= < <=
                   // = . : | , ;
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  int line = 1;  // 1-based line where the token starts
  std::string text;
  int64_t integer_value = 0;
  double float_value = 0;

  bool IsOperator(absl::string_view op) const { return type == TokenType::kOperator && text == op; }
  bool IsName(absl::string_view name) const { return type == TokenType::kName && text == name; }
};

// Splits `source` into tokens; the last is kEof. INVALID_ARGUMENT "line N: ..." for what
// Jinja2's lexer refuses: an unterminated comment or raw block, an unexpected character in a
// tag, unbalanced brackets inside a tag, a bad string escape, an integer literal out of range.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

// Python's str.isspace() for the code point that starts at `s[i]`; sets `*len` to its length in
// bytes (0 when it is not whitespace).
bool IsPythonSpaceAt(absl::string_view s, size_t i, size_t* len);

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_LEXER_H_
