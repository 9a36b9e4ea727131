#include "router/admission.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace carpool::router {
namespace {

constexpr int64_t kBucketMicros = 100'000;
constexpr int64_t kMinObservationMicros = 1'000'000;
// A tenant over max_concurrent is told to retry after this long.
constexpr int64_t kConcurrencyRetryMs = 100;

int Index(Priority p) { return std::clamp(static_cast<int>(p), 0, kNumPriorities - 1); }

}  // namespace

absl::Status AdmissionOptions::Validate() const {
  if (max_queued_requests < 1) {
    return absl::InvalidArgumentError("--max-queued-requests must be >= 1");
  }
  if (max_queued_tokens < 0 || max_inflight_tokens < 0 || interactive_reserve_tokens < 0) {
    return absl::InvalidArgumentError(
        "--max-queued-tokens, --max-inflight-tokens and --interactive-reserve must be >= 0");
  }
  if (max_inflight_tokens > 0 && interactive_reserve_tokens >= max_inflight_tokens) {
    return absl::InvalidArgumentError("--interactive-reserve must be < --max-inflight-tokens");
  }
  if (priority_aging_ms < 1) return absl::InvalidArgumentError("--priority-aging-ms must be >= 1");
  if (batch_max_in_flight < 1) {
    return absl::InvalidArgumentError("--batch-max-in-flight must be >= 1");
  }
  if (batch_max_queued < 1) return absl::InvalidArgumentError("--batch-max-queued must be >= 1");
  if (skip_ahead_ms < 0) return absl::InvalidArgumentError("--skip-ahead-ms must be >= 0");
  if (no_worker_timeout_ms < 0) {
    return absl::InvalidArgumentError("--no-worker-timeout-ms must be >= 0");
  }
  return absl::OkStatus();
}

AdmissionController::AdmissionController(const AdmissionOptions& options, TenantTable tenants)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      tenants_(std::move(tenants)),
      tenant_state_(tenants_.size()) {
  const int64_t now = clock_->NowMicros();
  for (int i = 0; i < tenants_.size(); ++i) {
    const TenantConfig& c = tenants_.at(i);
    // A batch bucket holds a minute of its rate.
    tenant_state_[i].bucket = {c.tokens_per_minute, c.burst_tokens,
                               static_cast<double>(c.burst_tokens), now};
    tenant_state_[i].batch_bucket = {c.batch_tokens_per_minute, c.batch_tokens_per_minute,
                                     static_cast<double>(c.batch_tokens_per_minute), now};
  }
}

int64_t AdmissionController::max_inflight_tokens() const {
  return options_.max_inflight_tokens > 0 ? options_.max_inflight_tokens : capacity_tokens_;
}

void AdmissionController::Refill(Bucket* b, int64_t now) {
  if (b->rate <= 0) return;
  const double per_micro = static_cast<double>(b->rate) / 60e6;
  b->tokens = std::min(static_cast<double>(b->burst),
                       b->tokens + per_micro * static_cast<double>(now - b->refilled_at));
  b->refilled_at = now;
}

std::optional<Refusal> AdmissionController::CheckTenant(const AdmissionRequest& r, int64_t tokens,
                                                        int64_t now) {
  if (r.tenant < 0) return std::nullopt;
  const TenantConfig& c = tenants_.at(r.tenant);
  TenantState& t = tenant_state_[r.tenant];
  if (!PriorityAllowed(r.priority, c.max_priority)) {
    return Refusal{absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
                   absl::StrCat("priority ", PriorityName(r.priority), " is above tenant ", c.name,
                                "'s highest class, ", PriorityName(c.max_priority)),
                   0};
  }
  // The batch lane has a limit of its own (batch_max_in_flight): a batch job's requests do not
  // take the tenant's interactive slots.
  if (!r.batch_job && c.max_concurrent > 0 && t.active >= c.max_concurrent) {
    return Refusal{absl::StatusCode::kResourceExhausted, reason::kTenantQuota,
                   absl::StrCat("tenant ", c.name, " has ", t.active,
                                " requests in flight, its limit"),
                   kConcurrencyRetryMs};
  }
  Bucket& b = BucketOf(t, r);
  if (b.rate > 0) {
    Refill(&b, now);
    const char* which = r.batch_job ? "batch " : "";
    if (tokens > b.burst) {
      return Refusal{absl::StatusCode::kResourceExhausted, reason::kTenantQuota,
                     absl::StrCat("the request needs ", tokens, " tokens; tenant ", c.name, "'s ",
                                  which, "bucket holds at most ", b.burst),
                     0};
    }
    if (b.tokens < static_cast<double>(tokens)) {
      const double per_ms = static_cast<double>(b.rate) / 60e3;
      const int64_t wait_ms = static_cast<int64_t>(
          std::ceil((static_cast<double>(tokens) - b.tokens) / per_ms));
      return Refusal{absl::StatusCode::kResourceExhausted, reason::kTenantQuota,
                     absl::StrCat("tenant ", c.name, " is over its ", b.rate, " ", which,
                                  "tokens per minute"),
                     std::max<int64_t>(1, wait_ms)};
    }
  }
  return std::nullopt;
}

