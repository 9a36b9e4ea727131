#include "common/connection_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace carpool {
namespace {

using Clock = std::chrono::steady_clock;

class ConnectionWatchTest : public ::testing::Test {
 protected:
  std::unique_ptr<Socket> Make(zmq::socket_type type) {
    SocketOptions options;
    options.linger_ms = 0;
    absl::StatusOr<std::unique_ptr<Socket>> s = Socket::Create(&context_, type, options);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Calls EstablishedConnectionDropped until it says true or 5 s pass, polling the monitor's
  // socket between calls.
  static bool DroppedWithin5s(SocketMonitor* monitor, bool* handshaken) {
    const Clock::time_point start = Clock::now();
    while (Clock::now() - start < std::chrono::seconds(5)) {
      if (EstablishedConnectionDropped(monitor, handshaken)) return true;
      const PollItem items[] = {{monitor->socket()}};
      EXPECT_TRUE(Poll(items, 50).ok());
    }
    return false;
  }

  zmq::context_t context_;
};

TEST_F(ConnectionWatchTest, ADroppedConnectionThatWasUpIsReportedOnce) {
  std::unique_ptr<Socket> server = Make(zmq::socket_type::router);
  ASSERT_TRUE(server->Bind("tcp://127.0.0.1:*").ok());
  std::unique_ptr<Socket> client = Make(zmq::socket_type::dealer);
  absl::StatusOr<std::unique_ptr<SocketMonitor>> monitor =
      SocketMonitor::Start(&context_, client.get());
  ASSERT_TRUE(monitor.ok()) << monitor.status();
  bool handshaken = false;
  EXPECT_FALSE(EstablishedConnectionDropped(monitor->get(), &handshaken));  // nothing queued
  ASSERT_TRUE(client->Connect(server->LastEndpoint()).ok());
  const Clock::time_point start = Clock::now();
  while (!handshaken && Clock::now() - start < std::chrono::seconds(5)) {
    EXPECT_FALSE(EstablishedConnectionDropped(monitor->get(), &handshaken));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(handshaken) << "no handshake within 5 s";

  server.reset();
  EXPECT_TRUE(DroppedWithin5s(monitor->get(), &handshaken));
  EXPECT_FALSE(handshaken);
  // Reported once: what follows (a reconnect attempt to the closed port) is no second drop.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(EstablishedConnectionDropped(monitor->get(), &handshaken));
}

TEST_F(ConnectionWatchTest, AConnectionThatNeverCameUpIsNotADrop) {
  // A plain TCP listener that accepts and closes at once: the client's connections drop before
  // any ZMTP handshake, which the monitor reports as disconnects.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::atomic<int> accepted{0};
  std::thread closer([&] {
    for (int i = 0; i < 3; ++i) {
      const int c = accept(listener, nullptr, nullptr);
      if (c < 0) return;
      close(c);
      ++accepted;
    }
  });
  std::unique_ptr<Socket> client = Make(zmq::socket_type::dealer);
  absl::StatusOr<std::unique_ptr<SocketMonitor>> monitor =
      SocketMonitor::Start(&context_, client.get());
  ASSERT_TRUE(monitor.ok()) << monitor.status();
  ASSERT_TRUE(client->Connect(absl::StrCat("tcp://127.0.0.1:", ntohs(addr.sin_port))).ok());
  bool handshaken = false;
  const Clock::time_point start = Clock::now();
  while (accepted.load() < 2 && Clock::now() - start < std::chrono::seconds(5)) {
    EXPECT_FALSE(EstablishedConnectionDropped(monitor->get(), &handshaken));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(accepted.load(), 2) << "the client did not connect and reconnect";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(EstablishedConnectionDropped(monitor->get(), &handshaken));
  EXPECT_FALSE(handshaken);
  client.reset();
  monitor->reset();
  shutdown(listener, SHUT_RDWR);
  close(listener);
  closer.join();
}

}  // namespace
}  // namespace carpool
