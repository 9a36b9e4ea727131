#include "router/admission.h"

#include <random>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

constexpr char kTenants[] = R"pb(
  tenant { key: "k-alpha" name: "alpha" max_concurrent: 4 tokens_per_minute: 6000 burst_tokens: 600 }
  tenant { key: "k-beta" name: "beta" max_priority: PRIORITY_INTERACTIVE }
)pb";

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionController Make(AdmissionOptions o, bool tenants = false) {
    o.clock = &clock_;
    TenantTable t;
    if (tenants) {
      auto parsed = TenantTable::Parse(kTenants);
      EXPECT_TRUE(parsed.ok()) << parsed.status();
      t = *parsed;
    }
    return AdmissionController(o, t);
  }
  AdmissionRequest Req(Priority p, int64_t prompt, int64_t max_tokens, int tenant = -1) {
    AdmissionRequest r;
    r.id = next_id_++;
    r.priority = p;
    r.prompt_tokens = prompt;
    r.max_tokens = max_tokens;
    r.tenant = tenant;
    return r;
  }
  // A batch job's request, as the router's batch runner sends it.
  AdmissionRequest BatchJob(int64_t prompt, int64_t max_tokens, int tenant = -1) {
    AdmissionRequest r = Req(Priority::kBatch, prompt, max_tokens, tenant);
    r.batch_job = true;
    return r;
  }
  // Dispatches what Next() gives; its id, or 0 when nothing may go.
  uint64_t DispatchNext(AdmissionController& a) {
    std::optional<uint64_t> id = a.Next();
    if (!id) return 0;
    a.MarkDispatched(*id);
    return *id;
  }
  FakeClock clock_{1'000'000};
  uint64_t next_id_ = 1;
};

TEST_F(AdmissionTest, QueueFullAndTokenBudgetAreTypedRefusalsWithRetryAfter) {
  AdmissionOptions o;
  o.max_queued_requests = 2;
  o.max_queued_tokens = 100;
  AdmissionController a = Make(o);
  EXPECT_FALSE(a.Admit(Req(Priority::kDefault, 10, 10)).has_value());
  auto big = a.Admit(Req(Priority::kDefault, 60, 40));
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->reason, std::string(reason::kTokenBudget));
  EXPECT_EQ(big->code, absl::StatusCode::kResourceExhausted);
  EXPECT_GT(big->retry_after_ms, 0);
  auto never = a.Admit(Req(Priority::kDefault, 100, 1));
  ASSERT_TRUE(never.has_value());
  EXPECT_THAT(never->message, HasSubstr("budget is 100"));
  EXPECT_FALSE(a.Admit(Req(Priority::kDefault, 10, 10)).has_value());
  auto full = a.Admit(Req(Priority::kDefault, 1, 1));
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->reason, std::string(reason::kQueueFull));
  EXPECT_EQ(full->code, absl::StatusCode::kUnavailable);
  EXPECT_GT(full->retry_after_ms, 0);
  EXPECT_EQ(a.counters().queued_tokens, 40);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST_F(AdmissionTest, InteractiveFirstThenAgingLetsBatchCatchUp) {
  AdmissionOptions o;
  o.priority_aging_ms = 1000;
  AdmissionController a = Make(o);
  a.SetCapacityTokens(1 << 20);
  const AdmissionRequest batch = Req(Priority::kBatch, 1, 1);
  ASSERT_FALSE(a.Admit(batch).has_value());
  clock_.AdvanceMicros(1000);
  const AdmissionRequest inter = Req(Priority::kInteractive, 1, 1);
  ASSERT_FALSE(a.Admit(inter).has_value());
  EXPECT_EQ(a.Next(), inter.id);
  // After two aging periods the batch request is level 0 and older: it goes first.
  clock_.AdvanceMicros(2'000'000);
  const AdmissionRequest inter2 = Req(Priority::kInteractive, 1, 1);
  ASSERT_FALSE(a.Admit(inter2).has_value());
  EXPECT_EQ(a.Next(), batch.id);
}

TEST_F(AdmissionTest, InflightBudgetAndInteractiveReserve) {
  AdmissionOptions o;
  o.max_inflight_tokens = 100;
  o.interactive_reserve_tokens = 30;
  AdmissionController a = Make(o);
  const AdmissionRequest d1 = Req(Priority::kDefault, 30, 30);
  const AdmissionRequest d2 = Req(Priority::kDefault, 5, 5);
  const AdmissionRequest i1 = Req(Priority::kInteractive, 10, 10);
  for (const auto& r : {d1, d2}) ASSERT_FALSE(a.Admit(r).has_value());
  ASSERT_EQ(a.Next(), d1.id);
  a.MarkDispatched(d1.id);
  // d2 would reach 70 of the 70 non-interactive tokens: fits exactly.
  ASSERT_EQ(a.Next(), d2.id);
  a.MarkDispatched(d2.id);
  const AdmissionRequest d3 = Req(Priority::kDefault, 1, 1);
  ASSERT_FALSE(a.Admit(d3).has_value());
  EXPECT_EQ(a.Next(), std::nullopt);  // only the reserve is left
  ASSERT_FALSE(a.Admit(i1).has_value());
  EXPECT_EQ(a.Next(), i1.id);  // interactive may use it
  EXPECT_EQ(a.max_inflight_tokens(), 100);
}

