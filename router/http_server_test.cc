// HttpServer over real sockets on 127.0.0.1: framing, limits, deadlines, pipelining, streaming
// and the refusals of hostile clients. Raw sockets, so the test decides every byte sent.
#include "router/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// A TCP connection to the server under test.
class Conn {
 public:
  explicit Conn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~Conn() { Close(); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool connected() const { return connected_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (SO_LINGER 0), as a crashed client would.
  void Reset() {
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    Close();
  }

  void HalfClose() { shutdown(fd_, SHUT_WR); }

  bool Send(absl::string_view bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads what arrives within `ms` (less once the peer closes, or after the first bytes when
  // `first` is set).
  void ReadFor(int64_t ms, bool first = false) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (!eof_ && Clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
      if (poll(&p, 1, std::max(left, 1)) <= 0) continue;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        eof_ = true;
        break;
      }
      in_.append(buf, static_cast<size_t>(n));
      if (first) break;
    }
  }

  struct Response {
    int status = 0;
    std::string head;
    std::string body;
  };

  // The next whole response (Content-Length or chunked), waiting up to `ms`; status 0 if none.
  Response Next(int64_t ms = 5000) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      Response r;
      if (TakeResponse(&r)) return r;
      if (eof_ || Clock::now() >= until) return Response{};
      ReadFor(20, /*first=*/true);
    }
  }

  bool eof() const { return eof_; }
  // Everything received and not yet taken by Next.
  const std::string& raw() const { return in_; }
  // True when the peer closed within `ms` (after whatever it still sent).
  bool ClosedWithin(int64_t ms) {
    ReadFor(ms);
    return eof_;
  }

