// Helpers shared by the built-ins' files (filters.cc, tests.cc, methods.cc, json.cc): binding a
// call's arguments to Python-style parameters. Internal to text/jinja/.
#ifndef CARPOOL_TEXT_JINJA_BUILTINS_INTERNAL_H_
#define CARPOOL_TEXT_JINJA_BUILTINS_INTERNAL_H_

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace carpool::text::jinja::internal {

// A call's arguments matched to named parameters, as Python binds them: positionals fill the
// parameters in order, keywords by name. Unknown keywords, too many positionals and a
// parameter given twice are INVALID_ARGUMENT naming `function`.
class BoundArgs {
 public:
  // `keywords`: whether keywords are accepted (Python's builtin str methods mostly take none).
  static absl::StatusOr<BoundArgs> Bind(absl::string_view function, const CallArgs& args,
                                        std::initializer_list<const char*> params,
                                        bool keywords = true);

  // The argument of parameter `i`, or nullptr when not given.
  const Value* Get(size_t i) const { return given_[i] ? &values_[i] : nullptr; }
  bool Has(size_t i) const { return given_[i]; }
  // The argument, or `fallback` when not given.
  Value Or(size_t i, Value fallback) const { return given_[i] ? values_[i] : std::move(fallback); }

 private:
  // (Inline: filters and methods bind at every call, and take a few parameters.)
  absl::InlinedVector<Value, 4> values_;
  absl::InlinedVector<bool, 4> given_;
};

// Argument conversions with Python's TypeError messages naming `what`.
absl::StatusOr<int64_t> ToInt(const Value& v, absl::string_view what);
absl::StatusOr<std::string> ToStr(const Value& v, absl::string_view what);

// Filters' str(): Undefined is "" (Jinja2's soft_str).
inline std::string SoftStr(const Value& v) { return v.Str(); }

// Makes `fn` a bound method value named `name` of a `type_name` object.
Value MakeMethod(absl::string_view type_name, absl::string_view name, Function fn);

// The ToJson body (json.cc), also used by ApplyFilter.
absl::StatusOr<std::string> Dumps(const Value& v, const Value& indent, const Value& separators,
                                  bool sort_keys, Budget& budget, bool ensure_ascii = false);

// int(d) for a float (filters.cc): an error for infinities and beyond int64.
absl::StatusOr<Value> FloatToInt(double d);

// Python's printf-style `fmt % args` (format.cc): the conversions s r a d i u f F e E g G x X
// o c and %%, flags, width and precision; %(name)s looks `name` up in args.keyword.
absl::StatusOr<std::string> PercentFormat(const std::string& fmt, const CallArgs& args,
                                          Budget& budget);

// String methods (methods.cc) that filters reuse: Python's str.split(sep, maxsplit) and
// str.replace(old, new, count).
std::vector<std::string> SplitWhitespace(absl::string_view s, int64_t maxsplit);
std::string Replace(absl::string_view s, absl::string_view old, absl::string_view replacement,
                    int64_t count);
// Python's str.strip(chars) (chars nullopt: whitespace), on each side asked for.
std::string Strip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);

// methods_more.cc: str's swapcase, casefold, expandtabs, translate, isidentifier, isprintable,
// isascii; and a number's attribute (real, imag, numerator, denominator) or bound method
// (conjugate, bit_length, is_integer). nullopt for other names.
std::optional<Function> MoreStrMethod(const Value& v, absl::string_view name);
std::optional<Value> NumberAttribute(const Value& v, absl::string_view name);

}  // namespace carpool::text::jinja::internal

#endif  // CARPOOL_TEXT_JINJA_BUILTINS_INTERNAL_H_
