// The chat template half of carpool-bench-tokenizer (--chat-messages FILE): what rendering one
// conversation with a model's chat template costs next to tokenizing the prompt it renders.
#ifndef CARPOOL_TEXT_CHAT_TEMPLATE_BENCH_H_
#define CARPOOL_TEXT_CHAT_TEMPLATE_BENCH_H_

#include <string>

#include "common/tokenizer.h"

namespace carpool::text {

struct ChatTemplateBenchOptions {
  // The model folder: its tokenizer_config.json (and chat_template.jinja) give the template.
  std::string model_dir;
  // A JSON array of OpenAI chat messages.
  std::string messages_file;
  // Timed passes; the best is printed. Default: 5.
  int passes = 5;
  // Print one JSON object instead of text. Default: false.
  bool json = false;
};

// Renders the conversation (ChatTemplate::Render, as the router does: the messages' JSON parsed,
// the context built, the template run) and encodes its output with `tokenizer` (without
// special tokens, as a rendered chat is encoded), each repeated until a pass takes at least
// 0.2 s; prints the best time per call of each and their ratio, and the same for the template
// run alone over a context built beforehand (ChatTemplate::Prepare). Returns the exit status.
int RunChatTemplateBench(const Tokenizer& tokenizer, const ChatTemplateBenchOptions& options);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_CHAT_TEMPLATE_BENCH_H_
