// An event-driven HTTP/1.1 server (Boost.Asio sockets, Boost.Beast's request parser), the
// transport under the OpenAI gateway (router/http_gateway.h).
//
// One I/O thread owns every connection: it accepts, reads, parses and writes, and enforces every
// deadline with a timer, so a connection costs memory, never a thread. A slow or silent client
// (slowloris) therefore delays nobody. Complete requests run on a pool of handler threads (a
// handler may block: the gateway waits on the router there); a streaming answer holds its handler
// thread until it ends.
//
// What a client gets (docs/http.md):
//   - keep-alive and pipelining: requests on one connection are answered in order, one at a time;
//   - 408 when the request head (request line + headers) has not arrived within idle_timeout_ms
//     of the connection's start or of the previous answer, or the body within body_timeout_ms of
//     its head, or the body pauses longer than idle_timeout_ms; a connection that sent nothing
//     at all is closed without an answer;
//   - 413 when the body (decoded length, whatever the framing: Content-Length or chunked) passes
//     max_body_bytes: the read stops there;
//   - 431 when the head passes max_header_bytes;
//   - 400 for framing RFC 9112 forbids (two different Content-Length values, Content-Length with
//     Transfer-Encoding, NUL or bare CR in a header value, a chunk header or trailers longer than
//     max_header_bytes); 501 for a Transfer-Encoding other than chunked alone;
//   - 503 (Retry-After: 1) at once when max_connections are open, or when max_concurrent_requests
//     handlers are busy;
//   - `100 Continue` when an HTTP/1.1 request asks for it;
//   - HEAD: the answer's head only; HTTP/1.0: a stream is the raw bytes, ended by a close.
// After an error answer the connection is closed gracefully: the server stops writing, reads and
// discards what the client still sends for a moment, so the client sees the answer, not a reset.
//
// Thread-safe: Start, Stats and the destructor from any thread; handlers run on pool threads.
#ifndef CARPOOL_ROUTER_HTTP_SERVER_H_
#define CARPOOL_ROUTER_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace carpool::router {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // as sent: "GET", "POST", ...
  std::string target;  // the request target as sent, e.g. "/v1/models/a%3Ab?x=1"
  std::string path;    // target before '?', percent-decoded
  std::string query;   // after '?', as sent
  HttpHeaders headers;
  std::string body;    // the decoded body (chunked framing removed)
  std::string remote;  // "ADDR:PORT" of the client

  // The first header named `name` (case-insensitive); empty when absent.
  std::string Header(absl::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;  // none when empty
  HttpHeaders headers;       // besides Content-Type, Content-Length and Connection
  std::string body;
  bool close = false;        // close the connection after this answer
};

// Answers one request: Send once, or StartStream, then Write any number of times, then End.
// A handler that returns without answering gets a 500 sent for it. Thread-compatible: used by
// the one handler thread that got it.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // The whole answer, written on the caller's thread (waiting for the client to take it at
  // most the server's write timeout).
  virtual void Send(HttpResponse response) = 0;
  // A chunked answer's head (`response.body` is ignored). False when the client is gone.
  virtual bool StartStream(const HttpResponse& head) = 0;
  // One chunk; blocks until the bytes are handed to the kernel. False when the client is gone,
  // did not read it within the server's write timeout, or the server is stopping.
  virtual bool Write(absl::string_view data) = 0;
  // The last chunk of a stream.
  virtual void End() = 0;
  // The client closed or reset the connection (a handler that runs long without writing polls
  // this to cancel work nobody will read), or the server is stopping.
  virtual bool Gone() const = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

struct HttpServerStats {
  int64_t connections = 0;           // open now
  int64_t connections_total = 0;     // accepted since start
  int64_t rejected_connections = 0;  // answered 503 over max_connections
  int64_t rejected_requests = 0;     // answered 503 over max_concurrent_requests
  int64_t timeouts = 0;              // 408s and write timeouts
  int64_t active_requests = 0;       // handlers running now
};

struct HttpServerOptions {
  // Address to listen on; port 0 picks a free one (HttpServer::port()). Default: 127.0.0.1:0.
  std::string host = "127.0.0.1";
  int port = 0;
  // Connections open at once; one more is answered 503 and closed. Default: 10000.
  int max_connections = 10000;
  // Handlers running at once (one thread each, started on demand; a stream holds one until it
  // ends); a request beyond them is answered 503 at once. Default: 1024.
  int max_concurrent_requests = 1024;
  // Largest decoded body; past it 413. Default: 1 MiB.
  int64_t max_body_bytes = 1 << 20;
  // A larger (or smaller) limit for the requests to these paths, as sent before any '?' (file
  // uploads). Default: none.
  std::map<std::string, int64_t, std::less<>> path_max_body_bytes;
  // Largest request head (request line + headers); past it 431. Default: 16 KiB.
  int64_t max_header_bytes = 16 << 10;
  // A connection must deliver a whole request head within this of its start or of the previous
  // answer (so it is also the keep-alive idle time). Default: 5000.
  int64_t idle_timeout_ms = 5000;
  // The body must arrive within this of its head (and never pause longer than
  // idle_timeout_ms). Default: 30000.
  int64_t body_timeout_ms = 30000;
  // A write the client does not take within this closes the connection. Default: 10000.
  int64_t write_timeout_ms = 10000;
  // Builds the body of the server's own error answers (400, 408, 413, 431, 503, 500) from the
  // status, a short machine-readable code and a message. Default: plain text.
  std::function<HttpResponse(int status, absl::string_view code, absl::string_view message)>
      error_page;
  // Called on the I/O or handler thread after each answer is queued: the request's path (empty
  // when none was parsed) and the status. Default: none.
  std::function<void(absl::string_view path, int status)> on_response;

  absl::Status Validate() const;
};

class HttpServer {
 public:
  // Binds, then serves on its own threads until destroyed.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  // Stops accepting, closes every connection (handlers' Write fails, Gone() turns true), waits
  // for the handlers to return and joins.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  HttpServerStats Stats() const;

 private:
  class Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_HTTP_SERVER_H_
