// Admission under load: the router in-process against simulated workers (fixed service rates)
// and scripted clients on real sockets. Must-show items 2-5 of the admission issue.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/clock.h"
#include "common/codec.h"
#include "router/router.h"
#include "router/testing/sim_worker.h"

namespace carpool::router {
namespace {

using testing::Drive;
using testing::Outcome;
using testing::QueryStats;

// Sees every tenant's stats where the router has tenants; ignored where it has none.
constexpr char kAdminKey[] = "key-admin";
using testing::Scripted;
using testing::SimWorker;
using testing::SimWorkerOptions;
using testing::Tag;
using testing::TaggedPrompt;

int64_t NowMicros() { return Clock::Real()->NowMicros(); }

// A worker that generates like SimWorker (one token per running request every step_ms) and
// answers embeds embed_ms after they arrive. KV: 64 blocks of 16 = 1024 tokens. Records the
// tags of its dispatches (a generate's prompt, an embed's first input) in arrival order, and the
// class each came at.
class EmbeddingSimWorker {
 public:
  EmbeddingSimWorker(const std::string& backend, int step_ms, int embed_ms)
      : step_ms_(step_ms), embed_ms_(embed_ms), thread_([this, backend] { Run(backend); }) {}
  ~EmbeddingSimWorker() {
    stop_.store(true);
    thread_.join();
  }
  std::vector<int> dispatch_order() const {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }
  std::map<int, Priority> priorities() const {
    std::lock_guard<std::mutex> lock(mu_);
    return priorities_;
  }

 private:
  struct Pending {
    uint64_t id = 0;
    int left = 0;      // generate: tokens to go
    int64_t due = 0;   // embed: when to answer (0: a generate)
    size_t inputs = 0;
  };
  void Run(const std::string& backend) {
    zmq::context_t context;
    SocketOptions so;
    so.routing_id = "embedding-sim";
    auto socket = Socket::Create(&context, zmq::socket_type::dealer, so);
    if (!socket.ok() || !(*socket)->Connect(backend).ok()) return;
    Socket& s = **socket;
    RegisterInfo reg;
    reg.worker_id = "embedding-sim";
    reg.model = "sim";
    reg.max_num_seqs = 8;
    reg.num_kv_blocks = 64;
    reg.block_size = 16;
    reg.max_model_len = 1024;
    reg.vocab_size = 300;
    reg.tokenizer = TokenizerKind::kByte;
    reg.bos_token_id = 256;
    reg.embed_queue_size = 64;
    reg.hidden_size = 4;
    (void)s.Send({Encode(WorkerMessage(reg))});
    uint64_t epoch = 0;
    std::vector<Pending> work;
    int64_t next_step = NowMicros(), next_beat = NowMicros();
    while (!stop_.load()) {
      auto frames = s.Recv(1);
      if (frames.ok() && frames->has_value() && (*frames)->size() == 1) {
        auto m = DecodeRouterMessage((**frames)[0]);
        if (m.ok()) {
          if (auto* ack = std::get_if<RegisterAckInfo>(&*m)) {
            epoch = ack->epoch;
          } else if (auto* d = std::get_if<DispatchInfo>(&*m)) {
            Record(Tag(d->prompt_tokens), d->priority);
            work.push_back({d->dispatch_id, d->sampling.max_tokens, 0, 0});
          } else if (auto* e = std::get_if<EmbedDispatchInfo>(&*m)) {
            Record(e->inputs.empty() ? -1 : Tag(e->inputs[0]), e->priority);
            work.push_back({e->dispatch_id, 0, NowMicros() + embed_ms_ * 1000, e->inputs.size()});
          }
        }
      }
      const int64_t now = NowMicros();
      if (epoch > 0 && now >= next_beat) {
        (void)s.Send({Encode(WorkerMessage(HeartbeatInfo{epoch, {}}))});
        next_beat = now + 100'000;
      }
      for (Pending& p : work) {
        if (p.due == 0 || now < p.due) continue;
        EmbedDoneInfo done{epoch, p.id, std::vector<std::vector<float>>(p.inputs, {1, 0, 0, 0})};
        (void)s.Send({Encode(WorkerMessage(done))});
        p.left = -1;
      }
      if (now >= next_step) {
        next_step = now + step_ms_ * 1000;
        StepTokensInfo step;
        step.epoch = epoch;
        for (Pending& p : work) {
          if (p.due != 0 || p.left <= 0) continue;
          TokenEvent e;
          e.dispatch_id = p.id;
          e.has_token = true;
          e.token.token = 1;
          e.finished = --p.left == 0;
          if (e.finished) e.finish_reason = "length";
          step.events.push_back(e);
        }
        if (!step.events.empty()) (void)s.Send({Encode(WorkerMessage(step))});
      }
      // Generates end at their last token, embeds once answered (left -1).
      std::erase_if(work, [](const Pending& p) { return p.due == 0 ? p.left <= 0 : p.left < 0; });
    }
  }
  void Record(int tag, Priority priority) {
    std::lock_guard<std::mutex> lock(mu_);
    order_.push_back(tag);
    priorities_[tag] = priority;
  }