TEST_F(AdmissionTest, TenantsQuotaPriorityAndRefunds) {
  AdmissionController a = Make(AdmissionOptions(), /*tenants=*/true);
  // alpha may not send interactive work.
  auto prio = a.Admit(Req(Priority::kInteractive, 1, 1, 0));
  ASSERT_TRUE(prio.has_value());
  EXPECT_EQ(prio->reason, std::string(reason::kInvalidArgument));
  // Bucket of 600 tokens, refilled at 100/s.
  const AdmissionRequest r1 = Req(Priority::kDefault, 200, 300, 0);
  ASSERT_FALSE(a.Admit(r1).has_value());
  auto over = a.Admit(Req(Priority::kDefault, 100, 100, 0));
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->reason, std::string(reason::kTenantQuota));
  EXPECT_EQ(over->retry_after_ms, 1000);  // 100 missing tokens at 100 tokens/s
  // Finishing after 50 of 300 tokens refunds the other 250.
  a.SetCapacityTokens(10000);
  a.MarkDispatched(*a.Next());
  ASSERT_TRUE(a.Release(r1.id, 50, true));
  EXPECT_FALSE(a.Release(r1.id, 50, true));  // exactly once
  EXPECT_FALSE(a.Admit(Req(Priority::kDefault, 100, 100, 0)).has_value());
  // Concurrency: 4 at most.
  for (int i = 0; i < 3; ++i) ASSERT_FALSE(a.Admit(Req(Priority::kBatch, 1, 1, 0)).has_value());
  auto busy = a.Admit(Req(Priority::kBatch, 1, 1, 0));
  ASSERT_TRUE(busy.has_value());
  EXPECT_THAT(busy->message, HasSubstr("in flight"));
  // beta: no limits, interactive allowed.
  EXPECT_FALSE(a.Admit(Req(Priority::kInteractive, 5000, 5000, 1)).has_value());
  EXPECT_EQ(a.TenantActive(0), 4);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST_F(AdmissionTest, DeadlinesExpireAndUnmeetableOnesAreRefused) {
  AdmissionController a = Make(AdmissionOptions());
  a.SetCapacityTokens(1000);
  // Measure a rate: 10 requests of 100 tokens finish over 1 s = 1000 tokens/s.
  for (int i = 0; i < 10; ++i) {
    const AdmissionRequest r = Req(Priority::kDefault, 50, 50);
    ASSERT_FALSE(a.Admit(r).has_value());
    a.MarkDispatched(*a.Next());
    clock_.AdvanceMicros(120'000);
    ASSERT_TRUE(a.Release(r.id, 50, true));
  }
  EXPECT_NEAR(a.ServiceRate(), 1000, 150);
  // Queue 2000 tokens ahead: 2 s of work.
  for (int i = 0; i < 20; ++i) ASSERT_FALSE(a.Admit(Req(Priority::kDefault, 50, 50)).has_value());
  AdmissionRequest tight = Req(Priority::kDefault, 10, 10);
  tight.deadline_micros = clock_.NowMicros() + 500'000;
  auto refused = a.Admit(tight);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->reason, std::string(reason::kDeadlineUnmeetable));
  // Interactive work is not behind the default queue.
  AdmissionRequest inter = Req(Priority::kInteractive, 10, 10);
  inter.deadline_micros = clock_.NowMicros() + 500'000;
  ASSERT_FALSE(a.Admit(inter).has_value());
  AdmissionRequest loose = Req(Priority::kDefault, 10, 10);
  loose.deadline_micros = clock_.NowMicros() + 5'000'000;
  ASSERT_FALSE(a.Admit(loose).has_value());
  clock_.AdvanceMicros(600'000);
  EXPECT_EQ(a.Expired(), std::vector<uint64_t>{inter.id});
  // An expired request is never the next one, even at the head of the best class.
  EXPECT_NE(a.Next(), inter.id);
}

TEST_F(AdmissionTest, TooLargeIsRefusedAtOnceNamingTheLimit) {
  AdmissionOptions o;
  o.interactive_reserve_tokens = 200;
  AdmissionController a = Make(o);
  a.SetCapacityTokens(1000);
  a.SetLargestWorkerTokens(600);
  auto over_class = a.Admit(Req(Priority::kDefault, 700, 200));
  ASSERT_TRUE(over_class.has_value());
  EXPECT_EQ(over_class->code, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over_class->reason, std::string(reason::kTooLarge));
  EXPECT_EQ(over_class->retry_after_ms, 0);  // retrying cannot help
  EXPECT_THAT(over_class->message, HasSubstr("reserves 900 tokens"));
  EXPECT_THAT(over_class->message, HasSubstr("may use 800 of the cluster's 1000"));
  auto over_all = a.Admit(Req(Priority::kInteractive, 1000, 1));
  ASSERT_TRUE(over_all.has_value());
  EXPECT_THAT(over_all->message, HasSubstr("in-flight token budget is 1000"));
  // One sequence must fit one worker's KV cache; an embed keeps none.
  auto over_worker = a.Admit(Req(Priority::kInteractive, 500, 200));
  ASSERT_TRUE(over_worker.has_value());
  EXPECT_THAT(over_worker->message, HasSubstr("largest worker's KV cache holds 600"));
  AdmissionRequest embed = Req(Priority::kInteractive, 700, 0);
  embed.kv_resident = false;
  EXPECT_FALSE(a.Admit(embed).has_value());
  EXPECT_FALSE(a.Admit(Req(Priority::kDefault, 400, 200)).has_value());
  EXPECT_TRUE(a.Oversized().empty());
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST_F(AdmissionTest, WithUnknownCapacityNothingIsRefusedButOversizedOnesNeverGo) {
  AdmissionController a = Make(AdmissionOptions());
  // No worker has registered: the limit is unknown, so nothing is too large yet.
  const AdmissionRequest big = Req(Priority::kDefault, 4000, 1000);
  const AdmissionRequest small = Req(Priority::kDefault, 10, 10);
  ASSERT_FALSE(a.Admit(big).has_value());
  ASSERT_FALSE(a.Admit(small).has_value());
  EXPECT_TRUE(a.Oversized().empty());
  // A worker of 1000 tokens registers: the big one can never run; it is reported, never
  // returned by Next(), and holds no budget: the small one goes.
  a.SetCapacityTokens(1000);
  a.SetLargestWorkerTokens(1000);
  const auto oversized = a.Oversized();
  ASSERT_EQ(oversized.size(), 1u);
  EXPECT_EQ(oversized[0].first, big.id);
  EXPECT_EQ(oversized[0].second.reason, std::string(reason::kTooLarge));
  EXPECT_THAT(oversized[0].second.message, HasSubstr("reserves 5000 tokens"));
  clock_.AdvanceMicros(60'000'000);  // long past any skip-ahead bound
  EXPECT_EQ(a.Next(), small.id);
  // The same happens to a request requeued onto a cluster that shrank.
  a.MarkDispatched(small.id);
  a.SetCapacityTokens(15);
  a.Requeue(small.id);
  ASSERT_EQ(a.Oversized().size(), 2u);
  EXPECT_EQ(a.Next(), std::nullopt);
}

TEST_F(AdmissionTest, AStalledWorkersCapacityStillCountsForTooLarge) {
  AdmissionController a = Make(AdmissionOptions());
  a.SetCapacityTokens(1000);
  a.SetCeilingTokens(1000);
  a.SetLargestWorkerTokens(600);
  const AdmissionRequest r = Req(Priority::kDefault, 500, 100);
  ASSERT_FALSE(a.Admit(r).has_value());
  // One of two 500-token workers stalls: 600 tokens no longer fit the budget, so the request
  // waits; it is not too large, since it fits once the worker recovers.
  a.SetCapacityTokens(500);
  EXPECT_TRUE(a.Oversized().empty());
  EXPECT_EQ(a.Next(), std::nullopt);
  a.SetCapacityTokens(1000);
  EXPECT_EQ(a.Next(), r.id);
  // A worker gone for good takes its part of the ceiling with it.
  a.SetCapacityTokens(500);
  a.SetCeilingTokens(500);
  ASSERT_EQ(a.Oversized().size(), 1u);
  EXPECT_TRUE(a.Release(r.id, 0, false));
  EXPECT_TRUE(a.CheckInvariants().ok());
}

// The old rule (no smaller request overtakes a larger one) let one large request stall the
// queue. Now: requests that fit go ahead of one that does not for skip_ahead_ms; then the budget
// is held for it, so it is not starved.
TEST_F(AdmissionTest, SmallRequestsSkipAheadOfALargeOneUntilItHasWaitedTheBound) {
  AdmissionOptions o;
  o.skip_ahead_ms = 1000;
  o.priority_aging_ms = 60'000;
  AdmissionController a = Make(o);
  a.SetCapacityTokens(100);
  const AdmissionRequest running = Req(Priority::kDefault, 30, 30);
  ASSERT_FALSE(a.Admit(running).has_value());
  a.MarkDispatched(*a.Next());
  const AdmissionRequest large = Req(Priority::kDefault, 40, 40);
  const AdmissionRequest small1 = Req(Priority::kDefault, 2, 2);
  const AdmissionRequest small2 = Req(Priority::kDefault, 2, 2);
  for (const auto& r : {large, small1, small2}) ASSERT_FALSE(a.Admit(r).has_value());
  // 60 + 80 > 100: the large one waits, the small ones behind it go.
  ASSERT_EQ(a.Next(), small1.id);
  a.MarkDispatched(small1.id);
  // Ones the router could not place count as not fitting, and are passed over too.
  EXPECT_EQ(a.Next({small2.id}), std::nullopt);
  clock_.AdvanceMicros(999'000);
  const AdmissionRequest small3 = Req(Priority::kDefault, 2, 2);
  ASSERT_FALSE(a.Admit(small3).has_value());
  EXPECT_EQ(a.Next({small2.id}), small3.id);
  // The large one has waited the bound: nothing behind it goes now, though it would fit.
  clock_.AdvanceMicros(1000);
  EXPECT_EQ(a.Next(), std::nullopt);
  // A better class is ahead of it in the order and still goes.
  const AdmissionRequest inter = Req(Priority::kInteractive, 2, 2);
  ASSERT_FALSE(a.Admit(inter).has_value());
  ASSERT_EQ(a.Next(), inter.id);
  a.MarkDispatched(inter.id);
  EXPECT_EQ(a.Next(), std::nullopt);
  // Room is made when the running request ends: the large one goes first, then the rest.
  ASSERT_TRUE(a.Release(running.id, 30, true));
  ASSERT_EQ(a.Next(), large.id);
  a.MarkDispatched(large.id);
  EXPECT_EQ(a.Next(), small2.id);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST_F(AdmissionTest, SkipAheadZeroKeepsStrictOrder) {
  AdmissionOptions o;
  o.skip_ahead_ms = 0;
  AdmissionController a = Make(o);
  a.SetCapacityTokens(100);
  const AdmissionRequest running = Req(Priority::kDefault, 50, 0);
  const AdmissionRequest large = Req(Priority::kDefault, 60, 0);
  const AdmissionRequest small = Req(Priority::kDefault, 1, 0);
  for (const auto& r : {running, large, small}) ASSERT_FALSE(a.Admit(r).has_value());
  a.MarkDispatched(*a.Next());
  EXPECT_EQ(a.Next(), std::nullopt);
}

TEST_F(AdmissionTest, QueuedRequestsAreStrandedAfterTheNoWorkerTimeout) {
  AdmissionOptions o;
  o.no_worker_timeout_ms = 30'000;
  AdmissionController a = Make(o);
  a.SetCapacityTokens(1000);
  const AdmissionRequest early = Req(Priority::kDefault, 1, 1);
  const AdmissionRequest running = Req(Priority::kDefault, 1, 1);
  ASSERT_FALSE(a.Admit(running).has_value());
  a.MarkDispatched(*a.Next());
  ASSERT_FALSE(a.Admit(early).has_value());
  clock_.AdvanceMicros(60'000'000);  // waiting for a busy cluster is not waiting for no worker
  EXPECT_TRUE(a.Stranded().empty());
  a.SetWorkersAvailable(false);  // the last worker died
  clock_.AdvanceMicros(20'000'000);
  a.Requeue(running.id);  // its worker was the one lost
  const AdmissionRequest late = Req(Priority::kDefault, 1, 1);
  ASSERT_FALSE(a.Admit(late).has_value());
  clock_.AdvanceMicros(9'999'999);
  EXPECT_TRUE(a.Stranded().empty());
  clock_.AdvanceMicros(1);
  EXPECT_EQ(a.Stranded(), std::vector<uint64_t>{early.id});
  a.SetWorkersAvailable(false);  // still none: the outage's start stays
  clock_.AdvanceMicros(20'000'000);
  EXPECT_EQ(a.Stranded(), (std::vector<uint64_t>{early.id, running.id, late.id}));
  a.SetWorkersAvailable(true);
  EXPECT_TRUE(a.Stranded().empty());
  // 0 turns it off.
  AdmissionOptions forever;
  forever.no_worker_timeout_ms = 0;
  AdmissionController b = Make(forever);
  b.SetWorkersAvailable(false);
  ASSERT_FALSE(b.Admit(Req(Priority::kDefault, 1, 1)).has_value());
  clock_.AdvanceMicros(3'600'000'000);
  EXPECT_TRUE(b.Stranded().empty());
}

TEST_F(AdmissionTest, TheBatchLaneWaitsWhileAnyOtherRequestIsQueued) {
  AdmissionOptions o;
  o.max_inflight_tokens = 100;
  AdmissionController a = Make(o);
  const AdmissionRequest job1 = BatchJob(10, 10);
  const AdmissionRequest job2 = BatchJob(10, 10);
  for (const auto& r : {job1, job2}) ASSERT_FALSE(a.Admit(r).has_value());
  EXPECT_EQ(a.counters().batch_queued, 2);
  EXPECT_EQ(a.counters().batch_queued_tokens, 40);
  EXPECT_EQ(a.counters().queued[static_cast<int>(Priority::kBatch)], 0);
  EXPECT_EQ(a.counters().queued_tokens, 0);
  // A default request arriving after them goes first.
  const AdmissionRequest big = Req(Priority::kDefault, 30, 30);
  ASSERT_FALSE(a.Admit(big).has_value());
  ASSERT_EQ(DispatchNext(a), big.id);
  // One that cannot go now (60 + 60 > 100) still holds the lane back, though a job would fit.
  const AdmissionRequest waiting = Req(Priority::kDefault, 30, 30);
  ASSERT_FALSE(a.Admit(waiting).has_value());
  EXPECT_EQ(a.Next(), std::nullopt);
  // So does one that fits but that the router could not place just now.
  ASSERT_TRUE(a.Release(big.id, 30, true));
  EXPECT_EQ(a.Next({waiting.id}), std::nullopt);
  ASSERT_EQ(DispatchNext(a), waiting.id);
  // Nothing else is queued: the lane goes, in arrival order.
  EXPECT_EQ(DispatchNext(a), job1.id);
  // An interactive arrival goes before the job queued ahead of it.
  const AdmissionRequest inter = Req(Priority::kInteractive, 1, 1);
  ASSERT_FALSE(a.Admit(inter).has_value());
  EXPECT_EQ(DispatchNext(a), inter.id);
  EXPECT_EQ(DispatchNext(a), 0u);  // 60 + 20 + 2 in flight leave 18: the job waits for room
  ASSERT_TRUE(a.Release(waiting.id, 30, true));
  EXPECT_EQ(DispatchNext(a), job2.id);
  EXPECT_EQ(a.counters().batch_inflight, 2);
  EXPECT_EQ(a.counters().inflight, 3);
  EXPECT_EQ(a.counters().inflight_tokens, 42);
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
  for (uint64_t id : {job1.id, job2.id, inter.id}) ASSERT_TRUE(a.Release(id, 1, true));
  const AdmissionCounters& c = a.counters();
  EXPECT_EQ(c.inflight + c.batch_inflight + c.batch_queued, 0);
  EXPECT_EQ(c.inflight_tokens + c.batch_queued_tokens, 0);
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
}

TEST_F(AdmissionTest, ExpiredOrOversizedRequestsDoNotHoldTheBatchLaneBack) {
  AdmissionOptions o;
  o.max_inflight_tokens = 100;
  AdmissionController a = Make(o);
  AdmissionRequest late = Req(Priority::kInteractive, 1, 1);
  late.deadline_micros = clock_.NowMicros() + 1000;
  const AdmissionRequest job = BatchJob(1, 1);
  for (const auto& r : {late, job}) ASSERT_FALSE(a.Admit(r).has_value());
  clock_.AdvanceMicros(1000);
  // `late` waits for Expired() to end it, and never goes: it holds nothing back.
  EXPECT_EQ(a.Expired(), std::vector<uint64_t>{late.id});
  EXPECT_EQ(a.Next(), job.id);
  // Nor does one that no longer fits the cluster (its workers left), until Oversized() ends it.
  AdmissionController b = Make(AdmissionOptions());
  b.SetCapacityTokens(1000);
  const AdmissionRequest large = Req(Priority::kDefault, 400, 400);
  const AdmissionRequest job2 = BatchJob(1, 1);
  for (const auto& r : {large, job2}) ASSERT_FALSE(b.Admit(r).has_value());
  b.SetCapacityTokens(500);
  ASSERT_EQ(b.Oversized().size(), 1u);
  EXPECT_EQ(b.Next(), job2.id);
}

TEST_F(AdmissionTest, BatchJobsNeverAgePastOtherClasses) {
  AdmissionOptions o;
  o.priority_aging_ms = 1000;
  AdmissionController a = Make(o);
  a.SetCapacityTokens(1 << 20);
  const AdmissionRequest job = BatchJob(1, 1);
  const AdmissionRequest plain_batch = Req(Priority::kBatch, 1, 1);
  for (const auto& r : {job, plain_batch}) ASSERT_FALSE(a.Admit(r).has_value());
  // An hour later (3600 aging periods) interactive and default arrivals still go first, and a
  // batch-class request that is not a batch job's ages as before.
  clock_.AdvanceMicros(3'600'000'000);
  const AdmissionRequest inter = Req(Priority::kInteractive, 1, 1);
  const AdmissionRequest def = Req(Priority::kDefault, 1, 1);
  for (const auto& r : {inter, def}) ASSERT_FALSE(a.Admit(r).has_value());
  EXPECT_EQ(DispatchNext(a), plain_batch.id);  // aged to level 0, and older
  EXPECT_EQ(DispatchNext(a), inter.id);
  EXPECT_EQ(DispatchNext(a), def.id);
  EXPECT_EQ(DispatchNext(a), job.id);
  // Whatever class the caller named, a batch job's request is the batch class's.
  AdmissionRequest odd = BatchJob(1, 1);
  odd.priority = Priority::kInteractive;
  ASSERT_FALSE(a.Admit(odd).has_value());
  EXPECT_EQ(a.counters().batch_queued, 1);
  EXPECT_EQ(a.counters().queued[static_cast<int>(Priority::kInteractive)], 0);
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
}

TEST_F(AdmissionTest, BatchMaxInFlightAndBatchMaxQueuedAreEnforced) {
  AdmissionOptions o;
  o.batch_max_in_flight = 2;
  o.batch_max_queued = 3;
  AdmissionController a = Make(o);
  a.SetCapacityTokens(1000);
  std::vector<AdmissionRequest> jobs;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(BatchJob(5, 5));
    ASSERT_FALSE(a.Admit(jobs.back()).has_value());
  }
  auto full = a.Admit(BatchJob(5, 5));
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(full->reason, std::string(reason::kQueueFull));
  EXPECT_GT(full->retry_after_ms, 0);
  EXPECT_THAT(full->message, HasSubstr("batch lane holds 3"));
  EXPECT_THAT(full->message, HasSubstr("--batch-max-queued"));
  EXPECT_EQ(DispatchNext(a), jobs[0].id);
  EXPECT_EQ(DispatchNext(a), jobs[1].id);
  // Two in flight, the lane's limit, with room to spare in the budget.
  EXPECT_EQ(a.Next(), std::nullopt);
  // Queue slots free on dispatch: two more fit in the lane's queue.
  ASSERT_FALSE(a.Admit(BatchJob(5, 5)).has_value());
  ASSERT_FALSE(a.Admit(BatchJob(5, 5)).has_value());
  EXPECT_TRUE(a.Admit(BatchJob(5, 5)).has_value());
  // A worker died: its job goes back to the front of the lane, past the queue limit.
  a.Requeue(jobs[1].id);
  EXPECT_EQ(a.counters().batch_queued, 4);
  EXPECT_EQ(a.counters().batch_inflight, 1);
  EXPECT_EQ(DispatchNext(a), jobs[1].id);
  EXPECT_EQ(a.Next(), std::nullopt);
  ASSERT_TRUE(a.Release(jobs[0].id, 5, true));
  EXPECT_EQ(DispatchNext(a), jobs[2].id);
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
  // Other work is not limited by the lane's in-flight count.
  const AdmissionRequest def = Req(Priority::kDefault, 5, 5);
  ASSERT_FALSE(a.Admit(def).has_value());
  EXPECT_EQ(DispatchNext(a), def.id);
}

TEST_F(AdmissionTest, TheBatchLaneAndTheQueueHaveSeparateLimits) {
  AdmissionOptions o;
  o.max_queued_requests = 2;
  o.max_queued_tokens = 50;
  o.batch_max_queued = 2;
  AdmissionController a = Make(o);
  ASSERT_FALSE(a.Admit(Req(Priority::kInteractive, 10, 10)).has_value());
  ASSERT_FALSE(a.Admit(Req(Priority::kDefault, 10, 10)).has_value());
  ASSERT_TRUE(a.Admit(Req(Priority::kDefault, 1, 1)).has_value());  // the queue is full
  // A full queue still admits batch jobs, and their tokens are not the queue's.
  ASSERT_FALSE(a.Admit(BatchJob(30, 30)).has_value());
  ASSERT_FALSE(a.Admit(BatchJob(30, 30)).has_value());
  EXPECT_EQ(a.counters().queued_tokens, 40);
  auto lane_full = a.Admit(BatchJob(1, 1));
  ASSERT_TRUE(lane_full.has_value());
  EXPECT_THAT(lane_full->message, HasSubstr("batch lane"));
  // And the other way round: a full lane still admits other work.
  AdmissionController b = Make(o);
  ASSERT_FALSE(b.Admit(BatchJob(1, 1)).has_value());
  ASSERT_FALSE(b.Admit(BatchJob(1, 1)).has_value());
  ASSERT_TRUE(b.Admit(BatchJob(1, 1)).has_value());
  ASSERT_FALSE(b.Admit(Req(Priority::kDefault, 20, 20)).has_value());
  ASSERT_FALSE(b.Admit(Req(Priority::kBatch, 1, 1)).has_value());
  EXPECT_EQ(b.counters().queued[static_cast<int>(Priority::kBatch)], 1);
  EXPECT_EQ(b.counters().batch_queued, 2);
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
  EXPECT_TRUE(b.CheckInvariants().ok()) << b.CheckInvariants();
}

TEST_F(AdmissionTest, TheBatchLaneUsesTheBatchClassBudget) {
  AdmissionOptions o;
  o.max_inflight_tokens = 100;
  o.interactive_reserve_tokens = 40;
  AdmissionController a = Make(o);
  // The batch class may use 60 of 100: a job of 70 could never run.
  auto too_large = a.Admit(BatchJob(35, 35));
  ASSERT_TRUE(too_large.has_value());
  EXPECT_EQ(too_large->reason, std::string(reason::kTooLarge));
  const AdmissionRequest j1 = BatchJob(20, 20);
  const AdmissionRequest j2 = BatchJob(20, 20);
  for (const auto& r : {j1, j2}) ASSERT_FALSE(a.Admit(r).has_value());
  EXPECT_EQ(DispatchNext(a), j1.id);
  EXPECT_EQ(a.Next(), std::nullopt);  // 40 + 40 > 60
  const AdmissionRequest inter = Req(Priority::kInteractive, 25, 25);
  ASSERT_FALSE(a.Admit(inter).has_value());
  EXPECT_EQ(DispatchNext(a), inter.id);  // the reserve is interactive's
}

TEST_F(AdmissionTest, BatchJobsDrawOnTheTenantsBatchBucketNotItsQuota) {
  AdmissionOptions o;
  AdmissionController a = [&] {
    o.clock = &clock_;
    auto t = TenantTable::Parse(R"pb(
      tenant {
        key: "k-alpha"
        name: "alpha"
        max_concurrent: 1
        tokens_per_minute: 600
        batch_tokens_per_minute: 6000
      }
      tenant { key: "k-beta" name: "beta" max_concurrent: 1 }
    )pb");
    EXPECT_TRUE(t.ok()) << t.status();
    return AdmissionController(o, *t);
  }();
  a.SetCapacityTokens(100000);
  // Batch jobs spend 5000 of the 6000 batch tokens, beyond max_concurrent 1.
  std::vector<AdmissionRequest> jobs;
  for (int i = 0; i < 5; ++i) {
    jobs.push_back(BatchJob(500, 500, 0));
    ASSERT_FALSE(a.Admit(jobs.back()).has_value());
  }
  // The interactive quota (600 tokens, one at a time) is untouched.
  const AdmissionRequest own = Req(Priority::kDefault, 300, 300, 0);
  ASSERT_FALSE(a.Admit(own).has_value());
  auto second = a.Admit(Req(Priority::kDefault, 1, 1, 0));
  ASSERT_TRUE(second.has_value());
  EXPECT_THAT(second->message, HasSubstr("1 requests in flight"));
  // The batch bucket has 1000 left: a job of 1200 is refused, retried after 200 tokens refill
  // at 100 per second.
  auto over = a.Admit(BatchJob(600, 600, 0));
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->reason, std::string(reason::kTenantQuota));
  EXPECT_THAT(over->message, HasSubstr("6000 batch tokens per minute"));
  EXPECT_EQ(over->retry_after_ms, 2000);
  auto never = a.Admit(BatchJob(3500, 3500, 0));
  ASSERT_TRUE(never.has_value());
  EXPECT_THAT(never->message, HasSubstr("batch bucket holds at most 6000"));
  EXPECT_EQ(a.TenantActive(0), 6);
  // A job released while queued refunds all of its reservation to the batch bucket.
  ASSERT_TRUE(a.Release(jobs[4].id, 0, false));
  EXPECT_FALSE(a.Admit(BatchJob(1000, 1000, 0)).has_value());
  // beta's batch has no limit of its own, and its concurrency limit is for its other work.
  for (int i = 0; i < 3; ++i) ASSERT_FALSE(a.Admit(BatchJob(500, 500, 1)).has_value());
  ASSERT_FALSE(a.Admit(Req(Priority::kDefault, 1, 1, 1)).has_value());
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
}

TEST_F(AdmissionTest, BatchLaneOptionsAreValidated) {
  AdmissionOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.batch_max_in_flight = 0;
  EXPECT_THAT(o.Validate().message(), HasSubstr("--batch-max-in-flight"));
  o.batch_max_in_flight = 1;
  o.batch_max_queued = 0;
  EXPECT_THAT(o.Validate().message(), HasSubstr("--batch-max-queued"));
  o.batch_max_queued = 1;
  EXPECT_TRUE(o.Validate().ok());
}

// Must-show 1: thousands of random admit / reject / dispatch / requeue (worker death) / cancel /
// expire / finish events on a fake clock; every step keeps the counters equal to the sums over
// the live requests, no request past its deadline is dispatched, no dispatch exceeds the budget,
// and once everything has ended every counter is zero and every tenant's bucket is full again.
TEST_F(AdmissionTest, RandomEventsKeepInvariantsAndEndAtZero) {
  AdmissionOptions o;
  o.max_queued_requests = 40;
  o.max_queued_tokens = 4000;
  o.interactive_reserve_tokens = 200;
  o.priority_aging_ms = 300;
  o.batch_max_in_flight = 3;
  o.batch_max_queued = 10;
  AdmissionController a = Make(o, /*tenants=*/true);
  std::mt19937_64 rng(1234);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  absl::flat_hash_set<uint64_t> queued, inflight, batch_jobs;
  absl::flat_hash_map<uint64_t, int64_t> deadline;
  int admitted = 0, refused = 0, dispatched = 0, requeued = 0, expired = 0, finished = 0;
  int batch_dispatched = 0;
  a.SetCapacityTokens(1000);
  for (int step = 0; step < 20000; ++step) {
    const int64_t op = uniform(0, 99);
    if (op < 35) {
      AdmissionRequest r = Req(static_cast<Priority>(uniform(0, 2)), uniform(1, 200),
                               uniform(1, 200), static_cast<int>(uniform(-1, 1)));
      r.batch_job = uniform(0, 3) == 0;
      if (uniform(0, 3) == 0) r.deadline_micros = clock_.NowMicros() + uniform(1, 400) * 1000;
      if (a.Admit(r).has_value()) {
        ++refused;
      } else {
        ++admitted;
        queued.insert(r.id);
        deadline[r.id] = r.deadline_micros;
        if (r.batch_job) batch_jobs.insert(r.id);
      }
    } else if (op < 60) {
      const int64_t before = a.counters().inflight_tokens;
      absl::flat_hash_set<uint64_t> oversized;
      for (const auto& [id, refusal] : a.Oversized()) oversized.insert(id);
      std::optional<uint64_t> id = a.Next();
      if (id) {
        ASSERT_TRUE(queued.contains(*id));
        ASSERT_TRUE(deadline[*id] == 0 || clock_.NowMicros() < deadline[*id]);
        ASSERT_TRUE(before == 0 || a.counters().inflight == 0 ||
                    before <= a.max_inflight_tokens());
        // A batch job's request goes only when no other request is queued and eligible.
        if (batch_jobs.contains(*id)) {
          for (uint64_t other : queued) {
            const bool expired = deadline[other] != 0 && clock_.NowMicros() >= deadline[other];
            ASSERT_TRUE(batch_jobs.contains(other) || expired || oversized.contains(other))
                << "batch job " << *id << " went ahead of " << other << " at step " << step;
          }
        }
        a.MarkDispatched(*id);
        if (batch_jobs.contains(*id)) ++batch_dispatched;
        queued.erase(*id);
        inflight.insert(*id);
        ++dispatched;
        // No request runs alone past the budget once it is known (it would be too_large).
        if (a.max_inflight_tokens() > 0) {
          ASSERT_LE(a.counters().inflight_tokens, a.max_inflight_tokens());
        } else {
          ASSERT_EQ(a.counters().inflight, 1);
        }
      }
    } else if (op < 68 && !inflight.empty()) {
      // A worker died: some of its requests go back to the front.
      const uint64_t id = *inflight.begin();
      a.Requeue(id);
      inflight.erase(id);
      queued.insert(id);
      ++requeued;
    } else if (op < 80 && !inflight.empty()) {
      const uint64_t id = *inflight.begin();
      ASSERT_TRUE(a.Release(id, uniform(0, 50), /*completed=*/true));
      inflight.erase(id);
      ++finished;
    } else if (op < 86 && !queued.empty()) {
      const uint64_t id = *queued.begin();  // cancelled while queued
      ASSERT_TRUE(a.Release(id, 0, false));
      queued.erase(id);
    } else if (op < 95) {
      clock_.AdvanceMicros(uniform(1, 50) * 1000);
      for (uint64_t id : a.Expired()) {
        ASSERT_TRUE(queued.contains(id));
        ASSERT_TRUE(a.Release(id, 0, false));
        queued.erase(id);
        ++expired;
      }
      for (uint64_t id : a.Overdue()) {
        ASSERT_TRUE(inflight.contains(id));
        ASSERT_TRUE(a.Release(id, 1, false));
        inflight.erase(id);
      }
    } else {
      a.SetCapacityTokens(uniform(0, 2000));  // workers come and go
    }
    ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants() << " at step " << step;
    const AdmissionCounters& c = a.counters();
    ASSERT_EQ(static_cast<int>(queued.size()),
              c.queued[0] + c.queued[1] + c.queued[2] + c.batch_queued);
    ASSERT_EQ(static_cast<int>(inflight.size()), c.inflight);
    ASSERT_LE(c.batch_inflight, o.batch_max_in_flight);
  }
  for (uint64_t id : queued) ASSERT_TRUE(a.Release(id, 0, false));
  for (uint64_t id : inflight) ASSERT_TRUE(a.Release(id, 3, true));
  const AdmissionCounters& c = a.counters();
  EXPECT_EQ(c.queued[0] + c.queued[1] + c.queued[2], 0);
  EXPECT_EQ(c.inflight, 0);
  EXPECT_EQ(c.queued_tokens, 0);
  EXPECT_EQ(c.inflight_tokens, 0);
  EXPECT_EQ(c.batch_queued, 0);
  EXPECT_EQ(c.batch_queued_tokens, 0);
  EXPECT_EQ(c.batch_inflight, 0);
  for (int p = 0; p < kNumPriorities; ++p) EXPECT_EQ(c.queued_tokens_by_class[p], 0);
  EXPECT_EQ(a.TenantActive(0), 0);
  EXPECT_EQ(a.TenantActive(1), 0);
  EXPECT_TRUE(a.CheckInvariants().ok());
  EXPECT_EQ(a.Next(), std::nullopt);
  // A minute later alpha's bucket is full again: a request of its whole burst is admitted (on a
  // cluster large enough to run it).
  clock_.AdvanceMicros(60'000'000);
  a.SetCapacityTokens(1000);
  const AdmissionRequest whole = Req(Priority::kDefault, 300, 300, 0);
  EXPECT_FALSE(a.Admit(whole).has_value());
  // Every kind of event happened, many times.
  EXPECT_GT(admitted, 1000);
  EXPECT_GT(refused, 100);
  EXPECT_GT(dispatched, 1000);
  EXPECT_GT(batch_dispatched, 100);
  EXPECT_GT(requeued, 100);
  EXPECT_GT(expired, 50);
  EXPECT_GT(finished, 500);
}

}  // namespace
}  // namespace carpool::router
