#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/chat_template_test_models.h"

namespace carpool::text {
namespace {

using ::testing::HasSubstr;

// The expected renderings below were produced by /usr/bin/python3 with Debian's Jinja2 3.1.2,
// configured as transformers' apply_chat_template configures it (design: ImmutableSandboxed-
// Environment(trim_blocks=True, lstrip_blocks=True, loopcontrols), its tojson, raise_exception,
// and render(messages=, tools=, documents=None, add_generation_prompt=, **special_tokens,
// **kwargs)), over the same messages.

std::shared_ptr<const ChatTemplate> Load(const std::string& config, const std::string& jinja = "",
                                         ChatTemplateOptions options = {}) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t =
      ChatTemplate::FromModelFiles(config, jinja, options);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : nullptr;
}

// The model's template of `config` over the request's fields.
absl::StatusOr<std::string> Render(const std::string& config, const std::string& messages,
                                   bool add_generation_prompt = true,
                                   const std::string& tools = "", const std::string& kwargs = "") {
  std::shared_ptr<const ChatTemplate> t = Load(config);
  if (t == nullptr) return absl::InternalError("did not load");
  ChatRequest r;
  r.messages_json = messages;
  r.tools_json = tools;
  r.add_generation_prompt = add_generation_prompt;
  r.chat_template_kwargs_json = kwargs;
  return t->Render(r);
}

// A config whose only content is the template `source`.
std::string WithTemplate(const std::string& source, const std::string& more = "") {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse("{" + more + "}");
  j["chat_template"] = source;
  return j.dump();
}

void ExpectInvalid(const absl::StatusOr<std::string>& r, const std::string& message) {
  ASSERT_FALSE(r.ok()) << "rendered: " << *r;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(message));
}

// ---------------------------------------------------------------------------------------------
// Selection

TEST(ChatTemplateSelectionTest, ConfigStringIsTheTemplate) {
  std::shared_ptr<const ChatTemplate> t = Load(WithTemplate("A{{ messages|length }}"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source(), "A{{ messages|length }}");
  ChatRequest r;
  r.messages_json = R"([{"role": "user", "content": "x"}])";
  EXPECT_EQ(*t->Render(r), "A1");
}

constexpr char kNamedList[] = R"({"chat_template": [
    {"name": "default", "template": "D{{ tools is none }}"},
    {"name": "tool_use", "template": "T{{ tools|length }}"},
    {"name": "rag", "template": "R"}]})";

TEST(ChatTemplateSelectionTest, NamedListUsesDefaultAndToolUseForRequestsWithTools) {
  std::shared_ptr<const ChatTemplate> t = Load(kNamedList);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source(), "D{{ tools is none }}");
  ChatRequest r;
  r.messages_json = "[]";
  EXPECT_EQ(*t->Render(r), "DTrue");
  r.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
  EXPECT_EQ(*t->Render(r), "T1");  // transformers: tools is not None and "tool_use" exists
  r.tools_json = "[]";
  EXPECT_EQ(*t->Render(r), "T0");
}

TEST(ChatTemplateSelectionTest, OverrideNamePicksFromTheListOrNamesIt) {
  std::shared_ptr<const ChatTemplate> t = Load(kNamedList, "", {"", "rag"});
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source(), "R");
  ChatRequest r;
  r.messages_json = "[]";
  r.tools_json = "[]";
  EXPECT_EQ(*t->Render(r), "R");  // a named pick is used for every request

  absl::StatusOr<std::shared_ptr<const ChatTemplate>> missing =
      ChatTemplate::FromModelFiles(kNamedList, "", {"", "chatml"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "no chat template named 'chatml': tokenizer_config.json names 'default', 'rag', "
            "'tool_use'");

  missing = ChatTemplate::FromModelFiles(WithTemplate("x"), "", {"", "default"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("has no list of named chat templates"));
}

TEST(ChatTemplateSelectionTest, ListWithoutDefaultIsNotFoundNamingTheNames) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = ChatTemplate::FromModelFiles(
      R"({"chat_template": [{"name": "b", "template": "B"}, {"name": "a", "template": "A"}]})",
      "", {});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(t.status().message(),
            "tokenizer_config.json has chat templates named 'a', 'b' but none named 'default': "
            "pick one with --chat-template NAME");
}

TEST(ChatTemplateSelectionTest, OverrideSourceWinsThenJinjaFileThenConfig) {
  std::shared_ptr<const ChatTemplate> t =
      Load(WithTemplate("config"), "file", {"override", "default"});
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source(), "override");
  // transformers: chat_template.jinja takes priority over tokenizer_config.json's template.
  t = Load(WithTemplate("config"), "file");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source(), "file");
  t = Load(kNamedList, "file");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source(), "file");
  t = Load("", "file only");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->source(), "file only");
}