  const int step_ms_;
  const int embed_ms_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<int> order_;
  std::map<int, Priority> priorities_;
  std::thread thread_;
};

// The token PositionalSimWorker generates at output position `i` of the request tagged `tag`:
// one of its own for each position, so a resume that lost or repeated tokens shows in them.
int32_t TokenAt(int tag, int i) { return 1 + (tag * 31 + i) % 250; }

// A generating worker like SimWorker (one token per running request every step_ms) whose tokens
// are TokenAt their position, and that continues a dispatch after the output_tokens it carries,
// as a worker resuming a moved request does. Records each dispatch and the cancels.
class PositionalSimWorker {
 public:
  struct Dispatched {
    int tag = 0;
    size_t resumed_from = 0;  // output tokens the dispatch carried
    Priority priority = Priority::kDefault;
  };
  PositionalSimWorker(const std::string& backend, int max_num_seqs, int step_ms)
      : max_num_seqs_(max_num_seqs),
        step_ms_(step_ms),
        thread_([this, backend] { Run(backend); }) {}
  ~PositionalSimWorker() {
    stop_.store(true);
    thread_.join();
  }
  std::vector<Dispatched> dispatches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dispatches_;
  }
  int cancels() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancels_;
  }
  // Steps each tag's sequence spent suspended (beyond max_num_seqs, by the worker's rule).
  std::map<int, int> suspended_steps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return suspended_steps_;
  }

 private:
  struct Running {
    uint64_t id = 0;
    int tag = 0;
    int next = 0;  // output position of its next token
    int max_tokens = 0;
    Priority priority = Priority::kDefault;
  };
  void Run(const std::string& backend) {
    zmq::context_t context;
    SocketOptions so;
    so.routing_id = "positional-sim";
    auto socket = Socket::Create(&context, zmq::socket_type::dealer, so);
    if (!socket.ok() || !(*socket)->Connect(backend).ok()) return;
    Socket& s = **socket;
    RegisterInfo reg;
    reg.worker_id = "positional-sim";
    reg.model = "sim";
    reg.max_num_seqs = max_num_seqs_;
    reg.num_kv_blocks = 4096;
    reg.block_size = 16;
    reg.max_model_len = 4096;
    reg.vocab_size = 300;
    reg.tokenizer = TokenizerKind::kByte;
    reg.bos_token_id = 256;
    (void)s.Send({Encode(WorkerMessage(reg))});
    uint64_t epoch = 0;
    std::vector<Running> running;
    int64_t next_step = NowMicros(), next_beat = NowMicros();
    while (!stop_.load()) {
      auto frames = s.Recv(1);
      if (frames.ok() && frames->has_value() && (*frames)->size() == 1) {
        auto m = DecodeRouterMessage((**frames)[0]);
        if (m.ok()) {
          if (auto* ack = std::get_if<RegisterAckInfo>(&*m)) {
            epoch = ack->epoch;
          } else if (auto* d = std::get_if<DispatchInfo>(&*m)) {
            const int tag = Tag(d->prompt_tokens);
            {
              std::lock_guard<std::mutex> lock(mu_);
              dispatches_.push_back({tag, d->output_tokens.size(), d->priority});
            }
            running.push_back({d->dispatch_id, tag, static_cast<int>(d->output_tokens.size()),
                               d->sampling.max_tokens, d->priority});
          } else if (auto* c = std::get_if<WorkerCancelInfo>(&*m)) {
            std::lock_guard<std::mutex> lock(mu_);
            cancels_ += static_cast<int>(std::erase_if(
                running, [&](const Running& r) { return r.id == c->dispatch_id; }));
          }
        }
      }
      const int64_t now = NowMicros();
      if (epoch > 0 && now >= next_beat) {
        WorkerLoad load;
        load.running = static_cast<int>(running.size());
        (void)s.Send({Encode(WorkerMessage(HeartbeatInfo{epoch, load}))});
        next_beat = now + 100'000;
      }
      if (now < next_step || epoch == 0 || running.empty()) continue;
      next_step = now + step_ms_ * 1000;
      StepTokensInfo step;
      step.epoch = epoch;
      // Like the worker's scheduler, at most max_num_seqs sequences a step: those of classes more
      // urgent than batch first, then batch-class ones, oldest first; the rest are suspended
      // (they keep their place and their tokens).
      std::stable_partition(running.begin(), running.end(),
                            [](const Running& r) { return r.priority != Priority::kBatch; });
      int stepped = 0;
      for (Running& r : running) {
        if (stepped == max_num_seqs_) {
          std::lock_guard<std::mutex> lock(mu_);
          ++suspended_steps_[r.tag];
          continue;
        }
        ++stepped;
        TokenEvent e;
        e.dispatch_id = r.id;
        e.has_token = true;
        e.token.token = TokenAt(r.tag, r.next);
        e.finished = ++r.next >= r.max_tokens;
        if (e.finished) e.finish_reason = "length";
        step.events.push_back(e);
      }
      std::erase_if(running, [](const Running& r) { return r.next >= r.max_tokens; });
      step.load.running = static_cast<int>(running.size());
      (void)s.Send({Encode(WorkerMessage(step))});
    }
  }

  const int max_num_seqs_;
  const int step_ms_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<Dispatched> dispatches_;
  int cancels_ = 0;
  std::map<int, int> suspended_steps_;
  std::thread thread_;
};

