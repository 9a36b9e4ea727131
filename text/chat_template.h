// A model's chat template: the Jinja2 program of its Hugging Face folder that turns OpenAI chat
// messages into the one prompt string the model was trained on, rendered as transformers'
// apply_chat_template renders it (text/jinja/template.h says how closely).
//
// Selection (FromModelFiles), first match wins:
//   1. options.override_source: a template's text (`--chat-template FILE`).
//   2. options.override_name: a named template of the model's list (`--chat-template NAME`).
//   3. chat_template.jinja, when the folder has one: transformers lets that file take priority
//      over the template entries of tokenizer_config.json.
//   4. tokenizer_config.json "chat_template": a string, or a list of {"name", "template"} whose
//      "default" entry is used (and, as transformers does, its "tool_use" entry for a request
//      that sends tools).
// A model with none of these is NOT_FOUND "the model has no chat template".
//
// Context of a render, as transformers builds it: `messages` (the request's array as given:
// content a string, null, or a list of part dicts; every other key of a message, such as
// tool_calls, tool_call_id, name, reasoning_content, passed through as JSON values), `tools`
// (the request's array, or None), `documents` (None), `add_generation_prompt`, the special
// tokens of tokenizer_config.json (bos_token, eos_token, unk_token, sep_token, pad_token,
// cls_token, mask_token, additional_special_tokens; an AddedToken object gives its "content";
// one absent, null or empty is not passed, so the template sees it Undefined), then each key of
// chat_template_kwargs as a variable (it may replace a special token, as in transformers, but not
// messages, tools or add_generation_prompt: those come from the request's own fields).
// Values are data only: nothing in a request is ever evaluated as template code.
//
// The rendered text is tokenized without adding special tokens (add_special_tokens = false, as
// apply_chat_template does): the template writes BOS itself when the model wants one.
//
// Thread safety: a ChatTemplate is immutable; Render is const and thread-safe.
#ifndef CARPOOL_TEXT_CHAT_TEMPLATE_H_
#define CARPOOL_TEXT_CHAT_TEMPLATE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "text/jinja/template.h"
#include "text/jinja/value.h"

namespace carpool::text {

// The largest chat_template_kwargs object a request may send (its JSON text).
constexpr int64_t kMaxChatTemplateKwargsBytes = int64_t{64} << 10;
// The deepest nesting of arrays and objects messages, tools and kwargs may have (messages is one
// level, each message a second); deeper documents are refused before they become values.
constexpr int kMaxChatJsonDepth = 100;

struct ChatTemplateOptions {
  // A template's source, used instead of the model's (`--chat-template FILE` read by the caller).
  // Default: "" (none).
  std::string override_source;
  // The name of one template of the model's named list in tokenizer_config.json
  // (`--chat-template NAME`). Ignored when override_source is set. Default: "" (none).
  std::string override_name;
};

// `--chat-template FILE|NAME` as the router and the CLI take it: a path to a readable file gives
// its contents as override_source; anything else without a '/' is a template name; a value with
// a '/' that is no readable file is NOT_FOUND naming it. "" gives empty options.
absl::StatusOr<ChatTemplateOptions> ChatTemplateOptionsFromFlag(const std::string& flag);

// One conversation to render. Every field is JSON text as the request carried it.
struct ChatRequest {
  // A JSON array of OpenAI chat messages.
  std::string messages_json;
  // A JSON array of OpenAI tools; "" = none (the template sees tools = None).
  std::string tools_json;
  // Whether the prompt ends by opening the assistant's turn. Default: true.
  bool add_generation_prompt = true;
  // A JSON object whose keys become template variables; "" = none. At most
  // kMaxChatTemplateKwargsBytes.
  std::string chat_template_kwargs_json;
};

class ChatTemplate {
 public:
  // The template of a Hugging Face model folder, chosen as the file comment says.
  // `tokenizer_config_json`: the folder's tokenizer_config.json ("" when it has none);
  // `chat_template_jinja`: its chat_template.jinja ("" when it has none).
  // NOT_FOUND "the model has no chat template" when nothing is found, or naming the list's
  // names when override_name (or "default") is not among them; INVALID_ARGUMENT for a config that
  // is not JSON or whose chat_template has the wrong shape, and jinja::Template::Parse's error
  // (the construct and its line) for a template carpool cannot run.
  static absl::StatusOr<std::shared_ptr<const ChatTemplate>> FromModelFiles(
      const std::string& tokenizer_config_json, const std::string& chat_template_jinja,
      const ChatTemplateOptions& options);

  // The template for byte-tokenizer (synthetic) models, in Jinja: one "ROLE: CONTENT\n" line per
  // message (developer shown as system; a list content's text parts joined; null content empty),
  // then "assistant:" when add_generation_prompt.
  static std::shared_ptr<const ChatTemplate> Builtin();

  // Renders one conversation. INVALID_ARGUMENT, naming the field, for bad input: messages not a
  // JSON array; messages[i] not an object; messages[i].role missing or not one of system, user,
  // assistant, tool, developer; messages[i].content neither a string, null nor a list;
  // messages[i].content[j] not an object with a string "type", or a "text" part whose "text" is
  // not a string; tools not an array of objects; chat_template_kwargs not an object, over
  // kMaxChatTemplateKwargsBytes, or setting messages, tools or add_generation_prompt; any of
  // them nested deeper than kMaxChatJsonDepth. The
  // template's own errors are INVALID_ARGUMENT too: raise_exception's message, an evaluation
  // error with its line, a limit of `options.limits` exceeded.
  absl::StatusOr<std::string> Render(const ChatRequest& request,
                                     const jinja::RenderOptions& options = {}) const;

  // Render in two steps, for callers that time them apart (carpool-bench-tokenizer): Prepare
  // checks the request and builds the template's context (the JSON parsed into values), then
  // program->Render(context, options) runs the template. Prepare's errors are Render's bad-input
  // errors; `program` is owned by this ChatTemplate.
  struct Prepared {
    jinja::Value context;
    const jinja::Template* program;
  };
  absl::StatusOr<Prepared> Prepare(const ChatRequest& request) const;

  // The source of the template a request without tools renders.
  const std::string& source() const { return source_; }

  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

 private:
  struct Parsed {
    std::string source;
    std::shared_ptr<const jinja::Template> program;
  };
  ChatTemplate(Parsed main, Parsed tool_use, jinja::Dict special_tokens);

  std::string source_;
  std::shared_ptr<const jinja::Template> program_;
  // The list's "tool_use" entry, for requests with tools; null when the model has none.
  std::shared_ptr<const jinja::Template> tool_use_program_;
  jinja::Dict special_tokens_;  // name -> string (or list of strings), as transformers passes
};

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_CHAT_TEMPLATE_H_
