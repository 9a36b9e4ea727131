#include "client/generate_command.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/router_generate.h"
#include "common/flags.h"
#include "common/status.h"
#include "text/hf_tokenizer.h"
#include "text/tokenizer_factory.h"
#include "worker/engine_flags.h"

namespace carpool::client {
namespace {

using nlohmann::json;
using worker::EngineRequest;

// Reads an optional numeric field; errors name it.
template <typename T>
absl::Status ReadNumber(const json& obj, const char* key, T* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a number"));
  }
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an integer"));
    }
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

absl::Status ReadIdList(const json& obj, const char* key, std::vector<int32_t>* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return absl::OkStatus();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be an array of ints"));
  }
  out->clear();
  for (const json& v : *it) {
    if (!v.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must hold only integers"));
    }
    const int64_t id = v.get<int64_t>();
    if (id < INT32_MIN || id > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" holds ", id,
                                                     ", outside the int32 range"));
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return absl::OkStatus();
}

absl::Status ReadSampling(const json& obj, SamplingParams* p) {
  RETURN_IF_ERROR(ReadNumber(obj, "max_tokens", &p->max_tokens));
  RETURN_IF_ERROR(ReadNumber(obj, "temperature", &p->temperature));
  RETURN_IF_ERROR(ReadNumber(obj, "top_p", &p->top_p));
  RETURN_IF_ERROR(ReadNumber(obj, "top_k", &p->top_k));
  RETURN_IF_ERROR(ReadNumber(obj, "min_p", &p->min_p));
  RETURN_IF_ERROR(ReadNumber(obj, "logprobs", &p->logprobs));
  if (obj.contains("seed") && !obj["seed"].is_null()) {
    if (!obj["seed"].is_number_integer()) {
      return absl::InvalidArgumentError("\"seed\" must be an integer");
    }
    p->seed = obj["seed"].get<uint64_t>();
    p->has_seed = true;
  }
  if (obj.contains("ignore_eos")) {
    if (!obj["ignore_eos"].is_boolean()) {
      return absl::InvalidArgumentError("\"ignore_eos\" must be true or false");
    }
    p->ignore_eos = obj["ignore_eos"].get<bool>();
  }
  return ReadIdList(obj, "stop_token_ids", &p->stop_token_ids);
}

// "logprobs" and, when top_logprobs > 0, "top_logprobs" of `out`.
void AddLogprobs(const std::vector<SampleResult>& samples, int top_logprobs, json* out) {
  json logprobs = json::array();
  json tops = json::array();
  for (const SampleResult& s : samples) {
    logprobs.push_back(s.logprob);
    json top = json::array();
    for (const TokenLogprob& t : s.top_logprobs) {
      top.push_back({{"token", t.token}, {"logprob", t.logprob}});
    }
    tops.push_back(std::move(top));
  }
  (*out)["logprobs"] = std::move(logprobs);
  if (top_logprobs > 0) (*out)["top_logprobs"] = std::move(tops);
}

}  // namespace

absl::StatusOr<PromptSpec> ParsePromptSpec(const std::string& line,
                                           const SamplingParams& defaults) {
  json obj = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return absl::InvalidArgumentError("line is not valid JSON");
  if (!obj.is_object()) return absl::InvalidArgumentError("line must be a JSON object");
  PromptSpec spec;
  spec.sampling = defaults;
  const bool has_text = obj.contains("prompt");
  const bool has_ids = obj.contains("prompt_ids");
  if (has_text == has_ids) {
    return absl::InvalidArgumentError("line needs exactly one of \"prompt\" and \"prompt_ids\"");
  }
  if (has_text) {
    if (!obj["prompt"].is_string()) {
      return absl::InvalidArgumentError("\"prompt\" must be a string");
    }
    spec.has_text = true;
    spec.text = obj["prompt"].get<std::string>();
  } else {
    RETURN_IF_ERROR(ReadIdList(obj, "prompt_ids", &spec.token_ids));
  }
  RETURN_IF_ERROR(ReadSampling(obj, &spec.sampling));
  if (auto it = obj.find("stop"); it != obj.end() && !it->is_null()) {
    spec.has_stop = true;
    if (it->is_string()) {
      spec.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const json& s : *it) {
        if (!s.is_string()) {
          return absl::InvalidArgumentError("\"stop\" must be a string or a list of strings");
        }
        spec.stop.push_back(s.get<std::string>());
      }
    } else {
      return absl::InvalidArgumentError("\"stop\" must be a string or a list of strings");
    }
  }
  return spec;
}

