#include "router/http_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <exception>
#include <iostream>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "router/handler_pool.h"

namespace carpool::router {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Parser = http::request_parser<http::string_body>;

// Bytes read per readiness event, and unparsed bytes held beyond a request head at most (reading
// pauses there while a handler runs: a pipelining client waits for its answers).
constexpr size_t kReadChunk = 16 << 10;
constexpr size_t kReadAhead = 64 << 10;
// After an error answer: how long, and how many bytes, the server keeps reading (and dropping)
// what the client still sends, so the client reads the answer instead of a reset.
constexpr int64_t kLingerMs = 2000;
constexpr size_t kLingerBytes = 8 << 20;
// Connections refused over max_connections that may linger for a graceful close at once.
constexpr int kMaxLingeringRefusals = 256;
// Pause before accepting again when the process is out of descriptors.
constexpr int64_t kAcceptBackoffMs = 50;

absl::string_view Reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Server Error";
  }
}

std::string Head(const HttpResponse& r, bool close, absl::string_view framing) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status), "\r\n");
  if (!r.content_type.empty()) absl::StrAppend(&out, "Content-Type: ", r.content_type, "\r\n");
  for (const auto& [k, v] : r.headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
  absl::StrAppend(&out, framing, close ? "Connection: close\r\n" : "", "\r\n");
  return out;
}

std::string Serialize(const HttpResponse& r, bool close) {
  std::string out = Head(r, close, absl::StrCat("Content-Length: ", r.body.size(), "\r\n"));
  out += r.body;
  return out;
}

absl::string_view ToAbsl(boost::beast::string_view s) { return {s.data(), s.size()}; }

int HexValue(char c) {
  return absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
}

std::string PercentDecode(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && absl::ascii_isxdigit(s[i + 1]) &&
        absl::ascii_isxdigit(s[i + 2])) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Retry-After: 1, unless the error page set one.
void SetRetryAfter(HttpResponse* r) {
  for (const auto& [k, v] : r->headers) {
    if (absl::EqualsIgnoreCase(k, "Retry-After")) return;
  }
  r->headers.emplace_back("Retry-After", "1");
}

HttpResponse PlainError(int status, absl::string_view code, absl::string_view message) {
  HttpResponse r;
  r.status = status;
  r.content_type = "text/plain";
  r.body = absl::StrCat(code, ": ", message, "\n");
  return r;
}

}  // namespace

std::string HttpRequest::Header(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

absl::Status HttpServerOptions::Validate() const {
  if (port < 0 || port > 65535) return absl::InvalidArgumentError("http port must be 0..65535");
  if (max_connections < 1) return absl::InvalidArgumentError("--http-max-connections must be >= 1");
  if (max_concurrent_requests < 1) {
    return absl::InvalidArgumentError("--http-max-concurrent-requests must be >= 1");
  }
  if (max_body_bytes < 1024) return absl::InvalidArgumentError("--http-max-body-bytes must be >= 1024");
  if (max_header_bytes < 1024 || max_header_bytes > (1 << 30)) {
    return absl::InvalidArgumentError("--http-max-header-bytes must be in [1024, 1 GiB]");
  }
  if (idle_timeout_ms < 100) return absl::InvalidArgumentError("--http-idle-timeout-ms must be >= 100");
  if (body_timeout_ms < 100) return absl::InvalidArgumentError("--http-body-timeout-ms must be >= 100");
  if (write_timeout_ms < 100) {
    return absl::InvalidArgumentError("--http-write-timeout-ms must be >= 100");
  }
  return absl::OkStatus();
}

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, HttpHandler handler)
      : options_(options), handler_(std::move(handler)), pool_(options.max_concurrent_requests) {
    if (!options_.error_page) options_.error_page = PlainError;
  }
  ~Impl() { Stop(); }

  absl::Status Start();
  void Stop();
  int port() const { return port_; }
  HttpServerStats Stats() const {
    HttpServerStats s;
    s.connections = connections_.load();
    s.connections_total = connections_total_.load();
    s.rejected_connections = rejected_connections_.load();
    s.rejected_requests = rejected_requests_.load();
    s.timeouts = timeouts_.load();
    s.active_requests = pool_.busy();
    return s;
  }

 private:
  class Connection;
  class Exchange;

  void Accept();
  void OnAccepted(tcp::socket socket);

  // Declared first: destroyed last, after everything that holds its sockets and timers.
  asio::io_context io_;
  HttpServerOptions options_;
  HttpHandler handler_;
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_backoff_{io_};
  std::thread io_thread_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  // Every open connection; touched only on the I/O thread.
  absl::flat_hash_set<std::shared_ptr<Connection>> open_;
  int lingering_refusals_ = 0;  // refused connections still open (I/O thread)
  std::atomic<int64_t> connections_{0};
  std::atomic<int64_t> connections_total_{0};
  std::atomic<int64_t> rejected_connections_{0};
  std::atomic<int64_t> rejected_requests_{0};
  std::atomic<int64_t> timeouts_{0};
  HandlerPool pool_;
};


