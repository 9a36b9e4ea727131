#include "text/chat_template_bench.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "text/chat_template.h"

namespace carpool::text {
namespace {

// The file's contents, or "" when it does not exist.
std::string ReadFileOrEmpty(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The best time per call of `fn` over `passes` passes, each calling it until 0.2 s went by.
template <typename Fn>
double BestSecondsPerCall(int passes, Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  double best = 1e30;
  for (int pass = 0; pass <= passes; ++pass) {  // pass 0 warms up
    const auto start = Clock::now();
    int64_t calls = 0;
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < 0.2);
    if (pass > 0) best = std::min(best, elapsed / calls);
  }
  return best;
}

}  // namespace

int RunChatTemplateBench(const Tokenizer& tokenizer, const ChatTemplateBenchOptions& options) {
  const std::filesystem::path dir(options.model_dir);
  auto tmpl = ChatTemplate::FromModelFiles(ReadFileOrEmpty(dir / "tokenizer_config.json"),
                                           ReadFileOrEmpty(dir / "chat_template.jinja"), {});
  if (!tmpl.ok()) {
    std::cerr << options.model_dir << ": " << tmpl.status() << "\n";
    return 1;
  }
  ChatRequest request;
  request.messages_json = ReadFileOrEmpty(options.messages_file);
  const nlohmann::json messages = nlohmann::json::parse(request.messages_json, nullptr, false);
  if (!messages.is_array()) {
    std::cerr << options.messages_file << ": not a JSON array of messages\n";
    return 1;
  }
  absl::StatusOr<std::string> prompt = (*tmpl)->Render(request);
  if (!prompt.ok()) {
    std::cerr << "render: " << prompt.status() << "\n";
    return 1;
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(*prompt, false);
  if (!ids.ok()) {
    std::cerr << "encode: " << ids.status() << "\n";
    return 1;
  }
  absl::StatusOr<ChatTemplate::Prepared> prepared = (*tmpl)->Prepare(request);
  if (!prepared.ok()) {
    std::cerr << "prepare: " << prepared.status() << "\n";
    return 1;
  }
  bool failed = false;
  const double render_s = BestSecondsPerCall(options.passes, [&] {
    failed |= !(*tmpl)->Render(request).ok();
  });
  const double template_s = BestSecondsPerCall(options.passes, [&] {
    failed |= !prepared->program->Render(prepared->context).ok();
  });
  const double encode_s = BestSecondsPerCall(options.passes, [&] {
    failed |= !tokenizer.Encode(*prompt, false).ok();
  });
  if (failed) {
    std::cerr << "a timed render or encode failed\n";
    return 1;
  }
  if (options.json) {
    nlohmann::json r = {{"messages", messages.size()}, {"prompt_bytes", prompt->size()},
                        {"prompt_tokens", ids->size()}, {"render_s", render_s},
                        {"encode_s", encode_s},         {"render_over_encode", render_s / encode_s},
                        {"template_s", template_s},
                        {"template_over_encode", template_s / encode_s}};
    std::cout << r.dump() << "\n";
    return 0;
  }
  std::cout << absl::StrFormat(
      "chat template: %d messages -> %d bytes, %d tokens\n"
      "encode %.2f us\n"
      "render %.2f us (%.2f%% of encode): the request's JSON parsed, the context built, the "
      "template run\n"
      "template %.2f us (%.2f%% of encode): the template run over a built context\n",
      messages.size(), prompt->size(), ids->size(), encode_s * 1e6, render_s * 1e6,
      100 * render_s / encode_s, template_s * 1e6, 100 * template_s / encode_s);
  return 0;
}

}  // namespace carpool::text
