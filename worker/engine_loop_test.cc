// EngineLoop's embedding policy against a backend that records the order of its Step and
// EmbedBatch calls: the test plays the I/O thread on the other end of the inproc pair.
#include "worker/engine_loop.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::worker::internal {
namespace {

using ::testing::HasSubstr;

constexpr int kWaitMs = 5000;  // every wait in this file fails after this long

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Generation: every request yields one token per Step until max_tokens. Embeddings: the vector
// {length, first token, last pooling?, normalize?}; an input starting with kPoison fails its
// batch. Appends 'S' to the log per Step that ran something, 'E' per EmbedBatch.
class RecordingBackend : public Backend {
 public:
  static constexpr int32_t kPoison = 999;

  RegisterInfo Describe() const override {
    RegisterInfo r;
    r.vocab_size = 1000;
    r.max_model_len = 64;
    return r;
  }
  absl::Status Add(const DispatchInfo& d) override {
    left_[d.dispatch_id] = d.sampling.max_tokens;
    return absl::OkStatus();
  }
  void Cancel(uint64_t id) override { left_.erase(id); }
  void CancelAll() override { left_.clear(); }
  bool has_unfinished() const override { return !left_.empty(); }
  std::vector<TokenEvent> Step() override {
    if (const int micros = step_micros_.load(); micros > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(micros));
    }
    std::vector<TokenEvent> events;
    for (auto it = left_.begin(); it != left_.end();) {
      TokenEvent e;
      e.dispatch_id = it->first;
      e.has_token = true;
      e.finished = --it->second == 0;
      events.push_back(e);
      it = e.finished ? left_.erase(it) : std::next(it);
    }
    if (!events.empty()) Record('S');
    return events;
  }
  WorkerLoad Load() const override {
    WorkerLoad l;
    l.running = static_cast<int>(left_.size());
    l.preemptions = 7;
    return l;
  }
  int embed_dim() const override { return 4; }
  absl::StatusOr<std::vector<std::vector<float>>> EmbedBatch(
      absl::Span<const EmbeddingInput* const> inputs) override {
    Record('E');
    std::vector<std::vector<float>> out;
    for (const EmbeddingInput* in : inputs) {
      if (in->tokens[0] == kPoison) return absl::InvalidArgumentError("poisoned input");
      out.push_back({static_cast<float>(in->tokens.size()), static_cast<float>(in->tokens[0]),
                     in->pooling == Pooling::kLast ? 1.0f : 0.0f, in->normalize ? 1.0f : 0.0f});
    }
    return out;
  }

  // How long each Step takes.
  void set_step_micros(int micros) { step_micros_.store(micros); }

  std::string log() const {
    absl::MutexLock lock(&mu_);
    return log_;
  }

 private:
  void Record(char c) {
    absl::MutexLock lock(&mu_);
    log_ += c;
  }

  std::map<uint64_t, int> left_;  // engine thread only
  std::atomic<int> step_micros_{0};
  mutable absl::Mutex mu_;
  std::string log_ ABSL_GUARDED_BY(mu_);
};

// An EngineLoop on its own thread; the test speaks for the I/O thread.
class LoopHarness {
 public:
  explicit LoopHarness(const EngineLoopOptions& options) {
    static std::atomic<int> counter{0};
    const std::string endpoint = absl::StrCat("inproc://engine-loop-test-", counter++);
    SocketOptions pair_options;
    pair_options.high_water_mark = kPairHighWaterMark;
    auto io = Socket::Create(&context_, zmq::socket_type::pair, pair_options);
    auto engine = Socket::Create(&context_, zmq::socket_type::pair, pair_options);
    EXPECT_TRUE(io.ok() && engine.ok());
    io_ = std::move(*io);
    engine_ = std::move(*engine);
    EXPECT_TRUE(io_->Bind(endpoint).ok());
    EXPECT_TRUE(engine_->Connect(endpoint).ok());
    thread_ = std::thread(
        [this, options] { EngineLoop(&backend_, engine_.get(), &load_, options).Run(); });
    Frame({kTagEpoch, "1"});
  }
  ~LoopHarness() {
    if (!done_) Drain();
    for (const int64_t deadline = NowMs() + kWaitMs; !done_ && NowMs() < deadline;) {
      Next(static_cast<int>(deadline - NowMs()));
    }
    EXPECT_TRUE(done_) << "the engine loop did not finish draining";
    thread_.join();
  }

