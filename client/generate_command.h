// `carpool generate`: runs prompts through an in-process engine, or through a carpool router
// with --router (client/router_generate.h), and prints the results.
#ifndef CARPOOL_CLIENT_GENERATE_COMMAND_H_
#define CARPOOL_CLIENT_GENERATE_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/carpool_client.h"
#include "nlohmann/json.hpp"
#include "worker/engine.h"
#include "common/tokenizer.h"

namespace carpool::client {

// One line of a prompts file, before tokenization: text or token ids, sampling, and stop
// strings (matched by the router on the output text; --router only).
struct PromptSpec {
  bool has_text = false;
  std::string text;                // when has_text
  std::vector<int32_t> token_ids;  // otherwise
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool has_stop = false;           // the line named "stop" (else the --stop flags apply)
};

// Parses one line of a prompts file (format below) without tokenizing it.
absl::StatusOr<PromptSpec> ParsePromptSpec(const std::string& line,
                                           const SamplingParams& defaults);

// Parses one line of a prompts file: {"prompt": "..."} or {"prompt_ids": [...]}, with optional
// max_tokens, temperature, top_p, top_k, min_p, seed, stop_token_ids, ignore_eos, logprobs
// (and "stop", a string or a list of them, which only --router takes). Fields not on the line
// come from `defaults`. `tokenizer` may be null (ids only).
absl::StatusOr<worker::EngineRequest> ParsePromptLine(const std::string& line,
                                                      const SamplingParams& defaults,
                                                      const Tokenizer* tokenizer,
                                                      bool add_bos);

// The JSON object printed for one finished prompt. `tokenizer` may be null (text is null).
nlohmann::json CompletionToJson(const worker::Completion& completion,
                                const Tokenizer* tokenizer, int top_logprobs,
                                bool skip_special_tokens = true);

// The same JSON object for a result that came through a router (text as the router decoded it;
// "stop_string" when a stop string ended it).
nlohmann::json ResultToJson(const GenerateResult& result, int top_logprobs);

// Compact JSON on one line; byte-level text that is not valid UTF-8 gets replacement characters.
std::string DumpJson(const nlohmann::json& j);

// {"error": {"code": "INVALID_ARGUMENT", "message": "..."}}, plus "line" when line > 0, and
// "reason" / "retry_after_ms" inside "error" when the status carries them (ErrorReason()).
nlohmann::json ErrorToJson(const absl::Status& status, int line);

// Entry point: argv[first..] are the command's flags. Returns the process exit code.
int RunGenerate(int argc, char** argv, int first);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_GENERATE_COMMAND_H_
