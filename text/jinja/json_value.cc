#include "text/jinja/json_value.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace carpool::text::jinja {
namespace {

// Objects with fewer keys than this find a repeated key by comparing with each; bigger ones go
// through Dict::Set, which keeps an index.
constexpr size_t kLinearKeys = 16;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The first byte at or after `p` that ends a plain run inside a string: '"', '\\', a control
// character (< 0x20) or a non-ASCII byte (>= 0x80, to be checked as UTF-8). `end` when none.
const char* ScanPlain(const char* p, const char* end) {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  const __m128i space = _mm_set1_epi8(0x20);
  while (end - p >= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // A signed compare: bytes >= 0x80 are negative, so "< 0x20" catches them with the controls.
    const __m128i special =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                     _mm_cmplt_epi8(v, space));
    const int mask = _mm_movemask_epi8(special);
    if (mask != 0) return p + __builtin_ctz(static_cast<unsigned>(mask));
    p += 16;
  }
#endif
  for (; p < end; ++p) {
    const unsigned char c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) return p;
  }
  return end;
}

// The '"' that closes a string in which `from` is the first backslash: the first one after it
// that no backslash escapes. Nullptr when there is none. Escapes only shrink, so the decoded
// string is at most as long as the text up to it.
const char* ClosingQuote(const char* from, const char* end) {
  for (const char* p = from;;) {
    const char* quote = static_cast<const char*>(std::memchr(p, '"', static_cast<size_t>(end - p)));
    if (quote == nullptr) return nullptr;
    size_t backslashes = 0;
    for (const char* b = quote; b > from && b[-1] == '\\'; --b) ++backslashes;
    if (backslashes % 2 == 0) return quote;
    p = quote + 1;
  }
}

// The length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates,
// nothing past U+10FFFF) of 2 to 4 bytes starting at `p`; 0 when there is none.
size_t Utf8SequenceLength(const char* p, const char* end) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(p[i]); };
  const auto in = [&](size_t i, unsigned lo, unsigned hi) {
    return p + i < end && byte(i) >= lo && byte(i) <= hi;
  };
  const unsigned c = byte(0);
  if (c < 0xC2) return 0;  // ASCII, a continuation byte, or an overlong lead (C0, C1)
  if (c < 0xE0) return in(1, 0x80, 0xBF) ? 2 : 0;
  if (c < 0xF0) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80;  // E0 80..9F would be overlong
    const unsigned hi = c == 0xED ? 0x9F : 0xBF;  // ED A0..BF would be a surrogate
    return in(1, lo, hi) && in(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (c < 0xF5) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80;  // F0 80..8F would be overlong
    const unsigned hi = c == 0xF4 ? 0x8F : 0xBF;  // F4 90.. would pass U+10FFFF
    return in(1, lo, hi) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  char buf[4];
  size_t n;
  if (cp < 0x80) {
    buf[0] = static_cast<char>(cp);
    n = 1;
  } else if (cp < 0x800) {
    buf[0] = static_cast<char>(0xC0 | (cp >> 6));
    buf[1] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    buf[0] = static_cast<char>(0xE0 | (cp >> 12));
    buf[1] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[2] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    buf[0] = static_cast<char>(0xF0 | (cp >> 18));
    buf[1] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    buf[2] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[3] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 4;
  }
  out->append(buf, n);
}

