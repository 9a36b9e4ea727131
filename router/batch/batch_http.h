// The Batch API over HTTP (docs/batch.md), in OpenAI's shapes, for the gateway:
//
//   POST   /v1/files                  multipart/form-data: purpose=batch, file=@FILE.jsonl
//   GET    /v1/files/{id}             the file object
//   GET    /v1/files/{id}/content     the file's bytes (an output or error file: JSONL)
//   DELETE /v1/files/{id}
//   POST   /v1/batches                {"input_file_id", "endpoint", "completion_window",
//                                      "metadata"}
//   GET    /v1/batches                ?after=ID&limit=N (1..100, default 20), newest first
//   GET    /v1/batches/{id}
//   POST   /v1/batches/{id}/cancel
//
// Errors are OpenAI error bodies: 400 a bad request (every field named), 401 an unknown key, 404
// an id the caller's tenant does not own, 405 the wrong method, 409 a batch that can no longer
// be cancelled, 413 a file above --batch-max-file-bytes, 507 a full state dir.
//
// Thread-safe (the service is).
#ifndef CARPOOL_ROUTER_BATCH_BATCH_HTTP_H_
#define CARPOOL_ROUTER_BATCH_BATCH_HTTP_H_

#include <string>
#include <string_view>

#include "router/batch/batch_service.h"
#include "router/http_server.h"

namespace carpool::router::batch {

// Whether `path` is one of the routes above (/v1/files..., /v1/batches...).
bool IsBatchApiPath(std::string_view path);

// Answers one request to a batch route; `api_key` is the request's bearer key.
HttpResponse ServeBatchApi(BatchService& service, const HttpRequest& request,
                           const std::string& api_key);

}  // namespace carpool::router::batch

#endif  // CARPOOL_ROUTER_BATCH_BATCH_HTTP_H_
