#include "worker/batching/batch_queue.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_format.h"
#include "common/status.h"

namespace carpool::worker {
namespace {

std::vector<int> SortedUnique(std::vector<int> sizes) {
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

}  // namespace

absl::Status DynamicBatcherOptions::Validate() const {
  if (max_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_batch_size must be >= 1, got %d", max_batch_size));
  }
  if (max_wait_micros < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_wait_micros must be >= 0, got %d", max_wait_micros));
  }
  for (int size : preferred_batch_sizes) {
    if (size < 1 || size > max_batch_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "preferred batch size %d is outside [1, max_batch_size=%d]", size, max_batch_size));
    }
  }
  if (max_concurrent_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_concurrent_batches must be >= 1, got %d", max_concurrent_batches));
  }
  if (max_queue_size < max_batch_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_queue_size (%d) must be >= max_batch_size (%d)", max_queue_size, max_batch_size));
  }
  if (default_timeout_micros < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("default_timeout_micros must be >= 0, got %d", default_timeout_micros));
  }
  return absl::OkStatus();
}

BatchQueue::BatchQueue(const DynamicBatcherOptions& options)
    : max_batch_size_(options.max_batch_size),
      max_wait_micros_(options.max_wait_micros),
      preferred_sizes_(SortedUnique(options.preferred_batch_sizes)),
      max_concurrent_batches_(options.max_concurrent_batches),
      max_queue_size_(options.max_queue_size) {
  stats_.batch_size_counts.assign(max_batch_size_ + 1, 0);
}

std::optional<BatchQueue::Ticket> BatchQueue::Add(int64_t now_micros, int64_t deadline_micros) {
  if (static_cast<int>(queue_.size()) >= max_queue_size_) {
    ++stats_.refused;
    return std::nullopt;
  }
  const Ticket ticket = next_ticket_++;
  tickets_[ticket] = TicketState{now_micros, deadline_micros, Phase::kQueued};
  queue_.insert(queue_.end(), ticket);
  if (deadline_micros != kNoDeadline) deadlines_.emplace(deadline_micros, ticket);
  ++stats_.submitted;
  return ticket;
}

void BatchQueue::Dequeue(Ticket ticket) {
  const TicketState& state = tickets_.at(ticket);
  queue_.erase(ticket);
  if (state.deadline_micros != kNoDeadline) deadlines_.erase({state.deadline_micros, ticket});
}

BatchQueue::CancelResult BatchQueue::Cancel(Ticket ticket) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return CancelResult::kUnknown;
  switch (it->second.phase) {
    case Phase::kQueued:
      Dequeue(ticket);
      tickets_.erase(it);
      ++stats_.cancelled;
      return CancelResult::kRemoved;
    case Phase::kRetryPending:
      for (auto retry = retries_.begin(); retry != retries_.end(); ++retry) {
        auto pos = std::find(retry->begin(), retry->end(), ticket);
        if (pos == retry->end()) continue;
        retry->erase(pos);
        if (retry->empty()) retries_.erase(retry);
        break;
      }
      tickets_.erase(it);
      ++stats_.cancelled;
      return CancelResult::kRemoved;
    case Phase::kRunning:
      it->second.phase = Phase::kAbandoned;
      ++stats_.cancelled;
      return CancelResult::kAbandoned;
    case Phase::kAbandoned:
      return CancelResult::kUnknown;
  }
  return CancelResult::kUnknown;
}

bool BatchQueue::HasFreeSlot() const {
  return static_cast<int>(in_flight_.size()) < max_concurrent_batches_;
}

int BatchQueue::DueBatchSize(int64_t now_micros) const {
  const int queued = static_cast<int>(queue_.size());
  if (queued == 0) return 0;
  if (queued >= max_batch_size_) return max_batch_size_;
  // The largest preferred size that fits (all are <= max_batch_size_).
  auto fits = std::upper_bound(preferred_sizes_.begin(), preferred_sizes_.end(), queued);
  if (fits != preferred_sizes_.begin()) return *std::prev(fits);
  const int64_t first_submit = tickets_.at(*queue_.begin()).submit_micros;
  if (now_micros - first_submit >= max_wait_micros_) return queued;
  return 0;
}

