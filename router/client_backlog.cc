#include "router/client_backlog.h"

#include <algorithm>

namespace carpool::router {

bool ClientBacklog::TooSlow(const std::string& client) const {
  auto it = clients_.find(client);
  return it != clients_.end() && it->second.too_slow;
}

bool ClientBacklog::TakeMessage(const std::string& client) {
  auto it = clients_.find(client);
  if (it == clients_.end() || !it->second.too_slow) return true;
  return ++it->second.received_since <= kSaturationFactor * options_.max_messages;
}

bool ClientBacklog::LostChunks(const std::string& client, const std::string& request_id) const {
  auto it = clients_.find(client);
  return it != clients_.end() && it->second.lost.contains(request_id);
}

ClientBacklog::Added ClientBacklog::Add(const std::string& client, const std::string& request_id,
                                        std::string frame, bool chunk) {
  Queue& q = clients_[client];
  if (q.too_slow && chunk) {
    q.lost.insert(request_id);
    ++discarded_;
    return Added::kDiscarded;
  }
  q.bytes += static_cast<int64_t>(frame.size());
  q.entries.push_back({request_id, std::move(frame), chunk});
  if (q.too_slow || (static_cast<int64_t>(q.entries.size()) <= options_.max_messages &&
                     q.bytes <= options_.max_bytes)) {
    return Added::kQueued;
  }
  q.too_slow = true;
  DropChunks(&q);
  return Added::kTooSlow;
}

void ClientBacklog::DropChunks(Queue* q) {
  absl::flat_hash_set<std::string> ended;
  for (const Entry& e : q->entries) {
    if (!e.chunk) ended.insert(e.request_id);
  }
  std::erase_if(q->entries, [&](const Entry& e) {
    if (!e.chunk || ended.contains(e.request_id)) return false;
    q->lost.insert(e.request_id);
    return true;
  });
  q->bytes = 0;
  for (const Entry& e : q->entries) q->bytes += static_cast<int64_t>(e.frame.size());
}

void ClientBacklog::Flush(const SendFn& send, std::vector<std::string>* gone) {
  for (auto it = clients_.begin(); it != clients_.end();) {
    Queue& q = it->second;
    bool client_gone = false;
    while (!q.entries.empty()) {
      const absl::Status s = send(it->first, q.entries.front().frame);
      if (absl::IsResourceExhausted(s)) break;
      if (absl::IsUnavailable(s)) {
        client_gone = true;
        break;
      }
      if (!s.ok()) ++discarded_;
      q.bytes -= static_cast<int64_t>(q.entries.front().frame.size());
      q.entries.pop_front();
    }
    if (client_gone) gone->push_back(it->first);
    if (client_gone || q.entries.empty()) {
      clients_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace carpool::router