absl::StatusOr<EngineRequest> ParsePromptLine(const std::string& line,
                                              const SamplingParams& defaults,
                                              const Tokenizer* tokenizer, bool add_bos) {
  ASSIGN_OR_RETURN(PromptSpec spec, ParsePromptSpec(line, defaults));
  if (spec.has_stop) {
    return absl::InvalidArgumentError(
        "\"stop\" needs --router (the router matches stop strings on the output text)");
  }
  EngineRequest request;
  request.sampling = std::move(spec.sampling);
  if (!spec.has_text) {
    request.prompt_tokens = std::move(spec.token_ids);
    return request;
  }
  if (tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "this model has no tokenizer: use \"prompt_ids\" instead of \"prompt\"");
  }
  ASSIGN_OR_RETURN(request.prompt_tokens, tokenizer->Encode(spec.text, add_bos));
  return request;
}

json CompletionToJson(const worker::Completion& c, const Tokenizer* tokenizer,
                      int top_logprobs, bool skip_special_tokens) {
  json out;
  out["tokens"] = c.tokens;
  out["text"] =
      tokenizer != nullptr ? json(tokenizer->Decode(c.tokens, skip_special_tokens)) : json(nullptr);
  AddLogprobs(c.logprobs, top_logprobs, &out);
  out["finish_reason"] = FinishReasonName(c.finish_reason);
  out["usage"] = {{"prompt_tokens", c.prompt_tokens},
                  {"completion_tokens", static_cast<int>(c.tokens.size())},
                  {"cached_prompt_tokens", c.cached_prompt_tokens}};
  const auto ms = [&](int64_t t) { return t > 0 ? (t - c.timings.arrival) / 1000.0 : 0.0; };
  out["timings"] = {{"queue_ms", ms(c.timings.first_scheduled)},
                    {"ttft_ms", ms(c.timings.first_token)},
                    {"total_ms", ms(c.timings.finished)}};
  return out;
}

json ResultToJson(const GenerateResult& r, int top_logprobs) {
  json out;
  out["tokens"] = r.TokenIds();
  out["text"] = r.text;
  AddLogprobs(r.tokens, top_logprobs, &out);
  out["finish_reason"] = r.finish_reason;
  if (!r.stop_string.empty()) out["stop_string"] = r.stop_string;
  out["usage"] = {{"prompt_tokens", r.usage.prompt_tokens},
                  {"completion_tokens", r.usage.completion_tokens},
                  {"cached_prompt_tokens", r.usage.cached_prompt_tokens}};
  out["timings"] = {{"queue_ms", r.timings.queue_ms},
                    {"ttft_ms", r.timings.ttft_ms},
                    {"total_ms", r.timings.total_ms}};
  return out;
}

std::string DumpJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json ErrorToJson(const absl::Status& status, int line) {
  json out;
  if (line > 0) out["line"] = line;
  out["error"] = {{"code", absl::StatusCodeToString(status.code())},
                  {"message", std::string(status.message())}};
  if (const std::string reason = ErrorReason(status); !reason.empty()) {
    out["error"]["reason"] = reason;
  }
  if (const int64_t ms = RetryAfterMs(status); ms > 0) out["error"]["retry_after_ms"] = ms;
  return out;
}

}  // namespace carpool::client

