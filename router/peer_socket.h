// Finding and watching the TCP connection behind an HTTP request, for handlers that run long
// without writing (a non-streamed completion): cpp-httplib 0.11 hands a handler the peer's
// address but neither its socket nor a way to learn that the peer went away.
//
// Linux only (/proc/self/fd). Thread-safe: both functions only read process state.
#ifndef CARPOOL_ROUTER_PEER_SOCKET_H_
#define CARPOOL_ROUTER_PEER_SOCKET_H_

#include <string>

namespace carpool::router {

// The descriptor of this process's TCP socket whose local port is `local_port` and whose peer
// is remote_addr:remote_port (IPv4 or IPv6 text form); -1 when there is none. The caller must
// keep the connection open while it uses the descriptor (an HTTP handler does: its server
// closes the socket only after the handler returns).
int FindConnectionFd(const std::string& remote_addr, int remote_port, int local_port);

// True when the peer of connected socket `fd` has closed or reset it; false while it is open,
// including when it sent more bytes not read yet (a pipelined request). Never blocks, reads
// nothing.
bool PeerClosed(int fd);

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_PEER_SOCKET_H_