  void Send(const RouterMessage& m) { Frame({kTagRouter, Encode(m)}); }
  void Frame(Frames f) { EXPECT_TRUE(io_->Send(f).ok()); }
  void Drain() { Frame({kTagDrain}); }

  // The next message to the router; nullopt on timeout or once the loop reported done.
  std::optional<WorkerMessage> Next(int timeout_ms) {
    if (done_) return std::nullopt;
    auto frames = io_->Recv(timeout_ms);
    if (!frames.ok() || !frames->has_value()) return std::nullopt;
    const Frames& f = **frames;
    // The loop's acknowledgement of an epoch, for the I/O thread: not a message to the router.
    if (f.size() == 2 && f[0] == kTagEpochSeen) return Next(timeout_ms);
    if (f.size() == 1 && f[0] == kTagDone) {
      done_ = true;
      return std::nullopt;
    }
    EXPECT_EQ(f.size(), 3u);
    if (f.size() != 3) return std::nullopt;
    auto m = DecodeWorkerMessage(f[2]);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return std::nullopt;
    return std::move(*m);
  }

  // Skips messages until a T satisfying `match`; nullopt after kWaitMs (or done).
  template <typename T>
  std::optional<T> WaitFor(std::function<bool(const T&)> match = nullptr) {
    for (const int64_t deadline = NowMs() + kWaitMs; NowMs() < deadline && !done_;) {
      std::optional<WorkerMessage> m = Next(static_cast<int>(deadline - NowMs()));
      if (!m.has_value()) continue;
      const T* t = std::get_if<T>(&*m);
      if (t != nullptr && (match == nullptr || match(*t))) return *t;
      seen_.push_back(std::move(*m));
    }
    return std::nullopt;
  }

