// Liveness of requests: the router in-process on a fake clock, against scripted workers and
// clients on real ZeroMQ sockets. A queued request with no worker ends no_workers after
// --no-worker-timeout-ms; a worker that heartbeats but never steps is stalled by the progress
// watchdog and its stream resumes, unbroken, on another worker; a stalled worker whose load then
// drains to nothing is placed again, one whose load does not stays stalled.
#include <chrono>
#include <thread>

#include "common/clock.h"
#include "common/codec.h"
#include "common/transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/router.h"
#include "router/testing/scripted_router.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

// How long a negative check listens for a message that must not come.
constexpr int kQuietMs = 150;

class LivenessTest : public ScriptedRouterTest {
 protected:
  void StartRouter() {
    RouterOptions o;
    o.max_migrations = max_migrations_;
    o.heartbeat_timeout_ms = heartbeat_timeout_ms_;
    o.stall_timeout_ms = 10'000;
    o.admission.no_worker_timeout_ms = 30'000;
    o.clock = &clock_;
    ScriptedRouterTest::StartRouter(std::move(o));
  }

  static StepTokensInfo Step(const FakeWorker& w, uint64_t dispatch_id, int32_t token,
                             bool finished = false) {
    return StepTokensInfo{w.epoch, {Token(dispatch_id, token, finished)}, {}};
  }

  static GenerateInput Request(const std::string& id, int max_tokens, bool stream) {
    return ScriptedRouterTest::Request(id, {1, 2}, max_tokens, stream);
  }

  static int KvUsed(const StatsOut& stats, const std::string& worker) {
    for (const WorkerStatsOut& w : stats.workers) {
      if (w.worker_id == worker) return w.kv_used_blocks;
    }
    return -1;
  }
  // Whether `worker` is listed and healthy (registered, heartbeating, not stalled or draining).
  static bool Healthy(const StatsOut& stats, const std::string& worker) {
    for (const WorkerStatsOut& w : stats.workers) {
      if (w.worker_id == worker) return w.healthy;
    }
    return false;
  }
  // A heartbeat whose load reports what the worker's engine has not finished.
  static void HeartbeatRunning(FakeWorker& w, int running, int waiting = 0) {
    WorkerLoad load;
    load.running = running;
    load.waiting = waiting;
    w.Send(HeartbeatInfo{w.epoch, load});
  }
  StatsOut Stats(Socket* c) {
    SendClient(c, StatsQuery{});
    return RecvClientAs<StatsOut>(c);
  }
  void Advance(int64_t ms) { clock_.AdvanceMicros(ms * 1000); }

