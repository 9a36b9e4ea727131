#include "router/peer_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace carpool::router {
namespace {

// A loopback TCP connection: the listener's accepted end (as an HTTP server holds it) and the
// client's end.
struct Connection {
  int server = -1;
  int client = -1;
  int server_port = 0;
  int client_port = 0;

  Connection() {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listener, 1), 0);
    EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
    server_port = ntohs(a.sin_port);
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    server = accept(listener, nullptr, nullptr);
    close(listener);
    sockaddr_in c{};
    len = sizeof(c);
    EXPECT_EQ(getsockname(client, reinterpret_cast<sockaddr*>(&c), &len), 0);
    client_port = ntohs(c.sin_port);
  }
  ~Connection() {
    if (server >= 0) close(server);
    if (client >= 0) close(client);
  }
};

TEST(PeerSocketTest, FindsTheServerSideOfAConnection) {
  Connection c;
  ASSERT_GE(c.server, 0);
  EXPECT_EQ(FindConnectionFd("127.0.0.1", c.client_port, c.server_port), c.server);
  // The client's end matches the reversed addresses, not these.
  EXPECT_EQ(FindConnectionFd("127.0.0.1", c.server_port, c.client_port), c.client);
  EXPECT_EQ(FindConnectionFd("127.0.0.2", c.client_port, c.server_port), -1);
  EXPECT_EQ(FindConnectionFd("127.0.0.1", c.client_port, c.server_port + 1), -1);
}

TEST(PeerSocketTest, OpenIdleAndPipelinedDataAreNotClosed) {
  Connection c;
  EXPECT_FALSE(PeerClosed(c.server));
  ASSERT_EQ(send(c.client, "GET", 3, 0), 3);
  EXPECT_FALSE(PeerClosed(c.server));
  char buf[3];
  EXPECT_EQ(recv(c.server, buf, 3, 0), 3);  // PeerClosed did not consume it
}

TEST(PeerSocketTest, ClosedAndResetPeersAreSeen) {
  Connection c;
  close(c.client);
  c.client = -1;
  EXPECT_TRUE(PeerClosed(c.server));

  Connection d;
  ASSERT_EQ(send(d.client, "x", 1, 0), 1);  // unread data, then the close
  close(d.client);
  d.client = -1;
  EXPECT_TRUE(PeerClosed(d.server));
}

}  // namespace
}  // namespace carpool::router
