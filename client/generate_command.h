// `carpool generate`: runs prompts through an in-process engine and prints the results.
#ifndef CARPOOL_CLIENT_GENERATE_COMMAND_H_
#define CARPOOL_CLIENT_GENERATE_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/engine.h"
#include "worker/tokenizer.h"

namespace carpool::client {

// Parses one line of a prompts file: {"prompt": "..."} or {"prompt_ids": [...]}, with optional
// max_tokens, temperature, top_p, top_k, min_p, seed, stop_token_ids, ignore_eos, logprobs.
// Fields not on the line come from `defaults`. `tokenizer` may be null (ids only).
absl::StatusOr<worker::EngineRequest> ParsePromptLine(const std::string& line,
                                                      const worker::SamplingParams& defaults,
                                                      const worker::Tokenizer* tokenizer,
                                                      bool add_bos);

// The JSON object printed for one finished prompt. `tokenizer` may be null (text is null).
nlohmann::json CompletionToJson(const worker::Completion& completion,
                                const worker::Tokenizer* tokenizer, int top_logprobs);

// {"error": {"code": "INVALID_ARGUMENT", "message": "..."}}, plus "line" when line > 0.
nlohmann::json ErrorToJson(const absl::Status& status, int line);

// Entry point: argv[first..] are the command's flags. Returns the process exit code.
int RunGenerate(int argc, char** argv, int first);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_GENERATE_COMMAND_H_
