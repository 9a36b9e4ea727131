// Noticing that a connection which was up has dropped, from a socket's SocketMonitor: what the
// worker (its router) and the SDK (its router) both watch for.
#ifndef CARPOOL_COMMON_CONNECTION_WATCH_H_
#define CARPOOL_COMMON_CONNECTION_WATCH_H_

#include "common/transport.h"

namespace carpool {

// Reads `monitor`'s queued events without waiting and keeps *handshaken (the watched socket's
// connection is up) current: a handshake sets it. True when a connection that was up dropped
// (the peer died, closed it or stopped answering ZMTP heartbeats): *handshaken is cleared and
// the events after it stay queued, for the caller to act on (register again, fail over). A drop
// of a connection that never came up (a failed handshake, a wrong CURVE key) is passed over: it
// carried nothing. False once no event is queued, or when the monitor cannot be read.
bool EstablishedConnectionDropped(SocketMonitor* monitor, bool* handshaken);

}  // namespace carpool

#endif  // CARPOOL_COMMON_CONNECTION_WATCH_H_
