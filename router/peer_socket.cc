#include "router/peer_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace carpool::router {
namespace {

// The address and port of `a` in text form; false for non-IP families.
bool Describe(const sockaddr_storage& a, std::string* addr, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) == nullptr) return false;
    *port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf)) == nullptr) return false;
    *port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  *addr = buf;
  return true;
}

}  // namespace

int FindConnectionFd(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
      continue;
    }
    std::string peer_addr, local_addr;
    int peer_port = -1, port = -1;
    if (!Describe(peer, &peer_addr, &peer_port) || !Describe(local, &local_addr, &port)) continue;
    if (peer_port == remote_port && port == local_port && peer_addr == remote_addr) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool PeerClosed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  const int n = poll(&p, 1, 0);
  if (n <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  if (p.revents & POLLRDHUP) return true;
  if (p.revents & POLLIN) {
    // Readable: data (a pipelined request: still open) or end of stream.
    char c;
    const ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0) return true;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

}  // namespace carpool::router