namespace carpool::client {
namespace {

struct GenerateFlags {
  worker::EngineOptions engine;
  SamplingParams sampling;
  std::string prompt;
  std::string prompt_ids;
  std::string prompts_file;
  std::string stop_token_ids;
  int64_t seed = -1;
  bool json = false;
  bool add_bos = true;
  bool skip_special_tokens = true;
  bool help = false;
  // Router mode (RouterGenerateOptions).
  std::string router;
  int64_t timeout_ms = 0;
  bool stream = false;
  Priority priority = Priority::kDefault;
  int64_t deadline_ms = 0;
  std::string api_key;
  int concurrency = 8;
  int retries = 0;
  std::string model_name;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
};

// Flags that configure an in-process engine (worker::RegisterEngineFlags): refused with
// --router, whose workers own the model.
constexpr const char* kEngineFlags[] = {"model",
                                        "block-size",
                                        "num-kv-blocks",
                                        "kv-cache-memory",
                                        "max-num-batched-tokens",
                                        "max-num-seqs",
                                        "max-model-len",
                                        "scheduler",
                                        "static-batch-timeout-ms",
                                        "enable-chunked-prefill",
                                        "enable-prefix-caching",
                                        "threads",
                                        "device",
                                        "gpu",
                                        "dtype",
                                        "gpu-memory-utilization",
                                        "cuda-graphs"};
// Flags that only mean something with --router.
constexpr const char* kRouterFlags[] = {"timeout-ms",  "stream",  "priority",   "deadline-ms",
                                        "api-key",     "concurrency", "retries", "model-name",
                                        "stop",        "include-stop-str-in-output"};

absl::Status ParsePriority(const std::string& text, Priority* out) {
  std::optional<Priority> p = PriorityFromName(text);
  if (!p) {
    return absl::InvalidArgumentError(
        absl::StrCat("--priority: expected interactive, default or batch, got '", text, "'"));
  }
  *out = *p;
  return absl::OkStatus();
}

void RegisterGenerateFlags(FlagParser* p, GenerateFlags* f) {
  worker::RegisterEngineFlags(p, &f->engine);
  p->AddString("prompt", &f->prompt, "prompt text (models with a tokenizer)");
  p->AddString("prompt-ids", &f->prompt_ids, "prompt as comma-separated token ids");
  p->AddString("prompts-file", &f->prompts_file,
               "JSONL file, one {\"prompt\": ...} or {\"prompt_ids\": [...]} per line");
  p->AddInt("max-tokens", &f->sampling.max_tokens, "tokens to generate");
  p->AddFloat("temperature", &f->sampling.temperature, "0 = greedy");
  p->AddInt("top-k", &f->sampling.top_k, "keep the k most likely tokens; 0: all");
  p->AddFloat("top-p", &f->sampling.top_p, "nucleus mass in (0, 1]");
  p->AddFloat("min-p", &f->sampling.min_p, "drop tokens below min-p x top prob");
  p->AddFloat("repetition-penalty", &f->sampling.repetition_penalty,
              ">1 discourages tokens already in the prompt or output");
  p->AddFloat("presence-penalty", &f->sampling.presence_penalty,
              "subtracted once from the logit of every token already in the output, [-2, 2]");
  p->AddFloat("frequency-penalty", &f->sampling.frequency_penalty,
              "subtracted per occurrence in the output, [-2, 2]");
  p->AddInt64("seed", &f->seed, "sampling seed; -1: random");
  p->AddString("stop-token-ids", &f->stop_token_ids, "comma-separated ids that end generation");
  p->AddBool("ignore-eos", &f->sampling.ignore_eos, "keep generating past EOS");
  p->AddInt("logprobs", &f->sampling.logprobs, "top alternatives per token, 0..20");
  p->AddBool("json", &f->json, "print one JSON object per prompt");
  p->AddBool("add-bos", &f->add_bos,
             "add the tokenizer's special tokens (BOS) to text prompts, as Hugging Face's "
             "add_special_tokens");
  p->AddBool("skip-special-tokens", &f->skip_special_tokens,
             "leave special tokens (BOS, EOS, ...) out of the output text");
  p->AddBool("help", &f->help, "show this help");
  p->AddString("router", &f->router,
               "send the prompts to a carpool router (tcp://host:port) instead of running an "
               "engine here; a pair tcp://A:port,tcp://B:port fails over to the second when the "
               "first is lost, streams resuming where they were (docs/cluster.md)");
  p->AddInt64("timeout-ms", &f->timeout_ms,
              absl::StrCat("router: per-request timeout; 0: the client's default, ",
                           ClientOptions().default_timeout_ms));
  p->AddBool("stream", &f->stream, "router: stream tokens; without --json, print text as it comes");
  p->AddCustom(
      "priority", [f](const std::string& v) { return ParsePriority(v, &f->priority); },
      "router: interactive | default | batch", "default");
  p->AddInt64("deadline-ms", &f->deadline_ms,
              "router: give up on the request this long after it reaches the router; 0: never");
  p->AddString("api-key", &f->api_key, "router: API key sent with every request");
  p->AddInt("concurrency", &f->concurrency, "router with --prompts-file: requests kept in flight");
  p->AddInt("retries", &f->retries,
            "router: resend a request refused with UNAVAILABLE up to this many times");
  p->AddString("model-name", &f->model_name,
               "router: the model to serve the prompts, as its workers registered it; none: "
               "the cluster's only model");
  p->AddCustom(
      "stop",
      [f](const std::string& v) {
        if (v.empty()) return absl::InvalidArgumentError("--stop: a stop string is not empty");
        f->stop.push_back(v);
        return absl::OkStatus();
      },
      "router: a stop string (repeat the flag for more): the output ends where its text first "
      "holds one");
  p->AddBool("include-stop-str-in-output", &f->include_stop_str_in_output,
             "router: keep the matched stop string at the end of the text");
}

// The tokenizer of an in-process model: the byte tokenizer for a synthetic preset, the
// folder's tokenizer.json otherwise. The error says why text cannot be used.
absl::StatusOr<std::unique_ptr<Tokenizer>> ModelTokenizer(const std::string& model) {
  if (TokenizerKindForModel(model) == TokenizerKind::kByte) return CreateTokenizer(model);
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = text::LoadTokenizer(model);
  if (t.ok()) return t;
  return absl::Status(t.status().code(),
                      absl::StrCat("model '", model, "' has no tokenizer carpool can use (",
                                   t.status().message(),
                                   "): pass token ids (--prompt-ids, or \"prompt_ids\" in a "
                                   "prompts file) instead of text"));
}

int Fail(const absl::Status& status) {
  std::cerr << "carpool generate: " << status.message() << "\n";
  return 2;
}

// The requests to run, one per prompt; a prompt that failed to parse keeps its error.
absl::StatusOr<std::vector<absl::StatusOr<worker::EngineRequest>>> BuildRequests(
    const GenerateFlags& f, const absl::StatusOr<std::unique_ptr<Tokenizer>>& loaded) {
  const Tokenizer* tokenizer = loaded.ok() ? loaded->get() : nullptr;
  const int sources = !f.prompt.empty() + !f.prompt_ids.empty() + !f.prompts_file.empty();
  if (sources != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt, --prompt-ids and --prompts-file");
  }
  std::vector<absl::StatusOr<worker::EngineRequest>> requests;
  if (!f.prompts_file.empty()) {
    std::ifstream in(f.prompts_file);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", f.prompts_file));
    std::string line;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      requests.push_back(ParsePromptLine(line, f.sampling, tokenizer, f.add_bos));
    }
    return requests;
  }
  worker::EngineRequest r;
  r.sampling = f.sampling;
  if (!f.prompt_ids.empty()) {
    RETURN_IF_ERROR(ParseIntList(f.prompt_ids, "--prompt-ids", &r.prompt_tokens));
  } else {
    if (tokenizer == nullptr) return loaded.status();
    ASSIGN_OR_RETURN(r.prompt_tokens, tokenizer->Encode(f.prompt, f.add_bos));
  }
  requests.push_back(std::move(r));
  return requests;
}

absl::StatusOr<GenerateInput> ToGenerateInput(PromptSpec spec, const GenerateFlags& f) {
  // The router validates too; checking here turns a bad flag into an error before connecting.
  RETURN_IF_ERROR(spec.sampling.Validate(std::numeric_limits<int32_t>::max()));
  GenerateInput input;
  input.has_text = spec.has_text;
  input.text = std::move(spec.text);
  input.token_ids = std::move(spec.token_ids);
  input.sampling = std::move(spec.sampling);
  input.priority = f.priority;
  input.deadline_ms = f.deadline_ms;
  input.add_bos = f.add_bos;
  input.model = f.model_name;
  input.stop = spec.has_stop ? std::move(spec.stop) : f.stop;
  input.include_stop_str_in_output = f.include_stop_str_in_output;
  input.skip_special_tokens = f.skip_special_tokens;
  return input;
}

int RunGenerateViaRouter(const GenerateFlags& f, const FlagParser& parser) {
  for (const char* name : kEngineFlags) {
    if (parser.WasSet(name)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", name, " is not allowed with --router: the router's workers run "
                       "the model")));
    }
  }
  if (f.concurrency < 1) return Fail(absl::InvalidArgumentError("--concurrency must be >= 1"));
  if (f.timeout_ms < 0) return Fail(absl::InvalidArgumentError("--timeout-ms must be >= 0"));
  if (f.deadline_ms < 0) return Fail(absl::InvalidArgumentError("--deadline-ms must be >= 0"));
  if (f.retries < 0) return Fail(absl::InvalidArgumentError("--retries must be >= 0"));
  const int sources = !f.prompt.empty() + !f.prompt_ids.empty() + !f.prompts_file.empty();
  if (sources != 1) {
    return Fail(absl::InvalidArgumentError(
        "give exactly one of --prompt, --prompt-ids and --prompts-file"));
  }
  RouterGenerateOptions o;
  o.client.router_endpoint = f.router;
  o.client.api_key = f.api_key;
  o.client.max_retries = f.retries;
  o.call.timeout_ms = f.timeout_ms;
  o.batch_mode = !f.prompts_file.empty();
  o.json = f.json;
  o.stream = f.stream;
  o.concurrency = f.concurrency;
  o.top_logprobs = f.sampling.logprobs;
  if (o.batch_mode) {
    std::ifstream in(f.prompts_file);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot open ", f.prompts_file)));
    std::string line;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      absl::StatusOr<PromptSpec> spec = ParsePromptSpec(line, f.sampling);
      o.requests.push_back(spec.ok() ? ToGenerateInput(std::move(*spec), f)
                                     : absl::StatusOr<GenerateInput>(spec.status()));
    }
  } else {
    PromptSpec spec;
    spec.sampling = f.sampling;
    spec.has_text = !f.prompt.empty();
    spec.text = f.prompt;
    if (!f.prompt_ids.empty()) {
      if (absl::Status s = ParseIntList(f.prompt_ids, "--prompt-ids", &spec.token_ids); !s.ok()) {
        return Fail(s);
      }
    }
    absl::StatusOr<GenerateInput> input = ToGenerateInput(std::move(spec), f);
    if (!input.ok()) return Fail(input.status());
    o.requests.push_back(std::move(input));
  }
  return RunRouterGenerate(std::move(o));
}

}  // namespace

