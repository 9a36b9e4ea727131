// The HTTP gateway in process against a real Router (inproc, with and without CURVE) and a
// simulated worker: routes, SSE framing, connection limits. The Python suite (tests/http) covers
// the rest against carpool-router and carpool-worker processes.
#include "router/http_gateway.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
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

}  // namespace
}  // namespace carpool::router
