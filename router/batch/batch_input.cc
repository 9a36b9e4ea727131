#include "router/batch/batch_input.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "router/openai_json.h"

namespace carpool::router::batch {
namespace {

// The file's lines without their "\n" (and a "\r" before it); the newline that ends the last line
// does not start another.
std::vector<std::string_view> SplitLines(std::string_view content) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < content.size()) {
    size_t end = content.find('\n', start);
    if (end == std::string_view::npos) end = content.size();
    std::string_view line = content.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

// The endpoint's own parser over the body: the error it gives, "" when the body is accepted.
std::string BodyError(std::string_view url, const std::string& body) {
  absl::Status status;
  if (url == "/v1/embeddings") {
    status = ParseEmbeddingsRequest(body).status();
  } else {
    status = ParseGenerationRequest(url == "/v1/chat/completions" ? ApiKind::kChat
                                                                  : ApiKind::kCompletion,
                                    body)
                 .status();
  }
  return status.ok() ? std::string() : std::string(status.message());
}

}  // namespace

bool IsBatchEndpoint(std::string_view url) {
  return url == "/v1/chat/completions" || url == "/v1/completions" || url == "/v1/embeddings";
}

absl::StatusOr<BatchInput> ValidateBatchInput(std::string_view content, std::string_view endpoint,
                                              const BatchInputOptions& options) {
  if (!IsBatchEndpoint(endpoint)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint must be /v1/chat/completions, /v1/completions or /v1/embeddings, got \"",
        std::string(endpoint), "\""));
  }
  if (static_cast<int64_t>(content.size()) > options.max_bytes) {
    return absl::OutOfRangeError(absl::StrCat("the batch input file is ", content.size(),
                                              " bytes, more than the limit of ",
                                              options.max_bytes));
  }
  std::vector<std::string_view> lines = SplitLines(content);
  if (lines.empty()) return absl::InvalidArgumentError("the batch input file has no requests");
  if (static_cast<int64_t>(lines.size()) > options.max_lines) {
    return absl::InvalidArgumentError(absl::StrCat("the batch input file has ", lines.size(),
                                                   " lines, more than the limit of ",
                                                   options.max_lines));
  }

  BatchInput input;
  absl::flat_hash_set<std::string> seen;
  int64_t model_line = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int64_t n = static_cast<int64_t>(i) + 1;
    auto fail = [&](std::string code, std::string message) {
      input.errors.push_back({n, std::move(code), std::move(message)});
    };
    if (IsBlank(lines[i])) {
      fail("empty_line", "blank line: every line must be one request");
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(lines[i].begin(), lines[i].end(), nullptr,
                                             /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      fail("invalid_json", "the line is not valid JSON");
      continue;
    }
    if (!j.is_object()) {
      fail("not_an_object", "the line is not a JSON object");
      continue;
    }
    // Every problem of the line is listed, not just the first.
    auto custom_id = j.find("custom_id");
    std::string id;
    if (custom_id == j.end() || custom_id->is_null()) {
      fail("missing_custom_id", "custom_id is missing");
    } else if (!custom_id->is_string()) {
      fail("missing_custom_id", "custom_id must be a string");
    } else if (custom_id->get_ref<const std::string&>().empty()) {
      fail("missing_custom_id", "custom_id is empty");
    } else {
      id = custom_id->get<std::string>();
      if (!seen.insert(id).second) {
        fail("duplicate_custom_id", absl::StrCat("custom_id \"", id, "\" appears more than once"));
      }
    }
    auto method = j.find("method");
    if (method == j.end() || !method->is_string() || method->get<std::string>() != "POST") {
      fail("invalid_method", "method must be \"POST\"");
    }
    auto url = j.find("url");
    std::string url_text = url != j.end() && url->is_string() ? url->get<std::string>() : "";
    const bool url_ok = url_text == endpoint;
    if (!IsBatchEndpoint(url_text)) {
      fail("invalid_url", "url must be /v1/chat/completions, /v1/completions or /v1/embeddings");
    } else if (!url_ok) {
      fail("invalid_url", absl::StrCat("url ", url_text, " is not the batch's endpoint ",
                                       std::string(endpoint)));
    }
    auto body = j.find("body");
    std::string body_text;
    if (body == j.end() || body->is_null()) {
      fail("missing_body", "body is missing");
    } else if (!body->is_object()) {
      fail("missing_body", "body must be a JSON object");
    } else {
      body_text = body->dump();
    }
    // The body is checked as the endpoint checks it only when the line targets that endpoint:
    // a body for another endpoint is that line's url error, not a second one.
    if (url_ok && body != j.end() && body->is_object()) {
      auto stream = body->find("stream");
      auto model = body->find("model");
      if (std::string error = BodyError(endpoint, body_text); !error.empty()) {
        fail("invalid_body", error);
      } else if (stream != body->end() && stream->is_boolean() && stream->get<bool>()) {
        fail("invalid_body", "stream is not supported in a batch");
      } else if (model == body->end() || !model->is_string() ||
                 model->get_ref<const std::string&>().empty()) {
        fail("missing_model", "body.model is missing");
      } else if (model_line == 0) {
        input.model = model->get<std::string>();
        model_line = n;
      } else if (model->get_ref<const std::string&>() != input.model) {
        fail("mismatched_model",
             absl::StrCat("body.model \"", model->get<std::string>(), "\" is not \"", input.model,
                          "\" (line ", model_line, "): a batch uses one model"));
      }
    }
    input.requests.push_back({n, std::move(id), std::move(body_text)});
  }
  if (!input.errors.empty()) input.requests.clear();
  return input;
}

std::string BatchErrorsJson(const std::vector<InputLineError>& errors) {
  nlohmann::ordered_json data = nlohmann::ordered_json::array();
  for (const InputLineError& e : errors) {
    data.push_back({{"code", e.code}, {"message", e.message}, {"param", nullptr},
                    {"line", e.line}});
  }
  nlohmann::ordered_json out;
  out["object"] = "list";
  out["data"] = std::move(data);
  return out.dump();
}

}  // namespace carpool::router::batch
