#include "router/chat_template.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace carpool::router {

absl::StatusOr<ChatTemplate> ParseChatTemplate(const std::string& name) {
  if (name == "auto") return ChatTemplate::kAuto;
  if (name == "llama3") return ChatTemplate::kLlama3;
  if (name == "chatml") return ChatTemplate::kChatMl;
  if (name == "plain") return ChatTemplate::kPlain;
  return absl::InvalidArgumentError(
      absl::StrCat("--chat-template must be llama3, chatml, plain or auto, not '", name, "'"));
}

const char* ChatTemplateName(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kAuto:
      return "auto";
    case ChatTemplate::kLlama3:
      return "llama3";
    case ChatTemplate::kChatMl:
      return "chatml";
    case ChatTemplate::kPlain:
      return "plain";
  }
  return "plain";
}

ChatTemplate ResolveChatTemplate(ChatTemplate t, const std::string& model_name) {
  if (t != ChatTemplate::kAuto) return t;
  const std::string name = absl::AsciiStrToLower(model_name);
  for (const char* marker : {"llama-3", "llama3", "llama_3"}) {
    if (absl::StrContains(name, marker)) return ChatTemplate::kLlama3;
  }
  if (absl::StrContains(name, "qwen") || absl::StrContains(name, "chatml")) {
    return ChatTemplate::kChatMl;
  }
  return ChatTemplate::kPlain;
}

bool IsChatRole(absl::string_view role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

std::string RenderChat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt) {
  std::string out;
  switch (t) {
    case ChatTemplate::kLlama3:
      out = "<|begin_of_text|>";
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n", m.content,
                        "<|eot_id|>");
      }
      if (add_generation_prompt) {
        absl::StrAppend(&out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
      }
      break;
    case ChatTemplate::kChatMl:
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
      }
      if (add_generation_prompt) absl::StrAppend(&out, "<|im_start|>assistant\n");
      break;
    case ChatTemplate::kAuto:
    case ChatTemplate::kPlain:
      for (const ChatMessage& m : messages) absl::StrAppend(&out, m.role, ": ", m.content, "\n");
      if (add_generation_prompt) absl::StrAppend(&out, "assistant:");
      break;
  }
  return out;
}

bool ChatTemplateWantsBos(ChatTemplate t) { return t != ChatTemplate::kLlama3; }

}  // namespace carpool::router
