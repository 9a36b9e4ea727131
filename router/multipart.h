// multipart/form-data bodies (RFC 7578), as OpenAI clients upload files to POST /v1/files: the
// parts of a body, each with its form field name, its filename (when it is a file) and its bytes.
//
// Pure functions; thread-safe.
#ifndef CARPOOL_ROUTER_MULTIPART_H_
#define CARPOOL_ROUTER_MULTIPART_H_

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace carpool::router {

struct FormPart {
  std::string name;          // Content-Disposition's name
  std::string filename;      // Content-Disposition's filename; "" for a plain field
  std::string content_type;  // the part's Content-Type; "" when absent
  absl::string_view data;     // into the body given to ParseMultipart
};

// The parts of `body` under the request's `content_type` header. INVALID_ARGUMENT naming the
// problem: not multipart/form-data, no boundary, a part without a name, a body that does not end
// with the closing delimiter.
absl::StatusOr<std::vector<FormPart>> ParseMultipart(absl::string_view content_type,
                                                     absl::string_view body);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_MULTIPART_H_