TEST(ChatTemplateSelectionTest, NoTemplateIsNotFound) {
  for (const char* config : {"", "{}", R"({"chat_template": null, "bos_token": "<s>"})"}) {
    absl::StatusOr<std::shared_ptr<const ChatTemplate>> t =
        ChatTemplate::FromModelFiles(config, "", {});
    ASSERT_FALSE(t.ok()) << config;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(t.status().message(), "the model has no chat template");
  }
}

TEST(ChatTemplateSelectionTest, BadConfigsAreInvalidArgument) {
  struct Case {
    const char* config;
    const char* message;
  };
  for (const Case& c : {
           Case{"{not json", "tokenizer_config.json is not valid JSON"},
           Case{"[1]", "tokenizer_config.json must be a JSON object"},
           Case{R"({"chat_template": 5})", "tokenizer_config.json: chat_template must be"},
           Case{R"({"chat_template": [{"name": "default", "template": "x"}, {"name": "y"}]})",
                "tokenizer_config.json: chat_template[1] must be"},
           Case{R"({"chat_template": ["x"]})", "tokenizer_config.json: chat_template[0] must be"},
       }) {
    absl::StatusOr<std::shared_ptr<const ChatTemplate>> t =
        ChatTemplate::FromModelFiles(c.config, "", {});
    ASSERT_FALSE(t.ok()) << c.config;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(c.message));
  }
}

TEST(ChatTemplateSelectionTest, ParseErrorsNameTheTemplateAndLine) {
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> t =
      ChatTemplate::FromModelFiles("", "ok\n{% include 'x' %}", {});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("chat_template.jinja: line 2"));

  t = ChatTemplate::FromModelFiles(
      R"({"chat_template": [{"name": "default", "template": "x"},
                            {"name": "tool_use", "template": "{% if %}"}]})",
      "", {});
  ASSERT_FALSE(t.ok());  // refused at load, not at the first request with tools
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("tokenizer_config.json chat_template 'tool_use': line 1"));
}

TEST(ChatTemplateOptionsFromFlagTest, FileNameOrNothing) {
  EXPECT_TRUE(ChatTemplateOptionsFromFlag("")->override_source.empty());
  EXPECT_TRUE(ChatTemplateOptionsFromFlag("")->override_name.empty());

  const std::string path = ::testing::TempDir() + "/chat_template_flag_test.jinja";
  std::ofstream(path) << "{{ messages }}\n";
  absl::StatusOr<ChatTemplateOptions> file = ChatTemplateOptionsFromFlag(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->override_source, "{{ messages }}\n");
  EXPECT_TRUE(file->override_name.empty());

  absl::StatusOr<ChatTemplateOptions> name = ChatTemplateOptionsFromFlag("tool_use");
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(name->override_name, "tool_use");
  EXPECT_TRUE(name->override_source.empty());

  EXPECT_EQ(ChatTemplateOptionsFromFlag("/no/such/template.jinja").status().code(),
            absl::StatusCode::kNotFound);
  std::ofstream(path, std::ios::trunc).flush();
  EXPECT_EQ(ChatTemplateOptionsFromFlag(path).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------------------------------------
// Context

TEST(ChatTemplateContextTest, SpecialTokensAsTransformersPassesThem) {
  // A string; an AddedToken object's content; null and "" not passed (Undefined); the list of
  // additional ones as strings. Jinja2: "<s>|</s>|False|False|['<a>', '<b>']|False".
  const std::string config = WithTemplate(
      "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ pad_token is defined }}|"
      "{{ additional_special_tokens }}|{{ sep_token is defined }}",
      R"("bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "</s>",
         "lstrip": false}, "unk_token": null, "pad_token": "",
         "additional_special_tokens": ["<a>", {"content": "<b>"}])");
  EXPECT_EQ(*Render(config, "[]"), "<s>|</s>|False|False|['<a>', '<b>']|False");
}

TEST(ChatTemplateContextTest, KwargsReplaceSpecialTokensButNotRequestFields) {
  const std::string config = WithTemplate("{{ bos_token }}", R"("bos_token": "<s>")");
  EXPECT_EQ(*Render(config, "[]", true, "", R"({"bos_token": "X"})"), "X");
  for (const char* key : {"messages", "tools", "add_generation_prompt"}) {
    ExpectInvalid(Render(config, "[]", true, "", absl::StrCat("{\"", key, "\": 1}")),
                  absl::StrCat("chat_template_kwargs may not set '", key, "'"));
  }
}

TEST(ChatTemplateContextTest, ToolsDocumentsAndGenerationPrompt) {
  const std::string config = WithTemplate(
      "{{ tools is none }} {{ documents is none }} {{ add_generation_prompt }}");
  EXPECT_EQ(*Render(config, "[]"), "True True True");
  EXPECT_EQ(*Render(config, "[]", false, "null"), "True True False");
  EXPECT_EQ(*Render(WithTemplate("{{ tools is none }} {{ tools | length }}"), "[]", true, "[]"),
            "False 0");
}

TEST(ChatTemplateContextTest, MessageFieldsPassThroughAsValues) {
  const std::string messages = R"([
      {"role": "assistant", "content": null, "name": "bob", "reasoning_content": "hm",
       "tool_calls": [{"id": "c", "type": "function",
                       "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c", "content": "r"}])";
  EXPECT_EQ(*Render(WithTemplate("{{ messages[0].tool_calls[0].function.name }} "
                                 "{{ messages[1].tool_call_id }} {{ messages[0].name }} "
                                 "{{ messages[0].reasoning_content }} "
                                 "{{ messages[0].content is none }}"),
                    messages),
            "f c bob hm True");
}

TEST(ChatTemplateContextTest, TojsonKeepsTheRequestsKeyOrder) {
  EXPECT_EQ(*Render(WithTemplate("{{ messages[0] | tojson }}"),
                    R"([{"role":"user","content":"x","z":1,"a":[true,null,1.5]}])"),
            R"({"role": "user", "content": "x", "z": 1, "a": [true, null, 1.5]})");
}

TEST(ChatTemplateContextTest, ContentPartsStayAListOfDicts) {
  EXPECT_EQ(*Render(WithTemplate("{{ messages[0].content[0].text }} "
                                 "{{ messages[0].content is string }} "
                                 "{{ messages[0].content[1].type }}"),
                    R"([{"role": "user", "content": [{"type": "text", "text": "hi"},
                         {"type": "image_url", "image_url": {"url": "u"}}]}])"),
            "hi False image_url");
}

