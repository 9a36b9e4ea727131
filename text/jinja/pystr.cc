#include "text/jinja/pystr.h"

#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>
#include <unicode/ustring.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_format.h"

namespace carpool::text::jinja::py {
namespace {

// The code point at s[*i] (U+FFFD for a byte that starts no well-formed sequence); advances *i.
char32_t Next(absl::string_view s, size_t* i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const unsigned char c = p[*i];
  if (c < 0x80) {
    ++*i;
    return c;
  }
  size_t need;
  char32_t cp;
  char32_t min;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2, cp = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3, cp = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4, cp = c & 0x07, min = 0x10000;
  } else {
    ++*i;
    return 0xFFFD;
  }
  if (*i + need > n) {
    ++*i;
    return 0xFFFD;
  }
  for (size_t k = 1; k < need; ++k) {
    const unsigned char b = p[*i + k];
    if ((b & 0xC0) != 0x80) {
      ++*i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*i;
    return 0xFFFD;
  }
  *i += need;
  return cp;
}

std::string FromUnicodeString(const icu::UnicodeString& u) {
  std::string out;
  u.toUTF8String(out);
  return out;
}

icu::UnicodeString ToUnicodeString(absl::string_view s) {
  return icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
}

bool IsCaseIgnorable(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASE_IGNORABLE);
}

// Python's lowercase of s[i] inside s: the full mapping, and for a capital sigma the final form
// when a cased letter precedes it and none follows (case-ignorable characters skipped).
void AppendLowerAt(const std::u32string& s, size_t i, std::string* out) {
  const char32_t c = s[i];
  if (c < 0x80) {
    out->push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    return;
  }
  if (c == 0x03A3) {
    size_t j = i;
    bool before = false;
    while (j > 0) {
      --j;
      if (IsCaseIgnorable(s[j])) continue;
      before = IsCased(s[j]);
      break;
    }
    bool after = false;
    for (size_t k = i + 1; k < s.size(); ++k) {
      if (IsCaseIgnorable(s[k])) continue;
      after = IsCased(s[k]);
      break;
    }
    AppendCodePoint(before && !after ? 0x03C2 : 0x03C3, out);
    return;
  }
  icu::UnicodeString u(static_cast<UChar32>(c));
  u.toLower(icu::Locale::getRoot());
  u.toUTF8String(*out);
}

void AppendTitle(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c));
    return;
  }
  icu::UnicodeString u(static_cast<UChar32>(c));
  u.toTitle(nullptr, icu::Locale::getRoot(),
            U_TITLECASE_WHOLE_STRING | U_TITLECASE_NO_BREAK_ADJUSTMENT | U_TITLECASE_NO_LOWERCASE);
  u.toUTF8String(*out);
}

}  // namespace

std::u32string Decode(absl::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(Next(s, &i));
  return out;
}

void AppendCodePoint(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendCodePoint(c, &out);
  return out;
}

int64_t CodePointCount(absl::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool IsSpace(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  const UChar32 u = static_cast<UChar32>(c);
  if (u_charType(u) == U_SPACE_SEPARATOR) return true;
  const UCharDirection d = u_charDirection(u);
  return d == U_WHITE_SPACE_NEUTRAL || d == U_BLOCK_SEPARATOR || d == U_SEGMENT_SEPARATOR;
}

bool IsPrintable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

bool IsAlpha(char32_t c) {
  if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return true;
    default:
      return false;
  }
}

bool IsDecimal(char32_t c) {
  return u_getIntPropertyValue(static_cast<UChar32>(c), UCHAR_NUMERIC_TYPE) == U_NT_DECIMAL;
}

bool IsDigit(char32_t c) {
  const int t = u_getIntPropertyValue(static_cast<UChar32>(c), UCHAR_NUMERIC_TYPE);
  return t == U_NT_DECIMAL || t == U_NT_DIGIT;
}

bool IsNumeric(char32_t c) {
  return u_getIntPropertyValue(static_cast<UChar32>(c), UCHAR_NUMERIC_TYPE) != U_NT_NONE;
}

bool IsCased(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED); }
bool IsUpper(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_UPPERCASE); }
bool IsLower(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_LOWERCASE); }
bool IsTitle(char32_t c) { return u_charType(static_cast<UChar32>(c)) == U_TITLECASE_LETTER; }

bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
         c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::string Upper(absl::string_view s) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& c : out) {
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    }
    return out;
  }
  icu::UnicodeString u = ToUnicodeString(s);
  u.toUpper(icu::Locale::getRoot());
  return FromUnicodeString(u);
}

std::string Lower(absl::string_view s) {
  bool ascii = true;
  for (char c : s) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    }
    return out;
  }
  const std::u32string u = Decode(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < u.size(); ++i) AppendLowerAt(u, i, &out);
  return out;
}

std::string Title(absl::string_view s) {
  const std::u32string u = Decode(s);
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    if (previous_cased) {
      AppendLowerAt(u, i, &out);
    } else {
      AppendTitle(u[i], &out);
    }
    previous_cased = u[i] < 0x80 ? ((u[i] | 32) >= 'a' && (u[i] | 32) <= 'z') : IsCased(u[i]);
  }
  return out;
}

std::string Capitalize(absl::string_view s) {
  const std::u32string u = Decode(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0) {
      AppendTitle(u[i], &out);
    } else {
      AppendLowerAt(u, i, &out);
    }
  }
  return out;
}

std::string SwapCase(absl::string_view s) {
  const std::u32string u = Decode(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < u.size(); ++i) {
    if (IsUpper(u[i])) {
      AppendLowerAt(u, i, &out);
    } else if (IsLower(u[i])) {
      out += Upper(Encode(u.substr(i, 1)));
    } else {
      AppendCodePoint(u[i], &out);
    }
  }
  return out;
}

std::string CaseFold(absl::string_view s) {
  icu::UnicodeString u = ToUnicodeString(s);
  u.foldCase(U_FOLD_CASE_DEFAULT);
  return FromUnicodeString(u);
}

bool IsXidStart(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_XID_START);
}
bool IsXidContinue(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_XID_CONTINUE);
}

std::string StrRepr(absl::string_view s) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(quote);
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = Next(s, &i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (IsPrintable(c)) {
      AppendCodePoint(c, &out);
    } else if (c <= 0xFF) {
      out += absl::StrFormat("\\x%02x", static_cast<uint32_t>(c));
    } else if (c <= 0xFFFF) {
      out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
    } else {
      out += absl::StrFormat("\\U%08x", static_cast<uint32_t>(c));
    }
  }
  out.push_back(quote);
  return out;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, result.ptr);  // "-1.2345e+16", "1e-05"
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    i = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e_pos; ++k) {
    if (sci[k] != '.') digits.push_back(sci[k]);
  }
  const int exponent = std::atoi(sci.c_str() + e_pos + 1);
  const int decpt = exponent + 1;  // the value is 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(static_cast<size_t>(decpt - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out.push_back('.');
      out += digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out.push_back(digits[0]);
  if (n > 1) {
    out.push_back('.');
    out += digits.substr(1);
  }
  out += absl::StrFormat("e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

}  // namespace carpool::text::jinja::py
