#include "router/batch/batch_http.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "router/multipart.h"
#include "router/openai_json.h"

namespace carpool::router::batch {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kFiles = "/v1/files";
constexpr absl::string_view kBatches = "/v1/batches";

HttpResponse Respond(int status, std::string body, const char* content_type) {
  HttpResponse r;
  r.status = status;
  r.content_type = content_type;
  r.body = std::move(body);
  return r;
}

HttpResponse Ok(std::string json) { return Respond(200, std::move(json), "application/json"); }

HttpResponse Error(int status, std::string code, std::string message, std::string param = "") {
  HttpError e;
  e.status = status;
  e.type = status >= 500 ? "server_error" : "invalid_request_error";
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  return Respond(status, ErrorBody(e), "application/json");
}

// The HTTP answer for a service error.
HttpResponse FromStatus(const absl::Status& s) {
  std::string message(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return Error(400, "invalid_request", std::move(message));
    case absl::StatusCode::kUnauthenticated:
      return Error(401, "unauthenticated", std::move(message));
    case absl::StatusCode::kNotFound:
      return Error(404, "not_found", std::move(message));
    case absl::StatusCode::kFailedPrecondition:
      return Error(409, "invalid_state", std::move(message));
    case absl::StatusCode::kOutOfRange:
      return Error(413, "file_too_large", std::move(message));
    case absl::StatusCode::kResourceExhausted:
      return Error(507, "storage_full", std::move(message));
    default:
      return Error(500, "internal", std::move(message));
  }
}

HttpResponse WrongMethod(const HttpRequest& req, const char* allowed) {
  HttpResponse r = Error(405, "method_not_allowed",
                         absl::StrCat(req.method, " is not allowed on ", req.path, "; use ",
                                      allowed));
  r.headers.emplace_back("Allow", allowed);
  return r;
}

std::string PercentDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    int hi, lo;
    auto hex = [](char c) {
      return c >= '0' && c <= '9' ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    if (s[i] == '%' && i + 2 < s.size() && (hi = hex(s[i + 1])) >= 0 &&
        (lo = hex(s[i + 2])) >= 0) {
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

// The query parameter `key` ("" when absent).
std::optional<std::string> Query(const std::string& query, absl::string_view key) {
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    if (PercentDecode(pair.substr(0, eq)) != key) continue;
    return eq == std::string_view::npos ? std::string() : PercentDecode(pair.substr(eq + 1));
  }
  return std::nullopt;
}

HttpResponse CreateFile(BatchService& service, const std::string& tenant,
                        const HttpRequest& req) {
  absl::StatusOr<std::vector<FormPart>> parts =
      ParseMultipart(req.Header("Content-Type"), req.body);
  if (!parts.ok()) return Error(400, "invalid_request", std::string(parts.status().message()));
  const FormPart* file = nullptr;
  const FormPart* purpose = nullptr;
  for (const FormPart& p : *parts) {
    if (p.name == "file") file = &p;
    if (p.name == "purpose") purpose = &p;
  }
  if (purpose == nullptr) {
    return Error(400, "invalid_request", "the form has no 'purpose' field", "purpose");
  }
  if (file == nullptr) return Error(400, "invalid_request", "the form has no 'file' part", "file");
  absl::StatusOr<StoredFile> stored =
      service.CreateFile(tenant, file->filename, std::string(purpose->data),
                         std::string_view(file->data.data(), file->data.size()));
  if (!stored.ok()) return FromStatus(stored.status());
  return Ok(FileJson(*stored));
}

// A string field of the create-batch body; an error names it when it is absent or not a string.
std::optional<HttpResponse> Field(const Json& body, const char* name, std::string* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) {
    return Error(400, "invalid_request", absl::StrCat("'", name, "' is required"), name);
  }
  if (!it->is_string()) {
    return Error(400, "invalid_request", absl::StrCat("'", name, "' must be a string"), name);
  }
  *out = it->get<std::string>();
  return std::nullopt;
}

HttpResponse CreateBatch(BatchService& service, const std::string& tenant,
                         const HttpRequest& req) {
  Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return Error(400, "invalid_request", "the body must be a JSON object");
  std::string input_file_id, endpoint, window, metadata;
  for (auto [name, out] : {std::pair{"input_file_id", &input_file_id},
                           std::pair{"endpoint", &endpoint},
                           std::pair{"completion_window", &window}}) {
    if (std::optional<HttpResponse> bad = Field(body, name, out)) return *std::move(bad);
  }
  if (auto m = body.find("metadata"); m != body.end() && !m->is_null()) metadata = m->dump();
  absl::StatusOr<Batch> b = service.CreateBatch(tenant, input_file_id, endpoint, window, metadata);
  if (!b.ok()) return FromStatus(b.status());
  return Ok(BatchJson(*b));
}

HttpResponse ListBatches(BatchService& service, const std::string& tenant,
                         const HttpRequest& req) {
  int limit = 20;
  if (std::optional<std::string> l = Query(req.query, "limit")) {
    if (!absl::SimpleAtoi(*l, &limit) || limit < 1 || limit > 100) {
      return Error(400, "invalid_request",
                   absl::StrCat("limit must be an integer from 1 to 100, got '", *l, "'"),
                   "limit");
    }
  }
  absl::StatusOr<BatchPage> page =
      service.ListBatches(tenant, Query(req.query, "after").value_or(""), limit);
  if (!page.ok()) return FromStatus(page.status());
  return Ok(BatchListJson(*page));
}

HttpResponse Files(BatchService& service, const std::string& tenant, const HttpRequest& req) {
  if (req.path == kFiles) {
    if (req.method != "POST") return WrongMethod(req, "POST");
    return CreateFile(service, tenant, req);
  }
  std::string id = req.path.substr(kFiles.size() + 1);
  if (absl::EndsWith(id, "/content")) {
    if (req.method != "GET") return WrongMethod(req, "GET");
    id.resize(id.size() - absl::string_view("/content").size());
    absl::StatusOr<std::string> content = service.GetFileContent(tenant, id);
    if (!content.ok()) return FromStatus(content.status());
    return Respond(200, *std::move(content), "application/octet-stream");
  }
  if (req.method == "GET") {
    absl::StatusOr<StoredFile> f = service.GetFile(tenant, id);
    return f.ok() ? Ok(FileJson(*f)) : FromStatus(f.status());
  }
  if (req.method == "DELETE") {
    absl::Status deleted = service.DeleteFile(tenant, id);
    return deleted.ok() ? Ok(FileDeletedJson(id)) : FromStatus(deleted);
  }
  return WrongMethod(req, "GET, DELETE");
}

HttpResponse Batches(BatchService& service, const std::string& tenant, const HttpRequest& req) {
  if (req.path == kBatches) {
    if (req.method == "POST") return CreateBatch(service, tenant, req);
    if (req.method == "GET") return ListBatches(service, tenant, req);
    return WrongMethod(req, "GET, POST");
  }
  std::string id = req.path.substr(kBatches.size() + 1);
  if (absl::EndsWith(id, "/cancel")) {
    if (req.method != "POST") return WrongMethod(req, "POST");
    id.resize(id.size() - absl::string_view("/cancel").size());
    absl::StatusOr<Batch> b = service.CancelBatch(tenant, id);
    return b.ok() ? Ok(BatchJson(*b)) : FromStatus(b.status());
  }
  if (req.method != "GET") return WrongMethod(req, "GET");
  absl::StatusOr<Batch> b = service.GetBatch(tenant, id);
  return b.ok() ? Ok(BatchJson(*b)) : FromStatus(b.status());
}

}  // namespace

bool IsBatchApiPath(std::string_view path) {
  const absl::string_view p(path.data(), path.size());
  return p == kFiles || p == kBatches || absl::StartsWith(p, "/v1/files/") ||
         absl::StartsWith(p, "/v1/batches/");
}

HttpResponse ServeBatchApi(BatchService& service, const HttpRequest& request,
                           const std::string& api_key) {
  absl::StatusOr<std::string> tenant = service.TenantOf(api_key);
  if (!tenant.ok()) return FromStatus(tenant.status());
  if (request.path == kFiles || absl::StartsWith(request.path, "/v1/files/")) {
    return Files(service, *tenant, request);
  }
  return Batches(service, *tenant, request);
}

}  // namespace carpool::router::batch
