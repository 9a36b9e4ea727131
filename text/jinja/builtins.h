// The built-ins of the Jinja2 interpreter: the filters and tests chat templates use, the methods
// of strings, dicts and lists (what `obj.name(...)` calls), and the tojson filter as transformers
// defines it. Each behaves as Jinja2 3.1 with Python 3.11 does, byte for byte where it prints;
// docs/chat_templates.md lists them and the known differences.
//
// Errors are INVALID_ARGUMENT with Python's or Jinja2's message where practical. Work that loops
// over a value or builds a string is charged to the render's Budget.
//
// Thread safety: all functions are thread-safe (they keep no state).
#ifndef CARPOOL_TEXT_JINJA_BUILTINS_H_
#define CARPOOL_TEXT_JINJA_BUILTINS_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace carpool::text::jinja {

// A filter: `input | name(args...)`.
using FilterFn = absl::StatusOr<Value> (*)(const Value& input, const CallArgs& args,
                                           Budget& budget);
// The filter `name`, or nullptr when carpool has none (the parser refuses those). The parser
// resolves each filter once, so a render does not look names up.
FilterFn FindFilter(absl::string_view name);
inline bool HasFilter(absl::string_view name) { return FindFilter(name) != nullptr; }
// `input | name(args...)`. REQUIRES: HasFilter(name).
absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input,
                                  const CallArgs& args, Budget& budget);

// Whether `name` is a test carpool has (`x is name`).
bool HasTest(absl::string_view name);
// `input is name(args...)`. REQUIRES: HasTest(name).
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, const CallArgs& args,
                               Budget& budget);

// The method `name` of `obj` bound to it (str.strip, dict.items, list.index, ...), for a number
// also its attribute (`(5).real`), or nullopt when carpool has no such method. The sandbox's refusals (mutating methods, _names) are
// GetAttr's, not this function's.
std::optional<Value> BoundMethod(const Value& obj, absl::string_view name);
// The string methods templates call once a message (strip, lstrip, rstrip, split, rsplit,
// startswith, endswith, find, rfind, index, rindex, count, replace), callable without binding
// them first: fn(name, s, args, budget) is what BoundMethod(s, name)->fn(args) gives. The
// parser resolves the name once.
using StrMethodFn = absl::StatusOr<Value> (*)(absl::string_view name, const std::string& s,
                                              const CallArgs& args, Budget& budget);
// nullptr for the other names (bind those with BoundMethod).
StrMethodFn FindStrMethod(absl::string_view name);

// json.dumps(v, ensure_ascii=False, indent=indent, separators=separators): separators default
// to (", ", ": "), or (",", ": ") with an indent. INVALID_ARGUMENT "Object of type Undefined is
// not JSON serializable" for what JSON cannot hold (also a dict key that is not a string,
// number, bool or None).
absl::StatusOr<std::string> ToJson(const Value& v, std::optional<int> indent,
                                   std::optional<std::pair<std::string, std::string>> separators,
                                   Budget& budget);

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_BUILTINS_H_