// One TCP connection, on the I/O thread, except for the few members under mu_ that the handler
// thread of its current request reads (through an Exchange).
class HttpServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class After { kNone, kNextRequest, kLinger };

  // `counted`: it counts against max_connections.
  Connection(Impl* server, tcp::socket socket, bool counted = true)
      : server_(server),
        counted_(counted),
        options_(server->options_),
        socket_(std::move(socket)),
        read_timer_(server->io_),
        write_timer_(server->io_) {}

  void Begin() {
    fd_ = socket_.native_handle();
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);
    socket_.set_option(tcp::no_delay(true), ec);
    const tcp::endpoint peer = socket_.remote_endpoint(ec);
    if (!ec) remote_ = absl::StrCat(peer.address().to_string(), ":", peer.port());
    NextRequest();
  }

  // Answers `bytes` before any request is read, then closes gracefully.
  void Refuse(std::string bytes) {
    fd_ = socket_.native_handle();
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);
    phase_ = Phase::kHandling;
    QueueWrite(std::move(bytes), After::kLinger);
  }

  // Ends the connection now. Idempotent. While a handler writes on the socket the descriptor
  // is only shut down (so the handler's send fails at once) and closed when it is done.
  void Close() {
    if (closed_) return;
    closed_ = true;
    read_timer_.cancel();
    write_timer_.cancel();
    out_.clear();
    bool handler_writes = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone_ = true;
      write_failed_ = true;
      handler_writes = handler_writes_;
    }
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    if (!handler_writes) socket_.close(ec);
    if (counted_) {
      server_->connections_.fetch_sub(1);
    } else {
      --server_->lingering_refusals_;
    }
    server_->open_.erase(shared_from_this());
  }

  // Queues bytes the server writes itself (its own answers); `after` says what follows.
  // REQUIRES: no handler writes on this connection.
  void QueueWrite(std::string bytes, After after) {
    if (closed_) return;
    out_.push_back(Pending{std::move(bytes), after});
    if (!writing_) WriteNext();
  }

  // ---- handler side (the handler thread of the current request)

  // Writes `bytes` on the handler's thread, straight to the socket (no hand-over to the I/O
  // thread), waiting for room at most the write timeout. False when the connection failed.
  bool SendAll(absl::string_view bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (write_failed_) return false;
    }
    const int fd = fd_;
    const auto timeout = std::chrono::milliseconds(options_.write_timeout_ms);
    auto deadline = std::chrono::steady_clock::now() + timeout;  // moves on with each progress
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n =
          ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off += static_cast<size_t>(n);
        deadline = std::chrono::steady_clock::now() + timeout;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 deadline - std::chrono::steady_clock::now())
                                 .count();
        if (left > 0 && !server_->stopping_.load()) {
          pollfd p{fd, POLLOUT, 0};
          if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100))) >= 0 ||
              errno == EINTR) {
            continue;
          }
        }
        if (left <= 0) server_->timeouts_.fetch_add(1);
      }
      FailWrites();
      return false;
    }
    return true;
  }

  // The handler is done with the socket; `after` says what follows (I/O thread, later).
  void HandlerDone(After after) {
    asio::post(server_->io_, [self = shared_from_this(), after] { self->OnHandlerDone(after); });
  }

  bool Gone() const {
    std::lock_guard<std::mutex> lock(mu_);
    return gone_ || server_->stopping_.load();
  }

  Impl* server() const { return server_; }

  // The socket belongs to the request's handler for writing from now until HandlerDone.
  void GiveWritesToHandler() {
    std::lock_guard<std::mutex> lock(mu_);
    handler_writes_ = true;
    gone_ = reset_;
    write_failed_ = reset_;
  }

 private:
  enum class Phase { kHead, kBody, kHandling, kLinger };
  struct Pending {
    std::string bytes;
    After after;
  };

  void FailWrites() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_failed_ = true;
    }
    asio::post(server_->io_, [self = shared_from_this()] { self->Close(); });
  }

  void OnHandlerDone(After after) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      handler_writes_ = false;
    }
    if (closed_) {
      boost::system::error_code ec;
      socket_.close(ec);  // deferred while the handler wrote
      return;
    }
    if (after == After::kLinger) return Linger();
    if (read_eof_ && buffer_.size() == 0) return Close();
    NextRequest();
  }

  // ---- reading

  // Ready for the next request on this connection: its head must arrive within the idle timeout.
  void NextRequest() {
    phase_ = Phase::kHead;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(options_.max_header_bytes));
    // The largest limit of any path until the head says which path this is (Beast checks a
    // Content-Length against it as the head completes).
    body_limit_ = options_.max_body_bytes;
    for (const auto& [path, limit] : options_.path_max_body_bytes) {
      body_limit_ = std::max(body_limit_, limit);
    }
    parser_->body_limit(static_cast<std::uint64_t>(body_limit_));
    head_bytes_ = 0;
    path_.clear();
    ArmRead(options_.idle_timeout_ms);
    if (buffer_.size() == 0) buffer_.shrink_to_fit();  // an idle connection holds no buffer
    Process();
    if (read_eof_ && phase_ == Phase::kHead) return Close();  // a partial head nobody finishes
    Read();
  }

  void ArmRead(int64_t ms) { ArmReadAt(std::chrono::steady_clock::now() + std::chrono::milliseconds(ms)); }

  // A wait that had already fired when the timer was re-armed still runs, with success: the
  // generation tells it apart.
  void ArmReadAt(std::chrono::steady_clock::time_point when) {
    read_timer_.expires_at(when);
    read_timer_.async_wait(
        [self = shared_from_this(), gen = ++read_timer_gen_](const boost::system::error_code& ec) {
          if (!ec && gen == self->read_timer_gen_) self->OnReadTimeout();
        });
  }

  void OnReadTimeout() {
    if (closed_) return;
    ++read_timer_gen_;
    switch (phase_) {
      case Phase::kHead:
        if (buffer_.size() == 0 && head_bytes_ == 0) return Close();  // idle keep-alive
        server_->timeouts_.fetch_add(1);
        return Fail(408, "request_timeout",
                    absl::StrCat("the request head did not arrive within ",
                                 options_.idle_timeout_ms, " ms"));
      case Phase::kBody:
        server_->timeouts_.fetch_add(1);
        return Fail(408, "request_timeout",
                    absl::StrCat("the request body did not arrive within ",
                                 options_.body_timeout_ms, " ms, or paused longer than ",
                                 options_.idle_timeout_ms, " ms"));
      case Phase::kLinger:
        return Close();
      case Phase::kHandling:
        return;
    }
  }

  // Waits for the socket to be readable, then reads what is there: a waiting connection holds
  // no read buffer.
  void Read() {
    if (closed_ || reading_ || read_eof_) return;
    if (phase_ == Phase::kHandling && buffer_.size() >= kReadAhead) return;  // resumed later
    reading_ = true;
    socket_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this()](const boost::system::error_code& ec) {
                         self->reading_ = false;
                         if (self->closed_) return;
                         if (ec) return self->OnReadEnd();
                         self->OnReadable();
                       });
  }

  void OnReadable() {
    boost::system::error_code ec;
    const size_t n = socket_.read_some(buffer_.prepare(kReadChunk), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return Read();
    if (ec && ec != asio::error::eof) {
      std::lock_guard<std::mutex> lock(mu_);
      reset_ = true;  // whatever was pipelined, nobody reads the answers
      gone_ = true;
    }
    if (ec) return OnReadEnd();
    buffer_.commit(n);
    if (phase_ == Phase::kLinger) {
      linger_bytes_ += n;
      buffer_.consume(buffer_.size());
      if (linger_bytes_ > kLingerBytes) return Close();
      return Read();
    }
    if (phase_ == Phase::kBody) ArmBody();
    Process();
    Read();
  }

  // The client closed its side, or the connection broke.
  void OnReadEnd() {
    read_eof_ = true;
    switch (phase_) {
      case Phase::kHead:
        if (buffer_.size() > 0) Process();  // answers what was pipelined before the close
        if (phase_ == Phase::kHead) Close();
        return;
      case Phase::kBody:
      case Phase::kLinger:
        return Close();
      case Phase::kHandling:
        if (buffer_.size() == 0) {  // nothing pipelined: nobody will read the answer
          std::lock_guard<std::mutex> lock(mu_);
          gone_ = true;
        }
        return;
    }
  }

  // Feeds buffered bytes to the parser while a request is being read.
  void Process() {
    while (!closed_ && (phase_ == Phase::kHead || phase_ == Phase::kBody) && buffer_.size() > 0) {
      beast::error_code ec;
      const size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (phase_ == Phase::kHead) head_bytes_ += used;
      if (ec == http::error::need_more) {
        // Beast consumes complete header lines and bounds only the rest, and does not bound a
        // chunk-size line or the trailers: the server bounds what a request may hold unparsed.
        const size_t held = (phase_ == Phase::kHead ? head_bytes_ : 0) + buffer_.size();
        if (held > static_cast<size_t>(options_.max_header_bytes)) {
          return phase_ == Phase::kHead
                     ? OnParseError(http::error::header_limit)
                     : Fail(400, "bad_request",
                            absl::StrCat("a chunk header or the trailers exceed ",
                                         options_.max_header_bytes, " bytes"));
        }
        break;
      }
      if (ec) return OnParseError(ec);
      if (phase_ == Phase::kHead && parser_->is_header_done()) {
        // A head parsed in one put() is not bounded by Beast's header_limit as a whole.
        if (head_bytes_ > static_cast<size_t>(options_.max_header_bytes)) {
          return OnParseError(http::error::header_limit);
        }
        if (!OnHead()) return;
      }
      if (parser_->is_done()) return Dispatch();
    }
    if (read_eof_ && phase_ == Phase::kBody) Close();
  }

  void OnParseError(const beast::error_code& ec) {
    if (ec == http::error::body_limit) {
      return Fail(413, "payload_too_large",
                  absl::StrCat("the request body exceeds ", body_limit_, " bytes"));
    }
    if (ec == http::error::header_limit) {
      return Fail(431, "headers_too_large",
                  absl::StrCat("the request head exceeds ", options_.max_header_bytes, " bytes"));
    }
    Fail(400, "bad_request", absl::StrCat("malformed HTTP request: ", ec.message()));
  }

  // Checks what Beast accepted in the head; false when the request was refused.
  bool OnHead() {
    const auto& h = parser_->get();
    path_ = std::string(h.target().substr(0, h.target().find('?')));
    auto limit = options_.path_max_body_bytes.find(path_);
    body_limit_ = limit != options_.path_max_body_bytes.end() ? limit->second
                                                              : options_.max_body_bytes;
    parser_->body_limit(static_cast<std::uint64_t>(body_limit_));
    if (parser_->content_length().has_value() &&
        *parser_->content_length() > static_cast<std::uint64_t>(body_limit_)) {
      OnParseError(http::error::body_limit);
      return false;
    }
    if (h.count(http::field::transfer_encoding) > 1 ||
        (h.count(http::field::transfer_encoding) == 1 &&
         !absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(ToAbsl(h[http::field::transfer_encoding])),
                                 "chunked"))) {
      Fail(501, "not_implemented", "the only Transfer-Encoding supported is chunked, alone");
      return false;
    }
    head_fields_ = static_cast<size_t>(std::distance(h.begin(), h.end()));
    version_ = h.version();
    head_only_ = h.method() == http::verb::head;
    for (const auto& f : h) {
      for (char c : f.value()) {
        if (c == '\0' || c == '\r' || c == '\n') {
          Fail(400, "bad_request", "a header value holds a NUL, CR or LF");
          return false;
        }
      }
    }
    keep_alive_ = h.keep_alive();
    if (version_ >= 11 && absl::EqualsIgnoreCase(ToAbsl(h[http::field::expect]), "100-continue") &&
        !parser_->is_done()) {
      // Written at once: the socket's buffer is empty between requests, and the handler will
      // own the write side once the body is in.
      constexpr absl::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      if (writing_ || ::send(fd_, kContinue.data(), kContinue.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
                          static_cast<ssize_t>(kContinue.size())) {
        Close();
        return false;
      }
    }
    parser_->eager(true);
    phase_ = Phase::kBody;
    body_deadline_ =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.body_timeout_ms);
    ArmBody();
    return true;
  }

  // The body must arrive by body_deadline_, and never pause longer than the idle timeout.
  void ArmBody() {
    ArmReadAt(std::min(body_deadline_, std::chrono::steady_clock::now() +
                                           std::chrono::milliseconds(options_.idle_timeout_ms)));
  }

  void Dispatch();

  // Answers a request the server refuses itself, then closes gracefully.
  void Fail(int status, absl::string_view code, const std::string& message) {
    read_timer_.cancel();
    phase_ = Phase::kHandling;  // no more parsing
    Report(status);
    QueueWrite(Serialize(options_.error_page(status, code, message), /*close=*/true),
               After::kLinger);
  }

  void Report(int status) {
    if (options_.on_response) options_.on_response(path_, status);
  }

  // ---- writing

  void WriteNext() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    write_timer_.expires_after(std::chrono::milliseconds(options_.write_timeout_ms));
    write_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec && self->writing_) {
        self->server_->timeouts_.fetch_add(1);
        self->Close();
      }
    });
    asio::async_write(socket_, asio::buffer(out_.front().bytes),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        self->OnWritten(ec);
                      });
  }

  void OnWritten(const boost::system::error_code& ec) {
    writing_ = false;
    write_timer_.cancel();
    if (closed_) return;
    if (ec) return Close();
    const After after = out_.front().after;
    out_.pop_front();
    switch (after) {
      case After::kNone:
        break;
      case After::kNextRequest:
        if (read_eof_ && buffer_.size() == 0) return Close();
        NextRequest();
        break;
      case After::kLinger:
        return Linger();
    }
    WriteNext();
  }

  // Stops writing, drops what the client still sends for a moment, then closes.
  void Linger() {
    phase_ = Phase::kLinger;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone_ = true;
      write_failed_ = true;
    }
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    buffer_.consume(buffer_.size());
    if (read_eof_) return Close();
    ArmRead(kLingerMs);
    Read();
  }

  Impl* const server_;
  const bool counted_;
  const HttpServerOptions& options_;
  tcp::socket socket_;
  int fd_ = -1;  // socket_'s descriptor, open until the handler that writes on it is done
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  std::string remote_;

  Phase phase_ = Phase::kHead;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  std::string path_;  // of the request being read or answered, for on_response
  bool keep_alive_ = true;
  size_t head_bytes_ = 0;
  int64_t body_limit_ = 0;  // of the request being read: max_body_bytes or its path's
  size_t head_fields_ = 0;  // fields of the head; more are chunked trailers, not headers
  unsigned version_ = 11;
  bool head_only_ = false;  // a HEAD request: answers carry no body
  uint64_t read_timer_gen_ = 0;
  size_t linger_bytes_ = 0;
  std::chrono::steady_clock::time_point body_deadline_;
  bool reading_ = false;
  bool read_eof_ = false;
  bool writing_ = false;
  bool closed_ = false;
  std::deque<Pending> out_;

  // Shared with the handler thread of the current request.
  mutable std::mutex mu_;
  bool gone_ = false;
  bool write_failed_ = false;
  bool handler_writes_ = false;  // a handler owns the socket's write side
  bool reset_ = false;           // the client reset the connection
};