// The four hex digits at `p` (REQUIRES: 4 bytes readable), or -1.
int32_t Hex4(const char* p) {
  int32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = p[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

// Whether the number `text` (JSON's grammar, already checked), which std::from_chars found out
// of a double's range, is too large (true) rather than too close to zero.
bool IsTooLarge(absl::string_view text) {
  // The value is 0.D x 10^(e + exponent), D starting at its first nonzero digit: at least 1
  // exactly when e + exponent >= 1.
  size_t i = text[0] == '-' ? 1 : 0;
  int64_t e = 0;
  bool found = false, after_point = false;
  for (; i < text.size() && (IsDigit(text[i]) || text[i] == '.'); ++i) {
    if (text[i] == '.') {
      after_point = true;
    } else if (!found) {
      found = text[i] != '0';
      if (found && !after_point) ++e;
      if (!found && after_point) --e;
    } else if (!after_point) {
      ++e;
    }
  }
  if (!found) return false;  // zero is never out of range
  int64_t exponent = 0;
  if (i < text.size()) {  // at 'e' or 'E'
    ++i;
    bool negative = false;
    if (text[i] == '+' || text[i] == '-') negative = text[i++] == '-';
    for (; i < text.size(); ++i) {
      exponent = std::min<int64_t>(exponent * 10 + (text[i] - '0'), int64_t{1} << 40);
    }
    if (negative) exponent = -exponent;
  }
  return e + exponent >= 1;
}

class Parser {
 public:
  Parser(absl::string_view text, int max_depth)
      : begin_(text.data()),
        p_(text.data()),
        end_(text.data() + text.size()),
        max_depth_(max_depth) {}

  absl::StatusOr<Value> Parse(JsonErrorKind* error_kind);

 private:
  size_t Offset(const char* at) const { return static_cast<size_t>(at - begin_); }
  bool Fail(const char* at, absl::string_view what) {
    error_ = absl::StrCat(what, " at byte ", Offset(at));
    return false;
  }
  // "expected X at byte N, found Y".
  bool Expected(absl::string_view what);
  std::string Describe(const char* at) const;

  void SkipSpace() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  // Each parses what starts at p_ (a value's first byte: no space before it) and leaves p_ just
  // after it. `depth`: the containers around it.
  bool ParseValue(int depth, Value* out);
  bool ParseArray(int depth, Value* out);
  bool ParseObject(int depth, Value* out);
  bool ParseString(std::string* out);
  bool ParseEscape(const char** at, std::string* out);
  bool ParseNumber(Value* out);
  bool ParseWord(Value* out);
  // A member's key and its ':' (p_ at the key; leaves p_ at the value).
  bool ParseKey(std::string* out);
  // The array or object at p_, which nests past max_depth: checked for syntax, iteratively,
  // building nothing.
  bool SkipTooDeep();

  const char* const begin_;
  const char* p_;
  const char* const end_;
  const int max_depth_;
  std::string error_;
  const char* too_deep_at_ = nullptr;  // the first container past max_depth
};

std::string Parser::Describe(const char* at) const {
  if (at == end_) return "the end of the text";
  const unsigned char c = static_cast<unsigned char>(*at);
  if (c >= 0x20 && c < 0x7F) return absl::StrCat("'", absl::string_view(at, 1), "'");
  if (c < 0x80) return absl::StrFormat("byte 0x%02x", c);
  const size_t n = Utf8SequenceLength(at, end_);
  if (n == 0) return "invalid UTF-8";
  return absl::StrCat("'", absl::string_view(at, n), "'");
}

bool Parser::Expected(absl::string_view what) {
  error_ = absl::StrCat("expected ", what, " at byte ", Offset(p_), ", found ", Describe(p_));
  return false;
}

bool Parser::ParseValue(int depth, Value* out) {
  if (p_ == end_) return Expected("a value");
  switch (*p_) {
    case '"': {
      std::string s;
      if (!ParseString(&s)) return false;
      *out = Value::String(std::move(s));
      return true;
    }
    case '[':
    case '{':
      if (depth >= max_depth_) {
        if (too_deep_at_ == nullptr) too_deep_at_ = p_;
        *out = Value::None();
        return SkipTooDeep();
      }
      return *p_ == '[' ? ParseArray(depth + 1, out) : ParseObject(depth + 1, out);
    case '-':
    case '0':
    case '1':
    case '2':
    case '3':
    case '4':
    case '5':
    case '6':
    case '7':
    case '8':
    case '9':
      return ParseNumber(out);
    default:
      return ParseWord(out);
  }
}

bool Parser::ParseArray(int depth, Value* out) {
  ++p_;  // '['
  SkipSpace();
  List items;
  if (p_ < end_ && *p_ == ']') {
    ++p_;
  } else {
    for (;;) {
      Value item = Value::None();
      if (!ParseValue(depth, &item)) return false;
      items.push_back(std::move(item));
      SkipSpace();
      if (p_ < end_ && *p_ == ',') {
        ++p_;
        SkipSpace();
      } else if (p_ < end_ && *p_ == ']') {
        ++p_;
        break;
      } else {
        return Expected("',' or ']'");
      }
    }
  }
  *out = Value::MakeList(std::move(items));
  return true;
}

bool Parser::ParseKey(std::string* out) {
  if (p_ == end_ || *p_ != '"') return Expected("a string key");
  if (!ParseString(out)) return false;
  SkipSpace();
  if (p_ == end_ || *p_ != ':') return Expected("':'");
  ++p_;
  SkipSpace();
  return true;
}

bool Parser::ParseObject(int depth, Value* out) {
  ++p_;  // '{'
  SkipSpace();
  Dict dict;
  if (p_ < end_ && *p_ == '}') {
    ++p_;
  } else {
    dict.entries.reserve(4);  // a message's role and content, a part's type and text: one alloc
    for (;;) {
      std::string key;
      if (!ParseKey(&key)) return false;
      Value value = Value::None();
      if (!ParseValue(depth, &value)) return false;
      if (dict.entries.size() < kLinearKeys) {
        // A repeated key keeps its first place and takes the last value, as a Python dict.
        Value* existing = nullptr;
        for (auto& [k, v] : dict.entries) {
          if (k.string_value() == key) existing = &v;
        }
        if (existing != nullptr) {
          *existing = std::move(value);
        } else {
          dict.entries.emplace_back(Value::String(std::move(key)), std::move(value));
        }
      } else {
        dict.Set(Value::String(std::move(key)), std::move(value));
      }
      SkipSpace();
      if (p_ < end_ && *p_ == ',') {
        ++p_;
        SkipSpace();
      } else if (p_ < end_ && *p_ == '}') {
        ++p_;
        break;
      } else {
        return Expected("',' or '}'");
      }
    }
  }
  *out = Value::MakeDict(std::move(dict));
  return true;
}

bool Parser::ParseString(std::string* out) {
  const char* const open = p_;
  const char* run = p_ + 1;  // bytes not yet appended to `out`
  const char* q = run;
  for (;;) {
    q = ScanPlain(q, end_);
    if (q == end_) return Fail(open, "unterminated string starting");
    const unsigned char c = static_cast<unsigned char>(*q);
    if (c == '"') {
      out->append(run, static_cast<size_t>(q - run));
      p_ = q + 1;
      return true;
    }
    if (c >= 0x80) {
      const size_t n = Utf8SequenceLength(q, end_);
      if (n == 0) return Fail(q, "invalid UTF-8");
      q += n;
    } else if (c == '\\') {
      if (run == open + 1) {  // the first escape: make room once, not at each piece
        if (const char* close = ClosingQuote(q, end_)) {
          out->reserve(static_cast<size_t>(close - run));
        }
      }
      out->append(run, static_cast<size_t>(q - run));
      if (!ParseEscape(&q, out)) return false;
      run = q;
    } else {
      return Fail(q,
                  absl::StrFormat("a control character (0x%02x) must be escaped in a string", c));
    }
  }
}

bool Parser::ParseEscape(const char** at, std::string* out) {
  const char* e = *at;  // the backslash
  if (end_ - e < 2) return Fail(e, "unterminated escape");
  char decoded;
  switch (e[1]) {
    case '"':
      decoded = '"';
      break;
    case '\\':
      decoded = '\\';
      break;
    case '/':
      decoded = '/';
      break;
    case 'b':
      decoded = '\b';
      break;
    case 'f':
      decoded = '\f';
      break;
    case 'n':
      decoded = '\n';
      break;
    case 'r':
      decoded = '\r';
      break;
    case 't':
      decoded = '\t';
      break;
    case 'u': {
      const int32_t cp = end_ - e >= 6 ? Hex4(e + 2) : -1;
      if (cp < 0) return Fail(e, "a \\u escape needs four hex digits");
      const absl::string_view escape(e, 6);
      if (cp >= 0xDC00 && cp <= 0xDFFF) return Fail(e, absl::StrCat("lone surrogate ", escape));
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        const int32_t low = end_ - e >= 12 && e[6] == '\\' && e[7] == 'u' ? Hex4(e + 8) : -1;
        if (low < 0xDC00 || low > 0xDFFF) return Fail(e, absl::StrCat("lone surrogate ", escape));
        AppendUtf8(0x10000 + ((static_cast<uint32_t>(cp) - 0xD800) << 10) +
                       (static_cast<uint32_t>(low) - 0xDC00),
                   out);
        *at = e + 12;
        return true;
      }
      AppendUtf8(static_cast<uint32_t>(cp), out);
      *at = e + 6;
      return true;
    }
    default:
      return Fail(e, absl::StrCat("invalid escape: a backslash followed by ", Describe(e + 1)));
  }
  out->push_back(decoded);
  *at = e + 2;
  return true;
}

bool Parser::ParseNumber(Value* out) {
  const char* const start = p_;
  const char* q = p_;
  if (*q == '-') ++q;
  if (q == end_ || !IsDigit(*q)) {
    if (end_ - q >= 8 && std::memcmp(q, "Infinity", 8) == 0) {
      return Fail(start, "-Infinity is not JSON");
    }
    p_ = q;
    return Expected("a digit");
  }
  if (*q == '0') {
    ++q;
  } else {
    while (q < end_ && IsDigit(*q)) ++q;
  }
  bool integer = true;
  if (q < end_ && *q == '.') {
    ++q;
    if (q == end_ || !IsDigit(*q)) {
      p_ = q;
      return Expected("a digit after '.'");
    }
    while (q < end_ && IsDigit(*q)) ++q;
    integer = false;
  }
  if (q < end_ && (*q == 'e' || *q == 'E')) {
    ++q;
    if (q < end_ && (*q == '+' || *q == '-')) ++q;
    if (q == end_ || !IsDigit(*q)) {
      p_ = q;
      return Expected("a digit in the exponent");
    }
    while (q < end_ && IsDigit(*q)) ++q;
    integer = false;
  }
  p_ = q;
  if (integer) {
    int64_t i = 0;
    if (std::from_chars(start, q, i).ec == std::errc()) {
      *out = Value::Int(i);
      return true;
    }
    // Outside int64: a float, as Value::FromJson gives it.
  }
  double d = 0;
  if (std::from_chars(start, q, d).ec == std::errc()) {
    *out = Value::Float(d);
    return true;
  }
  const absl::string_view text(start, static_cast<size_t>(q - start));
  if (IsTooLarge(text)) return Fail(start, "number too large for a double");
  *out = Value::Float(*start == '-' ? -0.0 : 0.0);  // what Python rounds it to
  return true;
}

bool Parser::ParseWord(Value* out) {
  const auto is = [&](absl::string_view word) {
    return static_cast<size_t>(end_ - p_) >= word.size() &&
           std::memcmp(p_, word.data(), word.size()) == 0;
  };
  if (is("true")) {
    *out = Value::Bool(true);
    p_ += 4;
  } else if (is("false")) {
    *out = Value::Bool(false);
    p_ += 5;
  } else if (is("null")) {
    *out = Value::None();
    p_ += 4;
  } else if (is("NaN") || is("Infinity")) {
    return Fail(p_, absl::StrCat(is("NaN") ? "NaN" : "Infinity", " is not JSON"));
  } else {
    return Expected("a value");
  }
  return true;
}

bool Parser::SkipTooDeep() {
  std::vector<char> closers;  // what each open container ends with
  std::string scratch;
  bool at_value = true;  // p_ is where a value starts (else where ',' or a closer is due)
  for (;;) {
    if (at_value) {
      if (p_ < end_ && (*p_ == '[' || *p_ == '{')) {
        closers.push_back(*p_ == '[' ? ']' : '}');
        ++p_;
        SkipSpace();
        if (p_ < end_ && *p_ == closers.back()) {
          ++p_;
          closers.pop_back();
          at_value = false;
        } else if (closers.back() == '}') {
          scratch.clear();
          if (!ParseKey(&scratch)) return false;
        }
      } else {
        Value scalar = Value::None();
        if (!ParseValue(max_depth_, &scalar)) return false;  // a scalar: no nesting
        at_value = false;
      }
      continue;
    }
    if (closers.empty()) return true;
    SkipSpace();
    if (p_ < end_ && *p_ == ',') {
      ++p_;
      SkipSpace();
      if (closers.back() == '}') {
        scratch.clear();
        if (!ParseKey(&scratch)) return false;
      }
      at_value = true;
    } else if (p_ < end_ && *p_ == closers.back()) {
      ++p_;
      closers.pop_back();
    } else {
      return Expected(closers.back() == ']' ? "',' or ']'" : "',' or '}'");
    }
  }
}

absl::StatusOr<Value> Parser::Parse(JsonErrorKind* error_kind) {
  const auto failed = [&](JsonErrorKind kind) {
    if (error_kind != nullptr) *error_kind = kind;
    return absl::InvalidArgumentError(error_);
  };
  if (end_ - p_ >= 3 && std::memcmp(p_, "\xEF\xBB\xBF", 3) == 0) p_ += 3;  // a byte order mark
  SkipSpace();
  Value value = Value::None();
  if (!ParseValue(0, &value)) return failed(JsonErrorKind::kSyntax);
  SkipSpace();
  if (p_ != end_) {
    Fail(p_, absl::StrCat("unexpected ", Describe(p_), " after the JSON value"));
    return failed(JsonErrorKind::kSyntax);
  }
  if (too_deep_at_ != nullptr) {
    error_ = absl::StrCat("nests arrays and objects deeper than ", max_depth_, " levels (at byte ",
                          Offset(too_deep_at_), ")");
    return failed(JsonErrorKind::kTooDeep);
  }
  return value;
}

}  // namespace

absl::StatusOr<Value> ParseJsonValue(absl::string_view text, int max_depth,
                                     JsonErrorKind* error_kind) {
  CARPOOL_CHECK(max_depth >= 0 && max_depth <= kMaxJsonValueDepth);
  return Parser(text, max_depth).Parse(error_kind);
}

}  // namespace carpool::text::jinja
