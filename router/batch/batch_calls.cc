#include "router/batch/batch_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace carpool::router::batch {
namespace {

// OpenAI's default page size of GET /v1/batches, and its largest.
constexpr int kDefaultListLimit = 20;
constexpr int kMaxListLimit = 100;

bool NeedsId(BatchOp op) {
  return op == BatchOp::kGetFile || op == BatchOp::kFileContent || op == BatchOp::kDeleteFile ||
         op == BatchOp::kGetBatch || op == BatchOp::kCancelBatch;
}

absl::StatusOr<BatchReplyInfo> Run(BatchService& service, const std::string& tenant,
                                   const BatchCallInfo& call) {
  switch (call.op) {
    case BatchOp::kUnspecified:
      break;
    case BatchOp::kCreateFile: {
      ASSIGN_OR_RETURN(StoredFile file,
                       service.CreateFile(tenant, call.filename, call.purpose, call.content));
      return BatchReplyInfo{"", FileJson(file), ""};
    }
    case BatchOp::kGetFile: {
      ASSIGN_OR_RETURN(StoredFile file, service.GetFile(tenant, call.id));
      return BatchReplyInfo{"", FileJson(file), ""};
    }
    case BatchOp::kFileContent: {
      ASSIGN_OR_RETURN(StoredFile file, service.GetFile(tenant, call.id));
      ASSIGN_OR_RETURN(std::string content, service.GetFileContent(tenant, call.id));
      return BatchReplyInfo{"", FileJson(file), std::move(content)};
    }
    case BatchOp::kDeleteFile:
      RETURN_IF_ERROR(service.DeleteFile(tenant, call.id));
      return BatchReplyInfo{"", FileDeletedJson(call.id), ""};
    case BatchOp::kCreateBatch: {
      ASSIGN_OR_RETURN(Batch batch,
                       service.CreateBatch(tenant, call.input_file_id, call.endpoint,
                                           call.completion_window, call.metadata_json));
      return BatchReplyInfo{"", BatchJson(batch), ""};
    }
    case BatchOp::kGetBatch: {
      ASSIGN_OR_RETURN(Batch batch, service.GetBatch(tenant, call.id));
      return BatchReplyInfo{"", BatchJson(batch), ""};
    }
    case BatchOp::kListBatches: {
      if (call.limit < 0 || call.limit > kMaxListLimit) {
        return absl::InvalidArgumentError(absl::StrCat("limit is ", call.limit,
                                                       "; it must be in [1, ", kMaxListLimit,
                                                       "] (0: ", kDefaultListLimit, ")"));
      }
      ASSIGN_OR_RETURN(BatchPage page,
                       service.ListBatches(tenant, call.after,
                                           call.limit == 0 ? kDefaultListLimit : call.limit));
      return BatchReplyInfo{"", BatchListJson(page), ""};
    }
    case BatchOp::kCancelBatch: {
      ASSIGN_OR_RETURN(Batch batch, service.CancelBatch(tenant, call.id));
      return BatchReplyInfo{"", BatchJson(batch), ""};
    }
  }
  return absl::InvalidArgumentError(
      "BatchCall.op is unset: name the operation (CREATE_FILE, GET_BATCH, ...)");
}

}  // namespace

absl::StatusOr<BatchReplyInfo> HandleBatchCall(BatchService& service, const std::string& tenant,
                                               const BatchCallInfo& call) {
  if (NeedsId(call.op) && call.id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BatchCall ", BatchOpName(call.op), " needs the id of a ",
        call.op == BatchOp::kGetBatch || call.op == BatchOp::kCancelBatch ? "batch" : "file"));
  }
  ASSIGN_OR_RETURN(BatchReplyInfo reply, Run(service, tenant, call));
  reply.request_id = call.request_id;
  return reply;
}

}  // namespace carpool::router::batch