// The answer to one request, on its handler thread.
class HttpServer::Impl::Exchange : public HttpResponder {
 public:
  using After = Connection::After;

  struct Framing {
    bool keep_alive = true;  // the request allows another one on the connection
    unsigned version = 11;   // 10 or 11
    bool head_only = false;  // HEAD: no body in the answer
  };

  Exchange(std::shared_ptr<Connection> connection, std::string path, Framing framing)
      : connection_(std::move(connection)), path_(std::move(path)), framing_(framing) {}

  void Send(HttpResponse response) override {
    if (answered_) return;
    answered_ = true;
    Report(response.status);
    close_ = response.close || !framing_.keep_alive;
    std::string bytes = Serialize(response, close_);
    if (framing_.head_only) bytes.resize(bytes.size() - response.body.size());
    ok_ = connection_->SendAll(bytes);
    ended_ = true;
  }

  // HTTP/1.1 streams are chunked; HTTP/1.0 has no chunks, so its stream is the raw bytes, ended
  // by closing the connection.
  bool StartStream(const HttpResponse& head) override {
    if (answered_) return false;
    answered_ = true;
    streaming_ = true;
    Report(head.status);
    chunked_ = framing_.version >= 11;
    close_ = head.close || !framing_.keep_alive || !chunked_;
    ok_ = connection_->SendAll(Head(head, close_, chunked_ ? "Transfer-Encoding: chunked\r\n" : ""));
    return ok_;
  }

