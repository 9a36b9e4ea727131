// Chat prompts in the router, in-process against scripted workers: a conversation rendered with
// the chat template its model's worker handed over (tokenizer_config.json, on the tokenizer
// pool) and tokenized without special tokens; the byte models' built-in template; the errors
// (no template, a template that did not load, a bad message, raise_exception, a render stopped by
// its limits while the router goes on serving); Tokenize with a chat.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/router.h"
#include "router/testing/scripted_router.h"
#include "text/hf_tokenizer.h"
#include "text/json_util.h"
#include "text/test_tokenizer_json.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

// The test vocabulary's template: BOS written by the template (as Llama 3's does), a role
// header per message, the tools and one kwarg when given.
constexpr char kTemplate[] =
    "{{ bos_token }}"
    "{% if tools %}[tools {{ tools | tojson }}]{% endif %}"
    "{% for m in messages %}"
    "{% if m.role not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user or assistant, not ' + m.role) }}"
    "{% endif %}"
    "<{{ m.role }}>{{ m.content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
    "{% if mood is defined %}({{ mood }}){% endif %}";

std::string ConfigWith(const std::string& chat_template) {
  text::Json config = {{"bos_token", "<|bos|>"}, {"eos_token", "<|eos|>"}};
  if (!chat_template.empty()) config["chat_template"] = chat_template;
  return config.dump();
}

ChatInput Chat(const std::string& messages_json) {
  ChatInput c;
  c.messages_json = messages_json;
  return c;
}

class RouterChatTest : public ScriptedRouterTest {
 protected:
  void StartRouter() {
    RouterOptions o;
    o.heartbeat_timeout_ms = 60'000;
    o.tokenizer_threads = 2;
    o.chat_render = render_;
    ScriptedRouterTest::StartRouter(std::move(o));
  }

  // A worker of `model` handing over the test vocabulary and `config` as its
  // tokenizer_config.json.
  FakeWorker StartHfWorker(const std::string& id, const std::string& model,
                           const std::string& config) {
    RegisterInfo r = FakeRegistration(id);
    r.model = model;
    r.tokenizer = TokenizerKind::kHuggingFace;
    r.tokenizer_json = text::TestTokenizerJson().dump();
    r.tokenizer_config_json = config;
    r.max_model_len = 4096;
    r.num_kv_blocks = 1000;
    return StartWorker(r);
  }

  // The ids of `text` in the test vocabulary, as Hugging Face's encode gives them.
  static std::vector<int32_t> Ids(const std::string& text, bool add_special_tokens) {
    auto t = text::HfTokenizer::FromJson(text::TestTokenizerJson().dump(), ConfigWith(""));
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    absl::StatusOr<std::vector<int32_t>> ids = (*t)->Encode(text, add_special_tokens);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  static GenerateInput ChatRequest(const std::string& id, ChatInput chat, const std::string& model,
                                   int max_tokens = 2) {
    GenerateInput g = Request(id, {}, max_tokens, /*stream=*/false);
    g.chat = std::move(chat);
    g.model = model;
    return g;
  }

  static TokenizeInput TokenizeChat(const std::string& id, ChatInput chat,
                                    const std::string& model) {
    TokenizeInput t;
    t.request_id = id;
    t.model = model;
    t.chat = std::move(chat);
    t.add_special_tokens = false;
    return t;
  }

  text::jinja::RenderOptions render_;
};

TEST_F(RouterChatTest, AChatIsRenderedWithTheModelsTemplateAndTokenizedWithoutSpecialTokens) {
  StartRouter();
  FakeWorker w = StartHfWorker("w1", "bpe", ConfigWith(kTemplate));
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  const std::string messages =
      R"([{"role": "system", "content": "hi"}, {"role": "user", "content": "hi hi"}])";
  SendClient(client.get(), ChatRequest("r1", Chat(messages), "bpe"));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  // The template wrote <|bos|> (258) itself: once, not again by the tokenizer's post-processor.
  const std::string rendered = "<|bos|><system>hi<user>hi hi<assistant>";
  EXPECT_EQ(d.prompt_tokens, Ids(rendered, /*add_special_tokens=*/false));
  ASSERT_FALSE(d.prompt_tokens.empty());
  EXPECT_EQ(d.prompt_tokens[0], 258);
  EXPECT_EQ(std::count(d.prompt_tokens.begin(), d.prompt_tokens.end(), 258), 1);
  w.Send(StepTokensInfo{w.epoch, {Token(d.dispatch_id, 'o'), Token(d.dispatch_id, 'k', true)}, {}});
  GenerateFinalOut f = RecvClientAs<GenerateFinalOut>(client.get());
  EXPECT_EQ(f.text, "ok");
  EXPECT_EQ(f.usage.prompt_tokens, static_cast<int>(d.prompt_tokens.size()));

  // Tokenize with the same chat gives the ids the generate request got.
  SendClient(client.get(), TokenizeChat("t1", Chat(messages), "bpe"));
  EXPECT_EQ(RecvClientAs<TokenizeResultOut>(client.get()).token_ids, d.prompt_tokens);
  // Without the generation prompt, with tools and a kwarg: all reach the template.
  ChatInput more = Chat(R"([{"role": "user", "content": "hi"}])");
  more.add_generation_prompt = false;
  more.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
  more.chat_template_kwargs_json = R"({"mood": "calm"})";
  SendClient(client.get(), TokenizeChat("t2", more, "bpe"));
  EXPECT_EQ(RecvClientAs<TokenizeResultOut>(client.get()).token_ids,
            Ids(R"(<|bos|>[tools [{"type": "function", "function": {"name": "f"}}]]<user>hi(calm))",
                false));
  // add_special_tokens asked for: the tokenizer's BOS on top, as transformers would.
  TokenizeInput both = TokenizeChat("t3", Chat(R"([{"role": "user", "content": "hi"}])"), "bpe");
  both.add_special_tokens = true;
  SendClient(client.get(), both);
  EXPECT_EQ(RecvClientAs<TokenizeResultOut>(client.get()).token_ids,
            Ids("<|bos|><user>hi<assistant>", true));
}

TEST_F(RouterChatTest, ByteModelsChatWithTheBuiltInTemplate) {
  StartRouter();
  FakeWorker w = StartWorker("w1");  // "fake": the byte tokenizer
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), ChatRequest("r1", Chat(R"([{"role": "developer", "content": "be"},
                                  {"role": "user", "content": [{"type": "text", "text": "a"},
                                                               {"type": "text", "text": "b"}]}])"),
                                       "", /*max_tokens=*/2));
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  const std::string rendered = "system: be\nuser: ab\nassistant:";
  EXPECT_EQ(d.prompt_tokens, std::vector<int32_t>(rendered.begin(), rendered.end()));
}

