// JSON text parsed straight into template values, as Python's json.loads reads it, as far as
// the Value model can hold the result (chat requests' messages, tools and kwargs arrive as JSON
// text; this is what turns them into the template's context, without an intermediate tree).
//
//   JSON                      Value
//   object                    kDict, keys in document order; a repeated key keeps the place of
//                             its first occurrence and takes its last value (as a Python dict)
//   array                     kList
//   string                    kString (UTF-8), every escape decoded, \uD83D\uDE00 pairs joined
//   integer (no '.', no 'e')  kInt; outside int64: kFloat, the nearest double (as Value::FromJson)
//   other number              kFloat, correctly rounded; one too small for a double is 0.0 (or
//                             -0.0), as Python gives it
//   true, false, null         kBool, kNone
//
// Where this differs from json.loads, on purpose (each is INVALID_ARGUMENT):
//   - a \u escape of a lone surrogate (\ud800 not followed by \udc00-\udfff, or a \udc00 on its
//     own): Python builds a str holding it, but a UTF-8 string cannot (Python itself could not
//     encode it to UTF-8 later);
//   - bytes that are not well-formed UTF-8, anywhere (including encoded surrogates, which
//     json.loads of bytes lets through as "surrogatepass");
//   - NaN, Infinity and -Infinity (Python's extension of JSON), and a number too large for a
//     double (json.loads gives inf; nlohmann's parser refuses it too).
// As json.loads of bytes does, a UTF-8 byte order mark before the document is skipped.
// Whitespace is JSON's four (space, tab, LF, CR).
//
// Thread safety: a pure function.
#ifndef CARPOOL_TEXT_JINJA_JSON_VALUE_H_
#define CARPOOL_TEXT_JINJA_JSON_VALUE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace carpool::text::jinja {

// The largest max_depth ParseJsonValue takes: the parser recurses once per level.
constexpr int kMaxJsonValueDepth = 1000;

// Why ParseJsonValue failed.
enum class JsonErrorKind {
  kSyntax,   // not JSON (or one of the refusals above)
  kTooDeep,  // well-formed JSON, but nested deeper than max_depth
};

// Parses one JSON document (whitespace around it allowed, nothing else after it).
// `max_depth`: how deep arrays and objects may nest ([] is 1, [[1]] is 2, a scalar 0).
// REQUIRES: 0 <= max_depth <= kMaxJsonValueDepth.
// INVALID_ARGUMENT with a message that names the problem and its byte offset, written to follow
// what the text was ("messages is not valid JSON: " + message): "expected ',' or ']' at byte 12",
// "invalid UTF-8 at byte 40", "lone surrogate \udc00 at byte 7", "nests arrays and objects
// deeper than 100 levels (at byte 100)". A document that is both too deep and not JSON is a
// kSyntax error. When `error_kind` is not null it is set on failure.
absl::StatusOr<Value> ParseJsonValue(absl::string_view text, int max_depth,
                                     JsonErrorKind* error_kind = nullptr);

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_JSON_VALUE_H_
