#include "client/batch_command.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/flags.h"

namespace carpool::client {
namespace {

constexpr char kUsage[] =
    "usage: carpool batch <subcommand> --router ENDPOINT [flags]\n"
    "  submit FILE.jsonl  upload the file and start a batch of its requests; prints the batch\n"
    "                     (--endpoint, --completion-window, --metadata; --wait, --output)\n"
    "  status ID          the batch's status, request counts, files and errors (--wait)\n"
    "  results ID         the output file of a finished batch (--errors: its error file)\n"
    "  cancel ID          cancel a batch; what finished is kept\n"
    "  list               your batches, newest first (--limit, --after)\n";

struct BatchFlags {
  std::string router;
  std::string api_key;
  int64_t timeout_ms = 60000;
  int retries = 0;
  int64_t max_message_bytes = int64_t{1} << 30;
  // submit
  std::string endpoint;
  std::string completion_window = "24h";
  std::map<std::string, std::string> metadata;
  bool wait = false;
  int64_t poll_ms = 1000;
  int64_t wait_timeout_ms = 0;
  std::string output;
  std::string errors_output;
  // results, list
  bool errors = false;
  int limit = 0;
  std::string after;
  bool json = false;
  bool help = false;
};

void RegisterFlags(FlagParser* p, BatchFlags* f) {
  p->AddString("router", &f->router, "the carpool router (tcp://host:port); required");
  p->AddString("api-key", &f->api_key, "API key (a router with tenants: the batch's owner)");
  p->AddInt64("timeout-ms", &f->timeout_ms, "timeout of each call to the router");
  p->AddInt("retries", &f->retries, "resend a call refused with UNAVAILABLE up to this many times");
  p->AddBytes("max-message-bytes", &f->max_message_bytes,
              "largest answer taken from the router (results: the output file)");
  p->AddString("endpoint", &f->endpoint,
               "submit: /v1/chat/completions, /v1/completions or /v1/embeddings; "
               "\"\": the first line's url");
  p->AddString("completion-window", &f->completion_window,
               "submit: how long the batch may run (24h, or Ns, Nm, Nh up to 24h)");
  p->AddCustom(
      "metadata",
      [f](const std::string& v) {
        const size_t eq = v.find('=');
        if (eq == std::string::npos || eq == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("--metadata: expected KEY=VALUE, got '", v, "'"));
        }
        f->metadata[v.substr(0, eq)] = v.substr(eq + 1);
        return absl::OkStatus();
      },
      "submit: KEY=VALUE kept with the batch; repeat for more");
  p->AddBool("wait", &f->wait,
             "submit, status: wait until the batch ends, showing its progress; exit 1 unless "
             "it completed");
  p->AddInt64("poll-ms", &f->poll_ms, "--wait: how often to ask for the batch's state");
  p->AddInt64("wait-timeout-ms", &f->wait_timeout_ms, "--wait: give up after this long; 0: never");
  p->AddString("output", &f->output,
               "submit, status --wait: write the output file here when the batch ends (submit: "
               "implies --wait); results: write it here instead of stdout");
  p->AddString("errors-output", &f->errors_output,
               "submit, status --wait: write the error file here when the batch ends (submit: "
               "implies --wait)");
  p->AddBool("errors", &f->errors, "results: the error file (failed requests) instead");
  p->AddInt("limit", &f->limit, "list: batches per page, 1..100 (0: 20)");
  p->AddString("after", &f->after, "list: the page after this batch id");
  p->AddBool("json", &f->json, "print OpenAI's JSON objects");
  p->AddBool("help", &f->help, "show this help");
}

int Fail(const std::string& message) {
  std::cerr << "carpool batch: " << message << "\n";
  return 2;
}

// "message (NOT_FOUND, reason not_found)", and exit code 1.
int RouterFailed(const absl::Status& status) {
  std::string text = absl::StrCat(status.message(), " (", absl::StatusCodeToString(status.code()));
  if (const std::string reason = ErrorReason(status); !reason.empty()) {
    absl::StrAppend(&text, ", reason ", reason);
  }
  if (const int64_t ms = RetryAfterMs(status); ms > 0) {
    absl::StrAppend(&text, ", retry after ", ms, " ms");
  }
  std::cerr << "carpool batch: " << text << ")\n";
  return 1;
}

nlohmann::json OrNull(const std::string& s) {
  return s.empty() ? nlohmann::json() : nlohmann::json(s);
}
nlohmann::json OrNull(int64_t t) { return t == 0 ? nlohmann::json() : nlohmann::json(t); }

std::string Time(int64_t t) {
  if (t == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(t), absl::UTCTimeZone());
}

int64_t Answered(const BatchInfo& b) {
  return b.request_counts.completed + b.request_counts.failed;
}

// The batch's details, one "name  value" line each, then its errors.
std::string Details(const BatchInfo& b) {
  std::string out;
  const auto row = [&](const char* name, const std::string& value) {
    absl::StrAppendFormat(&out, "%-18s %s\n", name, value.empty() ? "-" : value);
  };
  row("id", b.id);
  row("status", b.status);
  row("endpoint", b.endpoint);
  row("requests", absl::StrCat(Answered(b), "/", b.request_counts.total, " done, ",
                               b.request_counts.failed, " failed"));
  row("input_file_id", b.input_file_id);
  row("output_file_id", b.output_file_id);
  row("error_file_id", b.error_file_id);
  row("completion_window", b.completion_window);
  row("created_at", Time(b.created_at));
  row("expires_at", Time(b.expires_at));
  const std::pair<const char*, int64_t> ends[] = {
      {"in_progress_at", b.in_progress_at}, {"finalizing_at", b.finalizing_at},
      {"completed_at", b.completed_at},     {"failed_at", b.failed_at},
      {"expired_at", b.expired_at},         {"cancelling_at", b.cancelling_at},
      {"cancelled_at", b.cancelled_at}};
  for (const auto& [name, t] : ends) {
    if (t != 0) row(name, Time(t));
  }
  for (const auto& [key, value] : b.metadata) row(absl::StrCat("metadata.", key).c_str(), value);
  for (const BatchError& e : b.errors) {
    absl::StrAppend(&out, "error: line ", e.line, ": ", e.code, ": ", e.message, "\n");
  }
  return out;
}

void Print(const BatchInfo& b, bool json) {
  std::cout << (json ? BatchInfoToJson(b).dump() : BatchLine(b)) << "\n";
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot open ", path));
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

absl::Status WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Shows a waiting batch's progress on stderr: a bar redrawn in place on a terminal, a line per
// change otherwise (a log, a pipe).
class Progress {
 public:
  Progress() : terminal_(isatty(STDERR_FILENO) == 1) {}
  ~Progress() {
    if (drawn_) std::cerr << "\n";
  }

  void Show(const BatchInfo& b) {
    if (terminal_) {
      std::cerr << "\r" << ProgressBar(b) << std::flush;
      drawn_ = true;
      return;
    }
    if (b.status == last_status_ && Answered(b) == last_answered_) return;
    last_status_ = b.status;
    last_answered_ = Answered(b);
    std::cerr << BatchLine(b) << "\n";
  }

 private:
  const bool terminal_;
  bool drawn_ = false;
  std::string last_status_;
  int64_t last_answered_ = -1;
};

// After --wait: the files asked for, then the exit code for how the batch ended.
int Finish(Client& client, const BatchInfo& b, const BatchFlags& f, const BatchCallOptions& call) {
  if (!f.output.empty() || !f.errors_output.empty()) {
    absl::StatusOr<BatchResultFiles> files = client.BatchResults(b.id, call);
    if (!files.ok()) return RouterFailed(files.status());
    for (const auto& [path, content] : {std::pair(f.output, files->output_jsonl),
                                        std::pair(f.errors_output, files->error_jsonl)}) {
      if (path.empty()) continue;
      if (absl::Status s = WriteFile(path, content); !s.ok()) return Fail(std::string(s.message()));
    }
  }
  if (b.status == "completed") {
    if (b.request_counts.failed > 0 && f.errors_output.empty()) {
      std::cerr << "carpool batch: " << b.request_counts.failed
                << " request(s) failed: carpool batch results " << b.id << " --errors\n";
    }
    return 0;
  }
  std::cerr << "carpool batch: batch " << b.id << " ended " << b.status << "\n";
  for (const BatchError& e : b.errors) {
    std::cerr << "  line " << e.line << ": " << e.code << ": " << e.message << "\n";
  }
  return 1;
}

// Waits for `batch` to end, showing its progress, then as Finish.
int Wait(Client& client, const BatchInfo& batch, const BatchFlags& f,
         const BatchCallOptions& call) {
  absl::StatusOr<BatchInfo> done;
  {
    Progress progress;
    progress.Show(batch);
    BatchCallOptions wait_call = call;
    wait_call.timeout_ms = f.wait_timeout_ms;
    done = client.WaitBatch(
        batch.id, f.poll_ms, [&](const BatchInfo& b) { progress.Show(b); }, wait_call);
  }
  if (!done.ok()) return RouterFailed(done.status());
  Print(*done, f.json);
  return Finish(client, *done, f, call);
}

int Submit(Client& client, const BatchFlags& f, const std::vector<std::string>& args,
           const BatchCallOptions& call) {
  if (args.size() != 1) return Fail("submit takes one FILE.jsonl");
  absl::StatusOr<std::string> content = ReadFile(args[0]);
  if (!content.ok()) return Fail(std::string(content.status().message()));
  SubmitBatchOptions submit;
  submit.endpoint = f.endpoint;
  submit.completion_window = f.completion_window;
  submit.metadata = f.metadata;
  submit.filename = std::filesystem::path(args[0]).filename().string();
  submit.call = call;
  absl::StatusOr<BatchInfo> batch = client.SubmitBatchFile(*std::move(content), submit);
  if (!batch.ok()) {
    return batch.status().code() == absl::StatusCode::kInvalidArgument &&
                   ErrorReason(batch.status()).empty()
               ? Fail(std::string(batch.status().message()))  // refused before sending
               : RouterFailed(batch.status());
  }
  if (!f.wait && f.output.empty() && f.errors_output.empty()) {
    Print(*batch, f.json);
    return 0;
  }
  return Wait(client, *batch, f, call);
}

int Results(Client& client, const BatchFlags& f, const std::string& id,
            const BatchCallOptions& call) {
  absl::StatusOr<BatchResultFiles> files = client.BatchResults(id, call);
  if (!files.ok()) return RouterFailed(files.status());
  const std::string& content = f.errors ? files->error_jsonl : files->output_jsonl;
  if (!f.output.empty()) {
    if (absl::Status s = WriteFile(f.output, content); !s.ok()) {
      return Fail(std::string(s.message()));
    }
    return 0;
  }
  std::cout << content << std::flush;
  return 0;
}

int List(Client& client, const BatchFlags& f, const BatchCallOptions& call) {
  absl::StatusOr<BatchList> list = client.ListBatches(f.after, f.limit, call);
  if (!list.ok()) return RouterFailed(list.status());
  if (f.json) {
    nlohmann::json data = nlohmann::json::array();
    for (const BatchInfo& b : list->data) data.push_back(BatchInfoToJson(b));
    std::cout << nlohmann::json(
                     {{"object", "list"}, {"data", std::move(data)}, {"has_more", list->has_more}})
                     .dump()
              << "\n";
    return 0;
  }
  for (const BatchInfo& b : list->data) std::cout << BatchLine(b) << "\n";
  if (list->has_more) {
    std::cout << "(more: carpool batch list --after " << list->data.back().id << ")\n";
  }
  return 0;
}

}  // namespace

nlohmann::json BatchInfoToJson(const BatchInfo& b) {
  nlohmann::json errors;  // null
  if (!b.errors.empty()) {
    nlohmann::json data = nlohmann::json::array();
    for (const BatchError& e : b.errors) {
      data.push_back({{"code", e.code}, {"message", e.message}, {"line", OrNull(e.line)}});
    }
    errors = {{"object", "list"}, {"data", std::move(data)}};
  }
  nlohmann::json metadata;  // null
  for (const auto& [key, value] : b.metadata) metadata[key] = value;
  return {{"id", b.id},
          {"object", "batch"},
          {"endpoint", b.endpoint},
          {"errors", std::move(errors)},
          {"input_file_id", b.input_file_id},
          {"completion_window", b.completion_window},
          {"status", b.status},
          {"output_file_id", OrNull(b.output_file_id)},
          {"error_file_id", OrNull(b.error_file_id)},
          {"created_at", b.created_at},
          {"in_progress_at", OrNull(b.in_progress_at)},
          {"expires_at", OrNull(b.expires_at)},
          {"finalizing_at", OrNull(b.finalizing_at)},
          {"completed_at", OrNull(b.completed_at)},
          {"failed_at", OrNull(b.failed_at)},
          {"expired_at", OrNull(b.expired_at)},
          {"cancelling_at", OrNull(b.cancelling_at)},
          {"cancelled_at", OrNull(b.cancelled_at)},
          {"request_counts",
           {{"total", b.request_counts.total},
            {"completed", b.request_counts.completed},
            {"failed", b.request_counts.failed}}},
          {"metadata", std::move(metadata)}};
}

std::string BatchLine(const BatchInfo& b) {
  std::string line =
      absl::StrFormat("%s  %s  %d/%d done", b.id, b.status, Answered(b), b.request_counts.total);
  if (b.request_counts.failed > 0)
    absl::StrAppend(&line, " (", b.request_counts.failed, " failed)");
  absl::StrAppend(&line, "  ", b.endpoint);
  return line;
}

std::string ProgressBar(const BatchInfo& b, int width) {
  const int64_t total = b.request_counts.total;
  const int64_t answered = std::min(Answered(b), total);
  const int filled = total > 0 ? static_cast<int>(answered * width / total) : 0;
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "]  ",
                      answered, "/", total, "  ", b.status);
}

