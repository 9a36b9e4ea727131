// Validation of a batch input file (issue 16) before any of its requests runs, as OpenAI's Batch
// API validates: JSONL, one request a line, {"custom_id", "method", "url", "body"}.
//
// Each line is checked: valid JSON, an object, a non-empty string custom_id unique in the file,
// method "POST", url the batch's endpoint, body an object that the endpoint's own parser
// (router/openai_json.h) accepts and that names a model, the same model on every line, no
// streaming. Every bad line is listed with its number; a file with any error runs nothing.
// A blank line is an error (OpenAI accepts no blank lines); the newline ending the last line is
// not a blank line.
//
// Pure functions; thread-safe.
#ifndef CARPOOL_ROUTER_BATCH_BATCH_INPUT_H_
#define CARPOOL_ROUTER_BATCH_BATCH_INPUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace carpool::router::batch {

struct BatchInputOptions {
  // Most request lines in one file. Default: 50,000.
  int64_t max_lines = 50000;
  // Largest file in bytes. Default: 200 MB.
  int64_t max_bytes = 200 * 1000 * 1000;
};

// The endpoints a batch may target: /v1/chat/completions, /v1/completions, /v1/embeddings.
bool IsBatchEndpoint(std::string_view url);

struct InputLineError {
  int64_t line = 0;      // 1-based line number in the file
  std::string code;      // invalid_json, not_an_object, missing_custom_id, duplicate_custom_id,
                         // invalid_method, invalid_url, missing_body, invalid_body, missing_model,
                         // mismatched_model, empty_line
  std::string message;
};

struct BatchInputRequest {
  int64_t line = 0;        // 1-based
  std::string custom_id;
  std::string body;        // the request body, as JSON text
};

struct BatchInput {
  std::vector<BatchInputRequest> requests;  // in file order; empty when errors is not
  std::vector<InputLineError> errors;       // in line order
  std::string model;                        // the model every line names
};

// INVALID_ARGUMENT when `endpoint` is not a batch endpoint or the file has no request lines or
// more than max_lines; OUT_OF_RANGE when it is larger than max_bytes (HTTP 413). Otherwise the
// requests, or every line error.
absl::StatusOr<BatchInput> ValidateBatchInput(std::string_view content, std::string_view endpoint,
                                              const BatchInputOptions& options = {});

// OpenAI's batch `errors` object for line errors:
// {"object": "list", "data": [{"code", "message", "param": null, "line"}]}.
std::string BatchErrorsJson(const std::vector<InputLineError>& errors);

}  // namespace carpool::router::batch

#endif  // CARPOOL_ROUTER_BATCH_BATCH_INPUT_H_