TEST_F(RouterChatTest, AModelWithoutATemplateRefusesChatsClearlyAndServesText) {
  StartRouter();
  FakeWorker w = StartHfWorker("w1", "bare", ConfigWith(""));
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(),
             ChatRequest("r1", Chat(R"([{"role": "user", "content": "hi"}])"), "bare"));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.reason, reason::kInvalidArgument);
  EXPECT_THAT(e.message, HasSubstr("model 'bare' has no chat template (tokenizer_config.json has "
                                   "no chat_template and the folder no chat_template.jinja): "
                                   "start the router with --chat-template FILE"));
  SendClient(client.get(),
             TokenizeChat("t1", Chat(R"([{"role": "user", "content": "hi"}])"), "bare"));
  EXPECT_THAT(RecvError(client.get()).message, HasSubstr("has no chat template"));
  GenerateInput text = Request("r2", {}, 1, false);
  text.has_text = true;
  text.text = "hi";
  text.model = "bare";
  SendClient(client.get(), text);
  EXPECT_EQ(w.RecvAs<DispatchInfo>().prompt_tokens, Ids("hi", true));
}

TEST_F(RouterChatTest, ATemplateThatDoesNotParseIsReportedAtLoadNamingTheConstruct) {
  StartRouter();
  FakeWorker w = StartHfWorker("w1", "broken", ConfigWith("hello\n{% include 'x.jinja' %}"));
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(),
             ChatRequest("r1", Chat(R"([{"role": "user", "content": "hi"}])"), "broken"));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.message, HasSubstr("the chat template of model 'broken' did not load"));
  EXPECT_THAT(e.message, HasSubstr("line 2"));
  EXPECT_THAT(e.message, HasSubstr("include"));
}

