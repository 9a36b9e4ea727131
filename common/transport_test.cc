#include "common/transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace carpool {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

class TransportTest : public ::testing::Test {
 protected:
  std::unique_ptr<Socket> Make(zmq::socket_type type, const SocketOptions& options = {}) {
    absl::StatusOr<std::unique_ptr<Socket>> s = Socket::Create(&context_, type, options);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // A pair of PAIR sockets connected over inproc.
  void MakePair(const std::string& name, std::unique_ptr<Socket>* a, std::unique_ptr<Socket>* b) {
    *a = Make(zmq::socket_type::pair);
    *b = Make(zmq::socket_type::pair);
    ASSERT_TRUE((*a)->Bind("inproc://" + name).ok());
    ASSERT_TRUE((*b)->Connect("inproc://" + name).ok());
  }

  // A tcp endpoint on 127.0.0.1 that nothing listens on (bound once, then closed).
  std::string UnusedTcpEndpoint() {
    std::unique_ptr<Socket> s = Make(zmq::socket_type::router);
    EXPECT_TRUE(s->Bind("tcp://127.0.0.1:*").ok());
    return s->LastEndpoint();
  }

  zmq::context_t context_;
};

TEST_F(TransportTest, PollTimesOutWithNothingReadable) {
  std::unique_ptr<Socket> a, b;
  MakePair("poll-timeout", &a, &b);
  const PollItem items[] = {{a.get()}, {b.get()}};
  const Clock::time_point start = Clock::now();
  absl::StatusOr<PollResult> readable = Poll(items, 50);
  ASSERT_TRUE(readable.ok()) << readable.status();
  EXPECT_GE(MillisSince(start), 40);
  ASSERT_EQ(readable->size(), 2u);
  EXPECT_FALSE((*readable)[0]);
  EXPECT_FALSE((*readable)[1]);
}

TEST_F(TransportTest, PollReportsWhichSocketIsReadable) {
  std::unique_ptr<Socket> a, b;
  MakePair("poll-readable", &a, &b);
  ASSERT_TRUE(a->Send({"hello"}).ok());
  const PollItem items[] = {{a.get()}, {b.get()}};
  absl::StatusOr<PollResult> readable = Poll(items, 5000);
  ASSERT_TRUE(readable.ok()) << readable.status();
  EXPECT_FALSE((*readable)[0]);
  EXPECT_TRUE((*readable)[1]);
  absl::StatusOr<std::optional<Frames>> got = b->Recv(0);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, Frames{"hello"});
}

TEST_F(TransportTest, PollWatchesFileDescriptors) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::unique_ptr<Socket> a, b;
  MakePair("poll-fd", &a, &b);
  PollItem items[] = {{b.get()}, {nullptr, fds[0]}};
  absl::StatusOr<PollResult> readable = Poll(items, 0);
  ASSERT_TRUE(readable.ok()) << readable.status();
  EXPECT_FALSE((*readable)[1]);
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  readable = Poll(items, 5000);
  ASSERT_TRUE(readable.ok()) << readable.status();
  EXPECT_FALSE((*readable)[0]);
  EXPECT_TRUE((*readable)[1]);
  close(fds[0]);
  close(fds[1]);
}

TEST_F(TransportTest, PollOnATerminatedContextIsCancelled) {
  std::unique_ptr<Socket> s = Make(zmq::socket_type::pair);
  absl::Status status;
  std::thread poller([&] {
    const PollItem items[] = {{s.get()}};
    status = Poll(items, -1).status();  // forever, until the context is shut down
  });
  context_.shutdown();
  poller.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
}

TEST_F(TransportTest, ImmediateRefusesToQueueWithoutAConnection) {
  const std::string nowhere = UnusedTcpEndpoint();
  SocketOptions queueing;
  std::unique_ptr<Socket> plain = Make(zmq::socket_type::dealer, queueing);
  ASSERT_TRUE(plain->Connect(nowhere).ok());
  EXPECT_TRUE(plain->Send({"queued for later"}).ok());

  SocketOptions immediate;
  immediate.immediate = true;
  std::unique_ptr<Socket> strict = Make(zmq::socket_type::dealer, immediate);
  ASSERT_TRUE(strict->Connect(nowhere).ok());
  EXPECT_EQ(strict->Send({"nowhere to go"}).code(), absl::StatusCode::kResourceExhausted);
}