  bool Write(absl::string_view data) override {
    if (!streaming_ || !ok_) return false;
    if (data.empty() || framing_.head_only) return !Gone();
    if (!chunked_) return ok_ = connection_->SendAll(data);
    std::string chunk = absl::StrCat(absl::Hex(data.size()), "\r\n");
    chunk.append(data.data(), data.size());
    chunk += "\r\n";
    return ok_ = connection_->SendAll(chunk);
  }

  void End() override {
    if (!streaming_) return;
    streaming_ = false;
    ended_ = true;
    if (ok_ && chunked_ && !framing_.head_only) ok_ = connection_->SendAll("0\r\n\r\n");
  }

  bool Gone() const override { return connection_->Gone(); }

  // After the handler returned: answers what it left unanswered, ends what it left open.
  void Finish() {
    if (!answered_) {
      Send(connection_->server()->options_.error_page(500, "internal",
                                                      "the handler gave no answer"));
    } else if (streaming_) {
      End();
    }
  }

  // Once the handler's slot is free again: hands the connection back to the I/O thread, which
  // reads the next request or closes.
  void Release() {
    connection_->HandlerDone(ok_ && ended_ && !close_ ? After::kNextRequest : After::kLinger);
  }

 private:
  void Report(int status) {
    const auto& on_response = connection_->server()->options_.on_response;
    if (on_response) on_response(path_, status);
  }

