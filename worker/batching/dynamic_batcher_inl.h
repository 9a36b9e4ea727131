// Implementation of DynamicBatcher's templates. Include dynamic_batcher.h, not this file.
#ifndef CARPOOL_WORKER_BATCHING_DYNAMIC_BATCHER_INL_H_
#define CARPOOL_WORKER_BATCHING_DYNAMIC_BATCHER_INL_H_

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "worker/batching/dynamic_batcher.h"

namespace carpool::worker {

template <typename Request, typename Response>
absl::StatusOr<std::unique_ptr<DynamicBatcher<Request, Response>>>
DynamicBatcher<Request, Response>::Create(const DynamicBatcherOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<DynamicBatcher>(new DynamicBatcher(options, nullptr));
}

template <typename Request, typename Response>
absl::StatusOr<std::unique_ptr<DynamicBatcher<Request, Response>>>
DynamicBatcher<Request, Response>::Create(const DynamicBatcherOptions& options, BatchFunction fn) {
  RETURN_IF_ERROR(options.Validate());
  if (!fn) return absl::InvalidArgumentError("threaded DynamicBatcher needs a batch function");
  return std::unique_ptr<DynamicBatcher>(new DynamicBatcher(options, std::move(fn)));
}

template <typename Request, typename Response>
DynamicBatcher<Request, Response>::DynamicBatcher(const DynamicBatcherOptions& options,
                                                  BatchFunction fn)
    : clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      default_timeout_micros_(options.default_timeout_micros),
      batch_fn_(std::move(fn)),
      queue_(options) {
  if (!batch_fn_) return;
  workers_.reserve(options.max_concurrent_batches);
  for (int i = 0; i < options.max_concurrent_batches; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

template <typename Request, typename Response>
DynamicBatcher<Request, Response>::~DynamicBatcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& worker : workers_) worker.join();
  std::vector<Callback> unanswered;
  {
    absl::MutexLock lock(&mu_);
    for (Ticket ticket : queue_.DrainUnanswered())
      unanswered.push_back(TakeCallback(ticket, false));
    entries_.clear();
  }
  for (Callback& done : unanswered) {
    std::move(done)(absl::UnavailableError("the dynamic batcher was shut down"));
  }
}

template <typename Request, typename Response>
absl::StatusOr<typename DynamicBatcher<Request, Response>::Ticket>
DynamicBatcher<Request, Response>::Submit(Request request, Callback done) {
  return Submit(std::move(request), std::move(done), default_timeout_micros_);
}

template <typename Request, typename Response>
absl::StatusOr<typename DynamicBatcher<Request, Response>::Ticket>
DynamicBatcher<Request, Response>::Submit(Request request, Callback done, int64_t timeout_micros) {
  if (timeout_micros < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("timeout_micros must be >= 0, got %d", timeout_micros));
  }
  if (!done) return absl::InvalidArgumentError("Submit needs a callback");
  std::optional<Ticket> ticket;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the dynamic batcher is shutting down");
    // Read under the lock so that ticket order is submit-time order.
    const int64_t now = clock_->NowMicros();
    int64_t deadline = BatchQueue::kNoDeadline;
    if (timeout_micros > 0 && timeout_micros < BatchQueue::kNoDeadline - now) {
      deadline = now + timeout_micros;
    }
    ticket = queue_.Add(now, deadline);
    if (!ticket) return absl::ResourceExhaustedError("the dynamic batcher's queue is full");
    entries_.try_emplace(*ticket, Entry{std::move(request), std::move(done)});
  }
  work_cv_.Signal();
  return *ticket;
}

template <typename Request, typename Response>
bool DynamicBatcher<Request, Response>::Cancel(Ticket ticket) {
  Callback done;
  {
    absl::MutexLock lock(&mu_);
    switch (queue_.Cancel(ticket)) {
      case BatchQueue::CancelResult::kUnknown:
        return false;
      case BatchQueue::CancelResult::kRemoved:
        done = TakeCallback(ticket, /*forget=*/true);
        break;
      case BatchQueue::CancelResult::kAbandoned:
        // Its batch still reads the request; Complete forgets it.
        done = TakeCallback(ticket, /*forget=*/false);
        break;
    }
  }
  std::move(done)(absl::CancelledError("the request was cancelled"));
  return true;
}

