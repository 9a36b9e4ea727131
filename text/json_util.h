// Small readers for tokenizer.json fields: each error names the component and the field.
#ifndef CARPOOL_TEXT_JSON_UTIL_H_
#define CARPOOL_TEXT_JSON_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace carpool::text {

using Json = nlohmann::json;

inline absl::Status JsonError(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", where, ": ", what));
}

// The "type" of a component object, or an error naming `kind` (e.g. "normalizer").
absl::Status ComponentType(const Json& j, const std::string& kind, std::string* type);
// Optional fields: absent or null keeps *out. A value of the wrong type is an error.
absl::Status ReadBool(const Json& j, const char* key, const std::string& where, bool* out);
absl::Status ReadString(const Json& j, const char* key, const std::string& where, std::string* out);
absl::Status ReadInt(const Json& j, const char* key, const std::string& where, int64_t* out);
// The error for a component this build does not run.
absl::Status Unsupported(const std::string& kind, const std::string& type);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_JSON_UTIL_H_