  // True once the published load satisfies `pred` (within kWaitMs).
  bool WaitForLoad(std::function<bool(const WorkerLoad&)> pred) {
    for (const int64_t deadline = NowMs() + kWaitMs; NowMs() < deadline;) {
      if (pred(load_.Read())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  // True once the published embedding batcher counts satisfy `pred` (within kWaitMs).
  bool WaitForEmbedBatcher(std::function<bool(const EmbedBatcherCounters&)> pred) {
    for (const int64_t deadline = NowMs() + kWaitMs; NowMs() < deadline;) {
      std::optional<EmbedBatcherCounters> c = load_.ReadEmbedBatcher();
      if (c.has_value() && pred(*c)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  std::optional<EmbedBatcherCounters> embed_batcher() const { return load_.ReadEmbedBatcher(); }

  // Reads until the loop reports done (after a Drain); the messages go to seen().
  bool WaitDone() {
    for (const int64_t deadline = NowMs() + kWaitMs; NowMs() < deadline && !done_;) {
      if (auto m = Next(static_cast<int>(deadline - NowMs()))) seen_.push_back(std::move(*m));
    }
    return done_;
  }

  const std::vector<WorkerMessage>& seen() const { return seen_; }
  RecordingBackend& backend() { return backend_; }

 private:
  zmq::context_t context_;
  std::unique_ptr<Socket> io_, engine_;
  RecordingBackend backend_;
  SharedLoad load_;
  std::thread thread_;
  bool done_ = false;
  std::vector<WorkerMessage> seen_;  // skipped by WaitFor, or read by WaitDone
};

EngineLoopOptions Options(int max_batch_size, int64_t max_wait_micros, int idle_wait_ms = 10,
                          int queue_size = 1024) {
  EngineLoopOptions o;
  o.idle_wait_ms = idle_wait_ms;
  o.embed.max_batch_size = max_batch_size;
  o.embed.max_wait_micros = max_wait_micros;
  o.embed.max_queue_size = queue_size;
  return o;
}

DispatchInfo Generate(uint64_t id, int max_tokens) {
  DispatchInfo d;
  d.dispatch_id = id;
  d.prompt_tokens = {1, 2, 3};
  d.sampling.max_tokens = max_tokens;
  return d;
}

// Inputs {first}, {first + 1, first + 1}, ... (lengths 1, 2, 1, 2, ...).
EmbedDispatchInfo Embed(uint64_t id, int n, int32_t first = 1) {
  EmbedDispatchInfo d;
  d.dispatch_id = id;
  d.pooling = Pooling::kLast;
  d.normalize = false;
  for (int i = 0; i < n; ++i) d.inputs.push_back(std::vector<int32_t>(1 + i % 2, first + i));
  return d;
}

void ExpectAnswers(const EmbedDoneInfo& done, const EmbedDispatchInfo& d) {
  ASSERT_EQ(done.embeddings.size(), d.inputs.size());
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    EXPECT_EQ(done.embeddings[i],
              (std::vector<float>{static_cast<float>(d.inputs[i].size()),
                                  static_cast<float>(d.inputs[i][0]), 1.0f, 0.0f}))
        << "input " << i;
  }
}

TEST(EngineLoopEmbedTest, AtMostOneEmbeddingBatchBetweenTwoSteps) {
  LoopHarness loop(Options(/*max_batch_size=*/4, /*max_wait_micros=*/0));
  loop.backend().set_step_micros(2000);  // 120 ms of generation
  loop.Send(Generate(1, 60));
  ASSERT_TRUE(loop.WaitFor<StepTokensInfo>().has_value());  // generation is running
  const EmbedDispatchInfo embed = Embed(2, 100);            // 25 batches
  loop.Send(embed);
  auto done = loop.WaitFor<EmbedDoneInfo>();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->dispatch_id, 2u);
  EXPECT_EQ(done->epoch, 1u);
  ExpectAnswers(*done, embed);
  loop.Drain();
  ASSERT_TRUE(loop.WaitDone());
  const std::string log = loop.backend().log();
  EXPECT_EQ(std::count(log.begin(), log.end(), 'S'), 60);
  EXPECT_EQ(std::count(log.begin(), log.end(), 'E'), 25);
  // Every batch ran while generation still had work (25 batches < 59 steps left), and never
  // two of them between consecutive steps.
  EXPECT_EQ(log.back(), 'S') << log;
  EXPECT_EQ(log.find("EE"), std::string::npos) << log;
}

TEST(EngineLoopEmbedTest, BatchesRunBackToBackWithoutGenerationWork) {
  // A loop that slept idle_wait_ms between batches would need 25 s.
  LoopHarness loop(Options(/*max_batch_size=*/4, /*max_wait_micros=*/0, /*idle_wait_ms=*/1000));
  const EmbedDispatchInfo embed = Embed(3, 100);
  const int64_t start = NowMs();
  loop.Send(embed);
  auto done = loop.WaitFor<EmbedDoneInfo>();
  ASSERT_TRUE(done.has_value());
  EXPECT_LT(NowMs() - start, 900);
  ExpectAnswers(*done, embed);
  EXPECT_EQ(loop.backend().log(), std::string(25, 'E'));
}

TEST(EngineLoopEmbedTest, PartialBatchLeavesAfterMaxWait) {
  LoopHarness loop(Options(/*max_batch_size=*/32, /*max_wait_micros=*/40'000,
                           /*idle_wait_ms=*/2000));
  const int64_t start = NowMs();
  loop.Send(Embed(4, 3));
  auto done = loop.WaitFor<EmbedDoneInfo>();
  ASSERT_TRUE(done.has_value());
  const int64_t took = NowMs() - start;
  EXPECT_GE(took, 35);    // not before max_wait
  EXPECT_LT(took, 1000);  // and not after an idle sleep
  EXPECT_EQ(loop.backend().log(), "E");
}

TEST(EngineLoopEmbedTest, CancelDropsQueuedInputs) {
  LoopHarness loop(Options(/*max_batch_size=*/32, /*max_wait_micros=*/60'000'000));
  loop.Send(Embed(5, 3));
  ASSERT_TRUE(loop.WaitForLoad([](const WorkerLoad& l) { return l.embed_queued == 3; }));
  loop.Send(WorkerCancelInfo{5});
  ASSERT_TRUE(loop.WaitForLoad([](const WorkerLoad& l) { return l.embed_queued == 0; }));
  loop.Drain();
  ASSERT_TRUE(loop.WaitDone());
  EXPECT_EQ(loop.backend().log(), "");
  for (const WorkerMessage& m : loop.seen()) {
    EXPECT_FALSE(std::holds_alternative<EmbedDoneInfo>(m));
    EXPECT_FALSE(std::holds_alternative<RequestFailedInfo>(m));
  }
}

TEST(EngineLoopEmbedTest, NewEpochCancelsEmbeds) {
  LoopHarness loop(Options(/*max_batch_size=*/32, /*max_wait_micros=*/60'000'000));
  loop.Send(Embed(6, 2));
  ASSERT_TRUE(loop.WaitForLoad([](const WorkerLoad& l) { return l.embed_queued == 2; }));
  loop.Frame({kTagEpoch, "2"});
  ASSERT_TRUE(loop.WaitForLoad([](const WorkerLoad& l) { return l.embed_queued == 0; }));
  EXPECT_EQ(loop.backend().log(), "");
}

// A router that restarts numbers epochs and dispatches from 1 again: re-registering (epoch 0)
// under the same epoch number must still drop what the old router gave, or its old dispatch
// would answer (or refuse as "already running") the new router's dispatch of the same id.
TEST(EngineLoopEmbedTest, ReRegisteringUnderTheSameEpochNumberCancelsEmbeds) {
  LoopHarness loop(Options(/*max_batch_size=*/2, /*max_wait_micros=*/60'000'000));
  loop.Send(Embed(6, 1));  // half a batch: waits
  ASSERT_TRUE(loop.WaitForLoad([](const WorkerLoad& l) { return l.embed_queued == 1; }));
  loop.Frame({kTagEpoch, "0"});
  loop.Frame({kTagEpoch, "1"});
  ASSERT_TRUE(loop.WaitForLoad([](const WorkerLoad& l) { return l.embed_queued == 0; }));
  const EmbedDispatchInfo fresh = Embed(6, 2, /*first=*/50);  // a full batch: leaves at once
  loop.Send(fresh);
  auto done = loop.WaitFor<EmbedDoneInfo>();
  ASSERT_TRUE(done.has_value()) << "the new router's dispatch was not answered";
  EXPECT_EQ(done->dispatch_id, 6u);
  ExpectAnswers(*done, fresh);
  for (const WorkerMessage& m : loop.seen()) {
    if (const auto* f = std::get_if<RequestFailedInfo>(&m)) {
      ADD_FAILURE() << "request " << f->dispatch_id << " failed: " << f->error.message;
    }
  }
  EXPECT_EQ(loop.backend().log(), "E");
}

TEST(EngineLoopEmbedTest, FailingInputFailsOnlyItsRequest) {
  LoopHarness loop(Options(/*max_batch_size=*/8, /*max_wait_micros=*/20'000));
  EmbedDispatchInfo bad = Embed(7, 3);
  bad.inputs[1] = {RecordingBackend::kPoison, 5};
  const EmbedDispatchInfo good = Embed(8, 3, 100);
  loop.Send(bad);
  loop.Send(good);
  auto failed = loop.WaitFor<RequestFailedInfo>();
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->dispatch_id, 7u);
  EXPECT_EQ(failed->error.code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(failed->error.reason, reason::kInvalidArgument);
  EXPECT_THAT(failed->error.message, HasSubstr("input 1"));
  EXPECT_THAT(failed->error.message, HasSubstr("poisoned input"));
  std::optional<EmbedDoneInfo> done;
  for (const WorkerMessage& m : loop.seen()) {
    if (const auto* d = std::get_if<EmbedDoneInfo>(&m)) done = *d;
  }
  if (!done.has_value()) done = loop.WaitFor<EmbedDoneInfo>();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->dispatch_id, 8u);
  ExpectAnswers(*done, good);
  loop.Drain();
  ASSERT_TRUE(loop.WaitDone());
  for (const WorkerMessage& m : loop.seen()) {
    if (const auto* f = std::get_if<RequestFailedInfo>(&m)) {
      ADD_FAILURE() << "second failure for request " << f->dispatch_id;
    }
  }
}

TEST(EngineLoopEmbedTest, InvalidInputsFailAtDispatch) {
  LoopHarness loop(Options(/*max_batch_size=*/8, /*max_wait_micros=*/0));
  const std::vector<std::pair<std::vector<std::vector<int32_t>>, std::string>> cases = {
      {{}, "no inputs"},
      {{{5}, {}}, "input 1 is empty"},
      {{{5, 1000}}, "input 0: token 1 has id 1000, outside the vocabulary [0, 1000)"},
      {{{-3}}, "outside the vocabulary"},
      {{std::vector<int32_t>(65, 5)}, "input 0 has 65 tokens; max_model_len is 64"},
  };
  uint64_t id = 10;
  for (const auto& [inputs, message] : cases) {
    EmbedDispatchInfo d;
    d.dispatch_id = ++id;
    d.inputs = inputs;
    loop.Send(d);
    auto failed = loop.WaitFor<RequestFailedInfo>();
    ASSERT_TRUE(failed.has_value()) << message;
    EXPECT_EQ(failed->dispatch_id, id);
    EXPECT_EQ(failed->error.code, absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(failed->error.reason, reason::kInvalidArgument);
    EXPECT_THAT(failed->error.message, HasSubstr(message));
  }
  EXPECT_EQ(loop.backend().log(), "");
}

TEST(EngineLoopEmbedTest, FullQueueRefusesTheWholeDispatch) {
  LoopHarness loop(Options(/*max_batch_size=*/8, /*max_wait_micros=*/60'000'000,
                           /*idle_wait_ms=*/10, /*queue_size=*/8));
  loop.Send(Embed(20, 5));
  loop.Send(Embed(21, 4));
  auto failed = loop.WaitFor<RequestFailedInfo>();
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->dispatch_id, 21u);
  EXPECT_EQ(failed->error.code, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(failed->error.reason, reason::kQueueFull);
  EXPECT_TRUE(loop.WaitForLoad([](const WorkerLoad& l) { return l.embed_queued == 5; }));
  loop.Send(Embed(22, 3));  // fits exactly: a full batch of 8 leaves at once
  auto done =
      loop.WaitFor<EmbedDoneInfo>([](const EmbedDoneInfo& d) { return d.dispatch_id == 22; });
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(loop.backend().log(), "E");
}

TEST(EngineLoopEmbedTest, DrainFinishesQueuedEmbeds) {
  LoopHarness loop(Options(/*max_batch_size=*/32, /*max_wait_micros=*/100'000,
                           /*idle_wait_ms=*/1000));
  const EmbedDispatchInfo embed = Embed(30, 3);
  loop.Send(embed);
  loop.Drain();
  ASSERT_TRUE(loop.WaitDone());
  std::optional<EmbedDoneInfo> done;
  for (const WorkerMessage& m : loop.seen()) {
    if (const auto* d = std::get_if<EmbedDoneInfo>(&m)) done = *d;
  }
  ASSERT_TRUE(done.has_value()) << "drained without answering the queued embeds";
  ExpectAnswers(*done, embed);
}

TEST(EngineLoopEmbedTest, LoadCarriesPreemptionsAndEmbedQueue) {
  LoopHarness loop(Options(/*max_batch_size=*/32, /*max_wait_micros=*/60'000'000));
  loop.Send(Embed(40, 4));
  EXPECT_TRUE(loop.WaitForLoad(
      [](const WorkerLoad& l) { return l.embed_queued == 4 && l.preemptions == 7; }));
  loop.Send(Generate(41, 2));
  auto step = loop.WaitFor<StepTokensInfo>();
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->load.embed_queued, 4);
  EXPECT_EQ(step->load.preemptions, 7);
  loop.Send(WorkerCancelInfo{40});
}

TEST(EngineLoopEmbedTest, PublishesTheBatchersCountsWithRefusals) {
  LoopHarness loop(Options(/*max_batch_size=*/4, /*max_wait_micros=*/60'000'000,
                           /*idle_wait_ms=*/10, /*queue_size=*/8));
  ASSERT_TRUE(loop.WaitForEmbedBatcher([](const EmbedBatcherCounters& c) {
    return c.max_batch_size == 4 && c.submitted == 0;
  }));
  loop.Send(Embed(60, 5));  // a full batch of 4 runs; the fifth input waits
  loop.Send(Embed(61, 8));  // 8 more do not fit in the queue of 8: refused
  auto failed = loop.WaitFor<RequestFailedInfo>();
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->error.reason, reason::kQueueFull);
  ASSERT_TRUE(loop.WaitForEmbedBatcher(
      [](const EmbedBatcherCounters& c) { return c.answered == 4 && c.refused == 8; }));
  loop.Send(WorkerCancelInfo{60});
  ASSERT_TRUE(
      loop.WaitForEmbedBatcher([](const EmbedBatcherCounters& c) { return c.cancelled == 1; }));
  const std::optional<EmbedBatcherCounters> c = loop.embed_batcher();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->submitted, 5);
  EXPECT_EQ(c->answered, 4);
  EXPECT_EQ(c->batches, 1);
  ASSERT_EQ(c->batch_size_counts.size(), 5u);
  EXPECT_EQ(c->batch_size_counts[4], 1);
  EXPECT_EQ(c->queue_wait_count, 4);
  EXPECT_EQ(c->failed + c->timed_out, 0);
}

}  // namespace
}  // namespace carpool::worker::internal