 private:
  bool TakeResponse(Response* r) {
    const size_t end = in_.find("\r\n\r\n");
    if (end == std::string::npos) return false;
    r->head = in_.substr(0, end + 2);
    if (!absl::SimpleAtoi(r->head.substr(9, 3), &r->status)) return false;
    size_t pos = end + 4;
    const std::string lower = absl::AsciiStrToLower(r->head);
    if (r->status == 100) {
      in_.erase(0, pos);
      return TakeResponse(r);
    }
    if (lower.find("transfer-encoding: chunked") != std::string::npos) {
      std::string body;
      for (;;) {
        const size_t eol = in_.find("\r\n", pos);
        if (eol == std::string::npos) return false;
        size_t size = 0;
        if (!absl::SimpleHexAtoi(in_.substr(pos, eol - pos), &size)) return false;
        if (in_.size() < eol + 2 + size + 2) return false;
        body += in_.substr(eol + 2, size);
        pos = eol + 2 + size + 2;
        if (size == 0) break;
      }
      r->body = body;
    } else {
      size_t length = 0;
      const size_t cl = lower.find("content-length: ");
      if (cl != std::string::npos) {
        absl::SimpleAtoi(lower.substr(cl + 16, lower.find("\r\n", cl) - cl - 16), &length);
      }
      if (in_.size() < pos + length) return false;
      r->body = in_.substr(pos, length);
      pos += length;
    }
    in_.erase(0, pos);
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string in_;
};

// Polls `done` every 5 ms until it holds or `ms` pass.
void WaitUntil(const std::function<bool()>& done, int64_t ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  while (!done() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string Post(absl::string_view path, absl::string_view body, absl::string_view extra = "") {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: t\r\nContent-Length: ", body.size(),
                      "\r\n", extra, "\r\n", body);
}

class HttpServerTest : public ::testing::Test {
 protected:
  // Echoes the body of POST /echo; GET /slow blocks until released; GET /stream streams
  // `chunks` chunks; every call is counted.
  void Start(HttpServerOptions o = {}) {
    o.host = "127.0.0.1";
    o.port = 0;
    auto s = HttpServer::Start(o, [this](const HttpRequest& req, HttpResponder& res) {
      calls_.fetch_add(1);
      HttpResponse r;
      r.content_type = "text/plain";
      if (req.path == "/echo") {
        r.body = absl::StrCat(req.method, " ", req.path, " ", req.body);
        return res.Send(std::move(r));
      }
      if (req.path == "/slow") {
        while (!release_.load() && !res.Gone()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        saw_gone_.store(res.Gone());
        r.body = "slow";
        return res.Send(std::move(r));
      }
      if (req.path == "/stream") {
        if (!res.StartStream(r)) return;
        for (int i = 0; i < chunks_; ++i) {
          if (!res.Write(absl::StrCat("chunk", i, ";"))) {
            write_failed_.store(true);
            return;
          }
          if (stream_pause_ms_ > 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(stream_pause_ms_));
          }
        }
        return res.End();
      }
      if (req.path == "/silent") return;  // answers nothing: the server sends 500
      if (req.path == "/headers") {
        for (const auto& [k, v] : req.headers) absl::StrAppend(&r.body, k, "=", v, ";");
        return res.Send(std::move(r));
      }
      r.status = 404;
      res.Send(std::move(r));
    });
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  void TearDown() override {
    release_.store(true);
    server_.reset();
  }

  int port() const { return server_->port(); }

  // A server with one handler, held by a GET /slow on the returned connection.
  std::unique_ptr<Conn> HoldTheOnlyHandler() {
    HttpServerOptions o;
    o.max_concurrent_requests = 1;
    Start(o);
    auto busy = std::make_unique<Conn>(port());
    EXPECT_TRUE(busy->Send("GET /slow HTTP/1.1\r\nHost: t\r\n\r\n"));
    WaitUntil([&] { return server_->Stats().active_requests >= 1; }, 1000);
    return busy;
  }

  // Lets the /slow handler answer `busy` and waits until its slot is free.
  void ReleaseTheHandler(Conn* busy) {
    release_.store(true);
    EXPECT_EQ(busy->Next().body, "slow");
    WaitUntil([&] { return server_->Stats().active_requests == 0; }, 1000);
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> calls_{0};
  std::atomic<bool> release_{false};
  std::atomic<bool> saw_gone_{false};
  std::atomic<bool> write_failed_{false};
  int chunks_ = 3;
  int stream_pause_ms_ = 0;
};

TEST_F(HttpServerTest, AnswersKeepAliveRequestsInOrder) {
  Start();
  Conn c(port());
  ASSERT_TRUE(c.connected());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.Send(Post("/echo", absl::StrCat("body", i))));
    Conn::Response r = c.Next();
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, absl::StrCat("POST /echo body", i));
  }
  ASSERT_TRUE(c.Send("GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(c.Next().status, 404);
}

TEST_F(HttpServerTest, PipelinedRequestsAreAllAnsweredInOrder) {
  Start();
  Conn c(port());
  ASSERT_TRUE(c.Send(Post("/echo", "one") + Post("/echo", "two") + Post("/echo", "three")));
  for (const char* want : {"one", "two", "three"}) {
    Conn::Response r = c.Next();
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, absl::StrCat("POST /echo ", want));
  }
  EXPECT_FALSE(c.ClosedWithin(100));  // and the connection stays open
}

TEST_F(HttpServerTest, PipelinedRequestsBeforeAHalfCloseAreAnswered) {
  Start();
  Conn c(port());
  ASSERT_TRUE(c.Send(Post("/echo", "a") + Post("/echo", "b")));
  c.HalfClose();
  Conn::Response a = c.Next(), b = c.Next();
  EXPECT_EQ(a.body, "POST /echo a");
  EXPECT_EQ(b.body, "POST /echo b");
}

TEST_F(HttpServerTest, ChunkedBodiesAreDecoded) {
  Start();
  Conn c(port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"));
  Conn::Response r = c.Next();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /echo hello world");
}

TEST_F(HttpServerTest, BodyLimitHoldsForEveryFraming) {
  HttpServerOptions o;
  o.max_body_bytes = 64 << 10;
  Start(o);
  {
    Conn c(port());  // declared too large
    ASSERT_TRUE(c.Send(absl::StrCat("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: ",
                                    1 << 20, "\r\n\r\n")));
    Conn::Response r = c.Next();
    EXPECT_EQ(r.status, 413);
    EXPECT_THAT(r.body, HasSubstr("payload_too_large"));
    EXPECT_TRUE(c.ClosedWithin(3000));
  }
  {
    // Chunked: 300 chunks of 16 KiB would be 4.7 MiB; the server answers 413 once 64 KiB are
    // decoded and never reads the rest into memory.
    Conn c(port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk = absl::StrCat("4000\r\n", std::string(16 << 10, 'x'), "\r\n");
    int sent = 0;
    for (; sent < 300; ++sent) {
      if (!c.Send(chunk)) break;  // the server closed after its answer
      c.ReadFor(0);
      if (c.eof()) break;
    }
    Conn::Response r = c.Next();
    EXPECT_EQ(r.status, 413);
  }
  EXPECT_EQ(calls_.load(), 0);  // no handler saw either body
}

TEST_F(HttpServerTest, RefusesAmbiguousFraming) {
  Start();
  const std::vector<std::string> bad = {
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4\r\nabcd\r\n0\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
      "4\r\nabcd\r\n0\r\n\r\n",
      std::string("GET /echo HTTP/1.1\r\nHost: t\r\nX-A: a\0b\r\n\r\n", 40),
      "GET /echo HTTP/1.1\r\nHost: t\r\nX-A: a\rb\r\n\r\n",
      "GET /echo HTTP/1.1\r\nHost: t\r\nBad Name: a\r\n\r\n",
      "NOT HTTP AT ALL\r\n\r\n",
  };
  for (const std::string& req : bad) {
    Conn c(port());
    ASSERT_TRUE(c.Send(req));
    Conn::Response r = c.Next();
    EXPECT_EQ(r.status, 400) << absl::CEscape(req);
    EXPECT_TRUE(c.ClosedWithin(3000)) << absl::CEscape(req);
  }
  {
    Conn c(port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n"));
    EXPECT_EQ(c.Next().status, 501);
  }
  EXPECT_EQ(calls_.load(), 0);
}

TEST_F(HttpServerTest, HeadLimitIs431) {
  HttpServerOptions o;
  o.max_header_bytes = 4096;
  Start(o);
  {
    Conn c(port());  // one long line
    ASSERT_TRUE(c.Send(absl::StrCat("GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: ",
                                    std::string(8000, 'a'), "\r\n\r\n")));
    EXPECT_EQ(c.Next().status, 431);
  }
  for (int lines : {5, 6, 8}) {  // whole lines of 1 KB, the head sent at once: 5-8 KiB
    Conn c(port());
    std::string head = "GET /echo HTTP/1.1\r\nHost: t\r\n";
    for (int i = 0; i < lines; ++i) absl::StrAppend(&head, "X-", i, ": ", std::string(1000, 'p'), "\r\n");
    ASSERT_TRUE(c.Send(head + "\r\n"));
    EXPECT_EQ(c.Next().status, 431) << lines;
  }
  Conn ok(port());  // 3 KiB is under the limit
  std::string head = "GET /echo HTTP/1.1\r\nHost: t\r\n";
  for (int i = 0; i < 3; ++i) absl::StrAppend(&head, "X-", i, ": ", std::string(1000, 'p'), "\r\n");
  ASSERT_TRUE(ok.Send(head + "\r\n"));
  EXPECT_EQ(ok.Next().status, 200);
}

TEST_F(HttpServerTest, SlowHeadsGet408WithinTheIdleTimeoutAndDelayNobody) {
  HttpServerOptions o;
  o.idle_timeout_ms = 600;
  Start(o);
  // 50 slowloris connections dribble a head, one byte every 50 ms.
  std::vector<std::unique_ptr<Conn>> slow;
  for (int i = 0; i < 50; ++i) slow.push_back(std::make_unique<Conn>(port()));
  const std::string head = "GET /echo HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  const auto start = Clock::now();
  std::atomic<bool> stop{false};
  std::thread dribble([&] {
    for (size_t i = 0; i < head.size() && !stop.load(); ++i) {
      for (auto& c : slow) c->Send(head.substr(i, 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  // Meanwhile normal requests are answered at once.
  int64_t worst_ms = 0;
  for (int i = 0; i < 20; ++i) {
    Conn c(port());
    const auto t = Clock::now();
    ASSERT_TRUE(c.Send(Post("/echo", "x")));
    EXPECT_EQ(c.Next().status, 200);
    worst_ms = std::max(worst_ms, MsSince(t));
  }
  EXPECT_LT(worst_ms, 1000);
  for (auto& c : slow) {
    EXPECT_EQ(c->Next(3000).status, 408);
    EXPECT_TRUE(c->ClosedWithin(3000));
  }
  EXPECT_LT(MsSince(start), 600 + 2500);
  stop.store(true);
  dribble.join();
  EXPECT_GE(server_->Stats().timeouts, 50);
}

TEST_F(HttpServerTest, SlowBodyGets408AndIdleConnectionsCloseSilently) {
  HttpServerOptions o;
  o.idle_timeout_ms = 300;
  o.body_timeout_ms = 300;
  Start(o);
  Conn body(port()), idle(port());
  ASSERT_TRUE(body.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{"));
  EXPECT_EQ(body.Next(3000).status, 408);
  EXPECT_TRUE(idle.ClosedWithin(3000));
  Conn::Response none = idle.Next(10);
  EXPECT_EQ(none.status, 0);  // an idle connection is closed without an answer
  // Keep-alive: after an answer, the idle clock starts again.
  Conn c(port());
  ASSERT_TRUE(c.Send(Post("/echo", "a")));
  EXPECT_EQ(c.Next().status, 200);
  EXPECT_TRUE(c.ClosedWithin(3000));
}

TEST_F(HttpServerTest, ConnectionsOverTheLimitGet503AtOnce) {
  HttpServerOptions o;
  o.max_connections = 2;
  Start(o);
  Conn a(port()), b(port());
  ASSERT_TRUE(a.Send(Post("/echo", "a")));
  ASSERT_TRUE(b.Send(Post("/echo", "b")));
  EXPECT_EQ(a.Next().status, 200);
  EXPECT_EQ(b.Next().status, 200);
  Conn c(port());
  const auto t = Clock::now();
  Conn::Response r = c.Next();
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.head, HasSubstr("Retry-After: 1"));
  EXPECT_LT(MsSince(t), 500);
  EXPECT_EQ(server_->Stats().rejected_connections, 1);
  a.Close();
  WaitUntil([&] { return server_->Stats().connections <= 1; }, 1000);
  Conn d(port());
  ASSERT_TRUE(d.Send(Post("/echo", "d")));
  EXPECT_EQ(d.Next().status, 200);  // a slot is free again
}

TEST_F(HttpServerTest, RequestsOverTheHandlerLimitGet503AndTheConnectionStaysUsable) {
  std::unique_ptr<Conn> busy = HoldTheOnlyHandler();
  Conn c(port());
  ASSERT_TRUE(c.Send(Post("/echo", "x")));
  Conn::Response r = c.Next();
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.head, HasSubstr("Retry-After: 1"));
  ReleaseTheHandler(busy.get());
  ASSERT_TRUE(c.Send(Post("/echo", "again")));
  EXPECT_EQ(c.Next().body, "POST /echo again");
}

TEST_F(HttpServerTest, StreamsChunksAndNoticesAClientThatLeft) {
  Start();
  {
    Conn c(port());
    ASSERT_TRUE(c.Send("GET /stream HTTP/1.1\r\nHost: t\r\n\r\n"));
    Conn::Response r = c.Next();
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "chunk0;chunk1;chunk2;");
    ASSERT_TRUE(c.Send(Post("/echo", "after")));  // keep-alive after a stream
    EXPECT_EQ(c.Next().body, "POST /echo after");
  }
  chunks_ = 100000;
  stream_pause_ms_ = 1;
  {
    Conn c(port());
    ASSERT_TRUE(c.Send("GET /stream HTTP/1.1\r\nHost: t\r\n\r\n"));
    c.ReadFor(50);
    c.Reset();
  }
  WaitUntil([&] { return write_failed_.load(); }, 5000);
  EXPECT_TRUE(write_failed_.load());
}

TEST_F(HttpServerTest, AHandlerWaitingWithoutWritingSeesTheClientLeave) {
  Start();
  {
    Conn c(port());
    ASSERT_TRUE(c.Send("GET /slow HTTP/1.1\r\nHost: t\r\n\r\n"));
    WaitUntil([&] { return server_->Stats().active_requests >= 1; }, 1000);
  }  // closed
  WaitUntil([&] { return server_->Stats().active_requests == 0; }, 5000);
  EXPECT_EQ(server_->Stats().active_requests, 0);
  EXPECT_TRUE(saw_gone_.load());
}

TEST_F(HttpServerTest, ExpectContinueAndUnansweredHandlers) {
  Start();
  Conn c(port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
                     "Expect: 100-continue\r\n\r\n"));
  c.ReadFor(200);
  ASSERT_TRUE(c.Send("ok"));
  Conn::Response r = c.Next();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /echo ok");
  ASSERT_TRUE(c.Send("GET /silent HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(c.Next().status, 500);
}

TEST_F(HttpServerTest, PercentDecodesThePathAndSplitsTheQuery) {
  std::string seen;
  auto s = HttpServer::Start({}, [&](const HttpRequest& req, HttpResponder& res) {
    seen = absl::StrCat(req.path, "|", req.query, "|", req.Header("x-CASE"));
    res.Send(HttpResponse{});
  });
  ASSERT_TRUE(s.ok());
  Conn c((*s)->port());
  ASSERT_TRUE(c.Send("GET /v1/models/synthetic%3Atiny?a=1 HTTP/1.1\r\nX-Case: v\r\n\r\n"));
  EXPECT_EQ(c.Next().status, 200);
  EXPECT_EQ(seen, "/v1/models/synthetic:tiny|a=1|v");
}

TEST_F(HttpServerTest, PipelinedRequestsRefusedWhileHandlersAreBusyGetOneAnswerEach) {
  std::unique_ptr<Conn> busy = HoldTheOnlyHandler();
  Conn c(port());
  ASSERT_TRUE(c.Send(Post("/echo", "1") + Post("/echo", "2") + Post("/echo", "3")));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.Next().status, 503) << i;
  EXPECT_EQ(c.Next(200).status, 0);  // nothing more: each refusal written once
  ReleaseTheHandler(busy.get());
  ASSERT_TRUE(c.Send(Post("/echo", "4")));
  EXPECT_EQ(c.Next().body, "POST /echo 4");
}

TEST_F(HttpServerTest, HeadsAndChunkLinesAreBoundedHoweverTheyArrive) {
  HttpServerOptions o;
  o.max_header_bytes = 4096;
  Start(o);
  {
    // 16-byte header lines sent one by one: each is whole when it arrives.
    Conn c(port());
    ASSERT_TRUE(c.Send("GET /echo HTTP/1.1\r\n"));
    bool refused = false;
    for (int i = 0; i < 2000 && !refused; ++i) {
      if (!c.Send(absl::StrFormat("X-%010d: b\r\n", i))) break;
      if (i % 64 == 0) {
        c.ReadFor(1, /*first=*/true);
        refused = c.eof() || c.Next(1).status != 0;
      }
    }
    c.ReadFor(500);
    EXPECT_TRUE(c.eof());
  }
  {
    Conn c(port());  // a chunk-size line with an endless extension
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1;"));
    c.Send(std::string(20000, 'a'));
    EXPECT_EQ(c.Next().status, 400);
  }
  EXPECT_EQ(calls_.load(), 0);
}

TEST_F(HttpServerTest, TrailersAreNotHeaders) {
  Start();
  Conn c(port());
  ASSERT_TRUE(c.Send("POST /headers HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "1\r\na\r\n0\r\nAuthorization: Bearer sneaky\r\n\r\n"));
  Conn::Response r = c.Next();
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body, HasSubstr("Host=t;"));
  EXPECT_THAT(r.body, ::testing::Not(HasSubstr("sneaky")));
}

TEST_F(HttpServerTest, HeadAnswersCarryNoBodyAndKeepTheConnectionInStep) {
  Start();
  Conn c(port());
  ASSERT_TRUE(c.Send("HEAD /echo HTTP/1.1\r\nHost: t\r\n\r\nGET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n"));
  c.ReadFor(300);
  // The HEAD answer's Content-Length is that of the body it does not carry; the next answer
  // follows at once.
  const std::string& raw = c.raw();
  const size_t end = raw.find("\r\n\r\n");
  ASSERT_NE(end, std::string::npos) << raw;
  EXPECT_THAT(raw.substr(0, end), HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(raw.substr(0, end), HasSubstr("Content-Length: 11"));  // of "HEAD /echo "
  EXPECT_EQ(raw.substr(end + 4, 12), "HTTP/1.1 404") << raw;
}

TEST_F(HttpServerTest, Http10StreamsAreRawBytesEndedByAClose) {
  Start();
  Conn c(port());
  ASSERT_TRUE(c.Send("GET /stream HTTP/1.0\r\n\r\n"));
  EXPECT_TRUE(c.ClosedWithin(3000));
  const std::string& raw = c.raw();
  EXPECT_THAT(raw, ::testing::StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(raw, ::testing::Not(HasSubstr("Transfer-Encoding")));
  EXPECT_THAT(raw, ::testing::EndsWith("\r\n\r\nchunk0;chunk1;chunk2;"));
}

TEST_F(HttpServerTest, StopsWithHandlersMidStream) {
  chunks_ = 1000000;
  stream_pause_ms_ = 1;
  Start();
  Conn c(port());
  ASSERT_TRUE(c.Send("GET /stream HTTP/1.1\r\nHost: t\r\n\r\n"));
  c.ReadFor(50);
  const auto t = Clock::now();
  server_.reset();
  EXPECT_LT(MsSince(t), 2000);
  EXPECT_TRUE(c.ClosedWithin(2000));
}

}  // namespace
}  // namespace carpool::router
