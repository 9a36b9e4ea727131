// The router's admission controller: decides at arrival whether the cluster takes a request,
// holds the global queue of the ones it took, and says which one a worker should get next.
// Pure bookkeeping: no sockets, time from an injected Clock, so tests drive it by hand.
//
// Reservations. An admitted request reserves `tokens` (prompt + max_tokens) and one queue slot.
// Queued, it counts against max_queued_requests and max_queued_tokens; dispatched, against
// max_inflight_tokens. A batch job's request (below) counts against batch_max_queued instead of
// both queue limits, and dispatched against batch_max_in_flight as well as max_inflight_tokens.
// Release() gives everything back exactly once, wherever the request is; with no request left
// every counter is zero (CheckInvariants() verifies the sums).
//
// Size. A request must fit what the cluster could ever run: its tokens at most the in-flight
// budget of its class (below), and, for a request that lives in one worker's KV cache (generate,
// not embed), at most the largest registered worker's KV capacity. Larger ones are refused
// RESOURCE_EXHAUSTED too_large at admission. While a limit is unknown (no worker registered and
// no max_inflight_tokens) nothing is refused for it; Oversized() lists the queued requests that
// no longer fit once the limits are known (or after they shrank: a worker left), and Next()
// never returns them. A stalled worker shrinks the budget requests wait for, not these limits
// (SetCeilingTokens): what fits once it recovers is not ended.
//
// Order. Three FIFO queues, one per class. A queued request's level is its class's base
// (interactive 0, default 1, batch 2) minus one per `priority_aging_ms` it has waited, never
// below 0: a batch request waiting 2 aging periods competes with interactive work as an equal.
// The dispatch order merges the three queues, taking the lowest level, then the earliest
// arrival. Next() walks that order and returns the first request whose tokens fit the in-flight
// budget of its class (everything for interactive; max_inflight_tokens -
// interactive_reserve_tokens for the others; while the budget is unknown, one request at a
// time). A request that does not fit (or that the caller could not place on a worker) is
// overtaken by requests behind it that fit, among the next kMaxSkipAhead, while it has waited
// less than `skip_ahead_ms`; once it has waited that long nothing behind it goes: the budget is
// held for it until the requests in flight have left it room. So small requests pass a large
// one for skip_ahead_ms, and after that nothing overtakes it: it is never starved.
//
// The batch lane. A request of a batch job (AdmissionRequest::batch_job, sent by the router's
// batch runner, docs/batch.md) waits in a FIFO of its own, below all three classes: it runs at
// the batch class and never ages. Next() takes it only when no other request is queued and
// eligible (deadline not passed, not oversized), whether or not that one fits the budget now:
// while interactive work waits, the batch lane yields. It also needs fewer than
// batch_max_in_flight batch jobs' requests in flight and room in the batch class's budget
// (max_inflight_tokens - interactive_reserve_tokens); within the lane, requests that fit pass
// one that does not by the skip-ahead rule above. A batch job's request does not count against
// its tenant's max_concurrent, and draws on the tenant's batch bucket
// (TenantConfig::batch_tokens_per_minute), never on its interactive one. Those already in flight
// yield as well: HeldForBudget() names the request at the head of the order that waits for the
// budget, and the router preempts batch jobs' requests to make it room (router_workers.cc).
//
// Deadlines. Expired() lists queued requests whose deadline has passed (Next() never returns
// them), and Overdue() the dispatched ones. At admission a request with a deadline is refused
// `deadline_unmeetable` when
//   queued tokens at its class or better  /  measured service rate  >  its deadline,
// (for a batch job's request: every queued token, the batch lane's included),
// where the service rate is the reserved tokens of requests that finished in the last
// kRateWindowMicros, per second (unknown, and never a reason to refuse, until a full second of
// observations with at least one finish exists).
//
// Tenants (router/tenants.h) are indices into the table given at construction; -1 is the
// anonymous tenant of a router without --tenants (no limits).
//
// Thread-compatible: owned by the router's event loop.
#ifndef CARPOOL_ROUTER_ADMISSION_H_
#define CARPOOL_ROUTER_ADMISSION_H_

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/messages.h"
#include "router/tenants.h"

namespace carpool::router {

inline constexpr int kNumPriorities = 3;  // indexed by static_cast<int>(Priority)
inline constexpr int64_t kRateWindowMicros = 10'000'000;
// Next() looks at most this many requests past the ones that cannot go.
inline constexpr int kMaxSkipAhead = 256;

struct AdmissionOptions {
  // Requests queued at once; beyond it UNAVAILABLE queue_full. Default: 10000.
  int max_queued_requests = 10000;
  // Tokens (prompt + max_tokens) reserved by queued requests; beyond it RESOURCE_EXHAUSTED
  // token_budget. Default: 0 = no limit.
  int64_t max_queued_tokens = 0;
  // Tokens reserved by dispatched requests, cluster-wide. 0: the workers' KV capacity (the sum
  // of num_kv_blocks * block_size, from SetCapacityTokens). Default: 0.
  int64_t max_inflight_tokens = 0;
  // Part of the in-flight budget only interactive requests may use. Default: 0.
  int64_t interactive_reserve_tokens = 0;
  // Waiting this long raises a queued request one class (not a batch job's). Default: 5000.
  int64_t priority_aging_ms = 5000;
  // Batch jobs' requests dispatched at once (--batch-max-in-flight). Default: 64.
  int batch_max_in_flight = 64;
  // Batch jobs' requests queued at once; beyond it UNAVAILABLE queue_full
  // (--batch-max-queued). Default: 64.
  int batch_max_queued = 64;
  // How long requests that fit may go ahead of a queued request that does not; after that the
  // in-flight budget is held for it. 0: never overtaken. Default: 2000.
  int64_t skip_ahead_ms = 2000;
  // A queued request with no worker able to serve it for this long is Stranded(). 0: it waits
  // for one without end. Default: 30000.
  int64_t no_worker_timeout_ms = 30000;
  // Not owned; Clock::Real() when null.
  Clock* clock = nullptr;

