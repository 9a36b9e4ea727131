#include "text/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "text/jinja/json_value.h"

namespace carpool::text {
namespace {

using Json = nlohmann::ordered_json;
using jinja::Value;

// transformers' SPECIAL_TOKENS_ATTRIBUTES that hold one token, in its order.
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

// The roles a message may have. Anything else is refused: a template may paste the role into
// the prompt as is, and a role like "user\n<|im_start|>system" would forge turns.
bool IsRole(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool" ||
         role == "developer";
}

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

// Parses one JSON field of a request straight into values; errors name it.
absl::StatusOr<Value> ParseField(const std::string& text, const std::string& field) {
  jinja::JsonErrorKind kind = jinja::JsonErrorKind::kSyntax;
  absl::StatusOr<Value> value = jinja::ParseJsonValue(text, kMaxChatJsonDepth, &kind);
  if (value.ok()) return value;
  if (kind == jinja::JsonErrorKind::kTooDeep) {
    return Bad(field, absl::StrCat("nests arrays and objects deeper than ", kMaxChatJsonDepth,
                                   " levels"));
  }
  return Bad(field, absl::StrCat("is not valid JSON: ", value.status().message()));
}

// A token value of tokenizer_config.json as transformers' special_tokens_map gives it: a string,
// or an AddedToken object's "content". "" when absent, null or of another shape (transformers
// leaves out what is falsy).
std::string TokenText(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) {
    auto it = j.find("content");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

jinja::Dict SpecialTokens(const Json& config) {
  jinja::Dict tokens;
  for (const char* name : kSpecialTokens) {
    auto it = config.find(name);
    if (it == config.end()) continue;
    std::string text = TokenText(*it);
    if (!text.empty()) tokens.Set(Value::String(name), Value::String(std::move(text)));
  }
  auto it = config.find("additional_special_tokens");
  if (it != config.end() && it->is_array() && !it->empty()) {
    jinja::List list;
    for (const Json& t : *it) list.push_back(Value::String(TokenText(t)));
    tokens.Set(Value::String("additional_special_tokens"), Value::MakeList(std::move(list)));
  }
  return tokens;
}

// tokenizer_config.json's "chat_template": one source, or named ones (a list of
// {"name", "template"}, in the file's order).
struct ConfigTemplates {
  std::string single;  // "" when none or when the config has a list
  std::vector<std::pair<std::string, std::string>> named;
};

absl::StatusOr<ConfigTemplates> ReadConfigTemplates(const Json& config) {
  ConfigTemplates out;
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return out;
  if (it->is_string()) {
    out.single = it->get<std::string>();
    return out;
  }
  constexpr char kShape[] =
      "must be a string or a list of {\"name\": string, \"template\": string} objects";
  if (!it->is_array()) return Bad("tokenizer_config.json: chat_template", kShape);
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& entry = (*it)[i];
    auto name = entry.is_object() ? entry.find("name") : entry.end();
    auto source = entry.is_object() ? entry.find("template") : entry.end();
    if (!entry.is_object() || name == entry.end() || !name->is_string() ||
        source == entry.end() || !source->is_string()) {
      return Bad(absl::StrCat("tokenizer_config.json: chat_template[", i, "]"), kShape);
    }
    out.named.emplace_back(name->get<std::string>(), source->get<std::string>());
  }
  return out;
}

const std::string* FindNamed(const ConfigTemplates& t, const std::string& name) {
  for (const auto& [n, source] : t.named) {
    if (n == name) return &source;
  }
  return nullptr;
}

std::string NamesOf(const ConfigTemplates& t) {
  std::vector<std::string> names;
  for (const auto& entry : t.named) names.push_back("'" + entry.first + "'");
  std::sort(names.begin(), names.end());
  return absl::StrJoin(names, ", ");
}

// Parses one template; errors say which one it was (`origin`).
absl::StatusOr<std::shared_ptr<const jinja::Template>> Compile(const std::string& source,
                                                               const std::string& origin) {
  absl::StatusOr<std::unique_ptr<jinja::Template>> t = jinja::Template::Parse(source);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(origin, ": ", t.status().message()));
  }
  return std::shared_ptr<const jinja::Template>(std::move(*t));
}

// A role for an error message: escaped, cut at 40 bytes.
std::string ShowRole(const std::string& role) {
  constexpr size_t kShown = 40;
  return absl::StrCat("\"", absl::CHexEscape(absl::string_view(role).substr(0, kShown)),
                      role.size() > kShown ? "...\"" : "\"");
}

bool IsList(const Value& v) { return v.kind() == jinja::Kind::kList; }
bool IsDict(const Value& v) { return v.kind() == jinja::Kind::kDict; }

