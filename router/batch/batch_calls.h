// The Batch API over ZeroMQ (BatchCall, docs/protocol.md): one call of a client on the batch
// service, answered with the OpenAI JSON object the HTTP gateway would send for the same
// operation. carpool-router hands it to Router::SetBatchCalls; the router has authenticated the
// caller and names its tenant.
//
// Thread-safe (as BatchService).
#ifndef CARPOOL_ROUTER_BATCH_BATCH_CALLS_H_
#define CARPOOL_ROUTER_BATCH_BATCH_CALLS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/messages.h"
#include "router/batch/batch_service.h"

namespace carpool::router::batch {

// Runs `call` for `tenant` ("" without tenants) and returns its answer under call.request_id:
//   CREATE_FILE, GET_FILE: FileJson; FILE_CONTENT: FileJson and the bytes in `content`;
//   DELETE_FILE: FileDeletedJson; CREATE_BATCH, GET_BATCH, CANCEL_BATCH: BatchJson;
//   LIST_BATCHES: BatchListJson (limit 0 reads as 20).
// Errors are the service's (NOT_FOUND for another tenant's id, ...); INVALID_ARGUMENT for an
// unset op, a missing id, a list limit outside [0, 100].
absl::StatusOr<BatchReplyInfo> HandleBatchCall(BatchService& service, const std::string& tenant,
                                               const BatchCallInfo& call);

}  // namespace carpool::router::batch

#endif  // CARPOOL_ROUTER_BATCH_BATCH_CALLS_H_