  std::shared_ptr<Connection> connection_;
  const std::string path_;
  const Framing framing_;
  bool answered_ = false;
  bool streaming_ = false;
  bool chunked_ = true;
  bool ended_ = false;  // the whole answer was written (or tried)
  bool close_ = false;  // the connection ends after this answer
  bool ok_ = true;      // every write so far succeeded
};

void HttpServer::Impl::Connection::Dispatch() {
  phase_ = Phase::kHandling;
  read_timer_.cancel();
  auto request = std::make_shared<HttpRequest>();
  http::request<http::string_body> m = parser_->release();
  parser_.reset();
  request->method = std::string(m.method_string());
  request->target = std::string(m.target());
  const size_t q = request->target.find('?');
  request->path = PercentDecode(absl::string_view(request->target).substr(0, q));
  if (q != std::string::npos) request->query = request->target.substr(q + 1);
  // The head's fields only: chunked trailers (fields after them) skipped the head's checks and
  // are not headers.
  size_t n = 0;
  for (const auto& f : m) {
    if (n++ == head_fields_) break;
    request->headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  }
  request->body = std::move(m.body());
  request->remote = remote_;
  auto exchange = std::make_shared<Exchange>(
      shared_from_this(), path_, Exchange::Framing{keep_alive_, version_, head_only_});
  GiveWritesToHandler();
  const bool taken = server_->pool_.TryRun(
      [server = server_, request, exchange] {
        try {
          server->handler_(*request, *exchange);
        } catch (const std::exception& e) {
          std::cerr << "carpool-router: HTTP handler threw: " << e.what() << "\n";
        }
        exchange->Finish();
      },
      [exchange] { exchange->Release(); });
  if (taken) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handler_writes_ = false;
  }
  server_->rejected_requests_.fetch_add(1);
  HttpResponse r = options_.error_page(
      503, "too_many_requests",
      absl::StrCat("the gateway runs at most ", options_.max_concurrent_requests,
                   " requests at once"));
  SetRetryAfter(&r);
  Report(503);
  QueueWrite(Serialize(r, !keep_alive_), keep_alive_ ? After::kNextRequest : After::kLinger);
}

