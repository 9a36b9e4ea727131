#include "text/unicode.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

namespace carpool::text {

char32_t NextCodePoint(std::string_view s, size_t* i) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data()) + *i;
  const unsigned char c = p[0];
  if (c < 0x80) {
    *i += 1;
    return c;
  }
  if (c < 0xE0) {
    *i += 2;
    return ((c & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (c < 0xF0) {
    *i += 3;
    return ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *i += 4;
  return ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void AppendUtf8(char32_t c, std::string* out) {
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

namespace {

// The length of the well-formed sequence at p[0..n), or 0 with *valid_prefix set to the length
// of the maximal ill-formed prefix (at least 1).
size_t WellFormedLength(const unsigned char* p, size_t n, size_t* valid_prefix) {
  const unsigned char c = p[0];
  *valid_prefix = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) {
      *valid_prefix = k;
      return 0;
    }
    const unsigned char b = p[k];
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *valid_prefix = k;
      return 0;
    }
  }
  return need;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t prefix;
    const size_t len = WellFormedLength(p + i, s.size() - i, &prefix);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t prefix;
    const size_t len = WellFormedLength(p + i, bytes.size() - i, &prefix);
    if (len == 0) {
      out.append("\xEF\xBF\xBD");
      i += prefix;
    } else {
      out.append(bytes.substr(i, len));
      i += len;
    }
  }
  return out;
}

bool IsWhitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool IsNumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK) != 0;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  const UChar32 u = static_cast<UChar32>(c);
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

std::string_view TrimStartWhitespace(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!IsWhitespace(NextCodePoint(s, &next))) break;
    i = next;
  }
  return s.substr(i);
}

std::string_view TrimEndWhitespace(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!IsWhitespace(NextCodePoint(s, &i))) break;
    end = start;
  }
  return s.substr(0, end);
}

std::string Lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++i;
      continue;
    }
    const char32_t c = NextCodePoint(s, &i);
    // One character at a time, so no context-dependent rule (final sigma) applies.
    UChar src[2];
    int32_t src_len = 0;
    U16_APPEND_UNSAFE(src, src_len, static_cast<UChar32>(c));
    UChar dst[8];
    UErrorCode err = U_ZERO_ERROR;
    const int32_t n = u_strToLower(dst, 8, src, src_len, "", &err);
    if (U_FAILURE(err)) {
      AppendUtf8(c, &out);
      continue;
    }
    for (int32_t k = 0; k < n;) {
      UChar32 lc;
      U16_NEXT_UNSAFE(dst, k, lc);
      AppendUtf8(static_cast<char32_t>(lc), &out);
    }
  }
  return out;
}

}  // namespace carpool::text