template <typename Request, typename Response>
std::optional<typename DynamicBatcher<Request, Response>::Batch>
DynamicBatcher<Request, Response>::TryTakeBatch(int64_t now_micros) {
  std::vector<Callback> expired;
  std::optional<Batch> batch;
  {
    absl::MutexLock lock(&mu_);
    BatchQueue::TakeResult take = queue_.Take(now_micros);
    expired.reserve(take.expired.size());
    for (Ticket ticket : take.expired) expired.push_back(TakeCallback(ticket, /*forget=*/true));
    if (take.batch) {
      Batch taken;
      taken.id_ = take.batch->batch_id;
      taken.tickets_ = std::move(take.batch->tickets);
      taken.requests_.reserve(taken.tickets_.size());
      for (Ticket ticket : taken.tickets_) taken.requests_.push_back(&entries_.at(ticket).request);
      batch = std::move(taken);
    }
  }
  for (Callback& done : expired) {
    std::move(done)(absl::DeadlineExceededError("the request timed out waiting for a batch"));
  }
  return batch;
}

template <typename Request, typename Response>
void DynamicBatcher<Request, Response>::Complete(Batch batch,
                                                 absl::StatusOr<std::vector<Response>> results) {
  BatchQueue::Outcome outcome = BatchQueue::Outcome::kOk;
  absl::Status error;
  if (!results.ok()) {
    outcome = BatchQueue::Outcome::kError;
    error = results.status();
  } else if (results->size() != batch.size()) {
    outcome = BatchQueue::Outcome::kMalformed;
    error = absl::InternalError(absl::StrFormat(
        "the batch function returned %d responses for %d requests", results->size(), batch.size()));
  }
  std::vector<std::pair<Callback, size_t>> answers;  // callback, position in the batch
  {
    absl::MutexLock lock(&mu_);
    std::vector<BatchQueue::Disposition> dispositions = queue_.Complete(batch.id_, outcome);
    for (size_t i = 0; i < dispositions.size(); ++i) {
      const Ticket ticket = batch.tickets_[i];
      switch (dispositions[i]) {
        case BatchQueue::Disposition::kAnswer:
          answers.emplace_back(TakeCallback(ticket, /*forget=*/true), i);
          break;
        case BatchQueue::Disposition::kDrop:
          entries_.erase(ticket);
          break;
        case BatchQueue::Disposition::kRetry:
          break;
      }
    }
  }
  work_cv_.SignalAll();  // a slot is free, and a split may have queued two retries
  for (auto& [done, position] : answers) {
    if (outcome == BatchQueue::Outcome::kOk) {
      std::move(done)(std::move((*results)[position]));
    } else {
      std::move(done)(error);
    }
  }
}

template <typename Request, typename Response>
std::optional<int64_t> DynamicBatcher<Request, Response>::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  return queue_.NextDeadline(clock_->NowMicros());
}

template <typename Request, typename Response>
DynamicBatcherStats DynamicBatcher<Request, Response>::Stats() const {
  absl::MutexLock lock(&mu_);
  return queue_.Stats();
}

template <typename Request, typename Response>
typename DynamicBatcher<Request, Response>::Callback
DynamicBatcher<Request, Response>::TakeCallback(Ticket ticket, bool forget) {
  auto it = entries_.find(ticket);
  Callback done = std::move(it->second.done);
  if (forget) entries_.erase(it);
  return done;
}

template <typename Request, typename Response>
void DynamicBatcher<Request, Response>::WorkerLoop() {
  while (WaitForWork()) {
    std::optional<Batch> batch = TryTakeBatch(clock_->NowMicros());
    if (!batch) continue;
    absl::StatusOr<std::vector<Response>> results = batch_fn_(batch->requests());
    Complete(std::move(*batch), std::move(results));
  }
}

template <typename Request, typename Response>
bool DynamicBatcher<Request, Response>::WaitForWork() {
  absl::MutexLock lock(&mu_);
  // Checked under mu_, which Wait releases atomically, so no Signal is lost.
  while (!stopping_) {
    const int64_t now = clock_->NowMicros();
    const std::optional<int64_t> next = queue_.NextDeadline(now);
    if (next && *next <= now) return true;
    if (next) {
      work_cv_.WaitWithTimeout(&mu_, absl::Microseconds(*next - now));
    } else {
      work_cv_.Wait(&mu_);
    }
  }
  return false;
}

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_BATCHING_DYNAMIC_BATCHER_INL_H_
