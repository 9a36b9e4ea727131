// Answers the router could not hand to a client yet: the client is not reading, so its ZeroMQ pipe
// is at the high-water mark (ZMQ_ROUTER_MANDATORY makes that a send error, not a silent drop).
// Kept per client, in order, bounded; the router retries them from its event loop.
//
// When a client's backlog passes a limit, the client is "too slow": the queued stream chunks of
// its requests that have not ended are dropped at once (a stream whose final is queued stays
// whole; errors and finals stay), later chunks are not queued, and the router cancels its
// requests and queues one error for each; a stream that lost chunks ends in that error, never in
// its final (LostChunks). The mark clears when the backlog has been delivered. Answers that end a
// request (everything but chunks) are always kept: at most one per request the client sent. A
// client too slow may send kSaturationFactor x max_messages more messages (each refused, one
// small error); past that the router drops its messages unanswered (TakeMessage), so a client
// that keeps sending without reading cannot grow the router's memory without bound.
//
// Thread-compatible: owned by the router's event loop.
#ifndef CARPOOL_ROUTER_CLIENT_BACKLOG_H_
#define CARPOOL_ROUTER_CLIENT_BACKLOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"

namespace carpool::router {

struct ClientBacklogOptions {
  // Messages / bytes queued for one client before it is too slow. Defaults: 1024, 16 MiB.
  int64_t max_messages = 1024;
  int64_t max_bytes = 16 << 20;
};

class ClientBacklog {
 public:
  static constexpr int kSaturationFactor = 4;

  enum class Added {
    kQueued,
    // This message took the client past a limit: it is now too slow and the chunks of its
    // requests that have not ended are gone (this one included, if it was a chunk). The caller
    // ends the client's requests.
    kTooSlow,
    // Not queued: a chunk for a client already too slow.
    kDiscarded,
  };

  explicit ClientBacklog(const ClientBacklogOptions& options) : options_(options) {}

  // True while `client` has undelivered messages: new ones must queue behind them.
  bool Has(const std::string& client) const { return clients_.contains(client); }
  bool TooSlow(const std::string& client) const;
  // Counts a message that arrived from `client`. False when it is too slow and has sent
  // kSaturationFactor x max_messages messages since: drop it unanswered.
  bool TakeMessage(const std::string& client);
  bool empty() const { return clients_.empty(); }
  // Messages discarded so far (kDiscarded, and those Flush's `send` refused).
  int64_t discarded() const { return discarded_; }

  // Queues `frame` for `client` behind its other messages. `request_id`: the client's request it
  // answers ("" for none); `chunk`: a stream chunk (droppable), else an answer that ends it.
  Added Add(const std::string& client, const std::string& request_id, std::string frame,
            bool chunk);
  // True when chunks of `request_id` were dropped: its stream must not end in a final.
  bool LostChunks(const std::string& client, const std::string& request_id) const;

  // Hands every client's messages, in order, to `send(client, frame)` until it returns
  // RESOURCE_EXHAUSTED (the pipe is full again: later). UNAVAILABLE means the client is gone: its
  // backlog is dropped and its name appended to `gone`. Any other error drops that one message.
  using SendFn = std::function<absl::Status(const std::string& client, const std::string& frame)>;
  void Flush(const SendFn& send, std::vector<std::string>* gone);

  // Forgets `client`'s messages (it is gone).
  void Erase(const std::string& client) { clients_.erase(client); }

 private:
  struct Entry {
    std::string request_id;
    std::string frame;
    bool chunk = false;
  };
  struct Queue {
    std::deque<Entry> entries;
    int64_t bytes = 0;
    bool too_slow = false;
    int64_t received_since = 0;  // messages from the client since it became too slow
    absl::flat_hash_set<std::string> lost;  // requests whose chunks were dropped
  };

  static void DropChunks(Queue* q);

  ClientBacklogOptions options_;
  absl::flat_hash_map<std::string, Queue> clients_;
  int64_t discarded_ = 0;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_CLIENT_BACKLOG_H_