  int64_t heartbeat_timeout_ms_ = 60'000;
  int max_migrations_ = 3;
  FakeClock clock_{1'000'000'000};
};

TEST_F(LivenessTest, QueuedRequestsEndNoWorkersAfterTheTimeoutWithRetryAfter) {
  heartbeat_timeout_ms_ = 1000;
  StartRouter();
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  // No worker has ever registered.
  SendClient(client.get(), Request("r1", 4, false));
  ASSERT_EQ(Stats(client.get()).queued, 1);
  Advance(29'900);
  EXPECT_FALSE(TryRecvClient(client.get(), kQuietMs).has_value());
  Advance(100);
  ErrorInfo e = RecvClientAs<ErrorInfo>(client.get());
  EXPECT_EQ(e.request_id, "r1");
  EXPECT_EQ(e.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(e.reason, reason::kNoWorkers);
  EXPECT_EQ(e.retry_after_ms, 5000);
  EXPECT_THAT(e.message, HasSubstr("--no-worker-timeout-ms"));

  // The only worker dies with the request on it: it goes back to the queue, and ends the same
  // way once the timeout has passed since the worker was lost.
  FakeWorker w = StartWorker("w1");
  SendClient(client.get(), Request("r2", 4, false));
  w.RecvAs<DispatchInfo>();
  Advance(1'100);  // w1 misses its heartbeats
  for (int i = 0; i < 100 && !Stats(client.get()).workers.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(Stats(client.get()).queued, 1);
  Advance(29'800);
  EXPECT_FALSE(TryRecvClient(client.get(), kQuietMs).has_value());
  Advance(200);
  e = RecvClientAs<ErrorInfo>(client.get());
  EXPECT_EQ(e.request_id, "r2");
  EXPECT_EQ(e.reason, reason::kNoWorkers);
  const StatsOut s = Stats(client.get());
  EXPECT_EQ(s.rejections_by_reason.at(reason::kNoWorkers), 2);
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.inflight, 0);
  EXPECT_EQ(s.queued_tokens, 0);
}

// Text sent before any worker registered waits for its model's tokenizer (not admitted: no
// tokens reserved), is served once a worker registers, and otherwise ends no_workers after the
// same timeout; its deadline still applies meanwhile.
TEST_F(LivenessTest, TextBeforeAnyWorkerWaitsForTheTokenizerBoundedByTheTimeouts) {
  StartRouter();
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  GenerateInput text = Request("text", 2, false);
  text.has_text = true;
  text.text = "hi";
  text.token_ids.clear();
  SendClient(client.get(), text);
  GenerateInput dated = text;
  dated.request_id = "dated";
  dated.deadline_ms = 1000;
  SendClient(client.get(), dated);
  GenerateInput late = text;
  late.request_id = "late";
  SendClient(client.get(), late);
  StatsOut s = Stats(client.get());
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.queued_tokens, 0);
  Advance(1'000);
  ErrorInfo e = RecvClientAs<ErrorInfo>(client.get());
  EXPECT_EQ(e.request_id, "dated");
  EXPECT_EQ(e.reason, reason::kDeadlineExceeded);
  SendClient(client.get(), CancelInput{"late"});
  EXPECT_EQ(RecvClientAs<ErrorInfo>(client.get()).reason, reason::kCancelled);
  FakeWorker w = StartWorker("w1");
  DispatchInfo d = w.RecvAs<DispatchInfo>();
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{256, 'h', 'i'}));
  EXPECT_FALSE(w.Recv(kQuietMs).has_value());  // nothing of the cancelled one
  w.Send(Step(w, d.dispatch_id, 'o', true));
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).request_id, "text");
}

TEST_F(LivenessTest, TextWaitingForATokenizerEndsNoWorkersAfterTheTimeout) {
  StartRouter();
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  GenerateInput text = Request("text", 2, false);
  text.has_text = true;
  text.text = "hi";
  SendClient(client.get(), text);
  ASSERT_EQ(Stats(client.get()).queued, 0);
  Advance(29'900);
  EXPECT_FALSE(TryRecvClient(client.get(), kQuietMs).has_value());
  Advance(100);
  ErrorInfo e = RecvClientAs<ErrorInfo>(client.get());
  EXPECT_EQ(e.request_id, "text");
  EXPECT_EQ(e.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(e.reason, reason::kNoWorkers);
  EXPECT_EQ(e.retry_after_ms, 5000);
  EXPECT_THAT(e.message, HasSubstr("--no-worker-timeout-ms"));
}

// With several models, a request for one whose workers are all gone waits for one of them
// while the other model's workers serve, and ends no_workers after the same timeout.
TEST_F(LivenessTest, ARequestForAModelWithNoWorkerLeftEndsNoWorkersAfterTheTimeout) {
  StartRouter();
  RegisterInfo a = FakeRegistration("wa");
  a.model = "model-a";
  RegisterInfo b = FakeRegistration("wb");
  b.model = "model-b";
  FakeWorker wa = StartWorker(a);
  FakeWorker wb = StartWorker(b);
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  wb.Send(DeregisterInfo{wb.epoch});  // model-b has no worker left
  for (int i = 0; i < 100 && Stats(client.get()).workers.size() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  GenerateInput g = Request("r1", 2, false);
  g.model = "model-b";
  SendClient(client.get(), g);
  GenerateInput other = Request("r2", 2, false);
  other.model = "model-a";
  SendClient(client.get(), other);
  DispatchInfo d = wa.RecvAs<DispatchInfo>();  // model-a is served meanwhile
  wa.Send(Step(wa, d.dispatch_id, 'o', true));
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).request_id, "r2");
  Advance(29'900);
  EXPECT_FALSE(TryRecvClient(client.get(), kQuietMs).has_value());
  Advance(200);
  ErrorInfo e = RecvClientAs<ErrorInfo>(client.get());
  EXPECT_EQ(e.request_id, "r1");
  EXPECT_EQ(e.reason, reason::kNoWorkers);
  EXPECT_THAT(e.message, HasSubstr("model-b"));
  EXPECT_EQ(Stats(client.get()).queued, 0);
}

TEST_F(LivenessTest, AWorkerThatHeartbeatsButNeverStepsIsStalledAndTheStreamResumesExactly) {
  StartRouter();
  FakeWorker w1 = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", 5, /*stream=*/true));
  const DispatchInfo d1 = w1.RecvAs<DispatchInfo>();
  w1.Send(Step(w1, d1.dispatch_id, 10));
  w1.Send(Step(w1, d1.dispatch_id, 11));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).index, i);
  FakeWorker w2 = StartWorker("w2");
  // w1 keeps heartbeating but never steps again.
  Advance(9'000);
  w1.Heartbeat();
  w2.Heartbeat();
  EXPECT_FALSE(w2.Recv(kQuietMs).has_value());
  Advance(1'100);
  w1.Heartbeat();
  const DispatchInfo d2 = w2.RecvAs<DispatchInfo>();
  EXPECT_EQ(d2.prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(d2.output_tokens, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(d2.sampling.seed, d1.sampling.seed);
  EXPECT_EQ(w1.RecvAs<WorkerCancelInfo>().dispatch_id, d1.dispatch_id);
  StatsOut s = Stats(client.get());
  ASSERT_EQ(s.workers.size(), 2u);
  EXPECT_FALSE(s.workers[0].healthy);  // w1: registered, heartbeating, stalled
  EXPECT_TRUE(s.workers[1].healthy);
  EXPECT_EQ(s.migrations, 1);
  // A late token of w1 is stale; the stream goes on from w2 without a gap.
  w1.Send(Step(w1, d1.dispatch_id, 99));
  w2.Send(Step(w2, d2.dispatch_id, 12));
  w2.Send(Step(w2, d2.dispatch_id, 13));
  w2.Send(Step(w2, d2.dispatch_id, 14, /*finished=*/true));
  std::vector<int32_t> tokens;
  for (int i = 0; i < 3; ++i) {
    const GenerateChunkOut c = RecvClientAs<GenerateChunkOut>(client.get());
    EXPECT_EQ(c.index, 2 + i);
    tokens.push_back(c.tokens.empty() ? -1 : c.tokens[0].token);
  }
  EXPECT_EQ(tokens, (std::vector<int32_t>{12, 13, 14}));
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).usage.completion_tokens, 5);
  // w1 stepped (its stale step): it is healthy again and takes work.
  s = Stats(client.get());
  EXPECT_TRUE(s.workers[0].healthy);
  EXPECT_EQ(s.inflight, 0);
}

// A worker back from a network cut reconnects under its own id before the router saw the old
// connection die (no ZMTP heartbeat here). The new connection takes the id over: its
// registration is a new epoch, the stream the old one held resumes on it from the tokens the
// client already has, and what the old link still sends is dropped.
TEST_F(LivenessTest, AWorkerReconnectingUnderItsIdWhileTheOldLinkLivesTakesItOver) {
  StartRouter();
  FakeWorker old_link = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", 4, /*stream=*/true));
  const DispatchInfo d1 = old_link.RecvAs<DispatchInfo>();
  old_link.Send(Step(old_link, d1.dispatch_id, 10));
  old_link.Send(Step(old_link, d1.dispatch_id, 11));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).index, i);

  FakeWorker new_link = StartWorker("w1");  // refused without handover: no ack would come
  EXPECT_GT(new_link.epoch, old_link.epoch);
  const DispatchInfo d2 = new_link.RecvAs<DispatchInfo>();
  EXPECT_EQ(d2.prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(d2.output_tokens, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(d2.sampling.seed, d1.sampling.seed);
  // The old link's late token goes nowhere; the stream goes on from the new link, no gap.
  old_link.Send(Step(old_link, d1.dispatch_id, 99));
  new_link.Send(Step(new_link, d2.dispatch_id, 12));
  new_link.Send(Step(new_link, d2.dispatch_id, 13, /*finished=*/true));
  std::vector<int32_t> tokens;
  for (int i = 0; i < 2; ++i) {
    const GenerateChunkOut c = RecvClientAs<GenerateChunkOut>(client.get());
    EXPECT_EQ(c.index, 2 + i);
    tokens.push_back(c.tokens.empty() ? -1 : c.tokens[0].token);
  }
  EXPECT_EQ(tokens, (std::vector<int32_t>{12, 13}));
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).usage.completion_tokens, 4);
  const StatsOut s = Stats(client.get());
  ASSERT_EQ(s.workers.size(), 1u);
  EXPECT_TRUE(s.workers[0].healthy);
  EXPECT_EQ(s.inflight, 0);
}

TEST_F(LivenessTest, SlowStepsAndAdvancingPrefillAreNotStalls) {
  StartRouter();
  FakeWorker w1 = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", 8, /*stream=*/true));
  const DispatchInfo d1 = w1.RecvAs<DispatchInfo>();
  FakeWorker w2 = StartWorker("w2");
  // A long prefill: no token for 24 s, but the KV cache it fills grows every 8 s.
  for (int i = 1; i <= 3; ++i) {
    Advance(8'000);
    w1.Heartbeat(/*kv_used_blocks=*/10 * i);
    w2.Heartbeat();
    // The router has taken the heartbeat before the clock moves on (the stats answer alone
    // does not say so: worker and client sockets are read independently).
    StatsOut stats;
    for (int tries = 0; tries < 500; ++tries) {
      stats = Stats(client.get());
      if (KvUsed(stats, "w1") == 10 * i) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(KvUsed(stats, "w1"), 10 * i);
    EXPECT_EQ(stats.migrations, 0) << "after " << 8 * i << " s";
  }
  // Then steps of 1.5 s each: the watchdog's limit becomes 20 steps = 30 s.
  for (int i = 0; i < 4; ++i) {
    Advance(1'500);
    w1.Send(Step(w1, d1.dispatch_id, 20 + i));
    EXPECT_EQ(RecvClientAs<GenerateChunkOut>(client.get()).index, i);
  }
  // Its steps reported no KV use (load {}); heartbeats saying the same are no progress.
  Advance(25'000);
  w1.Heartbeat();
  w2.Heartbeat();
  EXPECT_FALSE(w2.Recv(kQuietMs).has_value());
  Advance(5'100);
  w1.Heartbeat();
  w2.Heartbeat();
  const DispatchInfo d2 = w2.RecvAs<DispatchInfo>();
  EXPECT_EQ(d2.output_tokens, (std::vector<int32_t>{20, 21, 22, 23}));
}

TEST_F(LivenessTest, AStallWhoseRequestsLeftWithTheirClientEndsThemAllCleanly) {
  // Failing the first request over finds its client gone, which ends its other request too,
  // before the watchdog's loop reaches it (this crashed the router once).
  max_migrations_ = 0;
  StartRouter();
  FakeWorker w1 = StartWorker("w1");
  {
    auto client = Dealer(router_->frontend_endpoint(), "gone");
    SendClient(client.get(), Request("a", 8, /*stream=*/true));
    SendClient(client.get(), Request("b", 8, /*stream=*/true));
    w1.RecvAs<DispatchInfo>();
    w1.RecvAs<DispatchInfo>();
  }  // the client leaves with both requests on w1
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the router sees it go
  Advance(10'100);
  w1.Heartbeat();
  auto other = Dealer(router_->frontend_endpoint(), "other");
  StatsOut stats;
  for (int tries = 0; tries < 200; ++tries) {
    stats = Stats(other.get());
    if (stats.inflight == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(stats.inflight, 0);
  ASSERT_EQ(stats.workers.size(), 1u);
  EXPECT_EQ(stats.workers[0].outstanding_tokens, 0);
}

// A stalled worker holds nothing once its requests moved away, so it can show no progress; its
// heartbeats going from the sequence it ran to nothing running or waiting (its engine took the
// cancel) make it healthy again, and it serves the next request.
TEST_F(LivenessTest, AStalledWorkerWhoseLoadDrainsIsPlacedAgain) {
  StartRouter();
  FakeWorker w1 = StartWorker("w1");
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", 4, /*stream=*/false));
  const DispatchInfo d1 = w1.RecvAs<DispatchInfo>();
  HeartbeatRunning(w1, 1);
  FakeWorker w2 = StartWorker("w2", /*max_seqs=*/1);
  Advance(10'100);
  HeartbeatRunning(w1, 1);  // hung: its load still shows the sequence
  w2.Heartbeat();
  const DispatchInfo d2 = w2.RecvAs<DispatchInfo>();  // r1 moved
  EXPECT_EQ(w1.RecvAs<WorkerCancelInfo>().dispatch_id, d1.dispatch_id);
  // Before its engine took the cancel, its load still shows the sequence: it stays stalled,
  // and the next request (w2 is full) waits.
  HeartbeatRunning(w1, 1);
  SendClient(client.get(), Request("r2", 4, /*stream=*/false));
  EXPECT_FALSE(w1.Recv(kQuietMs).has_value());
  StatsOut s = Stats(client.get());
  EXPECT_FALSE(Healthy(s, "w1"));
  EXPECT_EQ(s.queued, 1);
  // The engine took the cancel: nothing running or waiting. w1 is placed again.
  HeartbeatRunning(w1, 0);
  const DispatchInfo d3 = w1.RecvAs<DispatchInfo>();
  EXPECT_EQ(d3.prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(Healthy(Stats(client.get()), "w1"));
  w1.Send(Step(w1, d3.dispatch_id, 7, /*finished=*/true));
  const GenerateFinalOut f2 = RecvClientAs<GenerateFinalOut>(client.get());
  EXPECT_EQ(f2.request_id, "r2");
  EXPECT_EQ(f2.usage.completion_tokens, 1);
  w2.Send(Step(w2, d2.dispatch_id, 8, /*finished=*/true));
  EXPECT_EQ(RecvClientAs<GenerateFinalOut>(client.get()).request_id, "r1");
  s = Stats(client.get());
  EXPECT_TRUE(Healthy(s, "w1"));
  EXPECT_TRUE(Healthy(s, "w2"));
  EXPECT_EQ(s.inflight, 0);
  EXPECT_EQ(s.queued, 0);
}

// Heartbeats alone say nothing of an engine that hung: one whose load still shows its sequences,
// and one whose load never showed the request it hung on (its last load was from before), both
// stay stalled, and a request with no other worker ends no_workers.
TEST_F(LivenessTest, AStalledWorkerWhoseLoadDoesNotDrainStaysStalled) {
  max_migrations_ = 0;  // the stalled workers' requests end worker_lost: the workers hold nothing
  StartRouter();
  FakeWorker shows = StartWorker("shows", /*max_seqs=*/1);
  auto client = Dealer(router_->frontend_endpoint(), "c1");
  SendClient(client.get(), Request("r1", 4, /*stream=*/false));
  shows.RecvAs<DispatchInfo>();
  FakeWorker silent = StartWorker("silent", /*max_seqs=*/1);
  SendClient(client.get(), Request("r2", 4, /*stream=*/false));
  silent.RecvAs<DispatchInfo>();
  HeartbeatRunning(shows, 1, /*waiting=*/1);
  silent.Heartbeat();
  Advance(10'100);
  HeartbeatRunning(shows, 1, 1);
  silent.Heartbeat();
  for (int i = 0; i < 2; ++i) {
    const ErrorInfo e = RecvClientAs<ErrorInfo>(client.get());
    EXPECT_EQ(e.reason, reason::kWorkerLost) << e.request_id;
  }
  shows.RecvAs<WorkerCancelInfo>();
  silent.RecvAs<WorkerCancelInfo>();
  SendClient(client.get(), Request("r3", 4, /*stream=*/false));
  for (int i = 0; i < 3; ++i) {
    Advance(1'000);
    HeartbeatRunning(shows, 1, 1);
    silent.Heartbeat();
    EXPECT_FALSE(shows.Recv(kQuietMs).has_value());
    EXPECT_FALSE(silent.Recv(0).has_value());
  }
  const StatsOut s = Stats(client.get());
  EXPECT_FALSE(Healthy(s, "shows"));
  EXPECT_FALSE(Healthy(s, "silent"));
  EXPECT_EQ(s.queued, 1);
  Advance(30'000);
  const ErrorInfo e = RecvClientAs<ErrorInfo>(client.get());
  EXPECT_EQ(e.request_id, "r3");
  EXPECT_EQ(e.reason, reason::kNoWorkers);
}

}  // namespace
}  // namespace carpool::router
