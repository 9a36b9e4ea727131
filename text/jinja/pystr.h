// Python's str semantics over UTF-8, for the Jinja2 interpreter's values and built-ins: code
// point access, Python's character classes (str.isspace(), isprintable(), ...), Python's case
// mappings (full Unicode mappings from ICU, final sigma as Python handles it), and the repr()
// of strings and floats. Internal to text/jinja/.
//
// Strings are UTF-8; a byte that does not start a well-formed sequence decodes as U+FFFD (the
// interpreter's strings come from JSON and template sources, which are valid UTF-8).
#ifndef CARPOOL_TEXT_JINJA_PYSTR_H_
#define CARPOOL_TEXT_JINJA_PYSTR_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace carpool::text::jinja::py {

std::u32string Decode(absl::string_view s);
std::string Encode(const std::u32string& s);
void AppendCodePoint(char32_t c, std::string* out);
// Number of code points (bytes that are not UTF-8 continuation bytes).
int64_t CodePointCount(absl::string_view s);

// Python's character predicates (str.isspace() etc. of a one-character string).
bool IsSpace(char32_t c);      // bidirectional WS/B/S or category Zs
bool IsPrintable(char32_t c);  // not Cc/Cf/Cs/Co/Cn/Zl/Zp/Zs, except ' '
bool IsAlpha(char32_t c);      // L*: Lu Ll Lt Lm Lo
bool IsDecimal(char32_t c);    // Numeric_Type=Decimal
bool IsDigit(char32_t c);      // Numeric_Type=Decimal or Digit
bool IsNumeric(char32_t c);    // any Numeric_Type
bool IsCased(char32_t c);
bool IsUpper(char32_t c);
bool IsLower(char32_t c);
bool IsTitle(char32_t c);  // category Lt
// str.splitlines() boundaries: \n \r \v \f \x1c \x1d \x1e \x85 \u2028 \u2029.
bool IsLineBreak(char32_t c);

// str.upper(), str.lower(), str.title(), str.capitalize(), str.swapcase().
std::string Upper(absl::string_view s);
std::string Lower(absl::string_view s);
std::string Title(absl::string_view s);
std::string Capitalize(absl::string_view s);
std::string SwapCase(absl::string_view s);
std::string CaseFold(absl::string_view s);  // full case folding, as str.casefold()
bool IsXidStart(char32_t c);
bool IsXidContinue(char32_t c);

// repr(str): quotes as Python chooses them, escapes as Python writes them.
std::string StrRepr(absl::string_view s);
// repr(float) == str(float): the shortest string that reads back as `d` ('1.0', '1e-05',
// '1e+16', 'inf', '-inf', 'nan').
std::string FloatRepr(double d);

}  // namespace carpool::text::jinja::py

#endif  // CARPOOL_TEXT_JINJA_PYSTR_H_