// messages[i].content; the field names of errors are built only for errors.
absl::Status CheckContent(const Value& content, size_t i) {
  if (content.is_string() || content.is_none()) return absl::OkStatus();
  const auto field = [i] { return absl::StrCat("messages[", i, "].content"); };
  if (!IsList(content)) return Bad(field(), "must be a string, null or a list of content parts");
  const jinja::List& parts = content.list_value();
  for (size_t j = 0; j < parts.size(); ++j) {
    const Value& part = parts[j];
    const auto where = [&] { return absl::StrCat(field(), "[", j, "]"); };
    if (!IsDict(part)) return Bad(where(), "must be an object");
    const Value* type = part.dict_value().Find("type");
    if (type == nullptr || !type->is_string()) return Bad(where() + ".type", "must be a string");
    if (type->string_value() != "text") continue;
    const Value* text = part.dict_value().Find("text");
    if (text == nullptr || !text->is_string()) return Bad(where() + ".text", "must be a string");
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Messages(const std::string& text) {
  ASSIGN_OR_RETURN(Value messages, ParseField(text, "messages"));
  if (!IsList(messages)) return Bad("messages", "must be a JSON array");
  const jinja::List& list = messages.list_value();
  for (size_t i = 0; i < list.size(); ++i) {
    const Value& m = list[i];
    const auto field = [i] { return absl::StrCat("messages[", i, "]"); };
    if (!IsDict(m)) return Bad(field(), "must be an object");
    const Value* role = m.dict_value().Find("role");
    if (role == nullptr || role->is_none()) return Bad(field() + ".role", "is required");
    if (!role->is_string()) return Bad(field() + ".role", "must be a string");
    if (!IsRole(role->string_value())) {
      return Bad(field() + ".role", "must be system, user, assistant, tool or developer, not " +
                                        ShowRole(role->string_value()));
    }
    if (const Value* content = m.dict_value().Find("content")) {
      RETURN_IF_ERROR(CheckContent(*content, i));
    }
  }
  return messages;
}

absl::StatusOr<Value> Tools(const std::string& text) {
  if (text.empty()) return Value::None();
  ASSIGN_OR_RETURN(Value tools, ParseField(text, "tools"));
  if (tools.is_none()) return Value::None();
  if (!IsList(tools)) return Bad("tools", "must be a JSON array");
  const jinja::List& list = tools.list_value();
  for (size_t i = 0; i < list.size(); ++i) {
    if (!IsDict(list[i])) return Bad(absl::StrCat("tools[", i, "]"), "must be an object");
  }
  return tools;
}

// Adds each key of chat_template_kwargs to `context`.
absl::Status AddKwargs(const std::string& text, jinja::Dict& context) {
  if (text.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(text.size()) > kMaxChatTemplateKwargsBytes) {
    return Bad("chat_template_kwargs", absl::StrCat("is ", text.size(), " bytes, more than the ",
                                                    kMaxChatTemplateKwargsBytes, " allowed"));
  }
  ASSIGN_OR_RETURN(Value kwargs, ParseField(text, "chat_template_kwargs"));
  if (kwargs.is_none()) return absl::OkStatus();
  if (!IsDict(kwargs)) return Bad("chat_template_kwargs", "must be a JSON object");
  for (const auto& [key, value] : kwargs.dict_value().entries) {
    const std::string& name = key.string_value();  // JSON keys are strings
    if (name == "messages" || name == "tools" || name == "add_generation_prompt") {
      return Bad("chat_template_kwargs", absl::StrCat("may not set '", name,
                                                      "': send it as the request's own field"));
    }
    context.Set(key, value);
  }
  return absl::OkStatus();
}

// Renders what router/chat_template.cc's `plain` template wrote before issue 14: one
// "ROLE: CONTENT\n" line per message (developer as system; a list's text parts joined; null or
// absent content empty), then "assistant:" to open the reply.
constexpr char kBuiltinSource[] =
    "{% for message in messages %}"
    "{{ 'system' if message.role == 'developer' else message.role }}: "
    "{% if message.content is string %}{{ message.content }}"
    "{% elif message.content %}"
    "{% for part in message.content %}"
    "{% if part.type == 'text' %}{{ part.text }}{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

}  // namespace

absl::StatusOr<ChatTemplateOptions> ChatTemplateOptionsFromFlag(const std::string& flag) {
  ChatTemplateOptions options;
  if (flag.empty()) return options;
  std::error_code ec;
  if (std::filesystem::is_regular_file(flag, ec)) {
    std::ifstream in(flag, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read chat template file '", flag, "'"));
    std::stringstream text;
    text << in.rdbuf();
    options.override_source = text.str();
    if (options.override_source.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("chat template file '", flag, "' is empty"));
    }
    return options;
  }
  if (flag.find('/') != std::string::npos) {
    return absl::NotFoundError(absl::StrCat("cannot read chat template file '", flag, "'"));
  }
  options.override_name = flag;
  return options;
}

ChatTemplate::ChatTemplate(Parsed main, Parsed tool_use, jinja::Dict special_tokens)
    : source_(std::move(main.source)),
      program_(std::move(main.program)),
      tool_use_program_(std::move(tool_use.program)),
      special_tokens_(std::move(special_tokens)) {}

absl::StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::FromModelFiles(
    const std::string& tokenizer_config_json, const std::string& chat_template_jinja,
    const ChatTemplateOptions& options) {
  Json config = Json::object();
  if (!absl::StripAsciiWhitespace(tokenizer_config_json).empty()) {
    config = Json::parse(tokenizer_config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) {
      return absl::InvalidArgumentError("tokenizer_config.json is not valid JSON");
    }
    if (!config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json must be a JSON object");
    }
  }
  ASSIGN_OR_RETURN(ConfigTemplates templates, ReadConfigTemplates(config));

  std::string source, origin, tool_use_source;
  if (!options.override_source.empty()) {
    source = options.override_source;
    origin = "the --chat-template file";
  } else if (!options.override_name.empty()) {
    const std::string* named = FindNamed(templates, options.override_name);
    if (named == nullptr) {
      return absl::NotFoundError(
          templates.named.empty()
              ? absl::StrCat("no chat template named '", options.override_name,
                             "': tokenizer_config.json has no list of named chat templates")
              : absl::StrCat("no chat template named '", options.override_name,
                             "': tokenizer_config.json names ", NamesOf(templates)));
    }
    source = *named;
    origin = absl::StrCat("tokenizer_config.json chat_template '", options.override_name, "'");
  } else if (!chat_template_jinja.empty()) {
    source = chat_template_jinja;
    origin = "chat_template.jinja";
  } else if (!templates.single.empty()) {
    source = templates.single;
    origin = "tokenizer_config.json chat_template";
  } else if (!templates.named.empty()) {
    const std::string* named = FindNamed(templates, "default");
    if (named == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "tokenizer_config.json has chat templates named ", NamesOf(templates),
          " but none named 'default': pick one with --chat-template NAME"));
    }
    source = *named;
    origin = "tokenizer_config.json chat_template 'default'";
    if (const std::string* tool_use = FindNamed(templates, "tool_use")) tool_use_source = *tool_use;
  } else {
    return absl::NotFoundError("the model has no chat template");
  }

  Parsed main{source, nullptr};
  ASSIGN_OR_RETURN(main.program, Compile(source, origin));
  Parsed tool_use{tool_use_source, nullptr};
  if (!tool_use_source.empty()) {
    ASSIGN_OR_RETURN(tool_use.program,
                     Compile(tool_use_source, "tokenizer_config.json chat_template 'tool_use'"));
  }
  return std::shared_ptr<const ChatTemplate>(
      new ChatTemplate(std::move(main), std::move(tool_use), SpecialTokens(config)));
}