std::optional<Refusal> AdmissionController::Admit(const AdmissionRequest& request) {
  AdmissionRequest r = request;
  if (r.batch_job) r.priority = Priority::kBatch;  // the lane is the batch class's
  const int64_t now = clock_->NowMicros();
  const int64_t tokens = std::max<int64_t>(1, r.prompt_tokens + r.max_tokens);
  if (std::optional<Refusal> refusal = CheckSize(r.priority, r.kv_resident, tokens)) {
    return refusal;
  }
  if (std::optional<Refusal> refusal = CheckTenant(r, tokens, now)) return refusal;
  const int queued = counters_.queued[0] + counters_.queued[1] + counters_.queued[2];
  if (r.batch_job) {
    if (counters_.batch_queued >= options_.batch_max_queued) {
      return Refusal{absl::StatusCode::kUnavailable, reason::kQueueFull,
                     absl::StrCat("the batch lane holds ", counters_.batch_queued,
                                  " queued requests, its limit (--batch-max-queued)"),
                     RetryAfterMs(counters_.batch_queued_tokens / counters_.batch_queued)};
    }
  } else if (queued >= options_.max_queued_requests) {
    return Refusal{absl::StatusCode::kUnavailable, reason::kQueueFull,
                   absl::StrCat("the queue holds ", queued, " requests, its limit"),
                   RetryAfterMs(counters_.queued_tokens / std::max(1, queued))};
  }
  if (!r.batch_job && options_.max_queued_tokens > 0 &&
      counters_.queued_tokens + tokens > options_.max_queued_tokens) {
    if (tokens > options_.max_queued_tokens) {
      return Refusal{absl::StatusCode::kResourceExhausted, reason::kTokenBudget,
                     absl::StrCat("the request reserves ", tokens,
                                  " tokens (prompt + max_tokens); the queue's budget is ",
                                  options_.max_queued_tokens),
                     0};
    }
    return Refusal{absl::StatusCode::kResourceExhausted, reason::kTokenBudget,
                   absl::StrCat("queued requests reserve ", counters_.queued_tokens,
                                " tokens; this one's ", tokens, " would pass the budget of ",
                                options_.max_queued_tokens),
                   RetryAfterMs(counters_.queued_tokens + tokens - options_.max_queued_tokens)};
  }
  if (r.deadline_micros > 0) {
    const double rate = ServiceRate();
    int64_t ahead = 0;
    for (int p = 0; p <= Index(r.priority); ++p) ahead += counters_.queued_tokens_by_class[p];
    if (r.batch_job) ahead += counters_.batch_queued_tokens;  // the lane is behind every class
    if (rate > 0 && ahead > 0) {
      const double wait_micros = static_cast<double>(ahead) / rate * 1e6;
      if (static_cast<double>(now) + wait_micros > static_cast<double>(r.deadline_micros)) {
        return Refusal{absl::StatusCode::kDeadlineExceeded, reason::kDeadlineUnmeetable,
                       absl::StrCat("the queue ahead holds ", ahead, " tokens; at ",
                                    static_cast<int64_t>(rate), " tokens/s it needs ",
                                    static_cast<int64_t>(wait_micros / 1000),
                                    " ms, past the deadline"),
                       0};
      }
    }
  }
  if (r.tenant >= 0) {
    TenantState& t = tenant_state_[r.tenant];
    ++(r.batch_job ? t.batch_active : t.active);
    Bucket& b = BucketOf(t, r);
    if (b.rate > 0) b.tokens -= static_cast<double>(tokens);
  }
  Entry e;
  e.request = r;
  e.tokens = tokens;
  e.arrival = now;
  e.queued_at = now;
  QueueOf(e).push_back(r.id);
  CountQueued(e, +1);
  entries_[r.id] = e;
  return std::nullopt;
}