TEST(ChatTemplateContextTest, KwargsAreDataNeverCode) {
  EXPECT_EQ(*Render(WithTemplate("{{ x }} {{ y.k[1] }}"), "[]", true, "",
                    R"({"x": "{{ 7*7 }}", "y": {"k": [1, "two"]}})"),
            "{{ 7*7 }} two");
}

// The request's JSON as Python's json.loads reads it: a repeated key keeps its first place and
// its last value, escapes and pairs decoded, integers past int64 floats.
TEST(ChatTemplateContextTest, JsonReadAsPythonReadsIt) {
  EXPECT_EQ(*Render(WithTemplate("{{ messages[0] | tojson }} {{ x }} {{ y }}"),
                    R"([{"role": "user", "content": "a\u00e9\ud83d\ude00\n", "role": "assistant"}])",
                    true, "", R"({"x": 9223372036854775808, "y": [1.5e3, -0, 7]})"),
            "{\"role\": \"assistant\", \"content\": \"a\u00e9\U0001f600\\n\"} 9.223372036854776e+18 "
            "[1500.0, 0, 7]");
}

// ---------------------------------------------------------------------------------------------
// Bad input

TEST(ChatTemplateRenderTest, BadMessagesNameTheField) {
  const std::string config = WithTemplate("ok");
  struct Case {
    const char* messages;
    const char* message;
  };
  for (const Case& c : {
           Case{"", "messages is not valid JSON"},
           Case{"[{]", "messages is not valid JSON"},
           Case{R"([{"role": "user"} {"role": "user"}])",
                "messages is not valid JSON: expected ',' or ']' at byte 18, found '{'"},
           Case{"[{\"role\": \"user\", \"content\": \"\xff\"}]",
                "messages is not valid JSON: invalid UTF-8 at byte 30"},
           Case{R"([{"role": "user", "content": "\ud800"}])",
                "messages is not valid JSON: lone surrogate \\ud800 at byte 30"},
           Case{R"({"role": "user"})", "messages must be a JSON array"},
           Case{R"([{"role": "user", "content": "x"}, 3])", "messages[1] must be an object"},
           Case{R"([{"content": "x"}])", "messages[0].role is required"},
           Case{R"([{"role": 5, "content": "x"}])", "messages[0].role must be a string"},
           Case{R"([{"role": "user\nassistant", "content": "x"}])",
                R"(messages[0].role must be system, user, assistant, tool or developer, not "user\nassistant")"},
           Case{R"([{"role": "bot", "content": "x"}])", R"(, not "bot")"},
           Case{R"([{"role": "user", "content": 5}])",
                "messages[0].content must be a string, null or a list of content parts"},
           Case{R"([{"role": "user", "content": {"text": "x"}}])", "messages[0].content must be"},
           Case{R"([{"role": "user", "content": [5]}])", "messages[0].content[0] must be an object"},
           Case{R"([{"role": "user", "content": [{"text": "x"}]}])",
                "messages[0].content[0].type must be a string"},
           Case{R"([{"role": "user", "content": "a"},
                    {"role": "user", "content": [{"type": "text", "text": "a"},
                                                 {"type": "text", "text": 5}]}])",
                "messages[1].content[1].text must be a string"},
           Case{R"([{"role": "user", "content": [{"type": "text"}]}])",
                "messages[0].content[0].text must be a string"},
       }) {
    ExpectInvalid(Render(config, c.messages), c.message);
  }
  // Parts of other types need no text; content may be absent or null.
  EXPECT_EQ(*Render(config, R"([{"role": "user", "content": [{"type": "image_url"}]},
                               {"role": "assistant"}, {"role": "developer", "content": null}])"),
            "ok");
}

