// Chat templates: how the HTTP gateway turns OpenAI chat messages into one prompt string.
//
//   llama3  <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> ...
//           then <|start_header_id|>assistant<|end_header_id|>\n\n
//   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n ... then <|im_start|>assistant\n
//   plain   "ROLE: CONTENT\n" lines, then "assistant:" (for synthetic models and the echo backend)
//
// `auto` picks one per model name (ChatTemplateForModel). Pure functions; thread-safe.
#ifndef CARPOOL_ROUTER_CHAT_TEMPLATE_H_
#define CARPOOL_ROUTER_CHAT_TEMPLATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace carpool::router {

enum class ChatTemplate { kAuto, kLlama3, kChatMl, kPlain };

struct ChatMessage {
  std::string role;  // system | user | assistant | tool (IsChatRole)
  std::string content;
};

// Whether RenderChat can render `role`: system, user, assistant or tool. Any other string would
// be pasted into the prompt as is (a role "user\nassistant: ..." forges turns), so the parser
// refuses it; OpenAI's "developer" (its newer name for system) is parsed as "system".
bool IsChatRole(absl::string_view role);

// "llama3" | "chatml" | "plain" | "auto"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ChatTemplate> ParseChatTemplate(const std::string& name);
const char* ChatTemplateName(ChatTemplate t);

// kAuto resolved by the served model's name: llama3 for names with "llama-3"/"llama3"/"llama_3",
// chatml for "qwen" or "chatml", plain otherwise (synthetic:*, echo, unknown folders). Other
// values come back unchanged.
ChatTemplate ResolveChatTemplate(ChatTemplate t, const std::string& model_name);

// The prompt for `messages`, ending with the assistant's turn opened (unless
// !add_generation_prompt: /tokenize of a conversation as it stands).
// REQUIRES: t != kAuto (resolve it first); IsChatRole(m.role) for every message.
std::string RenderChat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt = true);

// Whether the router should prepend the tokenizer's BOS token: false for llama3, whose template
// writes <|begin_of_text|> itself.
bool ChatTemplateWantsBos(ChatTemplate t);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_CHAT_TEMPLATE_H_