std::deque<uint64_t>& AdmissionController::QueueOf(const Entry& e) {
  return e.request.batch_job ? batch_lane_ : queues_[Index(e.request.priority)];
}

const std::deque<uint64_t>& AdmissionController::QueueOf(const Entry& e) const {
  return e.request.batch_job ? batch_lane_ : queues_[Index(e.request.priority)];
}

void AdmissionController::CountQueued(const Entry& e, int sign) {
  if (e.request.batch_job) {
    counters_.batch_queued += sign;
    counters_.batch_queued_tokens += sign * e.tokens;
    return;
  }
  counters_.queued[Index(e.request.priority)] += sign;
  counters_.queued_tokens += sign * e.tokens;
  counters_.queued_tokens_by_class[Index(e.request.priority)] += sign * e.tokens;
}

void AdmissionController::CountInflight(const Entry& e, int sign) {
  counters_.inflight += sign;
  counters_.inflight_tokens += sign * e.tokens;
  if (e.request.batch_job) counters_.batch_inflight += sign;
}

int AdmissionController::Level(const Entry& e, int64_t now) const {
  const int64_t aged = (now - e.arrival) / (options_.priority_aging_ms * 1000);
  return static_cast<int>(std::max<int64_t>(0, Index(e.request.priority) - aged));
}

int64_t AdmissionController::ClassBudget(Priority p) const {
  const int64_t budget = max_inflight_tokens();
  return p == Priority::kInteractive ? budget : budget - options_.interactive_reserve_tokens;
}

bool AdmissionController::Fits(const Entry& e) const {
  // An unknown budget (no worker has reported its capacity): one request at a time.
  if (max_inflight_tokens() <= 0) return counters_.inflight == 0;
  return counters_.inflight_tokens + e.tokens <= ClassBudget(e.request.priority);
}

std::optional<Refusal> AdmissionController::CheckSize(Priority priority, bool kv_resident,
                                                      int64_t tokens) const {
  const auto refuse = [&](const std::string& limit) {
    return Refusal{absl::StatusCode::kResourceExhausted, reason::kTooLarge,
                   absl::StrCat("the request reserves ", tokens,
                                " tokens (prompt + max_tokens; an embed: all its inputs) but ",
                                limit, ", so it could never run"),
                   0};
  };
  const int64_t total = options_.max_inflight_tokens > 0
                            ? options_.max_inflight_tokens
                            : std::max(capacity_tokens_, ceiling_tokens_);
  if (total > 0) {
    const int64_t budget =
        priority == Priority::kInteractive ? total : total - options_.interactive_reserve_tokens;
    if (tokens > budget) {
      if (budget == total) {
        return refuse(absl::StrCat("the cluster's in-flight token budget is ", budget));
      }
      return refuse(absl::StrCat("the ", PriorityName(priority), " class may use ",
                                 std::max<int64_t>(0, budget), " of the cluster's ", total,
                                 " in-flight tokens (the rest is the interactive reserve)"));
    }
  }
  if (kv_resident && largest_worker_tokens_ > 0 && tokens > largest_worker_tokens_) {
    return refuse(
        absl::StrCat("the largest worker's KV cache holds ", largest_worker_tokens_, " tokens"));
  }
  return std::nullopt;
}

bool AdmissionController::Eligible(uint64_t id, int64_t now) const {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.queued) return false;
  const Entry& e = it->second;
  // Requests past their deadline stay queued until Expired() reports them, but never go; nor do
  // oversized ones, until Oversized() reports them.
  if (e.request.deadline_micros > 0 && now >= e.request.deadline_micros) return false;
  return !CheckSize(e.request.priority, e.request.kv_resident, e.tokens).has_value();
}

