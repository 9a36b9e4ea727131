// Test only: the Batch API of a router, in memory, for the FakeRouter (fake_router_test_util.h)
// in SDK and CLI tests. Files and batches answer with OpenAI's JSON objects in the shapes the
// router's batch service writes (router/batch/batch_service.h). A batch's requests "run" as it
// is polled: each GET_BATCH of a batch in progress answers one more request, and the one after
// the last finalizes it, writing an output line per request (an error line for each request
// whose custom_id starts with "bad"). A file with a line that is not JSON fails its batch at once,
// every such line listed in its errors (code invalid_json).
#ifndef CARPOOL_CLIENT_FAKE_BATCH_STORE_TEST_UTIL_H_
#define CARPOOL_CLIENT_FAKE_BATCH_STORE_TEST_UTIL_H_

#include <cctype>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/fake_router_test_util.h"
#include "nlohmann/json.hpp"

namespace carpool::testing {

class FakeBatchStore {
 public:
  using Json = nlohmann::ordered_json;

  // Answers the BatchCallInfo messages (others go to FakeRouter::Echo). Router thread.
  FakeRouter::Handler Handler() {
    return [this](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
      const auto* call = std::get_if<BatchCallInfo>(&m);
      if (call == nullptr) {
        FakeRouter::Echo(r, peer, m);
        return;
      }
      absl::MutexLock lock(&mu_);
      r.Reply(peer, Answer(*call));
    };
  }

  // A batch's status from now on (the test's hand on the lifecycle).
  void SetStatus(const std::string& batch_id, const std::string& status) {
    absl::MutexLock lock(&mu_);
    batches_[batch_id]["status"] = status;
  }
  // The content of a stored file ("" when there is none).
  std::string Content(const std::string& file_id) {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(file_id);
    return it == files_.end() ? "" : it->second.content;
  }

 private:
  struct File {
    Json object;
    std::string content;
  };

  static ServerMessage Error(const BatchCallInfo& call, absl::StatusCode code,
                             std::string message) {
    std::string reason = absl::StatusCodeToString(code);
    for (char& c : reason) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ErrorInfo{call.request_id, code, reason, std::move(message), 0};
  }
  static ServerMessage Reply(const BatchCallInfo& call, const Json& object,
                             std::string content = "") {
    return BatchReplyInfo{call.request_id, object.dump(), std::move(content)};
  }

