#include "text/jinja/lexer.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "text/jinja/pystr.h"

namespace carpool::text::jinja {
namespace {

// Decodes the UTF-8 code point at s[i]; *len gets its length (1 for a stray byte).
uint32_t DecodeAt(absl::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) -> uint32_t {
    return i + k < s.size() ? (static_cast<unsigned char>(s[i + k]) & 0x3F) : 0;
  };
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  if ((b & 0xE0) == 0xC0 && i + 1 < s.size()) {
    *len = 2;
    return ((b & 0x1F) << 6) | cont(1);
  }
  if ((b & 0xF0) == 0xE0 && i + 2 < s.size()) {
    *len = 3;
    return ((b & 0x0F) << 12) | (cont(1) << 6) | cont(2);
  }
  if ((b & 0xF8) == 0xF0 && i + 3 < s.size()) {
    *len = 4;
    return ((b & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
  }
  *len = 1;
  return b;
}

bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> Run();

 private:
  enum class Tag { kVariable, kBlock };

  absl::Status Fail(size_t pos, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("line ", LineAt(pos), ": ", message));
  }
  int LineAt(size_t pos) {
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < s_.size(); ++line_pos_) {
      if (s_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }
  bool StartsAt(size_t pos, absl::string_view what) const {
    return absl::string_view(s_).substr(pos, what.size()) == what;
  }
  size_t SkipSpace(size_t pos) const {
    size_t len = 0;
    while (pos < s_.size() && IsPythonSpaceAt(s_, pos, &len)) pos += len;
    return pos;
  }
  // Emits s_[begin, end) as data after Jinja2's strip rules for the tag that follows it.
  void EmitData(size_t begin, size_t end, char sign, bool lstrip_applies);
  // Lexes the inside of a tag that starts at pos_; stops after its end delimiter.
  absl::Status LexTag(Tag tag);
  // Lexes a `{% raw %}` body starting at pos_.
  absl::Status LexRaw();
  // Lexes a comment body starting at pos_.
  absl::Status LexComment();
  // Length of a `{% raw %}` opening tag at pos, 0 when there is none; *sign gets its sign.
  size_t MatchRawBegin(size_t pos, char* sign) const;
  size_t MatchDigits(size_t pos) const;
  bool LexNumber(size_t* pos, Token* token, absl::Status* error);
  absl::Status DecodeString(size_t begin, size_t end, std::string* out);
  void Push(TokenType type, size_t pos, std::string text = "") {
    Token t;
    t.type = type;
    t.line = LineAt(pos);
    t.text = std::move(text);
    tokens_.push_back(std::move(t));
  }

  std::string s_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

void Lexer::EmitData(size_t begin, size_t end, char sign, bool lstrip_applies) {
  absl::string_view text = absl::string_view(s_).substr(begin, end - begin);
  if (sign == '-') {
    size_t keep = 0, i = 0, len = 0;
    while (i < text.size()) {
      if (IsPythonSpaceAt(text, i, &len)) {
        i += len;
      } else {
        DecodeAt(text, i, &len);
        i += len;
        keep = i;
      }
    }
    text = text.substr(0, keep);
  } else if (sign != '+' && lstrip_applies) {
    const size_t nl = text.rfind('\n');
    const size_t line_start = nl == absl::string_view::npos ? 0 : nl + 1;
    if ((line_start > 0 || line_starting_) && line_start < text.size()) {
      size_t i = line_start, len = 0;
      while (i < text.size() && IsPythonSpaceAt(text, i, &len)) i += len;
      if (i == text.size()) text = text.substr(0, line_start);
    }
  }
  if (!text.empty()) Push(TokenType::kData, begin, std::string(text));
}

size_t Lexer::MatchRawBegin(size_t pos, char* sign) const {
  if (!StartsAt(pos, "{%")) return 0;
  size_t p = pos + 2;
  *sign = 0;
  if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) *sign = s_[p++];
  p = SkipSpace(p);
  if (!StartsAt(p, "raw")) return 0;
  p = SkipSpace(p + 3);
  if (StartsAt(p, "-%}")) return SkipSpace(p + 3) - pos;
  if (StartsAt(p, "%}")) return p + 2 - pos;
  return 0;
}

absl::StatusOr<std::vector<Token>> Lexer::Run() {
  while (pos_ < s_.size()) {
    // The earliest tag opening: {{, {% or {#.
    size_t p = pos_;
    for (;;) {
      p = s_.find('{', p);
      if (p == std::string::npos || p + 1 >= s_.size()) {
        p = std::string::npos;
        break;
      }
      const char c = s_[p + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++p;
    }
    if (p == std::string::npos) {
      Push(TokenType::kData, pos_, s_.substr(pos_));
      break;
    }
    char raw_sign = 0;
    if (const size_t raw_len = MatchRawBegin(p, &raw_sign); raw_len > 0) {
      EmitData(pos_, p, raw_sign, /*lstrip_applies=*/true);
      pos_ = p + raw_len;
      line_starting_ = s_[pos_ - 1] == '\n';
      if (absl::Status st = LexRaw(); !st.ok()) return st;
      continue;
    }
    const char kind = s_[p + 1];
    size_t after = p + 2;
    char sign = 0;
    if (after < s_.size() && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
    EmitData(pos_, p, sign, /*lstrip_applies=*/kind != '{');
    pos_ = after;
    line_starting_ = false;
    absl::Status st;
    if (kind == '#') {
      st = LexComment();
    } else if (kind == '%') {
      Push(TokenType::kBlockBegin, p);
      st = LexTag(Tag::kBlock);
    } else {
      Push(TokenType::kVariableBegin, p);
      st = LexTag(Tag::kVariable);
    }
    if (!st.ok()) return st;
  }
  Push(TokenType::kEof, s_.size());
  return std::move(tokens_);
}

absl::Status Lexer::LexComment() {
  const size_t q = s_.find("#}", pos_);
  if (q == std::string::npos) return Fail(pos_, "missing end of comment tag");
  size_t end = q + 2;
  const char sign = q > pos_ ? s_[q - 1] : 0;
  if (sign == '-') {
    end = SkipSpace(end);
  } else if (sign != '+' && end < s_.size() && s_[end] == '\n') {
    ++end;
  }
  pos_ = end;
  line_starting_ = s_[end - 1] == '\n';
  return absl::OkStatus();
}

absl::Status Lexer::LexRaw() {
  for (size_t p = s_.find("{%", pos_); p != std::string::npos; p = s_.find("{%", p + 1)) {
    size_t q = p + 2;
    char sign = 0;
    if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) sign = s_[q++];
    q = SkipSpace(q);
    if (!StartsAt(q, "endraw")) continue;
    q = SkipSpace(q + 6);
    size_t end;
    if (StartsAt(q, "+%}")) {
      end = q + 3;
    } else if (StartsAt(q, "-%}")) {
      end = SkipSpace(q + 3);
    } else if (StartsAt(q, "%}")) {
      end = q + 2;
      if (end < s_.size() && s_[end] == '\n') ++end;
    } else {
      continue;
    }
    EmitData(pos_, p, sign, /*lstrip_applies=*/true);
    pos_ = end;
    line_starting_ = s_[end - 1] == '\n';
    return absl::OkStatus();
  }
  return Fail(pos_, "missing end of raw directive");
}

size_t Lexer::MatchDigits(size_t pos) const {
  size_t p = pos;
  if (p >= s_.size() || !IsDigit(s_[p])) return 0;
  while (p < s_.size() && IsDigit(s_[p])) ++p;
  while (p + 1 < s_.size() && s_[p] == '_' && IsDigit(s_[p + 1])) {
    ++p;
    while (p < s_.size() && IsDigit(s_[p])) ++p;
  }
  return p;
}

bool Lexer::LexNumber(size_t* pos, Token* token, absl::Status* error) {
  const size_t start = *pos;
  auto without_underscores = [&](size_t end) {
    std::string out;
    for (size_t i = start; i < end; ++i) {
      if (s_[i] != '_') out.push_back(s_[i]);
    }
    return out;
  };
  // A float: digits, then a fraction and/or an exponent (not right after a '.').
  if (start == 0 || s_[start - 1] != '.') {
    if (const size_t digits_end = MatchDigits(start); digits_end > 0) {
      size_t frac_end = 0;
      if (digits_end + 1 < s_.size() && s_[digits_end] == '.' && IsDigit(s_[digits_end + 1])) {
        frac_end = MatchDigits(digits_end + 1);
      }
      auto match_exponent = [&](size_t p) -> size_t {
        if (p >= s_.size() || (s_[p] != 'e' && s_[p] != 'E')) return 0;
        ++p;
        if (p < s_.size() && (s_[p] == '+' || s_[p] == '-')) ++p;
        return MatchDigits(p);
      };
      size_t end = match_exponent(frac_end > 0 ? frac_end : digits_end);
      if (end == 0) end = frac_end;
      if (end > 0) {
        token->type = TokenType::kFloat;
        token->float_value = std::strtod(without_underscores(end).c_str(), nullptr);
        *pos = end;
        return true;
      }
    }
  }
  // An integer: 0b.., 0o.., 0x.., a decimal, or zero.
  int base = 10;
  size_t digits_begin = start, end = start;
  auto match_based = [&](int b) {
    size_t p = start + 2;
    auto ok = [&](char c) {
      const int v = HexValue(c);
      return v >= 0 && v < b;
    };
    size_t last = 0;
    while (p < s_.size()) {
      if (ok(s_[p])) {
        last = ++p;
      } else if (s_[p] == '_' && p + 1 < s_.size() && ok(s_[p + 1])) {
        p += 2;
        last = p;
      } else {
        break;
      }
    }
    return last;
  };
  if (s_[start] == '0' && start + 1 < s_.size()) {
    const char x = s_[start + 1] | 0x20;
    const int b = x == 'b' ? 2 : x == 'o' ? 8 : x == 'x' ? 16 : 0;
    if (b != 0) {
      if (const size_t e = match_based(b); e > 0) {
        base = b;
        digits_begin = start + 2;
        end = e;
      }
    }
  }
  if (end == start) {
    if (s_[start] == '0') {
      end = start + 1;
      while (end < s_.size() &&
             (s_[end] == '0' || (s_[end] == '_' && end + 1 < s_.size() && s_[end + 1] == '0'))) {
        end += s_[end] == '_' ? 2 : 1;
      }
    } else {
      end = start + 1;
      while (end < s_.size() && (IsDigit(s_[end]) ||
                                 (s_[end] == '_' && end + 1 < s_.size() && IsDigit(s_[end + 1])))) {
        end += s_[end] == '_' ? 2 : 1;
      }
    }
  }
  uint64_t value = 0;
  for (size_t i = digits_begin; i < end; ++i) {
    if (s_[i] == '_') continue;
    const uint64_t d = static_cast<uint64_t>(HexValue(s_[i]));
    if (value > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - d) / base) {
      *error = Fail(start, absl::StrCat("integer literal '", s_.substr(start, end - start),
                                        "' is too large"));
      return false;
    }
    value = value * base + d;
  }
  token->type = TokenType::kInteger;
  token->integer_value = static_cast<int64_t>(value);
  *pos = end;
  return true;
}

absl::Status Lexer::DecodeString(size_t begin, size_t end, std::string* out) {
  for (size_t i = begin; i < end;) {
    if (s_[i] != '\\') {
      out->push_back(s_[i++]);
      continue;
    }
    const char c = s_[i + 1];
    i += 2;
    switch (c) {
      case '\n':
        break;
      case '\\':
        out->push_back('\\');
        break;
      case '\'':
        out->push_back('\'');
        break;
      case '"':
        out->push_back('"');
        break;
      case 'a':
        out->push_back('\a');
        break;
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case 'n':
        out->push_back('\n');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'v':
        out->push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int k = 0; k < digits; ++k) {
          const int v = i + k < end ? HexValue(s_[i + k]) : -1;
          if (v < 0) {
            return Fail(begin,
                        absl::StrFormat("truncated \\%c%s escape", c, std::string(digits, 'X')));
          }
          cp = cp * 16 + static_cast<uint32_t>(v);
        }
        i += digits;
        if (cp > 0x10FFFF) return Fail(begin, "illegal Unicode character");
        if (cp >= 0xD800 && cp <= 0xDFFF) {
          return Fail(begin, "a string literal escapes a lone surrogate");
        }
        py::AppendCodePoint(cp, out);
        break;
      }
      case 'N':
        return Fail(begin, "\\N{...} escapes in string literals are not supported");
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i < end && s_[i] >= '0' && s_[i] <= '7'; ++k, ++i) {
            cp = cp * 8 + static_cast<uint32_t>(s_[i] - '0');
          }
          py::AppendCodePoint(cp, out);
        } else if (static_cast<unsigned char>(c) < 0x80) {
          out->push_back('\\');
          out->push_back(c);
        } else {
          // Jinja2 escapes non-ASCII text before decoding escapes: "\é" reads as "\xe9".
          size_t len = 0;
          const uint32_t cp = DecodeAt(s_, i - 1, &len);
          i = i - 1 + len;
          out->push_back('\\');
          if (cp < 0x100) {
            absl::StrAppendFormat(out, "x%02x", cp);
          } else if (cp < 0x10000) {
            absl::StrAppendFormat(out, "u%04x", cp);
          } else {
            absl::StrAppendFormat(out, "U%08x", cp);
          }
        }
    }
  }
  return absl::OkStatus();
}