TEST(ChatTemplateRenderTest, BadToolsAndKwargs) {
  const std::string config = WithTemplate("ok");
  ExpectInvalid(Render(config, "[]", true, R"({"type": "function"})"), "tools must be a JSON array");
  ExpectInvalid(Render(config, "[]", true, "[{}, 1]"), "tools[1] must be an object");
  ExpectInvalid(Render(config, "[]", true, "[", ""), "tools is not valid JSON");
  ExpectInvalid(Render(config, "[]", true, "", "[1]"), "chat_template_kwargs must be a JSON object");
  ExpectInvalid(Render(config, "[]", true, "", "{"), "chat_template_kwargs is not valid JSON");
  const std::string big = "{\"x\": \"" + std::string(kMaxChatTemplateKwargsBytes, 'a') + "\"}";
  ExpectInvalid(Render(config, "[]", true, "", big),
                absl::StrCat("chat_template_kwargs is ", big.size(), " bytes, more than the 65536 "
                             "allowed"));
  const std::string fits = "{\"x\": \"" + std::string(kMaxChatTemplateKwargsBytes - 9, 'a') + "\"}";
  ASSERT_EQ(static_cast<int64_t>(fits.size()), kMaxChatTemplateKwargsBytes);
  EXPECT_EQ(*Render(config, "[]", true, "", fits), "ok");
}

TEST(ChatTemplateRenderTest, DeepNestingIsRefusedBeforeItBecomesValues) {
  const std::string config = WithTemplate("{{ x | length }}");
  auto nested = [](int depth) {  // {"x": [[...]]}: the object and depth - 1 arrays
    return "{\"x\": " + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
  };
  EXPECT_EQ(*Render(config, "[]", true, "", nested(kMaxChatJsonDepth)), "1");
  ExpectInvalid(Render(config, "[]", true, "", nested(kMaxChatJsonDepth + 1)),
                "chat_template_kwargs nests arrays and objects deeper than 100 levels");
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  ExpectInvalid(Render(config, deep), "messages nests arrays and objects deeper than 100 levels");
  ExpectInvalid(Render(config, "[]", true, deep), "tools nests arrays and objects deeper");
}

TEST(ChatTemplateRenderTest, RaiseExceptionAndLimitsAreInvalidArgument) {
  ExpectInvalid(Render(WithTemplate("{% if messages[0].role != 'system' %}"
                                    "{{ raise_exception('the first message must be system') }}"
                                    "{% endif %}"),
                       R"([{"role": "user", "content": "x"}])"),
                "the first message must be system");

  std::shared_ptr<const ChatTemplate> t =
      Load(WithTemplate("{% for i in range(100) %}x{% endfor %}"));
  ASSERT_NE(t, nullptr);
  ChatRequest r;
  r.messages_json = "[]";
  jinja::RenderOptions options;
  options.limits.max_loop_iterations = 10;
  absl::StatusOr<std::string> out = t->Render(r, options);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("loop iterations"));
  EXPECT_EQ(t->Render(r)->size(), 100u);
}

// ---------------------------------------------------------------------------------------------
// Real templates against Jinja2's renderings