  ServerMessage Answer(const BatchCallInfo& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (call.op) {
      case BatchOp::kCreateFile: {
        if (call.purpose != "batch") {
          return Error(call, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("purpose '", call.purpose, "' is not batch"));
        }
        return Reply(call, AddFile(call.filename, "batch", call.content));
      }
      case BatchOp::kGetFile:
      case BatchOp::kFileContent:
      case BatchOp::kDeleteFile: {
        auto it = files_.find(call.id);
        if (it == files_.end()) {
          return Error(call, absl::StatusCode::kNotFound, absl::StrCat("no file '", call.id, "'"));
        }
        if (call.op == BatchOp::kDeleteFile) {
          files_.erase(it);
          return Reply(call, Json{{"id", call.id}, {"object", "file"}, {"deleted", true}});
        }
        return Reply(call, it->second.object,
                     call.op == BatchOp::kFileContent ? it->second.content : "");
      }
      case BatchOp::kCreateBatch: {
        auto it = files_.find(call.input_file_id);
        if (it == files_.end()) {
          return Error(call, absl::StatusCode::kNotFound,
                       absl::StrCat("no file '", call.input_file_id, "'"));
        }
        if (call.endpoint.empty() || call.endpoint[0] != '/') {
          return Error(call, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("'", call.endpoint, "' is not a batch endpoint"));
        }
        const std::string id = absl::StrCat("batch_", ++next_id_);
        int64_t total = 0;
        Json errors = Json::array();
        for (absl::string_view line : absl::StrSplit(it->second.content, '\n', absl::SkipEmpty())) {
          Json j = Json::parse(line, nullptr, false);
          ++total;
          if (!j.is_object()) {
            errors.push_back({{"code", "invalid_json"},
                              {"message", "the line is not JSON"},
                              {"param", nullptr},
                              {"line", total}});
            continue;
          }
          custom_ids_[id].push_back(j.value("custom_id", ""));
        }
        Json b = {{"id", id},
                  {"object", "batch"},
                  {"endpoint", call.endpoint},
                  {"errors", nullptr},
                  {"input_file_id", call.input_file_id},
                  {"completion_window", call.completion_window},
                  {"status", "in_progress"},
                  {"output_file_id", nullptr},
                  {"error_file_id", nullptr},
                  {"created_at", 1700000000 + next_id_},
                  {"in_progress_at", 1700000001 + next_id_},
                  {"expires_at", 1700086400 + next_id_},
                  {"completed_at", nullptr},
                  {"request_counts", {{"total", total}, {"completed", 0}, {"failed", 0}}},
                  {"metadata",
                   call.metadata_json.empty() ? Json(nullptr) : Json::parse(call.metadata_json)}};
        if (!errors.empty()) {
          b["status"] = "failed";
          b["failed_at"] = 1700000002 + next_id_;
          b["errors"] = {{"object", "list"}, {"data", errors}};
          b["request_counts"]["total"] = 0;
        }
        batches_[id] = b;
        order_.insert(order_.begin(), id);
        return Reply(call, b);
      }
      case BatchOp::kGetBatch:
      case BatchOp::kCancelBatch: {
        auto it = batches_.find(call.id);
        if (it == batches_.end()) {
          return Error(call, absl::StatusCode::kNotFound, absl::StrCat("no batch '", call.id, "'"));
        }
        Json& b = it->second;
        if (call.op == BatchOp::kCancelBatch) {
          const std::string status = b["status"];
          if (status != "in_progress" && status != "validating") {
            return Error(call, absl::StatusCode::kFailedPrecondition,
                         absl::StrCat("batch '", call.id, "' is ", status));
          }
          b["status"] = "cancelling";
          return Reply(call, b);
        }
        Advance(call.id, b);
        return Reply(call, b);
      }
      case BatchOp::kListBatches: {
        Json data = Json::array();
        bool started = call.after.empty();
        const int limit = call.limit == 0 ? 20 : call.limit;
        bool has_more = false;
        for (const std::string& id : order_) {
          if (!started) {
            started = id == call.after;
            continue;
          }
          if (static_cast<int>(data.size()) == limit) {
            has_more = true;
            break;
          }
          data.push_back(batches_[id]);
        }
        return Reply(call, Json{{"object", "list"}, {"data", data}, {"has_more", has_more}});
      }
      case BatchOp::kUnspecified:
        break;
    }
    return Error(call, absl::StatusCode::kInvalidArgument, "op is unset");
  }

  Json AddFile(const std::string& filename, const std::string& purpose, std::string content)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string id = absl::StrCat("file-", ++next_id_);
    Json object = {{"id", id},
                   {"object", "file"},
                   {"bytes", content.size()},
                   {"created_at", 1700000000 + next_id_},
                   {"filename", filename},
                   {"purpose", purpose}};
    files_[id] = {object, std::move(content)};
    return object;
  }

  // One request more of a running batch; past the last, its output files and `completed`.
  void Advance(const std::string& id, Json& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Json& counts = b["request_counts"];
    const std::string status = b["status"];
    if (status == "cancelling") {
      b["status"] = "cancelled";
      b["cancelled_at"] = 1700000100;
      return;
    }
    if (status != "in_progress") return;
    const int64_t done = counts["completed"].get<int64_t>() + counts["failed"].get<int64_t>();
    const std::vector<std::string>& ids = custom_ids_[id];
    if (done < static_cast<int64_t>(ids.size())) {
      Json& count = counts[ids[done].rfind("bad", 0) == 0 ? "failed" : "completed"];
      count = count.get<int64_t>() + 1;
      return;
    }
    std::string output, errors;
    for (const std::string& custom_id : ids) {
      const bool bad = custom_id.rfind("bad", 0) == 0;
      Json line = {{"id", absl::StrCat("batch_req_", custom_id)},
                   {"custom_id", custom_id},
                   {"response",
                    {{"status_code", bad ? 400 : 200},
                     {"request_id", absl::StrCat("req_", custom_id)},
                     {"body", {{"echo", custom_id}}}}},
                   {"error", nullptr}};
      (bad ? errors : output) += line.dump() + "\n";
    }
    b["output_file_id"] = AddFile("output.jsonl", "batch_output", output)["id"];
    if (!errors.empty()) b["error_file_id"] = AddFile("errors.jsonl", "batch_output", errors)["id"];
    b["status"] = "completed";
    b["completed_at"] = 1700000200;
  }

  absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, File> files_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Json> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // newest first
  std::map<std::string, std::vector<std::string>> custom_ids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace carpool::testing

#endif  // CARPOOL_CLIENT_FAKE_BATCH_STORE_TEST_UTIL_H_
