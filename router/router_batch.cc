// Router::Impl, the Batch API side: a BatchCall is checked and authenticated on the loop like
// any request, then runs on batch_pool_ (one thread: the batch store's fsyncs and a 200 MB
// upload never hold up the loop), and its completion answers the client with the handler's
// BatchReply or its error.
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "router/router_impl.h"

namespace carpool::router {
namespace {

// The error a batch call's failed status becomes: its code, its message, and as the reason the
// code's name in lower case ("not_found", "out_of_range", ...; the shared reasons
// invalid_argument, unauthenticated and internal read the same).
ErrorInfo BatchCallError(const std::string& request_id, const absl::Status& status) {
  const absl::StatusCode code =
      status.code() == absl::StatusCode::kOk ? absl::StatusCode::kInternal : status.code();
  return ErrorInfo{request_id, code, absl::AsciiStrToLower(absl::StatusCodeToString(code)),
                   std::string(status.message()), 0};
}

}  // namespace

void Router::Impl::OnBatchCall(const std::string& client, BatchCallInfo in) {
  absl::Status shape = CheckRequestId(in.request_id, LimitsFor(client));
  if (shape.ok() && in.op == BatchOp::kUnspecified) {
    shape = absl::InvalidArgumentError(
        "BatchCall.op is unset: name the operation (CREATE_FILE, GET_BATCH, ...)");
  }
  int tenant = -1;
  if (!Accept(client, in.request_id, shape, in.api_key, &tenant)) return;
  if (!batch_handler_) {
    SendError(client, in.request_id, absl::StatusCode::kFailedPrecondition, "failed_precondition",
              "this router has no batch store (--state-dir)");
    return;
  }
  const int64_t bytes = static_cast<int64_t>(in.content.size());
  if (static_cast<int>(batch_calls_.size()) >= kMaxBatchCallsWaiting ||
      (batch_call_bytes_ > 0 && batch_call_bytes_ + bytes > options_.max_batch_call_bytes)) {
    SendError(client, in.request_id, absl::StatusCode::kUnavailable, reason::kQueueFull,
              absl::StrCat(batch_calls_.size(), " batch calls holding ", batch_call_bytes_,
                           " bytes of uploads are waiting for the batch store; try again"),
              kBatchBusyRetryMs);
    return;
  }
  const std::string tenant_name = tenant >= 0 ? options_.tenants.at(tenant).name : "";
  batch_calls_.insert({client, in.request_id});
  batch_call_bytes_ += bytes;
  batch_pool_->Submit([this, client, bytes, tenant_name,
                       in = std::move(in)]() mutable -> TokenizerPool::Completion {
    absl::StatusOr<BatchReplyInfo> reply = batch_handler_(tenant_name, in);
    // The upload is not needed past here: free it before the completion waits for the loop.
    in.content = std::string();
    return [this, client = std::move(client), bytes, request_id = std::move(in.request_id),
            reply = std::move(reply)]() mutable {
      batch_calls_.erase({client, request_id});
      batch_call_bytes_ -= bytes;
      // The store's answer, not a refusal of the router's: not counted as a rejection.
      if (!reply.ok()) {
        SendToClient(client, BatchCallError(request_id, reply.status()));
        return;
      }
      reply->request_id = request_id;
      SendToClient(client, *std::move(reply));
    };
  });
}

}  // namespace carpool::router