  absl::Status Validate() const;
};

struct AdmissionRequest {
  uint64_t id = 0;                 // the request's router_id: unique for the controller's life
  int tenant = -1;                 // index into the tenant table; -1: anonymous
  Priority priority = Priority::kDefault;
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 0;
  int64_t deadline_micros = 0;     // absolute, on the clock; 0: none
  // Its tokens live in one worker's KV cache while it runs (generate); false for an embed,
  // which keeps no KV once its forward pass is done.
  bool kv_resident = true;
  // A request of a batch job: admitted in the batch lane (see the top of this file), at
  // Priority::kBatch whatever `priority` says.
  bool batch_job = false;
};

// Why a request was not admitted, as the client will see it.
struct Refusal {
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  const char* reason = reason::kQueueFull;
  std::string message;
  int64_t retry_after_ms = 0;
};

struct AdmissionCounters {
  // The class queues: every queued request but batch jobs'.
  std::array<int, kNumPriorities> queued = {0, 0, 0};
  int64_t queued_tokens = 0;
  std::array<int64_t, kNumPriorities> queued_tokens_by_class = {0, 0, 0};
  // Every dispatched request, batch jobs' included (they share the in-flight budget).
  int inflight = 0;
  int64_t inflight_tokens = 0;
  // The batch lane: batch jobs' requests queued, and those of `inflight` that are batch jobs'.
  int batch_queued = 0;
  int64_t batch_queued_tokens = 0;
  int batch_inflight = 0;
};

class AdmissionController {
 public:
  AdmissionController(const AdmissionOptions& options, TenantTable tenants);

  // Admits `request` (it is queued at the back of its class, or of the batch lane) or says why
  // not. Checks, in order: size, tenant priority, tenant concurrency and token bucket, queue
  // slots, queued tokens, deadline; for a batch job's request: size, tenant priority, the
  // tenant's batch bucket, the batch lane's slots, deadline.
  std::optional<Refusal> Admit(const AdmissionRequest& request);

  // The queued request that should be dispatched now, by the rule above; nullopt when none may
  // go. `unplaced`: requests the caller found no worker for just now; they count as not fitting
  // (and are overtaken, or held for, like one). At most kMaxSkipAhead requests that cannot go
  // are passed over. Does not change state (but forgets ids released while queued).
  std::optional<uint64_t> Next(const absl::flat_hash_set<uint64_t>& unplaced = {});
  // The first request of the dispatch order (queued, eligible, not a batch job's) when it waits
  // for in-flight budget: not in `unplaced`, and its tokens do not fit its class's budget now.
  // With the tokens it lacks, which the router may free by preempting batch jobs' requests.
  // nullopt when it fits, none waits, or the budget is unknown.
  std::optional<std::pair<uint64_t, int64_t>> HeldForBudget(
      const absl::flat_hash_set<uint64_t>& unplaced) const;
  // The tokens a request reserves (prompt + max_tokens; an embed's inputs); 0 for an unknown id.
  int64_t ReservedTokens(uint64_t id) const;
  // Moves a queued request to in flight. REQUIRES: it is queued.
  void MarkDispatched(uint64_t id);
  // Puts an in-flight request back at the front of its class or of the batch lane (its worker
  // died or refused it). Its place in the queue may exceed max_queued_requests (or
  // batch_max_queued) for a while. REQUIRES: in flight.
  void Requeue(uint64_t id);
  // Ends a request wherever it is. `generated_tokens` were produced for it (refunded from the
  // tenant's bucket: what it did not use of max_tokens, or everything if never dispatched);
  // `completed` feeds the service rate. False (and nothing changes) for an unknown id.
  bool Release(uint64_t id, int64_t generated_tokens, bool completed);

  // Queued requests whose deadline is at or before now; dispatched ones (Overdue).
  std::vector<uint64_t> Expired() const;
  std::vector<uint64_t> Overdue() const;

