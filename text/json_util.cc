#include "text/json_util.h"

namespace carpool::text {

absl::Status ComponentType(const Json& j, const std::string& kind, std::string* type) {
  if (!j.is_object()) return JsonError(kind, "expected an object");
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return JsonError(kind, "has no \"type\" string");
  *type = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& j, const char* key, const std::string& where, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return JsonError(where, absl::StrCat("\"", key, "\" must be a boolean"));
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadString(const Json& j, const char* key, const std::string& where,
                        std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return JsonError(where, absl::StrCat("\"", key, "\" must be a string"));
  *out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadInt(const Json& j, const char* key, const std::string& where, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) {
    return JsonError(where, absl::StrCat("\"", key, "\" must be an integer"));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status Unsupported(const std::string& kind, const std::string& type) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", kind, " type \"", type, "\" is not supported"));
}

}  // namespace carpool::text