// ---- the server

absl::Status HttpServer::Impl::Start() {
  if (absl::Status s = options_.Validate(); !s.ok()) return s;
  boost::system::error_code ec;
  const asio::ip::address address = asio::ip::make_address(options_.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http: '", options_.host, "' is not an IP address"));
  }
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ":",
                                               options_.port, ": ", ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  Accept();
  io_thread_ = std::thread([this] { io_.run(); });
  return absl::OkStatus();
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (stopping_.load()) return;
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors (EMFILE/ENFILE) or a connection reset before it was taken: pause a
      // moment rather than spin, then go on.
      accept_backoff_.expires_after(std::chrono::milliseconds(kAcceptBackoffMs));
      accept_backoff_.async_wait([this](const boost::system::error_code& e) {
        if (!e) Accept();
      });
      return;
    }
    OnAccepted(std::move(socket));
    Accept();
  });
}

void HttpServer::Impl::OnAccepted(tcp::socket socket) {
  connections_total_.fetch_add(1);
  if (connections_.load() >= options_.max_connections) {
    rejected_connections_.fetch_add(1);
    HttpResponse r = options_.error_page(
        503, "too_many_connections",
        absl::StrCat("the gateway holds at most ", options_.max_connections,
                     " connections at once"));
    SetRetryAfter(&r);
    if (options_.on_response) options_.on_response("", 503);
    // Answered and closed gracefully (so the client reads the 503 rather than a reset), and
    // not counted against the limit meanwhile; past kMaxLingeringRefusals of those (a flood),
    // closed at once so they do not take every descriptor.
    if (lingering_refusals_ >= kMaxLingeringRefusals) {
      boost::system::error_code ec;
      socket.close(ec);
      return;
    }
    ++lingering_refusals_;
    auto refused = std::make_shared<Connection>(this, std::move(socket), /*counted=*/false);
    open_.insert(refused);
    refused->Refuse(Serialize(r, /*close=*/true));
    return;
  }
  connections_.fetch_add(1);
  auto connection = std::make_shared<Connection>(this, std::move(socket));
  open_.insert(connection);
  connection->Begin();
}

void HttpServer::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true);
  if (io_thread_.joinable()) {
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      accept_backoff_.cancel();
      std::vector<std::shared_ptr<Connection>> open(open_.begin(), open_.end());
      for (const auto& c : open) c->Close();
    });
  }
  pool_.Join();  // handlers see Gone() and failing writes, and return
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
}

// ---- HttpServer

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port(); }
HttpServerStats HttpServer::Stats() const { return impl_->Stats(); }

}  // namespace carpool::router
