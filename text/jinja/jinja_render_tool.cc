// carpool-jinja-render: renders templates read as JSON Lines on stdin, one JSON line out per line
// in, for the Jinja2 parity tests (tests/chat_template/). Not a user tool.
//
//   carpool-jinja-render           each line {"template": "...", "context": {...},
//                                  "now_unix_micros": N?, "limits": {...}?} goes through
//                                  jinja::Template::Parse and Render;
//   carpool-jinja-render --chat    each line {"tokenizer_config": {...} or "PATH",
//                                  "chat_template_jinja": "..."?, "override_source": "..."?,
//                                  "override_name": "..."?, "messages": [...], "tools": [...]?,
//                                  "add_generation_prompt": bool?, "kwargs": {...}?,
//                                  "now_unix_micros": N?, "limits": {...}?} goes through
//                                  ChatTemplate::FromModelFiles and Render (the router's path).
//
// Each answer is {"ok": true, "output": "...", "render_us": N} or {"ok": false, "error": "CODE:
// message", "phase": "parse" | "render", "render_us": N} ("parse" is Template::Parse, or
// ChatTemplate::FromModelFiles with --chat); a line that is not such a request answers
// {"ok": false, "error": ..., "phase": "input", "bad_input": true}. "limits" may set
// max_output_bytes, max_loop_iterations, max_recursion_depth, max_run_time_us (jinja::Limits; the
// rest keep their defaults). Without now_unix_micros strftime_now reads the system clock. Output
// lines are flushed one by one.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "text/chat_template.h"
#include "text/jinja/template.h"
#include "text/jinja/value.h"

namespace carpool::text::jinja {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A string field: `fallback` when absent.
absl::StatusOr<std::string> StringField(const Json& request, const char* key,
                                        const std::string& fallback = "") {
  if (!request.contains(key)) return fallback;
  if (!request[key].is_string())
    return absl::InvalidArgumentError(absl::StrCat(key, ": not a string"));
  return request[key].get<std::string>();
}

absl::StatusOr<RenderOptions> OptionsOf(const Json& request) {
  RenderOptions options;
  if (request.contains("now_unix_micros")) {
    const Json& now = request["now_unix_micros"];
    if (!now.is_number_integer())
      return absl::InvalidArgumentError("now_unix_micros: not an integer");
    const int64_t micros = now.get<int64_t>();
    options.now_unix_micros = [micros] { return micros; };
  }
  if (request.contains("limits")) {
    const Json& limits = request["limits"];
    if (!limits.is_object()) return absl::InvalidArgumentError("limits: not an object");
    for (const auto& [key, value] : limits.items()) {
      if (!value.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat("limits.", key, ": not an integer"));
      }
      const int64_t v = value.get<int64_t>();
      if (key == "max_output_bytes") {
        options.limits.max_output_bytes = v;
      } else if (key == "max_loop_iterations") {
        options.limits.max_loop_iterations = v;
      } else if (key == "max_recursion_depth") {
        options.limits.max_recursion_depth = static_cast<int>(v);
      } else if (key == "max_run_time_us") {
        options.limits.max_run_time_us = v;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("limits: unknown key '", key, "'"));
      }
    }
  }
  return options;
}

// Where a request failed, for the answer's "phase": "input" (the request itself), "parse"
// (Template::Parse, or ChatTemplate::FromModelFiles in --chat mode) or "render".
using Phase = const char*;

absl::StatusOr<std::string> RenderTemplate(const Json& request, const RenderOptions& options,
                                           Phase& phase) {
  if (!request.contains("template")) return absl::InvalidArgumentError("template: missing");
  ASSIGN_OR_RETURN(const std::string source, StringField(request, "template"));
  const Json context = request.contains("context") ? request["context"] : Json::object();
  if (!context.is_object()) return absl::InvalidArgumentError("context: not an object");
  phase = "parse";
  ASSIGN_OR_RETURN(std::unique_ptr<Template> program, Template::Parse(source));
  phase = "render";
  return program->Render(Value::FromJson(context), options);
}

// A JSON text field of a chat request: "" when absent (or null, for tools and kwargs).
std::string JsonTextOf(const Json& request, const char* key) {
  if (!request.contains(key) || request[key].is_null()) return "";
  return request[key].dump();
}

absl::StatusOr<std::string> RenderChat(const Json& request, const RenderOptions& options,
                                       Phase& phase) {
  std::string config;
  if (request.contains("tokenizer_config")) {
    const Json& c = request["tokenizer_config"];
    if (c.is_string()) {
      ASSIGN_OR_RETURN(config, ReadFile(c.get<std::string>()));
    } else if (c.is_object()) {
      config = c.dump();
    } else {
      return absl::InvalidArgumentError("tokenizer_config: neither an object nor a path");
    }
  }
  ChatTemplateOptions template_options;
  ASSIGN_OR_RETURN(template_options.override_source, StringField(request, "override_source"));
  ASSIGN_OR_RETURN(template_options.override_name, StringField(request, "override_name"));
  ASSIGN_OR_RETURN(const std::string jinja_file, StringField(request, "chat_template_jinja"));
  phase = "parse";
  ASSIGN_OR_RETURN(std::shared_ptr<const ChatTemplate> chat_template,
                   ChatTemplate::FromModelFiles(config, jinja_file, template_options));
  ChatRequest chat;
  // Absent messages reach Render as "" so that its own check answers.
  chat.messages_json = JsonTextOf(request, "messages");
  chat.tools_json = JsonTextOf(request, "tools");
  if (request.contains("add_generation_prompt")) {
    if (!request["add_generation_prompt"].is_boolean()) {
      return absl::InvalidArgumentError("add_generation_prompt: not a bool");
    }
    chat.add_generation_prompt = request["add_generation_prompt"].get<bool>();
  }
  chat.chat_template_kwargs_json = JsonTextOf(request, "kwargs");
  phase = "render";
  return chat_template->Render(chat, options);
}

// "CODE: message", without the status's payloads.
std::string ErrorText(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

Json Answer(const std::string& line, bool chat_mode) {
  Json request = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return Json{{"ok", false},
                {"error", "the line is not a JSON object"},
                {"phase", "input"},
                {"bad_input", true}};
  }
  absl::StatusOr<RenderOptions> options = OptionsOf(request);
  if (!options.ok()) {
    return Json{{"ok", false},
                {"error", ErrorText(options.status())},
                {"phase", "input"},
                {"bad_input", true}};
  }
  Phase phase = "input";
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> output =
      chat_mode ? RenderChat(request, *options, phase) : RenderTemplate(request, *options, phase);
  const int64_t micros = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  if (!output.ok()) {
    return Json{{"ok", false},
                {"error", ErrorText(output.status())},
                {"phase", phase},
                {"render_us", micros}};
  }
  return Json{{"ok", true}, {"output", *std::move(output)}, {"render_us", micros}};
}

int Main(int argc, char** argv) {
  bool chat_mode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--chat") {
      chat_mode = true;
    } else {
      std::fprintf(stderr, "usage: %s [--chat] < requests.jsonl > answers.jsonl\n", argv[0]);
      return 2;
    }
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    // Text that is not UTF-8 prints as U+FFFD, so the comparison shows it instead of failing here.
    std::cout << Answer(line, chat_mode).dump(-1, ' ', false, Json::error_handler_t::replace)
              << '\n'
              << std::flush;
  }
  return 0;
}

}  // namespace
}  // namespace carpool::text::jinja

int main(int argc, char** argv) { return carpool::text::jinja::Main(argc, argv); }