std::optional<uint64_t> AdmissionController::Next(const absl::flat_hash_set<uint64_t>& unplaced) {
  const int64_t now = clock_->NowMicros();
  // Drop ids released while queued from the front of each queue.
  const auto drop_released = [&](std::deque<uint64_t>& q) {
    while (!q.empty()) {
      auto it = entries_.find(q.front());
      if (it != entries_.end() && it->second.queued) break;
      q.pop_front();
    }
  };
  for (std::deque<uint64_t>& q : queues_) drop_released(q);
  drop_released(batch_lane_);
  // Walk the dispatch order: a merge of the class queues by (level, arrival).
  std::array<size_t, kNumPriorities> cursor = {0, 0, 0};
  const int64_t skip_micros = options_.skip_ahead_ms * 1000;
  for (int walked = 0; walked <= kMaxSkipAhead; ++walked) {
    int best = -1;
    int best_level = 0;
    int64_t best_arrival = 0;
    for (int p = 0; p < kNumPriorities; ++p) {
      const std::deque<uint64_t>& q = queues_[p];
      while (cursor[p] < q.size() && !Eligible(q[cursor[p]], now)) ++cursor[p];
      if (cursor[p] == q.size()) continue;
      const Entry& e = entries_.at(q[cursor[p]]);
      const int level = Level(e, now);
      if (best < 0 || level < best_level || (level == best_level && e.arrival < best_arrival)) {
        best = p;
        best_level = level;
        best_arrival = e.arrival;
      }
    }
    if (best < 0) {
      // No request of the classes is queued and eligible (the first pass found none): the
      // batch lane may go. Once one was seen that cannot go, the lane yields to it.
      return walked == 0 ? NextBatchJob(unplaced, now) : std::nullopt;
    }
    const uint64_t id = queues_[best][cursor[best]++];
    const Entry& e = entries_.at(id);
    if (!unplaced.contains(id) && Fits(e)) return id;
    // It cannot go: requests behind it may go ahead until it has waited skip_ahead_ms; from then
    // on the budget is held for it.
    if (now - e.arrival >= skip_micros) return std::nullopt;
  }
  return std::nullopt;
}

std::optional<uint64_t> AdmissionController::NextBatchJob(
    const absl::flat_hash_set<uint64_t>& unplaced, int64_t now) {
  // The lane's own limit: none of its requests can go.
  if (counters_.batch_inflight >= options_.batch_max_in_flight) return std::nullopt;
  const int64_t skip_micros = options_.skip_ahead_ms * 1000;
  int walked = 0;
  for (const uint64_t id : batch_lane_) {
    if (!Eligible(id, now)) continue;
    const Entry& e = entries_.at(id);
    if (!unplaced.contains(id) && Fits(e)) return id;
    // As in the classes: ahead of one that cannot go for skip_ahead_ms, then held for it.
    if (now - e.arrival >= skip_micros || ++walked > kMaxSkipAhead) return std::nullopt;
  }
  return std::nullopt;
}

std::optional<std::pair<uint64_t, int64_t>> AdmissionController::HeldForBudget(
    const absl::flat_hash_set<uint64_t>& unplaced) const {
  if (max_inflight_tokens() <= 0) return std::nullopt;
  const int64_t now = clock_->NowMicros();
  // The head of Next()'s order: the first eligible request of each class queue, merged.
  const Entry* head = nullptr;
  int head_level = 0;
  for (const std::deque<uint64_t>& q : queues_) {
    auto it = std::find_if(q.begin(), q.end(), [&](uint64_t id) { return Eligible(id, now); });
    if (it == q.end()) continue;
    const Entry& e = entries_.at(*it);
    const int level = Level(e, now);
    if (head == nullptr || level < head_level ||
        (level == head_level && e.arrival < head->arrival)) {
      head = &e;
      head_level = level;
    }
  }
  if (head == nullptr || unplaced.contains(head->request.id) || Fits(*head)) return std::nullopt;
  return std::make_pair(head->request.id, counters_.inflight_tokens + head->tokens -
                                              ClassBudget(head->request.priority));
}

int64_t AdmissionController::ReservedTokens(uint64_t id) const {
  auto it = entries_.find(id);
  return it != entries_.end() ? it->second.tokens : 0;
}

void AdmissionController::MarkDispatched(uint64_t id) {
  Entry& e = entries_.at(id);
  e.queued = false;
  CountQueued(e, -1);
  CountInflight(e, +1);
  std::deque<uint64_t>& q = QueueOf(e);
  if (!q.empty() && q.front() == id) {
    q.pop_front();
  } else {
    // Behind expired requests: take it out here, so a later Requeue finds no stale copy.
    auto it = std::find(q.begin(), q.end(), id);
    if (it != q.end()) q.erase(it);
  }
}

