// The HTTP gateway in process against a real Router (inproc, with and without CURVE) and a
// simulated worker: routes, SSE framing, connection limits; and against a fake router
// (client/fake_router_test_util.h) for what it sends the router and how it reads the answers
// (/tokenize, /detokenize, the text options of a generation). The Python suite (tests/http) covers
// the rest against carpool-router and carpool-worker processes.
#include "router/http_gateway.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "client/fake_router_test_util.h"
#include "router/router.h"
#include "router/testing/sim_worker.h"
#include "common/transport.h"

namespace carpool::router {
namespace {

using nlohmann::json;

class HttpGatewayTest : public ::testing::Test {
 protected:
  void Start(bool curve, int max_connections = 8) {
    RouterOptions o;
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    if (curve) {
      auto server = GenerateCurveKeyPair();
      auto other = GenerateCurveKeyPair();
      ASSERT_TRUE(server.ok() && other.ok());
      o.curve_secret_key = server->secret_key;
      o.curve_allowed_client_keys = {other->public_key};
    }
    auto router = Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
    HttpGatewayOptions h;
    h.listen = "127.0.0.1:0";
    h.router_endpoint = router_->inproc_endpoint();
    h.zmq_context = router_->zmq_context();
    h.server.max_connections = max_connections;
    h.server.idle_timeout_ms = 1000;
    h.metrics = [] { return std::string("carpool_test_metric 1\n"); };
    auto gateway = HttpGateway::Start(h);
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = std::move(*gateway);
  }
  void StartWorker() {
    worker_ = std::make_unique<testing::SimWorker>(router_->backend_endpoint(),
                                                   testing::SimWorkerOptions());
  }
  void TearDown() override {
    gateway_.reset();
    worker_.reset();
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  httplib::Client Http() {
    httplib::Client c("127.0.0.1", gateway_->port());
    c.set_read_timeout(10, 0);
    return c;
  }
  // Polls /ready until 200 (a worker registered) or ~5 s.
  bool WaitReady() {
    httplib::Client c = Http();
    for (int i = 0; i < 100; ++i) {
      auto res = c.Get("/ready");
      if (res && res->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  std::unique_ptr<Router> router_;
  std::thread thread_;
  std::unique_ptr<testing::SimWorker> worker_;
  std::unique_ptr<HttpGateway> gateway_;
};

TEST_F(HttpGatewayTest, ServesOverInprocUnderCurve) {
  Start(/*curve=*/true);
  httplib::Client c = Http();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto not_ready = c.Get("/ready");  // the router answers, but has no worker
  ASSERT_TRUE(not_ready);
  EXPECT_EQ(not_ready->status, 503);
  EXPECT_EQ(not_ready->get_header_value("Retry-After"), "1");
  StartWorker();
  ASSERT_TRUE(WaitReady());
  auto res = c.Post("/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 4})",
                    "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST_F(HttpGatewayTest, StreamsServerSentEvents) {
  Start(/*curve=*/false);
  StartWorker();
  ASSERT_TRUE(WaitReady());
  httplib::Client c = Http();
  auto res = c.Post(
      "/v1/completions",
      R"({"prompt": [1, 2], "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}})",
      "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_THAT(res->get_header_value("Content-Type"), ::testing::HasSubstr("text/event-stream"));
  std::vector<json> events;
  bool done = false;
  size_t pos = 0;
  while (pos < res->body.size()) {
    const size_t end = res->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string event = res->body.substr(pos, end - pos);
    pos = end + 2;
    if (event[0] == ':') continue;
    ASSERT_EQ(event.rfind("data: ", 0), 0u) << event;
    if (event == "data: [DONE]") {
      done = true;
      continue;
    }
    EXPECT_FALSE(done) << "an event after [DONE]";
    events.push_back(json::parse(event.substr(6)));
  }
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 5);
}

TEST_F(HttpGatewayTest, ErrorsAndRoutes) {
  Start(/*curve=*/false);
  StartWorker();
  ASSERT_TRUE(WaitReady());
  httplib::Client c = Http();
  auto bad = c.Post("/v1/completions", "{", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["code"], "invalid_argument");
  auto unknown = c.Post("/v1/completions", R"({"model": "nope", "prompt": [1]})",
                        "application/json");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(json::parse(unknown->body)["error"]["code"], "model_not_found");
  EXPECT_EQ(json::parse(unknown->body)["error"]["param"], "model");
  auto n2 = c.Post("/v1/completions", R"({"prompt": [1], "n": 2})", "application/json");
  ASSERT_TRUE(n2);
  EXPECT_EQ(n2->status, 400);
  EXPECT_EQ(json::parse(n2->body)["error"]["param"], "n");
  EXPECT_TRUE(json::parse(bad->body)["error"]["param"].is_null());
  auto route = c.Get("/v2/nothing");
  ASSERT_TRUE(route);
  EXPECT_EQ(route->status, 404);
  EXPECT_EQ(json::parse(route->body)["error"]["code"], "not_found");
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, ::testing::HasSubstr("carpool_test_metric 1"));
  EXPECT_THAT(metrics->body, ::testing::HasSubstr("carpool_http_responses_total{route=\"/v1/completions\",code=\"404\"} 1"));
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4");
}

TEST_F(HttpGatewayTest, TokenizeAndDetokenizeThroughTheRouter) {
  Start(/*curve=*/false);
  StartWorker();  // the byte tokenizer, max_model_len 4096
  ASSERT_TRUE(WaitReady());
  httplib::Client c = Http();
  auto res = c.Post("/tokenize", R"({"prompt": "hi"})", "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body),
            json::parse(R"({"count": 3, "max_model_len": 4096, "tokens": [256, 104, 105]})"));
  res = c.Post("/detokenize", R"({"tokens": [256, 104, 105]})", "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["prompt"], "<|256|>hi");
  res = c.Post("/detokenize", R"({"tokens": [104, 100000]})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_argument");
}

TEST_F(HttpGatewayTest, ConnectionsOverTheLimitGet503AtOnce) {
  Start(/*curve=*/false, /*max_connections=*/2);
  // Two idle keep-alive connections hold both slots.
  httplib::Client a = Http(), b = Http();
  a.set_keep_alive(true);
  b.set_keep_alive(true);
  ASSERT_TRUE(a.Get("/health"));
  ASSERT_TRUE(b.Get("/health"));
  httplib::Client c = Http();
  const auto start = std::chrono::steady_clock::now();
  auto res = c.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

// ---- against a fake router: tokenize, detokenize, and the text options of a generation

using FakeRouter = carpool::testing::FakeRouter;

// The fake router's stats list one worker serving `model`; everything else as FakeRouter::Echo
// unless `handler` answers it (returns true).
FakeRouter::Handler ServingModel(
    std::string model,
    std::function<bool(FakeRouter&, const std::string&, const ClientMessage&)> handler = {}) {
  return [model, handler](FakeRouter& r, const std::string& peer, const ClientMessage& m) {
    if (std::holds_alternative<StatsQuery>(m)) {
      StatsOut s = FakeRouter::CannedStats();
      s.workers.resize(1);
      s.workers[0].model = model;
      return r.Reply(peer, s);
    }
    if (handler && handler(r, peer, m)) return;
    FakeRouter::Echo(r, peer, m);
  };
}

class GatewayTextTest : public ::testing::Test {
 protected:
  void Start(FakeRouter::Handler handler) {
    router_ = std::make_unique<FakeRouter>(std::move(handler));
    HttpGatewayOptions h;
    h.listen = "127.0.0.1:0";
    h.router_endpoint = router_->endpoint();
    h.request_timeout_ms = 5000;
    auto gateway = HttpGateway::Start(h);
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = std::move(*gateway);
  }
  void TearDown() override { gateway_.reset(); }
  httplib::Result Post(const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", gateway_->port());
    c.set_read_timeout(10, 0);
    return c.Post(path, body, "application/json");
  }
  template <typename T>
  std::vector<T> Sent() const {
    std::vector<T> out;
    for (const ClientMessage& m : router_->Received()) {
      if (const auto* x = std::get_if<T>(&m)) out.push_back(*x);
    }
    return out;
  }

  std::unique_ptr<FakeRouter> router_;
  std::unique_ptr<HttpGateway> gateway_;
};

TEST_F(GatewayTextTest, TokenizeAndDetokenizeInVllmShapes) {
  Start(ServingModel("synthetic:tiny"));
  auto res = Post("/tokenize", R"({"prompt": "hi"})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body),
            json::parse(R"({"count": 3, "max_model_len": 2048, "tokens": [256, 104, 105]})"));
  res = Post("/tokenize", R"({"model": "synthetic:tiny", "prompt": "hi",
                              "add_special_tokens": false})");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["tokens"], json::parse("[104, 105]"));
  // Messages go to the router as a chat, for the model's template; no special tokens unless
  // asked (the ids /v1/chat/completions uses). This fake router "renders" a chat as its
  // messages' JSON.
  res = Post("/tokenize", R"({"messages": [{"role": "user", "content": "a"}]})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::string messages = R"([{"role":"user","content":"a"}])";
  EXPECT_EQ(json::parse(res->body)["count"], messages.size());
  res = Post("/tokenize", R"({"messages": [{"role": "user", "content": "a"}],
                              "add_generation_prompt": false, "add_special_tokens": true,
                              "chat_template_kwargs": {"k": 1}})");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["count"], 1 + messages.size());
  std::vector<TokenizeInput> sent = Sent<TokenizeInput>();
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(sent[0].model, "synthetic:tiny");  // the served model, named
  EXPECT_TRUE(sent[0].add_special_tokens);
  EXPECT_FALSE(sent[0].chat.has_value());
  ASSERT_TRUE(sent[2].chat.has_value());
  EXPECT_EQ(sent[2].text, "");
  EXPECT_EQ(sent[2].chat->messages_json, messages);
  EXPECT_TRUE(sent[2].chat->add_generation_prompt);
  EXPECT_FALSE(sent[2].add_special_tokens);
  ASSERT_TRUE(sent[3].chat.has_value());
  EXPECT_FALSE(sent[3].chat->add_generation_prompt);
  EXPECT_TRUE(sent[3].add_special_tokens);
  EXPECT_EQ(sent[3].chat->chat_template_kwargs_json, R"({"k":1})");

  res = Post("/detokenize", R"({"model": "synthetic:tiny", "tokens": [256, 111, 107]})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body), json::parse(R"({"prompt": "<|256|>ok"})"));
  ASSERT_EQ(Sent<DetokenizeInput>().size(), 1u);
  EXPECT_FALSE(Sent<DetokenizeInput>()[0].skip_special_tokens);
}

TEST_F(GatewayTextTest, TokenizeErrorsAreOpenAiErrors) {
  Start(ServingModel("synthetic:tiny"));
  const auto error_of = [](const httplib::Result& res) { return json::parse(res->body)["error"]; };
  auto res = Post("/tokenize", R"({"model": "other", "prompt": "x"})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(error_of(res)["code"], "model_not_found");
  EXPECT_EQ(error_of(res)["param"], "model");
  res = Post("/tokenize", R"({"prompt": 3})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(error_of(res)["param"], "prompt");
  res = Post("/detokenize", R"({"tokens": [1, "x"]})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(error_of(res)["param"], "tokens");
  EXPECT_EQ(error_of(res)["type"], "invalid_request_error");
  httplib::Client c("127.0.0.1", gateway_->port());
  auto get = c.Get("/tokenize");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(get->get_header_value("Allow"), "POST");
  EXPECT_TRUE(Sent<TokenizeInput>().empty());  // none of these reached the router
  EXPECT_TRUE(Sent<DetokenizeInput>().empty());
}

TEST_F(GatewayTextTest, RouterErrorsOfTokenizeMapToHttp) {
  Start(ServingModel("synthetic:tiny", [](FakeRouter& r, const std::string& peer,
                                          const ClientMessage& m) {
    if (const auto* t = std::get_if<TokenizeInput>(&m)) {
      r.Reply(peer, ErrorInfo{t->request_id, absl::StatusCode::kInvalidArgument,
                              reason::kInvalidArgument, "text is not valid UTF-8 at byte 3", 0});
      return true;
    }
    if (const auto* d = std::get_if<DetokenizeInput>(&m)) {
      r.Reply(peer, ErrorInfo{d->request_id, absl::StatusCode::kFailedPrecondition, "",
                              "model 'm' has no tokenizer: pass token ids", 0});
      return true;
    }
    return false;
  }));
  auto res = Post("/tokenize", R"({"prompt": "abc"})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "invalid_argument");
  EXPECT_EQ(e["message"], "text is not valid UTF-8 at byte 3");
  EXPECT_EQ(e["type"], "invalid_request_error");
  res = Post("/detokenize", R"({"tokens": [1]})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_THAT(json::parse(res->body)["error"]["message"].get<std::string>(),
              ::testing::HasSubstr("no tokenizer"));
}

TEST_F(GatewayTextTest, GenerationSendsModelStopAndTextOptions) {
  Start(ServingModel("synthetic:tiny"));
  auto res = Post("/v1/completions", R"({"prompt": "hello", "max_tokens": 8, "stop": ["ll"],
                                         "include_stop_str_in_output": true,
                                         "skip_special_tokens": false})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  // Stop strings are the router's to match: this fake one ignores them, so the whole echo
  // comes back, the byte tokenizer's model too.
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], "hello");
  EXPECT_EQ(json::parse(res->body)["choices"][0]["finish_reason"], "length");
  res = Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
                                         "stop": "zz"})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::vector<GenerateInput> sent = Sent<GenerateInput>();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].model, "synthetic:tiny");
  EXPECT_EQ(sent[0].stop, (std::vector<std::string>{"ll"}));
  EXPECT_TRUE(sent[0].include_stop_str_in_output);
  EXPECT_FALSE(sent[0].skip_special_tokens);
  EXPECT_EQ(sent[1].stop, (std::vector<std::string>{"zz"}));
  EXPECT_FALSE(sent[1].include_stop_str_in_output);
  EXPECT_TRUE(sent[1].skip_special_tokens);
}

// The router makes the text, matches the stop strings and reports the finish; the gateway
// passes its text, finish_reason and usage on as they are (here for a model with a real
// tokenizer; the byte tokenizer's models the same, above).
TEST_F(GatewayTextTest, TakesTheRoutersTextAndStop) {
  Start(ServingModel("/models/llama-3", [](FakeRouter& r, const std::string& peer,
                                           const ClientMessage& m) {
    const auto* g = std::get_if<GenerateInput>(&m);
    if (g == nullptr) return false;
    SampleResult t;
    t.token = 1000;
    GenerateFinalOut f;
    f.request_id = g->request_id;
    f.finish_reason = "stop";
    f.stop_string = "END";
    f.usage = {7, 2, 0};
    // The text holds what would be a stop string were the gateway to look: it must not.
    if (g->stream) {
      r.Reply(peer, GenerateChunkOut{g->request_id, 0, {t}, "caf\xc3\xa9 "});
      r.Reply(peer, GenerateChunkOut{g->request_id, 1, {t}, "STOP"});
    } else {
      f.tokens = {t, t};
      f.text = "caf\xc3\xa9 STOP";
    }
    r.Reply(peer, f);
    return true;
  }));
  auto res = Post("/v1/completions", R"({"prompt": "x", "stop": ["STOP", "END"]})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], "caf\xc3\xa9 STOP");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["model"], "/models/llama-3");
  res = Post("/v1/completions", R"({"prompt": "x", "stop": "STOP", "stream": true,
                                    "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::string text;
  std::string finish;
  int prompt_tokens = -1;
  for (size_t pos = 0; pos < res->body.size();) {
    const size_t end = res->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string event = res->body.substr(pos, end - pos);
    pos = end + 2;
    if (event[0] == ':' || event == "data: [DONE]") continue;
    json e = json::parse(event.substr(6));
    if (e.contains("usage") && e["usage"].is_object()) prompt_tokens = e["usage"]["prompt_tokens"];
    if (e["choices"].empty()) continue;
    text += e["choices"][0]["text"].get<std::string>();
    if (e["choices"][0]["finish_reason"].is_string()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "caf\xc3\xa9 STOP");
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(prompt_tokens, 7);
}

// ---- chat (issue 14): what /v1/chat/completions sends the router

TEST_F(GatewayTextTest, ChatSendsMessagesToolsAndKwargsAsTheyCame) {
  Start(ServingModel("synthetic:tiny"));
  auto res = Post("/v1/chat/completions",
                  R"({"messages": [{"role": "user", "content": "hi", "name": "zed"}],
                      "tools": [{"type": "function", "function": {"name": "get_weather",
                                 "parameters": {"type": "object", "properties": {}}}}],
                      "tool_choice": "none", "chat_template_kwargs": {"enable_thinking": false},
                      "add_generation_prompt": true, "max_tokens": 3})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  res = Post("/v1/chat/completions",
             R"({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                 "add_generation_prompt": false, "max_tokens": 3})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::vector<GenerateInput> sent = Sent<GenerateInput>();
  ASSERT_EQ(sent.size(), 2u);
  ASSERT_TRUE(sent[0].chat.has_value());
  EXPECT_FALSE(sent[0].has_text);
  EXPECT_EQ(sent[0].chat->messages_json, R"([{"role":"user","content":"hi","name":"zed"}])");
  EXPECT_EQ(sent[0].chat->tools_json,
            R"([{"type":"function","function":{"name":"get_weather",)"
            R"("parameters":{"type":"object","properties":{}}}}])");
  EXPECT_EQ(sent[0].chat->chat_template_kwargs_json, R"({"enable_thinking":false})");
  EXPECT_TRUE(sent[0].chat->add_generation_prompt);
  ASSERT_TRUE(sent[1].chat.has_value());
  EXPECT_TRUE(sent[1].stream);
  EXPECT_FALSE(sent[1].chat->add_generation_prompt);
  EXPECT_EQ(sent[1].chat->tools_json, "");
  EXPECT_EQ(sent[1].chat->chat_template_kwargs_json, "");
}

TEST_F(GatewayTextTest, ToolChoiceOtherThanNoneAndBadKwargsAre400sNamingThem) {
  Start(ServingModel("synthetic:tiny"));
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  struct Case {
    std::string extra;
    std::string param;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"("tool_choice": "auto")", "tool_choice",
       "\"auto\" is not supported: carpool does not parse tool calls from the output; send "
       "tool_choice \"none\""},
      {R"("tool_choice": "required")", "tool_choice", "\"required\" is not supported"},
      {R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})",
       "tool_choice", "\"function get_weather\" is not supported"},
      {R"("chat_template_kwargs": "thinking")", "chat_template_kwargs", "must be an object"},
      {R"("messages": [{"role": "robot", "content": "x"}])", "messages[0].role", "robot"},
  };
  for (const Case& c : cases) {
    const std::string body = c.extra.rfind("\"messages\"", 0) == 0
                                 ? "{" + c.extra + "}"
                                 : "{" + messages + ", " + c.extra + "}";
    for (bool stream : {false, true}) {
      std::string b = body;
      if (stream) b.insert(1, R"("stream": true, )");
      auto res = Post("/v1/chat/completions", b);
      ASSERT_TRUE(res);
      EXPECT_EQ(res->status, 400) << b;
      json e = json::parse(res->body)["error"];
      EXPECT_EQ(e["param"], c.param) << b;
      EXPECT_EQ(e["type"], "invalid_request_error");
      EXPECT_EQ(e["code"], "invalid_argument");
      EXPECT_THAT(e["message"].get<std::string>(), ::testing::HasSubstr(c.message)) << b;
    }
  }
  EXPECT_TRUE(Sent<GenerateInput>().empty());  // none reached the router
}

// Against the real router: a synthetic model's chat is the built-in template's text, the bytes
// the gateway's old "plain" template made, now without the BOS (the template writes none).
TEST_F(HttpGatewayTest, ChatAndTokenizeOfASyntheticModelUseTheBuiltInTemplate) {
  Start(/*curve=*/false);
  StartWorker();
  ASSERT_TRUE(WaitReady());
  httplib::Client c = Http();
  auto res = c.Post("/tokenize",
                    R"({"messages": [{"role": "system", "content": "s"},
                                     {"role": "user", "content": "a"}]})",
                    "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::string rendered = "system: s\nuser: a\nassistant:";
  EXPECT_EQ(json::parse(res->body)["tokens"],
            json(std::vector<int>(rendered.begin(), rendered.end())));
  res = c.Post("/v1/chat/completions",
               R"({"messages": [{"role": "system", "content": "s"},
                                {"role": "user", "content": "a"}], "max_tokens": 2})",
               "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["usage"]["prompt_tokens"], rendered.size());
  // The template's own checks come back as 400s too.
  res = c.Post("/v1/chat/completions",
               R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
                   "chat_template_kwargs": {"messages": []}})",
               "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_argument");
  // Streamed too: the router's refusal comes before the first chunk, so it keeps its status.
  res = c.Post("/v1/chat/completions",
               R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 2,
                   "stream": true, "chat_template_kwargs": {"tools": []}})",
               "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_THAT(json::parse(res->body)["error"]["message"].get<std::string>(),
              ::testing::HasSubstr("chat_template_kwargs"));
}

}  // namespace
}  // namespace carpool::router
