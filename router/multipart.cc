#include "router/multipart.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace carpool::router {
namespace {

// The value of parameter `key` in a header value such as `form-data; name="file"`: quoted
// (backslash escapes undone) or a plain token; nullopt when absent.
std::optional<std::string> Param(absl::string_view header, absl::string_view key) {
  size_t pos = header.find(';');
  while (pos != absl::string_view::npos) {
    absl::string_view rest = absl::StripLeadingAsciiWhitespace(header.substr(pos + 1));
    const size_t eq = rest.find('=');
    if (eq == absl::string_view::npos) return std::nullopt;
    const absl::string_view name = absl::StripTrailingAsciiWhitespace(rest.substr(0, eq));
    absl::string_view value = absl::StripLeadingAsciiWhitespace(rest.substr(eq + 1));
    std::string out;
    size_t end;
    if (!value.empty() && value[0] == '"') {
      size_t i = 1;
      for (; i < value.size() && value[i] != '"'; ++i) {
        if (value[i] == '\\' && i + 1 < value.size()) ++i;
        out += value[i];
      }
      end = i + 1;
    } else {
      end = value.find(';');
      if (end == absl::string_view::npos) end = value.size();
      out = std::string(absl::StripTrailingAsciiWhitespace(value.substr(0, end)));
    }
    if (absl::EqualsIgnoreCase(name, key)) return out;
    const size_t next = value.find(';', std::min(end, value.size()));
    if (next == absl::string_view::npos) return std::nullopt;
    header = value.substr(next);
    pos = 0;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<FormPart>> ParseMultipart(absl::string_view content_type,
                                                     absl::string_view body) {
  const absl::string_view media =
      absl::StripAsciiWhitespace(content_type.substr(0, content_type.find(';')));
  if (!absl::EqualsIgnoreCase(media, "multipart/form-data")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the body must be multipart/form-data, got Content-Type \"", content_type, "\""));
  }
  const std::optional<std::string> boundary = Param(content_type, "boundary");
  if (!boundary.has_value() || boundary->empty() || boundary->size() > 70) {
    return absl::InvalidArgumentError("the multipart Content-Type has no valid boundary");
  }
  const std::string delimiter = absl::StrCat("--", *boundary);
  // The first delimiter may follow a preamble; every later one starts a line.
  size_t pos = body.find(delimiter);
  if (pos == absl::string_view::npos ||
      (pos != 0 && (pos < 2 || body.substr(pos - 2, 2) != "\r\n"))) {
    return absl::InvalidArgumentError("the multipart body has no opening boundary");
  }
  const std::string next_delimiter = absl::StrCat("\r\n", delimiter);
  std::vector<FormPart> parts;
  pos += delimiter.size();
  for (;;) {
    if (body.substr(pos, 2) == "--") return parts;  // the closing delimiter
    // Transport padding, then the line break that ends the delimiter line.
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;
    if (body.substr(pos, 2) != "\r\n") {
      return absl::InvalidArgumentError("a multipart boundary line does not end with CRLF");
    }
    pos += 2;
    // A part with no headers starts straight with the blank line.
    const bool no_headers = body.substr(pos, 2) == "\r\n";
    const size_t head_end = no_headers ? pos : body.find("\r\n\r\n", pos);
    if (head_end == absl::string_view::npos) {
      return absl::InvalidArgumentError("a multipart part's headers do not end");
    }
    const size_t data_start = no_headers ? pos + 2 : head_end + 4;
    const size_t data_end = body.find(next_delimiter, data_start);
    if (data_end == absl::string_view::npos) {
      return absl::InvalidArgumentError("the multipart body ends without its closing boundary");
    }
    FormPart part;
    absl::string_view headers = no_headers ? absl::string_view() : body.substr(pos, head_end - pos);
    while (!headers.empty()) {
      const size_t eol = headers.find("\r\n");
      const absl::string_view line = headers.substr(0, eol);
      headers = eol == absl::string_view::npos ? absl::string_view() : headers.substr(eol + 2);
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos) continue;
      const absl::string_view field = absl::StripAsciiWhitespace(line.substr(0, colon));
      const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
      if (absl::EqualsIgnoreCase(field, "Content-Disposition")) {
        part.name = Param(value, "name").value_or("");
        part.filename = Param(value, "filename").value_or("");
      } else if (absl::EqualsIgnoreCase(field, "Content-Type")) {
        part.content_type = std::string(value);
      }
    }
    if (part.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("multipart part ", parts.size() + 1, " has no form field name"));
    }
    part.data = body.substr(data_start, data_end - data_start);
    parts.push_back(std::move(part));
    pos = data_end + next_delimiter.size();
  }
}

}  // namespace carpool::router