void AdmissionController::Requeue(uint64_t id) {
  Entry& e = entries_.at(id);
  e.queued = true;
  e.queued_at = clock_->NowMicros();
  CountInflight(e, -1);
  CountQueued(e, +1);
  std::deque<uint64_t>& q = QueueOf(e);
  // A stale copy of the id further back (it was dispatched from behind a tombstone) would make
  // it appear twice; drop it so the queue holds the id once.
  q.erase(std::remove(q.begin(), q.end(), id), q.end());
  q.push_front(id);
}

bool AdmissionController::Release(uint64_t id, int64_t generated_tokens, bool completed) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  const Entry& e = it->second;
  const int64_t now = clock_->NowMicros();
  if (e.queued) {
    CountQueued(e, -1);
  } else {
    CountInflight(e, -1);
  }
  if (e.request.tenant >= 0) {
    TenantState& t = tenant_state_[e.request.tenant];
    --(e.request.batch_job ? t.batch_active : t.active);
    Bucket& b = BucketOf(t, e.request);
    if (b.rate > 0) {
      Refill(&b, now);
      const int64_t refund =
          e.queued ? e.tokens
                   : std::max<int64_t>(0, e.request.max_tokens - generated_tokens);
      b.tokens = std::min(static_cast<double>(b.burst), b.tokens + static_cast<double>(refund));
    }
  }
  if (completed) RecordFinish(e.tokens, now);
  entries_.erase(it);
  return true;
}

bool AdmissionController::IsQueued(uint64_t id) const {
  auto it = entries_.find(id);
  return it != entries_.end() && it->second.queued;
}

int AdmissionController::TenantActive(int tenant) const {
  return tenant >= 0 && tenant < static_cast<int>(tenant_state_.size())
             ? tenant_state_[tenant].active + tenant_state_[tenant].batch_active
             : 0;
}