// A client of generate and embed requests on one DEALER: sends now, collects every answer.
// With `context` (the router's), it may connect to the router's in-process endpoint.
class ProbeClient {
 public:
  explicit ProbeClient(const std::string& frontend, zmq::context_t* context = nullptr) {
    auto s = Socket::Create(context != nullptr ? context : &context_, zmq::socket_type::dealer,
                            SocketOptions());
    EXPECT_TRUE(s.ok());
    socket_ = std::move(*s);
    EXPECT_TRUE(socket_->Connect(frontend).ok());
  }
  void Send(const ClientMessage& m) { ASSERT_TRUE(socket_->Send({Encode(m)}).ok()); }
  // Reads answers until `request_id` has one (the first chunk of a stream counts), or 10 s.
  void WaitFor(const std::string& request_id) {
    const int64_t give_up = NowMicros() + 10'000'000;
    while (!seen_.contains(request_id) && NowMicros() < give_up) ReadOne(10);
  }
  // Reads until every id in `ids` has ended, or 10 s.
  void WaitEnded(const std::vector<std::string>& ids) {
    const int64_t give_up = NowMicros() + 10'000'000;
    const auto all = [&] {
      for (const std::string& id : ids) {
        if (!ended_.contains(id)) return false;
      }
      return true;
    };
    while (!all() && NowMicros() < give_up) ReadOne(10);
  }
  std::map<std::string, ServerMessage> ended_;
  // A stream's chunks in the order they came.
  std::map<std::string, std::vector<GenerateChunkOut>> chunks_;

 private:
  void ReadOne(int wait_ms) {
    auto frames = socket_->Recv(wait_ms);
    if (!frames.ok() || !frames->has_value()) return;
    auto m = DecodeServerMessage((**frames)[0]);
    if (!m.ok()) return;
    std::visit(
        [&](const auto& v) {
          if constexpr (requires { v.request_id; }) {
            seen_.insert(v.request_id);
            if (!std::holds_alternative<GenerateChunkOut>(*m)) ended_.emplace(v.request_id, *m);
          }
        },
        *m);
    if (const auto* chunk = std::get_if<GenerateChunkOut>(&*m)) {
      chunks_[chunk->request_id].push_back(*chunk);
    }
  }

  zmq::context_t context_;
  std::unique_ptr<Socket> socket_;
  std::set<std::string> seen_;
};

EmbedInput TaggedEmbed(const std::string& id, int tag, int inputs, int tokens_each) {
  EmbedInput e;
  e.request_id = id;
  for (int i = 0; i < inputs; ++i) {
    EmbedItem item;
    item.token_ids = TaggedPrompt(tag, tokens_each);
    e.inputs.push_back(item);
  }
  return e;
}

