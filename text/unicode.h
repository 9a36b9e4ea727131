// UTF-8 and character-class helpers shared by the text/ components. The character classes follow
// the definitions the Hugging Face `tokenizers` library uses (Rust's char methods), read from ICU.
#ifndef CARPOOL_TEXT_UNICODE_H_
#define CARPOOL_TEXT_UNICODE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace carpool::text {

// The code point starting at s[*i]; advances *i past it. REQUIRES: s is valid UTF-8, *i < size.
char32_t NextCodePoint(std::string_view s, size_t* i);
// Byte length of the UTF-8 sequence whose lead byte is `lead` (1 for a stray byte).
inline size_t Utf8Length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
void AppendUtf8(char32_t c, std::string* out);

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence, or npos.
size_t FindInvalidUtf8(std::string_view s);
// `bytes` as UTF-8 with every maximal ill-formed subsequence replaced by U+FFFD (the rule of
// Rust's String::from_utf8_lossy and the WHATWG decoder).
std::string Utf8Lossy(std::string_view bytes);

bool IsWhitespace(char32_t c);  // White_Space (Rust char::is_whitespace)
bool IsNumeric(char32_t c);     // general category N* (Rust char::is_numeric)
// A regex word character (\w of Rust's regex crate and Oniguruma): Alphabetic, a mark, Nd, Pc or
// a join control. Added tokens' single_word looks at it.
bool IsWordChar(char32_t c);

// `s` without leading / trailing White_Space characters. REQUIRES: valid UTF-8.
std::string_view TrimStartWhitespace(std::string_view s);
std::string_view TrimEndWhitespace(std::string_view s);

// The full lowercase mapping of each character (Rust char::to_lowercase, no context rules).
std::string Lowercase(std::string_view s);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_UNICODE_H_