std::vector<uint64_t> AdmissionController::Expired() const {
  const int64_t now = clock_->NowMicros();
  std::vector<uint64_t> out;
  for (const auto& [id, e] : entries_) {
    if (e.queued && e.request.deadline_micros > 0 && now >= e.request.deadline_micros) {
      out.push_back(id);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint64_t> AdmissionController::Overdue() const {
  const int64_t now = clock_->NowMicros();
  std::vector<uint64_t> out;
  for (const auto& [id, e] : entries_) {
    if (!e.queued && e.request.deadline_micros > 0 && now >= e.request.deadline_micros) {
      out.push_back(id);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<uint64_t, Refusal>> AdmissionController::Oversized() const {
  std::vector<std::pair<uint64_t, Refusal>> out;
  for (const auto& [id, e] : entries_) {
    if (!e.queued) continue;
    if (std::optional<Refusal> r = CheckSize(e.request.priority, e.request.kv_resident, e.tokens)) {
      out.emplace_back(id, *std::move(r));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

void AdmissionController::SetWorkersAvailable(bool available) {
  if (available) {
    no_workers_since_ = -1;
  } else if (no_workers_since_ < 0) {
    no_workers_since_ = clock_->NowMicros();
  }
}

std::vector<uint64_t> AdmissionController::Stranded() const {
  std::vector<uint64_t> out;
  if (no_workers_since_ < 0 || options_.no_worker_timeout_ms <= 0) return out;
  const int64_t now = clock_->NowMicros();
  const int64_t timeout = options_.no_worker_timeout_ms * 1000;
  for (const auto& [id, e] : entries_) {
    if (e.queued && now - std::max(no_workers_since_, e.queued_at) >= timeout) out.push_back(id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void AdmissionController::RecordFinish(int64_t tokens, int64_t now) {
  if (first_observation_ < 0) first_observation_ = now;
  const int64_t bucket = now / kBucketMicros;
  if (finishes_.empty() || finishes_.back().first != bucket) {
    finishes_.emplace_back(bucket, 0);
  }
  finishes_.back().second += tokens;
  const int64_t oldest = (now - kRateWindowMicros) / kBucketMicros;
  while (!finishes_.empty() && finishes_.front().first <= oldest) finishes_.pop_front();
}

double AdmissionController::ServiceRate() const {
  const int64_t now = clock_->NowMicros();
  if (first_observation_ < 0 || now - first_observation_ < kMinObservationMicros) return 0;
  // Drop buckets older than the window (a const method keeps the deque as is and skips them).
  const int64_t oldest = (now - kRateWindowMicros) / kBucketMicros;
  int64_t tokens = 0;
  for (const auto& [bucket, n] : finishes_) {
    if (bucket > oldest) tokens += n;
  }
  if (tokens == 0) return 0;
  const int64_t span = std::min(kRateWindowMicros, now - first_observation_);
  return static_cast<double>(tokens) * 1e6 / static_cast<double>(span);
}

int64_t AdmissionController::RetryAfterMs(int64_t tokens) const {
  const double rate = ServiceRate();
  if (rate <= 0) return 200;
  const int64_t ms = static_cast<int64_t>(static_cast<double>(tokens) / rate * 1e3);
  return std::clamp<int64_t>(ms, 50, 10'000);
}

absl::Status AdmissionController::CheckInvariants() const {
  AdmissionCounters c;
  std::vector<int> active(tenant_state_.size(), 0);
  std::vector<int> batch_active(tenant_state_.size(), 0);
  for (const auto& [id, e] : entries_) {
    if (e.queued && e.request.batch_job) {
      ++c.batch_queued;
      c.batch_queued_tokens += e.tokens;
    } else if (e.queued) {
      ++c.queued[Index(e.request.priority)];
      c.queued_tokens += e.tokens;
      c.queued_tokens_by_class[Index(e.request.priority)] += e.tokens;
    } else {
      ++c.inflight;
      c.inflight_tokens += e.tokens;
      if (e.request.batch_job) ++c.batch_inflight;
    }
    if (e.request.tenant >= 0) ++(e.request.batch_job ? batch_active : active)[e.request.tenant];
  }
  const auto mismatch = [](const char* what, int64_t want, int64_t have) {
    return absl::InternalError(absl::StrCat(what, ": entries say ", want, ", counter says ", have));
  };
  for (int p = 0; p < kNumPriorities; ++p) {
    if (c.queued[p] != counters_.queued[p]) {
      return mismatch("queued", c.queued[p], counters_.queued[p]);
    }
    if (c.queued_tokens_by_class[p] != counters_.queued_tokens_by_class[p]) {
      return mismatch("queued tokens by class", c.queued_tokens_by_class[p],
                      counters_.queued_tokens_by_class[p]);
    }
  }
  if (c.inflight != counters_.inflight) return mismatch("inflight", c.inflight, counters_.inflight);
  if (c.queued_tokens != counters_.queued_tokens) {
    return mismatch("queued_tokens", c.queued_tokens, counters_.queued_tokens);
  }
  if (c.inflight_tokens != counters_.inflight_tokens) {
    return mismatch("inflight_tokens", c.inflight_tokens, counters_.inflight_tokens);
  }
  if (c.batch_queued != counters_.batch_queued) {
    return mismatch("batch lane queued", c.batch_queued, counters_.batch_queued);
  }
  if (c.batch_queued_tokens != counters_.batch_queued_tokens) {
    return mismatch("batch lane queued tokens", c.batch_queued_tokens,
                    counters_.batch_queued_tokens);
  }
  if (c.batch_inflight != counters_.batch_inflight) {
    return mismatch("batch lane inflight", c.batch_inflight, counters_.batch_inflight);
  }
  for (size_t t = 0; t < active.size(); ++t) {
    const TenantState& state = tenant_state_[t];
    if (active[t] != state.active) return mismatch("tenant active", active[t], state.active);
    if (batch_active[t] != state.batch_active) {
      return mismatch("tenant batch active", batch_active[t], state.batch_active);
    }
    const std::string& name = tenants_.at(static_cast<int>(t)).name;
    for (const Bucket* b : {&state.bucket, &state.batch_bucket}) {
      if (b->rate > 0 && b->tokens > static_cast<double>(b->burst) + 1e-6) {
        return absl::InternalError(absl::StrCat("tenant ", name, "'s ",
                                                b == &state.bucket ? "" : "batch ",
                                                "bucket overflows"));
      }
    }
  }
  // Every queued entry is in its queue once, and no queue holds another's entry.
  for (const auto& [id, e] : entries_) {
    if (!e.queued) continue;
    const auto& q = QueueOf(e);
    if (std::count(q.begin(), q.end(), id) != 1) {
      return absl::InternalError(
          absl::StrCat("queued request ", id, " is not in its queue exactly once"));
    }
  }
  return absl::OkStatus();
}

}  // namespace carpool::router