BatchQueue::BatchPlan BatchQueue::StartBatch(std::vector<Ticket> tickets) {
  for (Ticket ticket : tickets) tickets_.at(ticket).phase = Phase::kRunning;
  const int size = static_cast<int>(tickets.size());
  ++stats_.batches;
  ++stats_.batch_size_counts[size];
  stats_.fill_ratio_sum += static_cast<double>(size) / max_batch_size_;
  BatchPlan plan{next_batch_id_++, tickets};
  in_flight_.emplace(plan.batch_id, std::move(tickets));
  return plan;
}

BatchQueue::TakeResult BatchQueue::Take(int64_t now_micros) {
  TakeResult result;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now_micros) {
    const Ticket ticket = deadlines_.begin()->second;
    Dequeue(ticket);
    tickets_.erase(ticket);
    result.expired.push_back(ticket);
    ++stats_.timed_out;
  }
  if (!HasFreeSlot()) return result;
  if (!retries_.empty()) {
    std::vector<Ticket> tickets = std::move(retries_.front());
    retries_.pop_front();
    result.batch = StartBatch(std::move(tickets));
    return result;
  }
  const int size = DueBatchSize(now_micros);
  if (size == 0) return result;
  std::vector<Ticket> tickets;
  tickets.reserve(size);
  for (int i = 0; i < size; ++i) {
    const Ticket ticket = *queue_.begin();
    const int64_t wait = now_micros - tickets_.at(ticket).submit_micros;
    ++stats_.queue_wait_count;
    stats_.queue_wait_sum_micros += wait;
    stats_.queue_wait_max_micros = std::max(stats_.queue_wait_max_micros, wait);
    Dequeue(ticket);
    tickets.push_back(ticket);
  }
  result.batch = StartBatch(std::move(tickets));
  return result;
}

std::vector<BatchQueue::Disposition> BatchQueue::Complete(int64_t batch_id, Outcome outcome) {
  auto node = in_flight_.extract(batch_id);
  CARPOOL_CHECK(!node.empty());
  const std::vector<Ticket>& tickets = node.mapped();
  std::vector<Disposition> dispositions(tickets.size(), Disposition::kAnswer);
  std::vector<Ticket> live;
  for (size_t i = 0; i < tickets.size(); ++i) {
    auto it = tickets_.find(tickets[i]);
    if (it->second.phase == Phase::kAbandoned) {
      dispositions[i] = Disposition::kDrop;
      tickets_.erase(it);
    } else {
      live.push_back(tickets[i]);
    }
  }
  if (outcome == Outcome::kError && live.size() > 1) {
    ++stats_.batch_splits;
    const auto middle = live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2);
    retries_.emplace_back(live.begin(), middle);
    retries_.emplace_back(middle, live.end());
    for (Ticket ticket : live) tickets_.at(ticket).phase = Phase::kRetryPending;
    for (Disposition& d : dispositions) {
      if (d == Disposition::kAnswer) d = Disposition::kRetry;
    }
    return dispositions;
  }
  for (Ticket ticket : live) tickets_.erase(ticket);
  (outcome == Outcome::kOk ? stats_.answered : stats_.failed) += static_cast<int64_t>(live.size());
  return dispositions;
}

std::optional<int64_t> BatchQueue::NextDeadline(int64_t now_micros) const {
  std::optional<int64_t> next;
  if (!deadlines_.empty()) next = deadlines_.begin()->first;
  if (!HasFreeSlot() || (retries_.empty() && queue_.empty())) return next;
  int64_t due = now_micros;
  if (retries_.empty() && DueBatchSize(now_micros) == 0) {
    due = tickets_.at(*queue_.begin()).submit_micros + max_wait_micros_;
  }
  return next ? std::min(*next, due) : due;
}

std::vector<BatchQueue::Ticket> BatchQueue::DrainUnanswered() {
  std::vector<Ticket> unanswered;
  for (const auto& [ticket, state] : tickets_) {
    if (state.phase != Phase::kAbandoned) unanswered.push_back(ticket);
  }
  std::sort(unanswered.begin(), unanswered.end());
  tickets_.clear();
  queue_.clear();
  deadlines_.clear();
  retries_.clear();
  in_flight_.clear();
  return unanswered;
}

DynamicBatcherStats BatchQueue::Stats() const {
  DynamicBatcherStats stats = stats_;
  stats.queued = static_cast<int64_t>(queue_.size());
  stats.batches_in_flight = static_cast<int64_t>(in_flight_.size());
  return stats;
}

}  // namespace carpool::worker
