#include "common/connection_watch.h"

#include <optional>

#include "absl/status/statusor.h"

namespace carpool {

bool EstablishedConnectionDropped(SocketMonitor* monitor, bool* handshaken) {
  for (;;) {
    absl::StatusOr<std::optional<SocketMonitor::Event>> event = monitor->Next();
    if (!event.ok() || !event->has_value()) return false;
    if (**event == SocketMonitor::Event::kHandshakeSucceeded) {
      *handshaken = true;
    } else if (**event == SocketMonitor::Event::kDisconnected && *handshaken) {
      *handshaken = false;
      return true;
    }
  }
}

}  // namespace carpool