absl::Status Lexer::LexTag(Tag tag) {
  std::vector<char> balance;
  for (;;) {
    if (pos_ >= s_.size()) return absl::OkStatus();  // the parser reports the missing end
    if (balance.empty()) {
      if (tag == Tag::kBlock) {
        if (StartsAt(pos_, "+%}")) {
          Push(TokenType::kBlockEnd, pos_);
          pos_ += 3;
          line_starting_ = false;
          return absl::OkStatus();
        }
        if (StartsAt(pos_, "-%}")) {
          Push(TokenType::kBlockEnd, pos_);
          pos_ = SkipSpace(pos_ + 3);
          line_starting_ = s_[pos_ - 1] == '\n';
          return absl::OkStatus();
        }
        if (StartsAt(pos_, "%}")) {
          Push(TokenType::kBlockEnd, pos_);
          pos_ += 2;
          line_starting_ = false;
          if (pos_ < s_.size() && s_[pos_] == '\n') {
            ++pos_;
            line_starting_ = true;
          }
          return absl::OkStatus();
        }
      } else {
        if (StartsAt(pos_, "-}}")) {
          Push(TokenType::kVariableEnd, pos_);
          pos_ = SkipSpace(pos_ + 3);
          line_starting_ = s_[pos_ - 1] == '\n';
          return absl::OkStatus();
        }
        if (StartsAt(pos_, "}}")) {
          Push(TokenType::kVariableEnd, pos_);
          pos_ += 2;
          line_starting_ = false;
          return absl::OkStatus();
        }
      }
    }
    size_t len = 0;
    if (IsPythonSpaceAt(s_, pos_, &len)) {
      pos_ = SkipSpace(pos_);
      continue;
    }
    const char c = s_[pos_];
    if (IsDigit(c)) {
      Token token;
      token.line = LineAt(pos_);
      absl::Status error;
      size_t p = pos_;
      if (!LexNumber(&p, &token, &error)) return error;
      pos_ = p;
      tokens_.push_back(std::move(token));
      continue;
    }
    if (IsNameStart(c)) {
      size_t p = pos_;
      while (p < s_.size() && IsNameChar(s_[p])) ++p;
      Push(TokenType::kName, pos_, s_.substr(pos_, p - pos_));
      pos_ = p;
      continue;
    }
    if (c == '\'' || c == '"') {
      size_t p = pos_ + 1;
      while (p < s_.size() && s_[p] != c) p += s_[p] == '\\' ? 2 : 1;
      if (p >= s_.size()) {
        return Fail(pos_, absl::StrFormat("unexpected char '%c' (an unterminated string)", c));
      }
      std::string value;
      if (absl::Status st = DecodeString(pos_ + 1, p, &value); !st.ok()) return st;
      Push(TokenType::kString, pos_, std::move(value));
      pos_ = p + 1;
      continue;
    }
    static constexpr absl::string_view kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    std::string op;
    for (absl::string_view two : kTwoChar) {
      if (StartsAt(pos_, two)) op = std::string(two);
    }
    if (op.empty() &&
        absl::string_view("+-/*%~[](){}><=.:|,;").find(c) != absl::string_view::npos) {
      op = std::string(1, c);
    }
    if (op.empty()) {
      DecodeAt(s_, pos_, &len);
      return Fail(pos_, absl::StrCat("unexpected char '", s_.substr(pos_, len), "'"));
    }
    if (op == "(" || op == "[" || op == "{") {
      balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
    } else if (op == ")" || op == "]" || op == "}") {
      if (balance.empty()) return Fail(pos_, absl::StrCat("unexpected '", op, "'"));
      const char expected = balance.back();
      balance.pop_back();
      if (expected != op[0]) {
        return Fail(pos_, absl::StrFormat("unexpected '%s', expected '%c'", op, expected));
      }
    }
    Push(TokenType::kOperator, pos_, op);
    pos_ += op.size();
  }
}

}  // namespace

bool IsPythonSpaceAt(absl::string_view s, size_t i, size_t* len) {
  const uint32_t c = DecodeAt(s, i, len);
  if (IsPythonSpace(c)) return true;
  *len = 0;
  return false;
}

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  // Newlines become \n; one trailing newline goes (keep_trailing_newline is off).
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(source[i]);
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized)).Run();
}

}  // namespace carpool::text::jinja
