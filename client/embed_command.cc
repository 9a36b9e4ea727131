#include "client/embed_command.h"

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/generate_command.h"
#include "common/flags.h"

namespace carpool::client {
namespace {

struct EmbedFlags {
  std::string router;
  std::vector<std::string> texts;              // --input, in order
  std::vector<std::vector<int32_t>> id_lists;  // --input-ids, in order
  std::string inputs_file;
  std::string pooling = "mean";
  bool normalize = true;
  bool add_bos = true;
  bool json = false;
  std::string priority = "default";
  int64_t deadline_ms = 0;
  int64_t timeout_ms = 60000;
  std::string api_key;
  int retries = 0;
  bool help = false;
};

void RegisterFlags(FlagParser* p, EmbedFlags* f) {
  p->AddString("router", &f->router, "the carpool router (tcp://host:port); required");
  p->AddCustom(
      "input",
      [f](const std::string& v) {
        f->texts.push_back(v);
        return absl::OkStatus();
      },
      "an input text; repeat for more (in order, before any --input-ids)");
  p->AddCustom(
      "input-ids",
      [f](const std::string& v) {
        std::vector<int32_t> ids;
        if (absl::Status s = ParseIntList(v, "--input-ids", &ids); !s.ok()) return s;
        f->id_lists.push_back(std::move(ids));
        return absl::OkStatus();
      },
      "an input as comma-separated token ids; repeat for more");
  p->AddString("inputs-file", &f->inputs_file, "a file of input texts, one per line");
  p->AddString("pooling", &f->pooling, "mean | last");
  p->AddBool("normalize", &f->normalize, "unit-length embeddings (--no-normalize turns it off)");
  p->AddBool("add-bos", &f->add_bos, "prepend BOS to text inputs");
  p->AddBool("json", &f->json, "print an OpenAI-style JSON document");
  p->AddString("priority", &f->priority, "interactive | default | batch");
  p->AddInt64("deadline-ms", &f->deadline_ms,
              "give up this long after the request reaches the router; 0: never");
  p->AddInt64("timeout-ms", &f->timeout_ms, "client-side timeout");
  p->AddString("api-key", &f->api_key, "API key sent with the request");
  p->AddInt("retries", &f->retries,
            "resend a request refused with UNAVAILABLE up to this many times");
  p->AddBool("help", &f->help, "show this help");
}

int Fail(const std::string& message) {
  std::cerr << "carpool embed: " << message << "\n";
  return 2;
}

// "message (RESOURCE_EXHAUSTED, reason queue_full, retry after 200 ms)".
std::string Describe(const absl::Status& status) {
  std::string text = absl::StrCat(status.message(), " (", absl::StatusCodeToString(status.code()));
  if (const std::string reason = ErrorReason(status); !reason.empty()) {
    absl::StrAppend(&text, ", reason ", reason);
  }
  if (const int64_t ms = RetryAfterMs(status); ms > 0) {
    absl::StrAppend(&text, ", retry after ", ms, " ms");
  }
  return absl::StrCat(text, ")");
}

// The request the flags describe, or INVALID_ARGUMENT naming the bad flag.
absl::StatusOr<EmbedInput> BuildRequest(const EmbedFlags& f) {
  EmbedInput in;
  if (f.router.empty()) return absl::InvalidArgumentError("--router is required");
  const bool inline_inputs = !f.texts.empty() || !f.id_lists.empty();
  if (inline_inputs == !f.inputs_file.empty()) {
    return absl::InvalidArgumentError(
        "give --input / --input-ids (repeatable) or --inputs-file, not both and not neither");
  }
  for (const std::string& t : f.texts) in.inputs.push_back({true, t, {}});
  for (const std::vector<int32_t>& ids : f.id_lists) in.inputs.push_back({false, "", ids});
  if (!f.inputs_file.empty()) {
    std::ifstream file(f.inputs_file);
    if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot open ", f.inputs_file));
    std::string line;
    while (std::getline(file, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      in.inputs.push_back({true, line, {}});
    }
    if (in.inputs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(f.inputs_file, " has no inputs"));
    }
  }
  if (f.pooling == "mean") {
    in.pooling = Pooling::kMean;
  } else if (f.pooling == "last") {
    in.pooling = Pooling::kLast;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--pooling: expected mean or last, got '", f.pooling, "'"));
  }
  std::optional<Priority> priority = PriorityFromName(f.priority);
  if (!priority) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--priority: expected interactive, default or batch, got '", f.priority, "'"));
  }
  in.priority = *priority;
  if (f.deadline_ms < 0) return absl::InvalidArgumentError("--deadline-ms must be >= 0");
  if (f.timeout_ms <= 0) return absl::InvalidArgumentError("--timeout-ms must be > 0");
  if (f.retries < 0) return absl::InvalidArgumentError("--retries must be >= 0");
  in.normalize = f.normalize;
  in.add_bos = f.add_bos;
  in.deadline_ms = f.deadline_ms;
  return in;
}

}  // namespace

nlohmann::json EmbedResultToJson(const EmbedResult& result) {
  nlohmann::json data = nlohmann::json::array();
  for (size_t i = 0; i < result.embeddings.size(); ++i) {
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", result.embeddings[i]}});
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"usage",
           {{"prompt_tokens", result.usage.prompt_tokens},
            {"total_tokens", result.usage.prompt_tokens}}}};
}

int RunEmbed(int argc, char** argv, int first) {
  EmbedFlags f;
  FlagParser parser;
  RegisterFlags(&parser, &f);
  if (absl::Status s = parser.Parse(argc, argv, first); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (f.help) {
    std::cout << "usage: carpool embed --router ENDPOINT (--input TEXT ... | --input-ids IDS ... "
                 "| --inputs-file FILE) [flags]\n"
                 "prints one line per input (its values, space-separated), or with --json\n"
                 "{\"data\": [{\"index\", \"embedding\"}], \"usage\"}\n"
              << parser.Help();
    return 0;
  }
  if (!parser.positionals().empty()) {
    return Fail(absl::StrCat("unexpected argument '", parser.positionals()[0], "'"));
  }
  absl::StatusOr<EmbedInput> request = BuildRequest(f);
  if (!request.ok()) return Fail(std::string(request.status().message()));

  ClientOptions options;
  options.router_endpoint = f.router;
  options.api_key = f.api_key;
  options.max_retries = f.retries;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return Fail(std::string(client.status().message()));
  CallOptions call;
  call.timeout_ms = f.timeout_ms;
  absl::StatusOr<EmbedResult> result = (*client)->Embed(std::move(*request), call);
  if (!result.ok()) {
    std::cerr << "carpool embed: " << Describe(result.status()) << "\n";
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (f.json) {
    std::cout << EmbedResultToJson(*result).dump() << "\n";
    return 0;
  }
  for (const std::vector<float>& e : result->embeddings) {
    std::string line;
    for (size_t i = 0; i < e.size(); ++i) {
      absl::StrAppendFormat(&line, i == 0 ? "%.7g" : " %.7g", e[i]);
    }
    std::cout << line << "\n";
  }
  return 0;
}

}  // namespace carpool::client
