// Python's str.format and format(value, spec) for the interpreter's values: {} {0} {name}
// fields with .attr and [key] lookups (through the sandbox's GetAttr / GetItem), !r !s !a
// conversions, and the format-spec mini-language for str, int and float
// ([[fill]align][sign][#][0][width][,|_][.precision][type], types s d b o x X c e E f F g G %).
// Internal to text/jinja/.
#ifndef CARPOOL_TEXT_JINJA_FORMAT_H_
#define CARPOOL_TEXT_JINJA_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace carpool::text::jinja {

// fmt.format(*args.positional, **args.keyword).
absl::StatusOr<std::string> StrFormat(absl::string_view fmt, const CallArgs& args, Budget& budget);
// format(value, spec). The padding a width asks for is charged to `budget`.
absl::StatusOr<std::string> FormatValue(const Value& value, absl::string_view spec,
                                        Budget& budget);

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_FORMAT_H_