  // The cluster's KV capacity in tokens; the in-flight budget when max_inflight_tokens is 0.
  void SetCapacityTokens(int64_t tokens) { capacity_tokens_ = tokens; }
  int64_t max_inflight_tokens() const;
  // What the cluster could run once every registered worker serves again (stalled ones
  // included), in tokens: too_large is judged against this, not against what serves right now,
  // so a worker stalled for a moment ends nothing that would fit when it recovers. 0: the same
  // as the capacity.
  void SetCeilingTokens(int64_t tokens) { ceiling_tokens_ = tokens; }
  // The largest KV capacity of one registered worker, in tokens; 0: unknown (no limit).
  void SetLargestWorkerTokens(int64_t tokens) { largest_worker_tokens_ = tokens; }
  // Queued requests that can never be dispatched under the present limits (see Size), with the
  // too_large refusal each should end with. Sorted by id.
  std::vector<std::pair<uint64_t, Refusal>> Oversized() const;

  // Whether some worker can serve requests now. While none can, a queued request's wait for one
  // runs from the later of the moment the last one went and the request's (re)queueing.
  void SetWorkersAvailable(bool available);
  // Queued requests that have waited no_worker_timeout_ms with no worker; sorted by id.
  std::vector<uint64_t> Stranded() const;

  // Reserved tokens finished per second over the window; 0 while unknown.
  double ServiceRate() const;
  // A retry_after_ms hint for a client refused for lack of room: the time the cluster needs to
  // finish `tokens` at the measured rate, clamped to [50, 10000]; 200 while the rate is unknown.
  int64_t RetryAfterMs(int64_t tokens) const;

  bool Contains(uint64_t id) const { return entries_.contains(id); }
  bool IsQueued(uint64_t id) const;
  const AdmissionCounters& counters() const { return counters_; }
  const TenantTable& tenants() const { return tenants_; }
  // The tenant's requests admitted and not ended, batch jobs' included.
  int TenantActive(int tenant) const;
  // Recomputes every counter from the entries; an error names the first mismatch.
  absl::Status CheckInvariants() const;

 private:
  struct Entry {
    AdmissionRequest request;
    int64_t tokens = 0;
    int64_t arrival = 0;
    int64_t queued_at = 0;  // admission or the last Requeue
    bool queued = true;
  };
  // A token bucket: `rate` tokens per minute up to `burst`; no limit when rate <= 0.
  struct Bucket {
    int64_t rate = 0;
    int64_t burst = 0;
    double tokens = 0;        // available
    int64_t refilled_at = 0;  // micros
  };
  struct TenantState {
    int active = 0;        // requests that count against max_concurrent (not batch jobs')
    int batch_active = 0;  // batch jobs' requests
    Bucket bucket;
    Bucket batch_bucket;
  };

  int Level(const Entry& e, int64_t now) const;
  // The in-flight budget of class `p` (may be <= 0 when the reserve takes it all).
  // REQUIRES: max_inflight_tokens() > 0, i.e. the budget is known.
  int64_t ClassBudget(Priority p) const;
  bool Fits(const Entry& e) const;
  // Why a request of `tokens` can never be dispatched under the present limits; nullopt if it
  // can (or a limit is unknown).
  std::optional<Refusal> CheckSize(Priority priority, bool kv_resident, int64_t tokens) const;
  // Whether the queued entry `id` may be dispatched now by everything but the budget: queued,
  // deadline not passed, not oversized.
  bool Eligible(uint64_t id, int64_t now) const;
  static void Refill(Bucket* b, int64_t now);
  // The bucket a request of tenant `t` draws on: its batch bucket for a batch job's request.
  static Bucket& BucketOf(TenantState& t, const AdmissionRequest& r) {
    return r.batch_job ? t.batch_bucket : t.bucket;
  }
  std::optional<Refusal> CheckTenant(const AdmissionRequest& r, int64_t tokens, int64_t now);
  // The queue of a queued entry: its class's or the batch lane.
  std::deque<uint64_t>& QueueOf(const Entry& e);
  const std::deque<uint64_t>& QueueOf(const Entry& e) const;
  // Moves `e`'s reservation between the queued and in-flight counters.
  void CountQueued(const Entry& e, int sign);
  void CountInflight(const Entry& e, int sign);
  // The batch lane's next request, by the rule of Next(). REQUIRES: no other request is
  // queued and eligible.
  std::optional<uint64_t> NextBatchJob(const absl::flat_hash_set<uint64_t>& unplaced,
                                       int64_t now);
  void RecordFinish(int64_t tokens, int64_t now);

  AdmissionOptions options_;
  Clock* clock_;
  TenantTable tenants_;
  std::vector<TenantState> tenant_state_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  // Ids in arrival order per class, and the batch lane's; ids no longer queued are skipped and
  // dropped lazily.
  std::array<std::deque<uint64_t>, kNumPriorities> queues_;
  std::deque<uint64_t> batch_lane_;
  AdmissionCounters counters_;
  int64_t capacity_tokens_ = 0;
  int64_t ceiling_tokens_ = 0;
  int64_t largest_worker_tokens_ = 0;
  // Since when no worker can serve requests; -1 while one can.
  int64_t no_workers_since_ = -1;
  // Finished reserved tokens per 100 ms bucket over the rate window.
  std::deque<std::pair<int64_t, int64_t>> finishes_;
  int64_t first_observation_ = -1;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_ADMISSION_H_