class AdmissionClusterTest : public ::testing::Test {
 protected:
  void Start(RouterOptions o) {
    o.frontend = "tcp://127.0.0.1:*";
    o.backend = "tcp://127.0.0.1:*";
    auto router = Router::Create(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    thread_ = std::thread([this] { EXPECT_TRUE(router_->Run().ok()); });
  }
  void AddWorkers(int n, int max_num_seqs, int step_ms) {
    for (int i = 0; i < n; ++i) {
      SimWorkerOptions o;
      o.id = absl::StrCat("sim", i);
      o.max_num_seqs = max_num_seqs;
      o.step_ms = step_ms;
      workers_.push_back(std::make_unique<SimWorker>(router_->backend_endpoint(), o));
    }
    for (int i = 0; i < 200; ++i) {
      const StatsOut s = QueryStats(router_->frontend_endpoint(), kAdminKey);
      if (static_cast<int>(s.workers.size()) == n) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "workers did not register";
  }
  void TearDown() override {
    workers_.clear();
    if (router_) router_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  // Every reservation is back: nothing queued or in flight, no tokens reserved.
  void ExpectIdle() {
    const StatsOut s = QueryStats(router_->frontend_endpoint(), kAdminKey);
    EXPECT_EQ(s.queued, 0);
    EXPECT_EQ(s.inflight, 0);
    EXPECT_EQ(s.queued_tokens, 0);
    EXPECT_EQ(s.inflight_tokens, 0);
    EXPECT_EQ(s.batch_lane_queued, 0);
    EXPECT_EQ(s.batch_lane_inflight, 0);
    for (const TenantStatsOut& t : s.tenants) EXPECT_EQ(t.active, 0) << t.name;
  }

  static GenerateInput Request(int tag, int max_tokens, Priority p = Priority::kDefault) {
    GenerateInput g;
    g.request_id = absl::StrCat("r", tag);
    g.token_ids = TaggedPrompt(tag);
    g.sampling.max_tokens = max_tokens;
    g.priority = p;
    return g;
  }

  static double Median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }

  std::unique_ptr<Router> router_;
  std::thread thread_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
};

// 2. A burst of 10x the queue limit at once: every request ends with a result or a typed
// refusal within 1 s of the burst, and every accepted one completes.
TEST_F(AdmissionClusterTest, BurstOfTenTimesTheQueueEndsWithinOneSecond) {
  RouterOptions o;
  o.admission.max_queued_requests = 50;
  Start(o);
  AddWorkers(2, 4, 1);
  std::vector<Scripted> script;
  for (int i = 0; i < 500; ++i) script.push_back({0, Request(i, 4)});
  const std::map<std::string, Outcome> out = Drive(router_->frontend_endpoint(), script, 5000);
  ASSERT_EQ(out.size(), 500u);
  int64_t first_sent = INT64_MAX, last_end = 0;
  int completed = 0, refused = 0;
  for (const auto& [id, r] : out) {
    ASSERT_TRUE(r.ended) << id << " hangs";
    first_sent = std::min(first_sent, r.sent_micros);
    last_end = std::max(last_end, r.ended_micros);
    if (r.ok) {
      ++completed;
      EXPECT_EQ(r.final.usage.completion_tokens, 4);
    } else {
      ++refused;
      EXPECT_EQ(r.error.reason, reason::kQueueFull) << r.error.message;
      EXPECT_EQ(r.error.code, absl::StatusCode::kUnavailable);
      EXPECT_GT(r.error.retry_after_ms, 0);
    }
  }
  EXPECT_LE(last_end - first_sent, 1'000'000);
  EXPECT_GE(completed, 50);
  EXPECT_GE(refused, 300);
  std::cout << "burst of 500 over a queue of 50: " << completed << " completed, " << refused
            << " refused queue_full, all ended " << (last_end - first_sent) / 1000
            << " ms after the burst\n";
  const StatsOut s = QueryStats(router_->frontend_endpoint());
  EXPECT_EQ(s.rejections_by_reason.at(reason::kQueueFull), refused);
  ExpectIdle();
}

// 3. Priorities under saturation: batch work fills the queue, interactive work arrives
// meanwhile; interactive's median queue time is at most a quarter of batch's, and batch finishes.
TEST_F(AdmissionClusterTest, InteractiveWaitsFarLessThanBatchUnderSaturation) {
  RouterOptions o;
  o.admission.priority_aging_ms = 60'000;
  Start(o);
  AddWorkers(1, 2, 5);  // ~80 requests/s of 4 tokens
  std::vector<Scripted> script;
  for (int i = 0; i < 60; ++i) script.push_back({0, Request(i, 4, Priority::kBatch)});
  for (int i = 0; i < 40; ++i) {
    script.push_back({50 + 25 * i, Request(100 + i, 4, Priority::kInteractive)});
  }
  const std::map<std::string, Outcome> out = Drive(router_->frontend_endpoint(), script, 20000);
  std::vector<double> batch, interactive;
  for (const auto& [id, r] : out) {
    ASSERT_TRUE(r.ok) << id << ": " << r.error.message;
    (id.size() <= 3 ? batch : interactive).push_back(r.final.timings.queue_ms);
  }
  ASSERT_EQ(batch.size(), 60u);
  ASSERT_EQ(interactive.size(), 40u);
  const double mi = Median(interactive), mb = Median(batch);
  std::cout << "median queue time: interactive " << mi << " ms, batch " << mb << " ms\n";
  EXPECT_LE(mi, mb / 4);
  ExpectIdle();
}

// 4. Tenants: one flooding at 10x its quota is refused tenant_quota (with retry_after_ms from
// its token bucket); another at its quota sees >= 99% success. Unknown keys: UNAUTHENTICATED.
TEST_F(AdmissionClusterTest, FloodingTenantIsRefusedWhileTheOtherIsServed) {
  RouterOptions o;
  auto tenants = TenantTable::Parse(R"pb(
    tenant { key: "key-flood" name: "flood" tokens_per_minute: 6000 burst_tokens: 100 }
    tenant { key: "key-steady" name: "steady" tokens_per_minute: 6000 burst_tokens: 100 }
  )pb");
  ASSERT_TRUE(tenants.ok());
  o.tenants = *tenants;
  o.admin_api_keys = {kAdminKey};  // stats of every tenant (ExpectIdle too)
  Start(o);
  AddWorkers(2, 8, 1);
  // Requests of 8 tokens (4 prompt + 4 output); quotas of 100 tokens/s = 12.5 requests/s.
  std::vector<Scripted> script;
  for (int i = 0; i < 250; ++i) {  // 125 requests/s for 2 s: 10x the quota
    GenerateInput g = Request(i, 4);
    g.request_id = absl::StrCat("flood", i);
    g.api_key = "key-flood";
    script.push_back({8 * i, g});
  }
  for (int i = 0; i < 24; ++i) {  // 12 requests/s for 2 s: at the quota
    GenerateInput g = Request(1000 + i, 4);
    g.request_id = absl::StrCat("steady", i);
    g.api_key = "key-steady";
    script.push_back({84 * i, g});
  }
  GenerateInput stranger = Request(2000, 4);
  stranger.request_id = "stranger";
  stranger.api_key = "key-unknown";
  script.push_back({0, stranger});
  const std::map<std::string, Outcome> out = Drive(router_->frontend_endpoint(), script, 20000);
  int flood_ok = 0, flood_quota = 0, steady_ok = 0;
  for (const auto& [id, r] : out) {
    ASSERT_TRUE(r.ended) << id;
    if (id.rfind("flood", 0) == 0) {
      if (r.ok) {
        ++flood_ok;
      } else {
        EXPECT_EQ(r.error.reason, reason::kTenantQuota) << r.error.message;
        EXPECT_EQ(r.error.code, absl::StatusCode::kResourceExhausted);
        EXPECT_GT(r.error.retry_after_ms, 0);
        ++flood_quota;
      }
    } else if (id.rfind("steady", 0) == 0) {
      steady_ok += r.ok;
    }
  }
  std::cout << "flood: " << flood_ok << " served, " << flood_quota
            << " refused tenant_quota; steady: " << steady_ok << "/24 served\n";
  EXPECT_GE(steady_ok * 100, 24 * 99);
  EXPECT_GE(flood_quota, 250 * 7 / 10);
  EXPECT_EQ(out.at("stranger").error.code, absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(out.at("stranger").error.reason, reason::kUnauthenticated);
  const StatsOut s = QueryStats(router_->frontend_endpoint(), kAdminKey);
  ASSERT_EQ(s.tenants.size(), 2u);
  EXPECT_EQ(s.tenants[0].rejected, flood_quota);
  EXPECT_EQ(s.tenants[1].rejected, 24 - steady_ok);
  ExpectIdle();
}

// 5. Deadlines: requests whose deadline passes in the queue end DEADLINE_EXCEEDED and never
// reach a worker; once the service rate is measured, a request whose deadline the queue ahead
// makes impossible is refused at once with deadline_unmeetable.
TEST_F(AdmissionClusterTest, ExpiredRequestsAreNeverDispatchedAndUnmeetableOnesAreRefused) {
  Start(RouterOptions());
  AddWorkers(1, 2, 5);  // ~80 requests/s of 4 tokens
  std::vector<Scripted> script;
  for (int i = 0; i < 120; ++i) script.push_back({0, Request(i, 4)});  // 1.5 s of work
  for (int i = 0; i < 30; ++i) {  // behind them, 300 ms to live: they expire in the queue
    GenerateInput g = Request(200 + i, 4);
    g.deadline_ms = 300;
    script.push_back({0, g});
  }
  for (int i = 0; i < 20; ++i) {  // once the rate is known: 150 ms against ~0.4 s of queue
    GenerateInput g = Request(300 + i, 4);
    g.deadline_ms = 150;
    script.push_back({1100 + i, g});
  }
  const std::map<std::string, Outcome> out = Drive(router_->frontend_endpoint(), script, 20000);
  const std::map<int, int64_t> dispatched = workers_[0]->dispatch_times();
  int exceeded = 0, unmeetable = 0, late_dispatches = 0;
  for (const auto& [id, r] : out) {
    ASSERT_TRUE(r.ended) << id;
    const int tag = std::stoi(id.substr(1));
    if (tag >= 200) {
      const int64_t deadline_ms = tag < 300 ? 300 : 150;
      auto d = dispatched.find(tag);
      // The router stamps arrival just after the client's send; 5 ms of slack for transit.
      if (d != dispatched.end() && d->second > r.sent_micros + (deadline_ms + 5) * 1000) {
        ++late_dispatches;
      }
    }
    if (r.ok) continue;
    if (r.error.reason == reason::kDeadlineExceeded) {
      EXPECT_EQ(r.error.code, absl::StatusCode::kDeadlineExceeded);
      ++exceeded;
    } else {
      EXPECT_EQ(r.error.reason, reason::kDeadlineUnmeetable) << r.error.message;
      ++unmeetable;
    }
  }
  std::cout << exceeded << " expired in the queue, " << unmeetable
            << " refused deadline_unmeetable, " << late_dispatches << " dispatched late\n";
  EXPECT_EQ(late_dispatches, 0);
  EXPECT_GE(exceeded, 25);
  EXPECT_GE(unmeetable, 10);
  ExpectIdle();
}

// 6 of the hardening issue. The probe: an embed request larger than the cluster's whole
// in-flight budget, and a 4-token completion sent with it. The embed is refused at once,
// too_large, naming the limit; the completion is served (TTFT well under 1 s).
TEST_F(AdmissionClusterTest, AnEmbedLargerThanTheClusterIsRefusedAndACompletionIsServed) {
  Start(RouterOptions());
  EmbeddingSimWorker worker(router_->backend_endpoint(), /*step_ms=*/2, /*embed_ms=*/1500);
  for (int i = 0; i < 200 && QueryStats(router_->frontend_endpoint()).workers.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ProbeClient client(router_->frontend_endpoint());
  const int64_t sent = NowMicros();
  client.Send(TaggedEmbed("huge", 1, 24, 101));  // 2424 tokens against a budget of 1024
  client.Send(Request(2, 4));
  client.WaitEnded({"huge", "r2"});
  ASSERT_TRUE(client.ended_.contains("huge"));
  ASSERT_TRUE(std::holds_alternative<ErrorInfo>(client.ended_.at("huge")));
  const ErrorInfo& e = std::get<ErrorInfo>(client.ended_.at("huge"));
  EXPECT_EQ(e.code, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(e.reason, reason::kTooLarge);
  EXPECT_THAT(e.message, ::testing::HasSubstr("reserves 2424 tokens"));
  EXPECT_THAT(e.message, ::testing::HasSubstr("in-flight token budget is 1024"));
  ASSERT_TRUE(client.ended_.contains("r2"));
  ASSERT_TRUE(std::holds_alternative<GenerateFinalOut>(client.ended_.at("r2")));
  const GenerateFinalOut& f = std::get<GenerateFinalOut>(client.ended_.at("r2"));
  std::cout << "completion beside a too-large embed: TTFT " << f.timings.ttft_ms << " ms, "
            << (NowMicros() - sent) / 1000 << " ms until both ended\n";
  EXPECT_LT(f.timings.ttft_ms, 1000);
  EXPECT_EQ(QueryStats(router_->frontend_endpoint()).rejections_by_reason.at(reason::kTooLarge),
            1);
  ExpectIdle();
}

// A large request that fits the cluster but not beside what runs now waits; smaller requests
// behind it go ahead while it has waited less than --skip-ahead-ms, then the budget is held for
// it: it runs as soon as the running request leaves room, before anything that came later.
TEST_F(AdmissionClusterTest, SmallRequestsGoAheadOfAWaitingLargeOneThenItIsNotStarved) {
  RouterOptions o;
  o.admission.skip_ahead_ms = 300;
  o.admission.priority_aging_ms = 60'000;
  Start(o);
  EmbeddingSimWorker worker(router_->backend_endpoint(), /*step_ms=*/5, /*embed_ms=*/20);
  for (int i = 0; i < 200 && QueryStats(router_->frontend_endpoint()).workers.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ProbeClient client(router_->frontend_endpoint());
  GenerateInput running = Request(1, 300);  // 304 tokens for >= 1.5 s
  running.stream = true;
  client.Send(running);
  client.WaitFor("r1");                            // it runs
  client.Send(TaggedEmbed("large", 2, 8, 100));    // 800 tokens: 304 + 800 > 1024, it waits
  client.Send(Request(3, 4));                      // fits: goes ahead
  client.WaitEnded({"r3"});
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the skip-ahead bound
  client.Send(Request(4, 4));                      // fits, but the budget is held for "large"
  client.WaitEnded({"r1", "large", "r3", "r4"});
  for (const char* id : {"r1", "large", "r3", "r4"}) {
    ASSERT_TRUE(client.ended_.contains(id)) << id;
    EXPECT_FALSE(std::holds_alternative<ErrorInfo>(client.ended_.at(id)))
        << id << ": " << std::get<ErrorInfo>(client.ended_.at(id)).message;
  }
  const GenerateFinalOut& small = std::get<GenerateFinalOut>(client.ended_.at("r3"));
  std::cout << "4-token completion behind a waiting 800-token embed: TTFT "
            << small.timings.ttft_ms << " ms\n";
  EXPECT_LT(small.timings.ttft_ms, 1000);
  EXPECT_EQ(worker.dispatch_order(), (std::vector<int>{1, 3, 2, 4}));
  ExpectIdle();
}

// Issue 16: batch_job is the batch runner's. A network client's generate or embed naming it is
// refused INVALID_ARGUMENT before admission. The in-process client's go in the batch lane: at
// most --batch-max-in-flight at once, dispatched at PRIORITY_BATCH, and a network client's
// request arriving while they wait goes before them; stats and /metrics show the lane.
TEST_F(AdmissionClusterTest, BatchJobsAreTheInProcessClientsAndRunInTheBatchLane) {
  RouterOptions o;
  o.admission.batch_max_in_flight = 2;
  o.admission.batch_max_queued = 8;
  Start(o);
  EmbeddingSimWorker worker(router_->backend_endpoint(), /*step_ms=*/10, /*embed_ms=*/20);
  for (int i = 0; i < 200 && QueryStats(router_->frontend_endpoint()).workers.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ProbeClient network(router_->frontend_endpoint());
  GenerateInput forged = Request(1, 4);
  forged.batch_job = true;
  EmbedInput forged_embed = TaggedEmbed("e2", 2, 1, 4);
  forged_embed.batch_job = true;
  network.Send(forged);
  network.Send(forged_embed);
  network.WaitEnded({"r1", "e2"});
  for (const char* id : {"r1", "e2"}) {
    ASSERT_TRUE(network.ended_.contains(id)) << id;
    ASSERT_TRUE(std::holds_alternative<ErrorInfo>(network.ended_.at(id))) << id;
    const ErrorInfo& e = std::get<ErrorInfo>(network.ended_.at(id));
    EXPECT_EQ(e.code, absl::StatusCode::kInvalidArgument) << id;
    EXPECT_EQ(e.reason, reason::kInvalidArgument) << id;
    EXPECT_THAT(e.message, ::testing::HasSubstr("batch_job is reserved for the router's batch "
                                                "runner"));
  }
  EXPECT_TRUE(worker.dispatch_order().empty());
  // Six jobs of 50 tokens (500 ms each at 10 ms a step) from the in-process client.
  ProbeClient runner(router_->inproc_endpoint(), router_->zmq_context());
  std::vector<std::string> jobs;
  for (int i = 0; i < 6; ++i) {
    GenerateInput g = Request(10 + i, 50);
    g.batch_job = true;
    runner.Send(g);
    jobs.push_back(g.request_id);
  }
  StatsOut s;
  for (int i = 0; i < 200; ++i) {
    s = QueryStats(router_->frontend_endpoint());
    if (s.batch_lane_inflight == 2 && s.batch_lane_queued == 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(s.batch_lane_inflight, 2);
  EXPECT_EQ(s.batch_lane_queued, 4);
  EXPECT_EQ(s.batch_max_inflight, 2);
  EXPECT_EQ(s.batch_max_queued, 8);
  EXPECT_EQ(s.queued, 4);  // the lane's, in the total
  EXPECT_EQ(s.queued_batch, 0);
  EXPECT_EQ(s.queued_tokens, 0);  // the queue's budget is not the lane's
  EXPECT_EQ(s.inflight, 2);
  // Sent while four jobs wait: it goes before them.
  network.Send(Request(20, 4));
  std::string metrics;
  for (int i = 0; i < 200; ++i) {
    metrics = router_->RenderMetrics();
    if (metrics.find("carpool_batch_lane_requests{state=\"running\"} 2") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_THAT(metrics, ::testing::HasSubstr("carpool_batch_lane_requests{state=\"running\"} 2"));
  runner.WaitEnded(jobs);
  network.WaitEnded({"r20"});
  for (const std::string& id : jobs) {
    ASSERT_TRUE(runner.ended_.contains(id)) << id;
    EXPECT_TRUE(std::holds_alternative<GenerateFinalOut>(runner.ended_.at(id))) << id;
  }
  ASSERT_TRUE(network.ended_.contains("r20"));
  EXPECT_TRUE(std::holds_alternative<GenerateFinalOut>(network.ended_.at("r20")));
  EXPECT_EQ(worker.dispatch_order(), (std::vector<int>{10, 11, 20, 12, 13, 14, 15}));
  const std::map<int, Priority> priorities = worker.priorities();
  for (int tag = 10; tag < 16; ++tag) EXPECT_EQ(priorities.at(tag), Priority::kBatch) << tag;
  EXPECT_EQ(priorities.at(20), Priority::kDefault);
  ExpectIdle();
}

// Issue 16: running batch jobs yield. Two batch jobs of `job_tokens` tokens (10 ms a step) from
// the in-process client, the first streaming, run on `worker`; once they have ~20 tokens each,
// an interactive request of 4 tokens comes from the network. With `preempted`, checks that the
// newer job (r11) was preempted for it once by the router and resumed after the tokens it had,
// at the batch class still; without, that the router sent the request to the worker at once
// and nothing was preempted (the worker suspends a job instead). Either way both jobs answer
// with exactly the tokens an unpreempted run gives (the stream's chunks unbroken), and every
// reservation is back at the end. Returns the milliseconds from the interactive request's send
// to its first token.
int64_t InteractiveBesideTwoBatchJobs(Router* router, const PositionalSimWorker& worker,
                                      int job_tokens, bool preempted) {
  for (int i = 0; i < 200 && QueryStats(router->frontend_endpoint()).workers.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ProbeClient runner(router->inproc_endpoint(), router->zmq_context());
  for (int tag : {10, 11}) {
    GenerateInput g;
    g.request_id = absl::StrCat("r", tag);
    g.token_ids = TaggedPrompt(tag);
    g.sampling.max_tokens = job_tokens;
    g.batch_job = true;
    g.stream = tag == 10;
    runner.Send(g);
  }
  runner.WaitFor("r10");
  for (int i = 0; i < 200 && worker.dispatches().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(worker.dispatches().size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ProbeClient network(router->frontend_endpoint());
  GenerateInput interactive;
  interactive.request_id = "r20";
  interactive.token_ids = TaggedPrompt(20);
  interactive.sampling.max_tokens = 4;
  interactive.priority = Priority::kInteractive;
  interactive.stream = true;
  const int64_t sent = NowMicros();
  network.Send(interactive);
  network.WaitFor("r20");
  const int64_t first_token_ms = (NowMicros() - sent) / 1000;
  network.WaitEnded({"r20"});
  runner.WaitEnded({"r10", "r11"});
  EXPECT_TRUE(network.ended_.contains("r20") &&
              std::holds_alternative<GenerateFinalOut>(network.ended_.at("r20")));
  for (const char* id : {"r10", "r11"}) {
    EXPECT_TRUE(runner.ended_.contains(id)) << id;
    if (!runner.ended_.contains(id)) return first_token_ms;
    const ServerMessage& end = runner.ended_.at(id);
    EXPECT_TRUE(std::holds_alternative<GenerateFinalOut>(end))
        << id << ": " << std::get<ErrorInfo>(end).message;
    if (!std::holds_alternative<GenerateFinalOut>(end)) return first_token_ms;
    const GenerateFinalOut& f = std::get<GenerateFinalOut>(end);
    EXPECT_EQ(f.usage.completion_tokens, job_tokens) << id;
    EXPECT_EQ(f.finish_reason, "length") << id;
  }
  const std::vector<GenerateChunkOut>& chunks = runner.chunks_["r10"];
  EXPECT_EQ(chunks.size(), static_cast<size_t>(job_tokens));
  for (int i = 0; i < static_cast<int>(chunks.size()); ++i) {
    EXPECT_EQ(chunks[i].index, i);
    EXPECT_EQ(chunks[i].tokens.size(), 1u);
    if (!chunks[i].tokens.empty()) {
      EXPECT_EQ(chunks[i].tokens[0].token, TokenAt(10, i)) << i;
    }
  }
  const std::vector<SampleResult>& tokens = std::get<GenerateFinalOut>(runner.ended_["r11"]).tokens;
  EXPECT_EQ(tokens.size(), static_cast<size_t>(job_tokens));
  for (int i = 0; i < static_cast<int>(tokens.size()); ++i) {
    EXPECT_EQ(tokens[i].token, TokenAt(11, i)) << i;
  }
  const std::vector<PositionalSimWorker::Dispatched> d = worker.dispatches();
  EXPECT_EQ(d.size(), preempted ? 4u : 3u);
  if (d.size() >= 3) {
    EXPECT_EQ(d[0].tag, 10);
    EXPECT_EQ(d[1].tag, 11);
    EXPECT_EQ(d[2].tag, 20);
  }
  if (preempted && d.size() == 4) {
    EXPECT_EQ(d[3].tag, 11);
    EXPECT_GT(d[3].resumed_from, 0u);
    EXPECT_LT(d[3].resumed_from, static_cast<size_t>(job_tokens));
    EXPECT_EQ(d[3].priority, Priority::kBatch);
  }
  EXPECT_EQ(worker.cancels(), preempted ? 1 : 0);
  if (!preempted) {
    // The newer job stood aside on the worker for the request's steps.
    const std::map<int, int> suspended = worker.suspended_steps();
    EXPECT_FALSE(suspended.contains(10));
    EXPECT_TRUE(suspended.contains(11) && suspended.at(11) >= 4);
  }
  const std::string metrics = router->RenderMetrics();
  EXPECT_THAT(metrics, ::testing::HasSubstr(absl::StrCat("carpool_batch_preemptions_total ",
                                                         preempted ? 1 : 0, "\n")));
  EXPECT_THAT(metrics, ::testing::HasSubstr("carpool_migrations_total 0\n"));
  return first_token_ms;
}

// Every sequence slot of the only worker is a batch job's: the request does not wait for one to
// finish, and no job is taken off the worker: its scheduler suspends one for the request's
// steps. With max_migrations 0 a migration would fail the job.
TEST_F(AdmissionClusterTest, BatchJobsYieldTheirSlotsToAWaitingRequest) {
  RouterOptions o;
  o.max_migrations = 0;
  Start(o);
  PositionalSimWorker worker(router_->backend_endpoint(), /*max_num_seqs=*/2, /*step_ms=*/10);
  const int64_t first_token_ms =
      InteractiveBesideTwoBatchJobs(router_.get(), worker, 150, /*preempted=*/false);
  std::cout << "interactive request beside 2 batch jobs holding both slots: first token "
            << first_token_ms << " ms after its send (one suspended on the worker)\n";
  // The jobs had more than a second to go: it did not wait for one.
  EXPECT_LT(first_token_ms, 300);
  ExpectIdle();
}

// A free slot, but the in-flight budget (--max-inflight-tokens 400) is the two batch jobs' (4 +
// 196 tokens each): the request would wait for budget; a batch job yields it.
TEST_F(AdmissionClusterTest, BatchJobsYieldTheBudgetToAWaitingRequest) {
  RouterOptions o;
  o.max_migrations = 0;
  o.admission.max_inflight_tokens = 400;
  Start(o);
  PositionalSimWorker worker(router_->backend_endpoint(), /*max_num_seqs=*/4, /*step_ms=*/10);
  const int64_t first_token_ms =
      InteractiveBesideTwoBatchJobs(router_.get(), worker, 196, /*preempted=*/true);
  std::cout << "interactive request beside 2 batch jobs holding the in-flight budget: first "
               "token "
            << first_token_ms << " ms after its send (preempting one)\n";
  EXPECT_LT(first_token_ms, 300);
  ExpectIdle();
}

// The same full worker without batch jobs: requests of the batch class from a network client are
// never preempted. The interactive request waits for one of them to finish.
TEST_F(AdmissionClusterTest, AFullWorkerWithoutBatchJobsStillQueues) {
  Start(RouterOptions());
  PositionalSimWorker worker(router_->backend_endpoint(), /*max_num_seqs=*/2, /*step_ms=*/10);
  for (int i = 0; i < 200 && QueryStats(router_->frontend_endpoint()).workers.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ProbeClient network(router_->frontend_endpoint());
  for (int tag : {10, 11}) network.Send(Request(tag, 150, Priority::kBatch));
  for (int i = 0; i < 200 && worker.dispatches().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(worker.dispatches().size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  GenerateInput interactive = Request(20, 4, Priority::kInteractive);
  interactive.stream = true;
  const int64_t sent = NowMicros();
  network.Send(interactive);
  network.WaitFor("r20");
  const int64_t first_token_ms = (NowMicros() - sent) / 1000;
  std::cout << "interactive request beside 2 batch-class requests holding both slots: first "
               "token "
            << first_token_ms << " ms after its send (no preemption)\n";
  // ~1.3 s: the time the first of them still needed.
  EXPECT_GT(first_token_ms, 1000);
  network.WaitEnded({"r10", "r11", "r20"});
  for (const char* id : {"r10", "r11", "r20"}) {
    ASSERT_TRUE(network.ended_.contains(id)) << id;
    EXPECT_TRUE(std::holds_alternative<GenerateFinalOut>(network.ended_.at(id))) << id;
  }
  EXPECT_EQ(worker.dispatches().size(), 3u);
  EXPECT_EQ(worker.cancels(), 0);
  EXPECT_THAT(router_->RenderMetrics(),
              ::testing::HasSubstr("carpool_batch_preemptions_total 0\n"));
  ExpectIdle();
}

}  // namespace
}  // namespace carpool::router