TEST(ChatTemplateModelsTest, Llama3) {
  using testing::kLlama3Config;
  EXPECT_EQ(*Render(kLlama3Config, R"([{"role": "system", "content": "You are terse."},
                                       {"role": "user", "content": "  Hi there \n"}])"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are "
            "terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi "
            "there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // A null content goes through `trim` as str(None).
  EXPECT_EQ(*Render(kLlama3Config, R"([{"role": "user", "content": "héllo 🌍"},
                                       {"role": "assistant", "content": null},
                                       {"role": "user", "content": "again"}])"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhéllo "
            "🌍<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nNone<|eot_id|><|start_"
            "header_id|>user<|end_header_id|>\n\nagain<|eot_id|><|start_header_id|>assistant<|"
            "end_header_id|>\n\n");
}

TEST(ChatTemplateModelsTest, Llama31) {
  using testing::kLlama31Config;
  EXPECT_EQ(*Render(kLlama31Config,
                    R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}])",
                    /*add_generation_prompt=*/false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|><|start_"
            "header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>");
  EXPECT_EQ(*Render(kLlama31Config,
                    R"([{"role": "system", "content": ""}, {"role": "user", "content": "x"}])"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n<|eot_id|><|start_"
            "header_id|>user<|end_header_id|>\n\nx<|eot_id|><|start_header_id|>assistant<|end_"
            "header_id|>\n\n");
}

TEST(ChatTemplateModelsTest, Qwen3SystemReasoningAndKwargs) {
  using testing::kQwen3Config;
  EXPECT_EQ(*Render(kQwen3Config, R"([{"role": "system", "content": "Be kind."},
                                      {"role": "user", "content": "Hello"}])"),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_"
            "start|>assistant\n");
  EXPECT_EQ(*Render(kQwen3Config, R"([
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
                {"role": "user", "content": "3+3?"},
                {"role": "assistant", "content": "<think>\nSix.\n</think>\n\n6"}])",
                    /*add_generation_prompt=*/false),
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>"
            "user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\nSix.\n</think>\n\n6<|im_end|>\n");
  EXPECT_EQ(*Render(kQwen3Config, R"([{"role": "user", "content": "Hi"}])", true, "",
                    R"({"enable_thinking": false})"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplateModelsTest, Qwen3ToolsCallsAndResults) {
  using testing::kQwen3Config;
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather in a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  const std::string messages = R"([
      {"role": "user", "content": "Weather in Paris and Rome?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "c1", "type": "function",
           "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
          {"id": "c2", "type": "function",
           "function": {"name": "get_weather", "arguments": {"city": "Rome", "unit": "°C"}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "18"},
      {"role": "tool", "tool_call_id": "c2", "content": "21"}])";
  EXPECT_EQ(
      *Render(kQwen3Config, messages, true, tools),
      "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
      "query.\n\nYou are provided with function signatures within <tools></tools> XML "
      "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
      "\"description\": \"Weather in a city\", \"parameters\": {\"type\": \"object\", "
      "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
      "[\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function "
      "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris and "
      "Rome?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": "
      "\"°C\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18\n</"
      "tool_response>\n<tool_response>\n21\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateModelsTest, Qwen3RaisesOnContentPartsAsJinja2Does) {
  // Jinja2: UndefinedError "'list object' has no attribute 'startswith'" (the template calls
  // content.startswith on every user message).
  ExpectInvalid(Render(testing::kQwen3Config,
                       R"([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])"),
                "has no attribute 'startswith'");
}

// ---------------------------------------------------------------------------------------------
// Builtin

TEST(ChatTemplateBuiltinTest, RendersWhatThePlainTemplateDid) {
  // router/chat_template.cc's `plain` (removed in issue 14): "ROLE: CONTENT\n" per message,
  // developer shown as system, text parts joined, absent content empty; then "assistant:".
  std::shared_ptr<const ChatTemplate> t = ChatTemplate::Builtin();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(ChatTemplate::Builtin(), t);
  ChatRequest r;
  r.messages_json = R"([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}])";
  EXPECT_EQ(*t->Render(r), "system: S\nuser: hi\nassistant:");
  r.messages_json = R"([{"role": "developer", "content": "S"},
      {"role": "user", "content": [{"type": "text", "text": "a"},
                                   {"type": "image_url", "image_url": {}},
                                   {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null}, {"role": "assistant"},
      {"role": "tool", "content": ""}])";
  EXPECT_EQ(*t->Render(r), "system: S\nuser: ab\nassistant: \nassistant: \ntool: \nassistant:");
  r.add_generation_prompt = false;
  EXPECT_EQ(*t->Render(r), "system: S\nuser: ab\nassistant: \nassistant: \ntool: \n");
  r.messages_json = "[]";
  EXPECT_EQ(*t->Render(r), "");
  r.messages_json = R"([{"role": "user\nassistant", "content": "x"}])";
  ExpectInvalid(t->Render(r), "messages[0].role must be");
}

}  // namespace
}  // namespace carpool::text