int RunBatch(int argc, char** argv, int first) {
  if (first >= argc || std::string(argv[first]) == "--help" || std::string(argv[first]) == "help") {
    BatchFlags f;
    FlagParser parser;
    RegisterFlags(&parser, &f);
    std::cout << kUsage << parser.Help();
    return first >= argc ? 2 : 0;
  }
  const std::string command = argv[first];
  BatchFlags f;
  FlagParser parser;
  RegisterFlags(&parser, &f);
  if (absl::Status s = parser.Parse(argc, argv, first + 1); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (f.poll_ms <= 0) return Fail("--poll-ms must be > 0");
  if (f.help) {
    std::cout << kUsage << parser.Help();
    return 0;
  }
  const std::vector<std::string>& args = parser.positionals();
  const bool takes_id = command == "status" || command == "results" || command == "cancel";
  if (command != "submit" && command != "list" && !takes_id) {
    return Fail(absl::StrCat("unknown subcommand '", command, "'\n", kUsage));
  }
  if (takes_id && args.size() != 1) return Fail(absl::StrCat(command, " takes one batch ID"));
  if (command == "list" && !args.empty()) {
    return Fail(absl::StrCat("unexpected argument '", args[0], "'"));
  }
  if (f.router.empty()) return Fail("--router is required");
  if (f.timeout_ms <= 0) return Fail("--timeout-ms must be > 0");
  if (f.retries < 0) return Fail("--retries must be >= 0");
  if (f.wait_timeout_ms < 0) return Fail("--wait-timeout-ms must be >= 0");

  ClientOptions options;
  options.router_endpoint = f.router;
  options.api_key = f.api_key;
  options.max_retries = f.retries;
  options.max_message_bytes = f.max_message_bytes;
  options.default_timeout_ms = f.timeout_ms;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return Fail(std::string(client.status().message()));
  Client& c = **client;
  BatchCallOptions call;
  call.timeout_ms = f.timeout_ms;

  if (command == "submit") return Submit(c, f, args, call);
  if (command == "list") return List(c, f, call);
  if (command == "results") return Results(c, f, args[0], call);
  absl::StatusOr<BatchInfo> batch =
      command == "cancel" ? c.CancelBatch(args[0], call) : c.GetBatch(args[0], call);
  if (!batch.ok()) return RouterFailed(batch.status());
  if (command == "status" && f.wait) return Wait(c, *batch, f, call);
  if (command == "status" && !f.json) {
    std::cout << Details(*batch);
  } else {
    Print(*batch, f.json);
  }
  return 0;
}

}  // namespace carpool::client