TEST_F(RouterChatTest, BadMessagesAndRaiseExceptionAreInvalidArgumentWithTheirMessage) {
  StartRouter();
  FakeWorker w = StartHfWorker("w1", "bpe", ConfigWith(kTemplate));
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  const auto error_of = [&](const std::string& id, const ChatInput& chat) {
    SendClient(client.get(), ChatRequest(id, chat, "bpe"));
    ErrorInfo e = RecvError(client.get());
    EXPECT_EQ(e.request_id, id);
    EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument) << e.message;
    EXPECT_EQ(e.reason, reason::kInvalidArgument) << e.message;
    return e.message;
  };
  EXPECT_THAT(error_of("role", Chat(R"([{"role": "banana", "content": "x"}])")),
              HasSubstr("messages[0].role"));
  EXPECT_THAT(error_of("content", Chat(R"([{"role": "user", "content": 7}])")),
              HasSubstr("messages[0].content"));
  EXPECT_THAT(error_of("json", Chat(R"({"role": "user"})")), HasSubstr("messages"));
  ChatInput kwargs = Chat(R"([{"role": "user", "content": "x"}])");
  kwargs.chat_template_kwargs_json = "[1]";
  EXPECT_THAT(error_of("kwargs", kwargs), HasSubstr("chat_template_kwargs"));
  // A role the template itself refuses: its raise_exception message.
  EXPECT_THAT(error_of("raise", Chat(R"([{"role": "tool", "content": "x"}])")),
              HasSubstr("roles are system, user or assistant, not tool"));
  // Nothing of these reached the worker; a good chat still does.
  SendClient(client.get(),
             ChatRequest("ok", Chat(R"([{"role": "user", "content": "hi"}])"), "bpe"));
  EXPECT_EQ(w.RecvAs<DispatchInfo>().prompt_tokens, Ids("<|bos|><user>hi<assistant>", false));
}

// A template that would loop (nearly) forever is stopped by the render's time limit and
// answers INVALID_ARGUMENT; the tokenizer pool's other thread serves the other requests
// meanwhile, and the router afterwards.
TEST_F(RouterChatTest, ALoopingTemplateIsStoppedByItsLimitWhileOthersAreServed) {
  render_.limits.max_loop_iterations = int64_t{1} << 60;
  render_.limits.max_run_time_us = 500'000;
  StartRouter();
  const std::string looping =
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}x";
  FakeWorker w = StartHfWorker("w1", "loop", ConfigWith(looping));
  FakeWorker b = StartHfWorker("w2", "bpe", ConfigWith(kTemplate));
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(),
             ChatRequest("loop", Chat(R"([{"role": "user", "content": "hi"}])"), "loop"));
  // Served while the render runs: a chat of another model and a text prompt of the same one.
  SendClient(client.get(),
             ChatRequest("chat", Chat(R"([{"role": "user", "content": "hi"}])"), "bpe"));
  EXPECT_EQ(b.RecvAs<DispatchInfo>().prompt_tokens, Ids("<|bos|><user>hi<assistant>", false));
  GenerateInput text = Request("text", {}, 1, false);
  text.has_text = true;
  text.text = "hi";
  text.model = "loop";
  SendClient(client.get(), text);
  EXPECT_EQ(w.RecvAs<DispatchInfo>().prompt_tokens, Ids("hi", true));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.request_id, "loop");
  EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.reason, reason::kInvalidArgument);
  EXPECT_THAT(e.message, HasSubstr("chat template: "));
  // The loop never reached a worker; the router still serves chats.
  SendClient(client.get(),
             ChatRequest("again", Chat(R"([{"role": "user", "content": "hi"}])"), "bpe"));
  EXPECT_EQ(b.RecvAs<DispatchInfo>().prompt_tokens, Ids("<|bos|><user>hi<assistant>", false));
  EXPECT_FALSE(w.Recv(150).has_value());
}

TEST_F(RouterChatTest, AnOutputPastItsLimitIsRefused) {
  render_.limits.max_output_bytes = 1000;
  StartRouter();
  FakeWorker w = StartHfWorker("w1", "big", ConfigWith("{% for i in range(500) %}abc{% endfor %}"));
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(),
             ChatRequest("big", Chat(R"([{"role": "user", "content": "hi"}])"), "big"));
  ErrorInfo e = RecvError(client.get());
  EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.message, HasSubstr("1000"));
  EXPECT_FALSE(w.Recv(100).has_value());
}

TEST_F(RouterChatTest, TheRoutersTemplateFileReplacesTheModels) {
  RouterOptions o;
  o.heartbeat_timeout_ms = 60'000;
  o.chat_template.override_source = "{% for m in messages %}[{{ m.content }}]{% endfor %}";
  ScriptedRouterTest::StartRouter(std::move(o));
  FakeWorker w = StartHfWorker("w1", "bpe", ConfigWith(kTemplate));
  FakeWorker bytes = StartWorker("w2");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(),
             ChatRequest("r1", Chat(R"([{"role": "user", "content": "hi"}])"), "bpe"));
  EXPECT_EQ(w.RecvAs<DispatchInfo>().prompt_tokens, Ids("[hi]", false));
  SendClient(client.get(),
             ChatRequest("r2", Chat(R"([{"role": "user", "content": "hi"}])"), "fake"));
  EXPECT_EQ(bytes.RecvAs<DispatchInfo>().prompt_tokens, (std::vector<int32_t>{'[', 'h', 'i', ']'}));
}

}  // namespace
}  // namespace carpool::router