// A TCP listener that completes connections (in the kernel's backlog) but never speaks ZMTP:
// what is sent to it stays queued. Returns its endpoint; *fd is the listening socket.
std::string SilentTcpListener(int* fd) {
  *fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(*fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(listen(*fd, 4), 0);
  EXPECT_EQ(getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  return "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

// How long closing a context takes when one DEALER with `linger_ms` (set at Create, or later
// with SetLinger) holds a message for a peer that never takes it.
int64_t CloseMillis(int linger_ms, bool use_setter) {
  int listener;
  const std::string silent = SilentTcpListener(&listener);
  zmq::context_t context;
  SocketOptions options;
  if (!use_setter) options.linger_ms = linger_ms;
  {
    auto dealer = Socket::Create(&context, zmq::socket_type::dealer, options);
    EXPECT_TRUE(dealer.ok());
    if (use_setter) {
      EXPECT_TRUE((*dealer)->SetLinger(linger_ms).ok());
    }
    EXPECT_TRUE((*dealer)->Connect(silent).ok());
    EXPECT_TRUE((*dealer)->Send({"undeliverable"}).ok());
  }
  const Clock::time_point start = Clock::now();
  context.close();
  const int64_t millis = MillisSince(start);
  close(listener);
  return millis;
}

TEST(TransportLingerTest, LingerBoundsHowLongCloseWaits) {
  EXPECT_LT(CloseMillis(0, /*use_setter=*/false), 250);
  EXPECT_GE(CloseMillis(300, /*use_setter=*/false), 250);
  EXPECT_GE(CloseMillis(300, /*use_setter=*/true), 250);
}

TEST_F(TransportTest, HeartbeatOptionsAreAccepted) {
  SocketOptions o;
  o.zmtp_heartbeat_ms = 100;
  o.zmtp_heartbeat_timeout_ms = 150;
  EXPECT_NE(Make(zmq::socket_type::dealer, o), nullptr);
}

// Receives the next message on `s`, waiting at most 5 s; nullopt if none came.
std::optional<Frames> RecvWithin5s(Socket* s) {
  absl::StatusOr<std::optional<Frames>> got = s->Recv(5000);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : std::nullopt;
}

// Two DEALERs under one routing id, the first still connected when the second arrives (a
// worker back from a network cut before the router saw its old connection die). With handover
// the second takes the id over: the router hears it and its replies reach it. Without, the
// second is refused and nothing it sends arrives.
TEST_F(TransportTest, RouterHandoverGivesAnIdToItsNewestConnection) {
  for (const bool handover : {true, false}) {
    SCOPED_TRACE(handover ? "handover" : "no handover");
    SocketOptions ro;
    ro.router_handover = handover;
    std::unique_ptr<Socket> router = Make(zmq::socket_type::router, ro);
    ASSERT_TRUE(router->Bind("tcp://127.0.0.1:*").ok());
    SocketOptions d;
    d.routing_id = "worker-7";
    std::unique_ptr<Socket> old_link = Make(zmq::socket_type::dealer, d);
    ASSERT_TRUE(old_link->Connect(router->LastEndpoint()).ok());
    ASSERT_TRUE(old_link->Send({"from the old link"}).ok());
    std::optional<Frames> got = RecvWithin5s(router.get());
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, (Frames{"worker-7", "from the old link"}));

    std::unique_ptr<Socket> new_link = Make(zmq::socket_type::dealer, d);
    ASSERT_TRUE(new_link->Connect(router->LastEndpoint()).ok());
    ASSERT_TRUE(new_link->Send({"from the new link"}).ok());
    absl::StatusOr<std::optional<Frames>> second = router->Recv(handover ? 5000 : 500);
    ASSERT_TRUE(second.ok()) << second.status();
    if (!handover) {
      EXPECT_FALSE(second->has_value()) << "a refused connection's message arrived";
      continue;
    }
    ASSERT_TRUE(second->has_value());
    EXPECT_EQ(**second, (Frames{"worker-7", "from the new link"}));
    ASSERT_TRUE(router->Send({"worker-7", "reply"}).ok());
    got = RecvWithin5s(new_link.get());
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, Frames{"reply"});
    absl::StatusOr<std::optional<Frames>> stale = old_link->Recv(100);
    ASSERT_TRUE(stale.ok());
    EXPECT_FALSE(stale->has_value()) << "the reply went to the replaced connection";
  }
}

TEST_F(TransportTest, ErrorsAreStatuses) {
  std::unique_ptr<Socket> s = Make(zmq::socket_type::router);
  EXPECT_EQ(s->Bind("bogus://nowhere").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->Bind("tcp://127.0.0.1:*").ok());
  std::unique_ptr<Socket> other = Make(zmq::socket_type::router);
  EXPECT_EQ(other->Bind(s->LastEndpoint()).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(TransportTest, AClosedSocketAnswersFailedPrecondition) {
  std::unique_ptr<Socket> s = Make(zmq::socket_type::dealer);
  s->Close();
  EXPECT_EQ(s->SetLinger(100).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Send({"x"}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Recv(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Connect("inproc://x").code(), absl::StatusCode::kFailedPrecondition);
  const PollItem items[] = {{s.get()}};
  EXPECT_EQ(Poll(items, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->LastEndpoint(), "");
  EXPECT_FALSE(SocketMonitor::Start(&context_, s.get()).ok());
}

// Waits (at most 5 s) for the next monitor event.
std::optional<SocketMonitor::Event> NextEvent(SocketMonitor* monitor) {
  const Clock::time_point start = Clock::now();
  while (MillisSince(start) < 5000) {
    absl::StatusOr<std::optional<SocketMonitor::Event>> e = monitor->Next();
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return std::nullopt;
    if (e->has_value()) return *e;
    const PollItem items[] = {{monitor->socket()}};
    EXPECT_TRUE(Poll(items, 100).ok());
  }
  return std::nullopt;
}

TEST_F(TransportTest, MonitorSeesTheHandshakeAndTheDisconnect) {
  std::unique_ptr<Socket> server = Make(zmq::socket_type::router);
  ASSERT_TRUE(server->Bind("tcp://127.0.0.1:*").ok());
  std::unique_ptr<Socket> client = Make(zmq::socket_type::dealer);
  absl::StatusOr<std::unique_ptr<SocketMonitor>> monitor =
      SocketMonitor::Start(&context_, client.get());
  ASSERT_TRUE(monitor.ok()) << monitor.status();
  EXPECT_EQ((*monitor)->Next().value(), std::nullopt);
  ASSERT_TRUE(client->Connect(server->LastEndpoint()).ok());
  EXPECT_EQ(NextEvent(monitor->get()), SocketMonitor::Event::kHandshakeSucceeded);
  server.reset();
  EXPECT_EQ(NextEvent(monitor->get()), SocketMonitor::Event::kDisconnected);
}

}  // namespace
}  // namespace carpool
