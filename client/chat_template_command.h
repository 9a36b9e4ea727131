// `carpool chat-template`: the prompt a model's chat template makes of a conversation, rendered
// in-process as the router renders it (text/chat_template.h), for debugging templates:
//
//   carpool chat-template --model DIR --messages-file F.json [--tools-file T.json]
//       [--no-generation-prompt] [--kwargs JSON] [--chat-template FILE|NAME]
//
// DIR is a Hugging Face model folder (its tokenizer_config.json and chat_template.jinja), or
// "synthetic:<preset>" for the built-in template of byte-tokenizer models. F.json holds the
// OpenAI messages array, T.json the tools array, --kwargs a chat_template_kwargs object.
// The prompt goes to stdout exactly as rendered (no newline added); errors go to stderr.
#ifndef CARPOOL_CLIENT_CHAT_TEMPLATE_COMMAND_H_
#define CARPOOL_CLIENT_CHAT_TEMPLATE_COMMAND_H_

#include <ostream>

namespace carpool::client {

// argv[first..] are the command's flags. Exit code 0 when the prompt was printed, 1 when the
// model's template does not load or the render fails (bad messages, raise_exception, a limit),
// 2 for bad flags or an input file that cannot be read.
int RunChatTemplate(int argc, char** argv, int first, std::ostream& out, std::ostream& err);
int RunChatTemplate(int argc, char** argv, int first);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_CHAT_TEMPLATE_COMMAND_H_