int RunGenerate(int argc, char** argv, int first) {
  GenerateFlags f;
  FlagParser parser;
  RegisterGenerateFlags(&parser, &f);
  if (absl::Status s = parser.Parse(argc, argv, first); !s.ok()) return Fail(s);
  if (f.help) {
    std::cout << "usage: carpool generate --model SPEC (--prompt TEXT | --prompt-ids IDS | "
                 "--prompts-file FILE) [flags]\n"
                 "       carpool generate --router ENDPOINT (--prompt TEXT | --prompt-ids IDS | "
                 "--prompts-file FILE) [flags]\n"
              << parser.Help();
    return 0;
  }
  if (!parser.positionals().empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parser.positionals()[0], "'")));
  }
  if (f.seed >= 0) {
    f.sampling.seed = static_cast<uint64_t>(f.seed);
    f.sampling.has_seed = true;
  }
  if (!f.stop_token_ids.empty()) {
    if (absl::Status s = ParseIntList(f.stop_token_ids, "--stop-token-ids",
                                      &f.sampling.stop_token_ids);
        !s.ok()) {
      return Fail(s);
    }
  }
  if (!f.router.empty()) return RunGenerateViaRouter(f, parser);
  for (const char* name : kRouterFlags) {
    if (parser.WasSet(name)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--", name, " needs --router")));
    }
  }
  if (absl::Status s = f.engine.Validate(); !s.ok()) return Fail(s);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = ModelTokenizer(f.engine.model);
  const Tokenizer* tok = tokenizer.ok() ? tokenizer->get() : nullptr;
  // generation_config.json's eos ids end generation too (Llama 3 Instruct's <|eot_id|>), as
  // the router's tokenizer has them.
  if (const auto* hf = dynamic_cast<const text::HfTokenizer*>(tok);
      hf != nullptr && !f.sampling.ignore_eos) {
    for (int32_t id : hf->stop_token_ids()) {
      std::vector<int32_t>& stops = f.sampling.stop_token_ids;
      if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
    }
  }
  auto requests = BuildRequests(f, tokenizer);
  if (!requests.ok()) return Fail(requests.status());
  const bool batch_mode = !f.prompts_file.empty();
  // Flag-level sampling errors are reported before loading the model.
  if (!batch_mode && !requests->front().ok()) return Fail(requests->front().status());

  auto engine = worker::Engine::Create(f.engine);
  if (!engine.ok()) return Fail(engine.status());

  std::vector<worker::EngineRequest> valid;
  std::vector<size_t> valid_index;
  std::vector<absl::StatusOr<worker::Completion>> results;
  for (size_t i = 0; i < requests->size(); ++i) {
    auto& r = (*requests)[i];
    results.push_back(r.ok() ? absl::StatusOr<worker::Completion>(absl::InternalError("pending"))
                             : absl::StatusOr<worker::Completion>(r.status()));
    if (r.ok()) {
      valid.push_back(std::move(*r));
      valid_index.push_back(i);
    }
  }
  auto done = (*engine)->Generate(std::move(valid));
  for (size_t j = 0; j < done.size(); ++j) results[valid_index[j]] = std::move(done[j]);

  int exit_code = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (!r.ok()) {
      if (!batch_mode) return Fail(r.status());
      std::cout << DumpJson(ErrorToJson(r.status(), static_cast<int>(i) + 1)) << "\n";
      exit_code = 1;
      continue;
    }
    const int top = f.sampling.logprobs;
    if (f.json || batch_mode) {
      std::cout << DumpJson(CompletionToJson(*r, tok, top, f.skip_special_tokens)) << "\n";
    } else if (tok != nullptr) {
      std::cout << tok->Decode(r->tokens, f.skip_special_tokens) << "\n";
    } else {
      std::cout << CompletionToJson(*r, nullptr, 0)["tokens"] << "\n";
    }
  }
  return exit_code;
}

}  // namespace carpool::client
