// `carpool bench serve --backend http`: requests through the router's OpenAI-compatible gateway
// (POST /v1/completions, stream: true), timed from the SSE chunks.
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/bench_serve_runner.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace carpool::client::bench {
namespace {

using nlohmann::json;

class HttpSender : public RequestSender {
 public:
  explicit HttpSender(HttpSenderOptions options) : options_(std::move(options)) {}

  absl::StatusOr<SendResult> Send(const BenchRequest& request,
                                  const std::function<void(int)>& on_chunk) override {
    json body{{"max_tokens", request.output_len},
              {"temperature", options_.temperature},
              {"ignore_eos", options_.ignore_eos},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              // logprobs: 0 puts each chunk's tokens in it, so chunks are counted exactly.
              {"logprobs", 0}};
    if (!options_.model.empty()) body["model"] = options_.model;
    if (request.has_text) {
      body["prompt"] = request.text;
    } else {
      body["prompt"] = request.token_ids;
    }
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
    if (!options_.api_key.empty()) {
      req.headers.emplace("Authorization", absl::StrCat("Bearer ", options_.api_key));
    }
    req.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
    std::string buffer, error;
    SendResult result;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      buffer.append(data, len);
      for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
        const std::string event = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
        json j = json::parse(event.substr(6), nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) continue;
        if (j.contains("error")) {
          error = j["error"].value("message", "error event");
          continue;
        }
        if (j.contains("usage") && j["usage"].is_object()) {
          result.prompt_tokens = j["usage"].value("prompt_tokens", 0);
          result.completion_tokens = j["usage"].value("completion_tokens", 0);
        }
        if (!j.contains("choices") || j["choices"].empty()) continue;
        const json& lp = j["choices"][0]["logprobs"];
        const int n = lp.is_object() ? static_cast<int>(lp["tokens"].size()) : 0;
        if (n > 0) on_chunk(n);
      }
      return true;
    };
    std::unique_ptr<httplib::Client> client = Take();
    httplib::Response res;
    httplib::Error http_error = httplib::Error::Success;
    const bool sent = client->send(req, res, http_error);
    Give(std::move(client));
    if (!sent) return absl::UnavailableError(httplib::to_string(http_error));
    if (res.status != 200) {
      return absl::UnavailableError(absl::StrCat("HTTP ", res.status, ": ", buffer, res.body));
    }
    if (!error.empty()) return absl::InternalError(error);
    return result;
  }

 private:
  // Keep-alive connections are reused across requests, one per request in flight.
  std::unique_ptr<httplib::Client> Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        return c;
      }
    }
    auto c = std::make_unique<httplib::Client>(options_.url);
    c->set_keep_alive(true);
    c->set_tcp_nodelay(true);
    const time_t s = static_cast<time_t>(options_.timeout_ms / 1000);
    c->set_read_timeout(s, 0);
    c->set_write_timeout(s, 0);
    return c;
  }
  void Give(std::unique_ptr<httplib::Client> c) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(c));
  }

  const HttpSenderOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<httplib::Client>> idle_;
};

}  // namespace

std::unique_ptr<RequestSender> NewHttpSender(const HttpSenderOptions& options) {
  return std::make_unique<HttpSender>(options);
}

}  // namespace carpool::client::bench
