// The OpenAI-compatible HTTP gateway (docs/http.md): an event-driven HTTP/1.1 server
// (router/http_server.h) in front of the router core, which it reaches over inproc ZeroMQ as an
// ordinary carpool::Client.
//
//   POST /v1/completions, /v1/chat/completions   (stream: true -> server-sent events)
//   POST /v1/embeddings    GET /v1/models    GET /health    GET /ready    GET /metrics
//
// Connections cost memory, not threads: at most max_connections are open at once, and one more
// gets an immediate 503 (Retry-After: 1). A request head must arrive within idle_timeout_ms and
// its body within body_timeout_ms (else 408), so slow clients delay nobody. Requests run on at
// most max_concurrent_requests handler threads (a stream holds one until it ends).
//
// Thread-safe. Destroy it before the Router whose context it uses.
#ifndef CARPOOL_ROUTER_HTTP_GATEWAY_H_
#define CARPOOL_ROUTER_HTTP_GATEWAY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "router/chat_template.h"

namespace zmq {
class context_t;
}  // namespace zmq

namespace carpool::router {

struct HttpGatewayOptions {
  // host:port to listen on; port 0 picks a free one (see HttpGateway::port()).
  // Default: 127.0.0.1:8000.
  std::string listen = "127.0.0.1:8000";
  // The router core: its inproc endpoint and context (Router::inproc_endpoint(), zmq_context()).
  // Any router endpoint works with zmq_context null (tests). Required.
  std::string router_endpoint;
  zmq::context_t* zmq_context = nullptr;  // not owned
  // Connections open at once (idle keep-alive ones included). Default: 10000.
  int max_connections = 10000;
  // Requests handled at once (one thread each; a stream holds its thread until it ends); one
  // more gets 503 at once. Default: 1024.
  int max_concurrent_requests = 1024;
  // Largest request body (decoded, whatever the framing); larger ones get 413. Default: 1 MiB.
  int64_t max_body_bytes = 1 << 20;
  // Largest request header block (request line + headers); larger ones get 431.
  // Default: 16 KiB.
  int64_t max_header_bytes = 16 << 10;
  // A request head must arrive within this of the connection's start or of the previous
  // answer (408 otherwise; an idle keep-alive connection is closed). Default: 5000.
  int64_t idle_timeout_ms = 5000;
  // A request body must arrive within this of its head (408 otherwise). Default: 30000.
  int64_t body_timeout_ms = 30000;
  // An answer's write the client does not read within this closes the connection.
  // Default: 10000.
  int64_t write_timeout_ms = 10000;
  // Longest a generation may take end to end (the SDK call timeout) unless the request's
  // deadline_ms says otherwise. Default: 600000.
  int64_t request_timeout_ms = 600000;
  // Chat prompt template; kAuto picks per model name (router/chat_template.h). Default: auto.
  ChatTemplate chat_template = ChatTemplate::kAuto;
  // max_tokens when a request gives none. Defaults: 16 (completions, as OpenAI), 256 (chat).
  int completion_max_tokens = 16;
  int chat_max_tokens = 256;
  // Renders the process's Prometheus metrics for GET /metrics (appended after the gateway's
  // own). Default: none.
  std::function<std::string()> metrics;

  absl::Status Validate() const;
};

class HttpGateway {
 public:
  // Connects to the router, binds the listening socket and starts serving on its own threads.
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Start(const HttpGatewayOptions& options);
  // Stops listening, ends the streams in flight (their requests are cancelled) and joins.
  ~HttpGateway();
  HttpGateway(const HttpGateway&) = delete;
  HttpGateway& operator=(const HttpGateway&) = delete;

  // The bound port.
  int port() const;

 private:
  class Impl;
  explicit HttpGateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_HTTP_GATEWAY_H_