std::shared_ptr<const ChatTemplate> ChatTemplate::Builtin() {
  static const std::shared_ptr<const ChatTemplate> builtin = [] {
    absl::StatusOr<std::shared_ptr<const jinja::Template>> program =
        Compile(kBuiltinSource, "the built-in chat template");
    CARPOOL_CHECK(program.ok());
    return std::shared_ptr<const ChatTemplate>(
        new ChatTemplate(Parsed{kBuiltinSource, *program}, Parsed{}, jinja::Dict{}));
  }();
  return builtin;
}

absl::StatusOr<ChatTemplate::Prepared> ChatTemplate::Prepare(const ChatRequest& request) const {
  jinja::Dict context;
  ASSIGN_OR_RETURN(Value messages, Messages(request.messages_json));
  ASSIGN_OR_RETURN(Value tools, Tools(request.tools_json));
  const bool has_tools = !tools.is_none();
  context.Set(Value::String("messages"), std::move(messages));
  context.Set(Value::String("tools"), std::move(tools));
  context.Set(Value::String("documents"), Value::None());
  context.Set(Value::String("add_generation_prompt"), Value::Bool(request.add_generation_prompt));
  for (const auto& [name, token] : special_tokens_.entries) context.Set(name, token);
  RETURN_IF_ERROR(AddKwargs(request.chat_template_kwargs_json, context));
  const jinja::Template* program =
      has_tools && tool_use_program_ != nullptr ? tool_use_program_.get() : program_.get();
  return Prepared{Value::MakeDict(std::move(context)), program};
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatRequest& request,
                                                 const jinja::RenderOptions& options) const {
  ASSIGN_OR_RETURN(Prepared prepared, Prepare(request));
  return prepared.program->Render(prepared.context, options);
}

}  // namespace carpool::text
