// The OpenAI-compatible HTTP gateway (docs/http.md): an event-driven HTTP/1.1 server
// (router/http_server.h) in front of the router core, which it reaches over inproc ZeroMQ as an
// ordinary carpool::Client.
//
//   POST /v1/completions, /v1/chat/completions   (stream: true -> server-sent events)
//   POST /v1/embeddings    POST /tokenize    POST /detokenize (vLLM's shapes)
//   GET /v1/models    GET /health    GET /ready    GET /metrics
//   /v1/files, /v1/batches (the Batch API, router/batch/batch_http.h)
//
// Connections cost memory, not threads: at most server.max_connections are open at once, and one
// more gets an immediate 503 (Retry-After: 1). A request head must arrive within
// server.idle_timeout_ms and its body within server.body_timeout_ms (else 408), so slow clients
// delay nobody. Requests run on at most server.max_concurrent_requests handler threads (a stream
// holds one until it ends).
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
#include "router/http_server.h"

namespace zmq {
class context_t;
}  // namespace zmq

namespace carpool::router {

namespace batch {
class BatchService;
}  // namespace batch

struct HttpGatewayOptions {
  // host:port to listen on; port 0 picks a free one (see HttpGateway::port()).
  // Default: 127.0.0.1:8000.
  std::string listen = "127.0.0.1:8000";
  // The router core: its inproc endpoint and context (Router::inproc_endpoint(), zmq_context()).
  // Any router endpoint works with zmq_context null (tests). Required.
  std::string router_endpoint;
  zmq::context_t* zmq_context = nullptr;  // not owned
  // The HTTP transport: connection and request limits, deadlines (router/http_server.h).
  // host and port come from `listen`; error_page and on_response are the gateway's own.
  HttpServerOptions server;
  // Longest a generation may take end to end (the SDK call timeout) unless the request's
  // deadline_ms says otherwise. Default: 600000.
  int64_t request_timeout_ms = 600000;
  // max_tokens when a request gives none. Defaults: 16 (completions, as OpenAI), 256 (chat).
  int completion_max_tokens = 16;
  int chat_max_tokens = 256;
  // Renders the process's Prometheus metrics for GET /metrics (appended after the gateway's
  // own). Default: none.
  std::function<std::string()> metrics;
  // The Batch API (/v1/files, /v1/batches; router/batch/batch_http.h); not owned, must outlive
  // the gateway. Default: none (those routes answer 404).
  batch::BatchService* batch = nullptr;
  // Largest body of a POST /v1/files upload (the file plus its multipart framing). 0: the same
  // as server.max_body_bytes. Default: 0.
  int64_t max_upload_bytes = 0;

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
