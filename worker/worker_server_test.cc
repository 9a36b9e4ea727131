// WorkerServer against a fake router: a ROUTER socket in the test speaking the worker protocol.
#include "worker/worker_server.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "common/codec.h"
#include "common/transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/backend.h"
#include "worker/echo_backend.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

using ::testing::ElementsAreArray;

constexpr int kWaitMs = 5000;  // every wait in this file fails after this long
constexpr char kWorkerId[] = "test-worker";

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The router side: receives the worker's messages in order and answers them.
class FakeRouter {
 public:
  // Binds `endpoint`, retrying for a while when it is still held by a router just closed.
  explicit FakeRouter(const std::string& endpoint = "tcp://127.0.0.1:*") {
    auto socket = Socket::Create(&context_, zmq::socket_type::router, SocketOptions());
    EXPECT_TRUE(socket.ok()) << socket.status();
    socket_ = std::move(*socket);
    absl::Status bound = socket_->Bind(endpoint);
    for (const int64_t deadline = NowMs() + kWaitMs; !bound.ok() && NowMs() < deadline;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      bound = socket_->Bind(endpoint);
    }
    EXPECT_TRUE(bound.ok()) << bound;
  }

  std::string endpoint() const { return socket_->LastEndpoint(); }

  // The next message from the worker, or nullopt after `timeout_ms`.
  std::optional<WorkerMessage> Next(int timeout_ms) {
    const int64_t deadline = NowMs() + timeout_ms;
    for (;;) {
      const int64_t left = deadline - NowMs();
      if (left <= 0) return std::nullopt;
      auto frames = socket_->Recv(static_cast<int>(left));
      EXPECT_TRUE(frames.ok()) << frames.status();
      if (!frames.ok() || !frames->has_value()) return std::nullopt;
      const Frames& f = **frames;
      EXPECT_EQ(f.size(), 2u);
      if (f.size() != 2) continue;
      EXPECT_EQ(f[0], kWorkerId);
      auto m = DecodeWorkerMessage(f[1]);
      EXPECT_TRUE(m.ok()) << m.status();
      if (m.ok()) return std::move(*m);
    }
  }

  // Skips messages until one of type T satisfying `match` arrives; nullopt after kWaitMs.
  // Every skipped message goes through `seen` when given.
  template <typename T>
  std::optional<T> WaitFor(std::function<bool(const T&)> match = nullptr,
                           std::function<void(const WorkerMessage&)> seen = nullptr) {
    const int64_t deadline = NowMs() + kWaitMs;
    while (NowMs() < deadline) {
      std::optional<WorkerMessage> m = Next(static_cast<int>(deadline - NowMs()));
      if (!m.has_value()) break;
      const T* t = std::get_if<T>(&*m);
      if (t != nullptr && (match == nullptr || match(*t))) return *t;
      if (seen != nullptr) seen(*m);
    }
    return std::nullopt;
  }

  void Send(const RouterMessage& m) { SendRaw(Encode(m)); }
  void SendRaw(const std::string& frame) { EXPECT_TRUE(socket_->Send({kWorkerId, frame}).ok()); }

  // Waits for `register` and acknowledges it with `epoch`.
  std::optional<RegisterInfo> Register(uint64_t epoch) {
    std::optional<RegisterInfo> r = WaitFor<RegisterInfo>();
    if (r.has_value()) Send(RegisterAckInfo{epoch});
    return r;
  }

 private:
  zmq::context_t context_;
  std::unique_ptr<Socket> socket_;
};

// A WorkerServer serving on its own thread; drained and joined at destruction.
class RunningWorker {
 public:
  explicit RunningWorker(const WorkerServerOptions& options) {
    auto server = WorkerServer::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = std::move(*server);
    thread_ = std::thread([this] {
      status_ = server_->Run();
      done_.store(true);
    });
  }
  ~RunningWorker() {
    if (!thread_.joinable()) return;
    server_->RequestDrain();
    thread_.join();
  }

  WorkerServer* server() { return server_.get(); }
  // True when Run returned within kWaitMs.
  bool WaitDone() {
    const int64_t deadline = NowMs() + kWaitMs;
    while (!done_.load() && NowMs() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done_.load() && thread_.joinable()) thread_.join();
    return done_.load();
  }
  const absl::Status& status() const { return status_; }

 private:
  std::unique_ptr<WorkerServer> server_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  absl::Status status_;
};

EngineOptions TinyEngine() {
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.num_threads = 1;
  o.num_kv_blocks = 256;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_model_len = 0;  // the model's, as RegisterEngineFlags leaves it
  return o;
}

WorkerServerOptions Options(const std::string& endpoint, EngineOptions engine) {
  WorkerServerOptions o;
  o.router_endpoint = endpoint;
  o.worker_id = kWorkerId;
  o.engine = std::move(engine);
  o.heartbeat_ms = 50;
  o.idle_wait_ms = 10;
  return o;
}

DispatchInfo Greedy(uint64_t id, std::vector<int32_t> prompt, int max_tokens) {
  DispatchInfo d;
  d.dispatch_id = id;
  d.prompt_tokens = std::move(prompt);
  d.sampling.temperature = 0;
  d.sampling.ignore_eos = true;
  d.sampling.max_tokens = max_tokens;
  d.sampling.logprobs = 2;
  return d;
}

EngineRequest ToEngineRequest(const DispatchInfo& d) {
  EngineRequest r;
  r.prompt_tokens = d.prompt_tokens;
  r.output_tokens = d.output_tokens;
  r.sampling = d.sampling;
  return r;
}

// What the fake router collected for one request.
struct Stream {
  std::vector<TokenEvent> events;
  std::vector<uint64_t> epochs;  // of the step messages that carried them
  bool finished() const { return !events.empty() && events.back().finished; }
  std::vector<int32_t> tokens() const {
    std::vector<int32_t> t;
    for (const TokenEvent& e : events) {
      if (e.has_token) t.push_back(e.token.token);
    }
    return t;
  }
};

// Collects `id`'s events until it finishes (or kWaitMs); other messages are skipped.
Stream Collect(FakeRouter& router, uint64_t id) {
  Stream s;
  router.WaitFor<StepTokensInfo>([&](const StepTokensInfo& step) {
    for (const TokenEvent& e : step.events) {
      if (e.dispatch_id != id) continue;
      s.events.push_back(e);
      s.epochs.push_back(step.epoch);
    }
    return s.finished();
  });
  return s;
}

class WorkerServerTest : public ::testing::Test {
 protected:
  FakeRouter router_;
};

TEST_F(WorkerServerTest, RegistersWithEngineCapacityThenHeartbeatsCarryTheEpoch) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  std::optional<RegisterInfo> r = router_.Register(7);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->worker_id, kWorkerId);
  EXPECT_EQ(r->model, "synthetic:tiny");
  EXPECT_EQ(r->max_num_seqs, 8);
  EXPECT_EQ(r->num_kv_blocks, 256);
  EXPECT_EQ(r->block_size, 16);
  EXPECT_EQ(r->max_model_len, 2048);
  EXPECT_EQ(r->vocab_size, 258);
  EXPECT_EQ(r->tokenizer, TokenizerKind::kByte);
  EXPECT_EQ(r->bos_token_id, 256);
  EXPECT_EQ(r->max_num_batched_tokens, 2048);
  EXPECT_EQ(r->embed_queue_size, 1024);
  EXPECT_GT(r->hidden_size, 0);

  for (int i = 0; i < 3; ++i) {
    std::optional<HeartbeatInfo> hb = router_.WaitFor<HeartbeatInfo>();
    ASSERT_TRUE(hb.has_value());
    EXPECT_EQ(hb->epoch, 7u);
    EXPECT_EQ(hb->load.running, 0);
    EXPECT_EQ(hb->load.kv_used_blocks, 0);
    EXPECT_EQ(hb->load.kv_free_blocks, 256);
  }
}

TEST_F(WorkerServerTest, GreedyDispatchStreamsWhatGenerateProduces) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  const DispatchInfo d = Greedy(42, {256, 10, 20, 30, 40, 50}, 12);
  router_.Send(d);
  const Stream s = Collect(router_, 42);

  auto engine = Engine::Create(TinyEngine());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto want = (*engine)->Generate({ToEngineRequest(d)});
  ASSERT_TRUE(want[0].ok()) << want[0].status();
  ASSERT_TRUE(s.finished());
  EXPECT_THAT(s.tokens(), ElementsAreArray(want[0]->tokens));
  EXPECT_EQ(s.events.back().finish_reason, "length");
  for (uint64_t epoch : s.epochs) EXPECT_EQ(epoch, 7u);
  for (size_t i = 0; i < s.events.size(); ++i) {
    ASSERT_TRUE(s.events[i].has_token);
    EXPECT_NEAR(s.events[i].token.logprob, want[0]->logprobs[i].logprob, 1e-5);
    EXPECT_EQ(s.events[i].token.top_logprobs.size(), 2u);
    EXPECT_EQ(s.events[i].finished, i + 1 == s.events.size());
  }

  // The same request resumed after its first 5 tokens continues identically.
  DispatchInfo resumed = d;
  resumed.dispatch_id = 43;
  resumed.output_tokens.assign(want[0]->tokens.begin(), want[0]->tokens.begin() + 5);
  router_.Send(resumed);
  const Stream rest = Collect(router_, 43);
  ASSERT_TRUE(rest.finished());
  EXPECT_THAT(rest.tokens(), ElementsAreArray(want[0]->tokens.begin() + 5, want[0]->tokens.end()));
}

// prefix_affinity's input: the prompt blocks a request leaves in the prefix cache are reported
// (by hash, salted) before the step that finishes it, and in full to a new registration.
TEST_F(WorkerServerTest, ReportsCachedPrefixBlocksAsKvEvents) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = i + 1;
  DispatchInfo d = Greedy(1, prompt, 2);
  d.cache_salt = 99;
  router_.Send(d);
  std::vector<uint64_t> chain;
  uint64_t parent = kRootBlockHash;
  for (int b = 0; b < 2; ++b) {  // 39 reusable tokens: 2 blocks of 16
    parent = BlockHash(parent, absl::MakeConstSpan(prompt).subspan(b * 16, 16), 99);
    chain.push_back(parent);
  }
  bool finished_before_kv = false;
  std::optional<KvEventsInfo> kv = router_.WaitFor<KvEventsInfo>(
      [](const KvEventsInfo& k) { return !k.stored.empty(); },
      [&](const WorkerMessage& m) {
        if (const auto* s = std::get_if<StepTokensInfo>(&m)) {
          for (const TokenEvent& e : s->events) finished_before_kv |= e.finished;
        }
      });
  ASSERT_TRUE(kv.has_value());
  EXPECT_FALSE(finished_before_kv);
  EXPECT_EQ(kv->epoch, 7u);
  EXPECT_FALSE(kv->reset);
  EXPECT_THAT(kv->stored, ::testing::UnorderedElementsAreArray(chain));
  EXPECT_TRUE(Collect(router_, 1).finished());
  // A router that asks the worker to register again gets everything held, as a reset.
  router_.Send(RegisterAckInfo{0});
  ASSERT_TRUE(router_.Register(8).has_value());
  kv = router_.WaitFor<KvEventsInfo>();
  ASSERT_TRUE(kv.has_value());
  EXPECT_TRUE(kv->reset);
  EXPECT_EQ(kv->epoch, 8u);
  EXPECT_THAT(kv->stored, ::testing::UnorderedElementsAreArray(chain));
}

// Blocks evicted to make room for another request are reported `removed` with the very step
// that evicted them, before that request's first token: no periodic check is waited for.
TEST_F(WorkerServerTest, ReportsBlocksEvictedForRoomAsRemovedWithTheEvictingStep) {
  EngineOptions engine = TinyEngine();
  engine.num_kv_blocks = 4;  // 64 tokens: the second request needs every block
  engine.scheduler.max_model_len = 64;
  RunningWorker worker(Options(router_.endpoint(), engine));
  ASSERT_TRUE(router_.Register(7).has_value());
  std::vector<int32_t> first(40), second(60);
  for (int i = 0; i < 40; ++i) first[i] = i + 1;
  for (int i = 0; i < 60; ++i) second[i] = i + 100;
  const std::vector<uint64_t> first_chain = PromptBlockHashes(first, 16, 99);   // 2 blocks
  const std::vector<uint64_t> second_chain = PromptBlockHashes(second, 16, 99);  // 3 blocks
  DispatchInfo d = Greedy(1, first, 2);
  d.cache_salt = 99;
  router_.Send(d);
  auto not_reset = [](const KvEventsInfo& k) { return !k.reset; };  // not the registration's
  std::optional<KvEventsInfo> kv = router_.WaitFor<KvEventsInfo>(not_reset);
  ASSERT_TRUE(kv.has_value());
  EXPECT_THAT(kv->stored, ElementsAreArray(first_chain));
  ASSERT_TRUE(Collect(router_, 1).finished());

  d = Greedy(2, second, 2);
  d.cache_salt = 99;
  router_.Send(d);
  bool second_token_before_kv = false;
  kv = router_.WaitFor<KvEventsInfo>(not_reset, [&](const WorkerMessage& m) {
    if (const auto* s = std::get_if<StepTokensInfo>(&m)) {
      for (const TokenEvent& e : s->events) second_token_before_kv |= e.dispatch_id == 2;
    }
  });
  ASSERT_TRUE(kv.has_value());
  EXPECT_FALSE(second_token_before_kv);
  EXPECT_EQ(kv->epoch, 7u);
  EXPECT_FALSE(kv->reset);
  EXPECT_THAT(kv->removed, ::testing::UnorderedElementsAreArray(first_chain));
  EXPECT_THAT(kv->stored, ElementsAreArray(second_chain));
  EXPECT_TRUE(Collect(router_, 2).finished());
}

TEST_F(WorkerServerTest, InvalidDispatchFailsWithInvalidArgument) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  router_.Send(Greedy(5, {10, 300}, 4));  // 300 is outside the vocabulary
  std::optional<RequestFailedInfo> f = router_.WaitFor<RequestFailedInfo>();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->epoch, 7u);
  EXPECT_EQ(f->dispatch_id, 5u);
  EXPECT_EQ(f->error.code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->error.reason, reason::kInvalidArgument);
  EXPECT_THAT(f->error.message, ::testing::HasSubstr("vocabulary"));
}

// The tiny preset with a context of 32768: a request that cannot end before its cancel arrives
// (tens of thousands of tokens at well under a millisecond each). Removed at destruction.
class LongContextModel {
 public:
  LongContextModel() {
    dir_ = std::filesystem::temp_directory_path() /
           ("carpool_worker_server_test_" + std::to_string(::getpid()));
    testing::CheckpointSpec spec;
    spec.config = *SyntheticConfig("tiny");
    spec.config.max_position_embeddings = kMaxLen;
    auto written = testing::WriteCheckpoint(dir_.string(), spec);
    EXPECT_TRUE(written.ok()) << written.status();
  }
  ~LongContextModel() { std::filesystem::remove_all(dir_); }

  static constexpr int kMaxLen = 32768;
  EngineOptions Engine() const {
    EngineOptions o = TinyEngine();
    o.model = dir_.string();
    o.num_kv_blocks = kMaxLen / 16;
    return o;
  }

 private:
  std::filesystem::path dir_;
};

TEST_F(WorkerServerTest, CancelStopsTheStreamAndFreesItsBlocks) {
  LongContextModel model;
  RunningWorker worker(Options(router_.endpoint(), model.Engine()));
  std::optional<RegisterInfo> r = router_.Register(7);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->tokenizer, TokenizerKind::kNone);  // a folder, not a synthetic preset
  const int kv_blocks = r->num_kv_blocks;
  router_.Send(Greedy(9, {256, 1, 2, 3}, LongContextModel::kMaxLen - 4));
  ASSERT_TRUE(router_.WaitFor<StepTokensInfo>([](const StepTokensInfo& s) {
    return !s.events.empty() && s.events[0].dispatch_id == 9 && s.events[0].has_token;
  }));
  router_.Send(WorkerCancelInfo{9});

  bool finished = false;
  auto watch = [&](const WorkerMessage& m) {
    if (const auto* s = std::get_if<StepTokensInfo>(&m)) {
      for (const TokenEvent& e : s->events) finished |= e.dispatch_id == 9 && e.finished;
    }
  };
  auto idle = [](const HeartbeatInfo& h) {
    return h.load.running == 0 && h.load.waiting == 0 && h.load.kv_used_blocks == 0;
  };
  std::optional<HeartbeatInfo> hb = router_.WaitFor<HeartbeatInfo>(idle, watch);
  ASSERT_TRUE(hb.has_value()) << "no heartbeat shows the blocks freed";
  EXPECT_EQ(hb->load.kv_free_blocks, kv_blocks);
  // Steps queued before the cancel took effect may still trail in; after two more heartbeats
  // nothing more may come for the request.
  ASSERT_TRUE(router_.WaitFor<HeartbeatInfo>(nullptr, watch));
  ASSERT_TRUE(router_.WaitFor<HeartbeatInfo>(nullptr, watch));
  int late_events = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(router_.WaitFor<HeartbeatInfo>(nullptr, [&](const WorkerMessage& m) {
      if (std::holds_alternative<StepTokensInfo>(m)) ++late_events;
    }));
  }
  EXPECT_EQ(late_events, 0);
  EXPECT_FALSE(finished) << "the request ran to its end: the cancel came too late to test";
}

TEST_F(WorkerServerTest, ANewEpochDropsTheRequestsOfTheOldOne) {
  LongContextModel model;
  RunningWorker worker(Options(router_.endpoint(), model.Engine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  router_.Send(Greedy(9, {256, 1, 2, 3}, LongContextModel::kMaxLen - 4));
  ASSERT_TRUE(router_.WaitFor<StepTokensInfo>().has_value());
  router_.Send(RegisterAckInfo{0});  // as a restarted router answers
  ASSERT_TRUE(router_.Register(8).has_value());
  std::optional<HeartbeatInfo> hb = router_.WaitFor<HeartbeatInfo>([](const HeartbeatInfo& h) {
    return h.epoch == 8 && h.load.running == 0 && h.load.kv_used_blocks == 0;
  });
  ASSERT_TRUE(hb.has_value()) << "the old epoch's request still holds the engine";
  // Nothing stamped with the old epoch leaves the worker once the new one is known.
  int old_epoch_messages = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(router_.WaitFor<HeartbeatInfo>(nullptr, [&](const WorkerMessage& m) {
      if (std::holds_alternative<StepTokensInfo>(m)) ++old_epoch_messages;
    }));
  }
  EXPECT_EQ(old_epoch_messages, 0);
}

TEST_F(WorkerServerTest, UndecodableFramesAreIgnored) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  router_.SendRaw("\xff\xff not a protobuf");
  router_.SendRaw("");
  RouterMessage wrong_version = DispatchInfo{};
  std::string frame = Encode(wrong_version);
  frame[1] = 9;  // protocol_version field (tag 0x08, then the value)
  router_.SendRaw(frame);
  ASSERT_TRUE(router_.WaitFor<HeartbeatInfo>());
  router_.Send(Greedy(3, {256, 7, 8}, 3));
  const Stream s = Collect(router_, 3);
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.tokens().size(), 3u);
}

TEST_F(WorkerServerTest, RegistersAgainWhenTheRouterAnswersEpochZero) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  ASSERT_TRUE(router_.WaitFor<HeartbeatInfo>());
  router_.Send(RegisterAckInfo{0});
  std::optional<RegisterInfo> again = router_.Register(8);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->worker_id, kWorkerId);
  std::optional<HeartbeatInfo> hb =
      router_.WaitFor<HeartbeatInfo>([](const HeartbeatInfo& h) { return h.epoch != 7; });
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->epoch, 8u);
}

// Steps and failures of every request until `deregister` (nullopt after kWaitMs).
struct UntilDeregister {
  std::map<uint64_t, Stream> streams;
  std::vector<RequestFailedInfo> failed;
  std::optional<DeregisterInfo> deregister;
};

UntilDeregister CollectUntilDeregister(FakeRouter& router) {
  UntilDeregister out;
  out.deregister = router.WaitFor<DeregisterInfo>(nullptr, [&](const WorkerMessage& m) {
    if (const auto* step = std::get_if<StepTokensInfo>(&m)) {
      for (const TokenEvent& e : step->events) out.streams[e.dispatch_id].events.push_back(e);
    } else if (const auto* f = std::get_if<RequestFailedInfo>(&m)) {
      out.failed.push_back(*f);
    }
  });
  return out;
}

TEST_F(WorkerServerTest, RequestDrainFinishesTheRunningRequestThenDeregisters) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  router_.Send(Greedy(1, {256, 5, 6}, 300));
  std::optional<StepTokensInfo> first = router_.WaitFor<StepTokensInfo>();
  ASSERT_TRUE(first.has_value());
  worker.server()->RequestDrain();

  UntilDeregister rest = CollectUntilDeregister(router_);
  ASSERT_TRUE(rest.deregister.has_value());
  EXPECT_EQ(rest.deregister->epoch, 7u);
  EXPECT_TRUE(rest.failed.empty());
  const Stream& s = rest.streams[1];
  ASSERT_TRUE(s.finished());
  EXPECT_EQ(s.tokens().size() + first->events.size(), 300u);
  EXPECT_EQ(s.events.back().finish_reason, "length");
  ASSERT_TRUE(worker.WaitDone());
  EXPECT_TRUE(worker.status().ok()) << worker.status();
}

TEST_F(WorkerServerTest, RouterDrainRefusesNewDispatchesWithDraining) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  router_.Send(Greedy(1, {256, 5, 6}, 2000));
  ASSERT_TRUE(router_.WaitFor<StepTokensInfo>().has_value());
  // In this order on one connection: the worker is draining when the dispatch arrives.
  router_.Send(DrainInfo{});
  router_.Send(Greedy(2, {256, 5}, 4));

  UntilDeregister rest = CollectUntilDeregister(router_);
  ASSERT_TRUE(rest.deregister.has_value());
  ASSERT_EQ(rest.failed.size(), 1u);
  EXPECT_EQ(rest.failed[0].dispatch_id, 2u);
  EXPECT_EQ(rest.failed[0].epoch, 7u);
  EXPECT_EQ(rest.failed[0].error.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(rest.failed[0].error.reason, reason::kDraining);
  EXPECT_FALSE(rest.streams.contains(2));
  EXPECT_TRUE(rest.streams[1].finished()) << "the running request must finish";
  ASSERT_TRUE(worker.WaitDone());
  EXPECT_TRUE(worker.status().ok()) << worker.status();
}

// A router that comes up after the worker, and one that restarts: the worker reconnects and
// registers with each (the new router answers a heartbeat it cannot place with epoch 0).
TEST(WorkerServerReconnectTest, RegistersWithARouterThatComesUpLaterAndAfterItRestarts) {
  std::string endpoint;
  {
    FakeRouter probe;  // only to find a free port
    endpoint = probe.endpoint();
  }
  WorkerServerOptions o = Options(endpoint, TinyEngine());
  RunningWorker worker(o);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the worker is retrying
  {
    FakeRouter first(endpoint);
    ASSERT_TRUE(first.Register(7).has_value());
    std::optional<HeartbeatInfo> hb = first.WaitFor<HeartbeatInfo>();
    ASSERT_TRUE(hb.has_value());
    EXPECT_EQ(hb->epoch, 7u);
  }
  // The restarted router on the same endpoint: the worker saw its connection drop, gave up
  // epoch 7 and registers again at once (nothing of epoch 7 reaches the new router).
  FakeRouter second(endpoint);
  ASSERT_TRUE(second.Register(9).has_value());
  std::optional<HeartbeatInfo> hb = second.WaitFor<HeartbeatInfo>();
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->epoch, 9u);
  second.Send(Greedy(4, {256, 9, 9}, 3));
  const Stream s = Collect(second, 4);
  EXPECT_TRUE(s.finished());
  for (uint64_t epoch : s.epochs) EXPECT_EQ(epoch, 9u);
}

EngineOptions Echo();

// ---- two routers (docs/cluster.md, "Two routers")

TEST(WorkerServerTwoRoutersTest, RegistersWithTheNextRouterUnderANewEpochWhenItsRouterDrops) {
  LongContextModel model;
  auto first = std::make_unique<FakeRouter>();
  FakeRouter second;
  WorkerServerOptions o =
      Options(first->endpoint() + ", " + second.endpoint(), model.Engine());
  o.router_lost_ms = 5000;  // only the dropped connection may move it in this test
  RunningWorker worker(o);
  ASSERT_TRUE(first->Register(7).has_value());
  // The second router hears nothing while the first serves.
  EXPECT_FALSE(second.Next(300).has_value());
  first->Send(Greedy(9, {256, 1, 2, 3}, LongContextModel::kMaxLen - 4));
  ASSERT_TRUE(first->WaitFor<StepTokensInfo>().has_value());
  const int64_t killed = NowMs();
  first.reset();  // its socket closes, as a router killed with -9
  std::optional<RegisterInfo> r = second.Register(3);
  ASSERT_TRUE(r.has_value()) << "no register reached the second router";
  EXPECT_LT(NowMs() - killed, 2000) << "the drop should be noticed at once, not by a timeout";
  // The first router's request went with it: nothing of it runs or leaves under the new epoch.
  std::optional<HeartbeatInfo> hb = second.WaitFor<HeartbeatInfo>(
      [](const HeartbeatInfo& h) { return h.epoch == 3 && h.load.running == 0; },
      [](const WorkerMessage& m) {
        EXPECT_FALSE(std::holds_alternative<StepTokensInfo>(m)) << "a step of the old request";
      });
  ASSERT_TRUE(hb.has_value());
  second.Send(Greedy(4, {256, 9, 9}, 3));
  const Stream s = Collect(second, 4);
  EXPECT_TRUE(s.finished());
  for (uint64_t epoch : s.epochs) EXPECT_EQ(epoch, 3u);
}

// The next router numbers epochs and dispatches from 1 as the lost one did: nothing the engine
// produced for the lost router's requests may reach it under the reused epoch number.
TEST(WorkerServerTwoRoutersTest, NothingOfTheLostRoutersRequestsReachesTheNextUnderTheSameEpoch) {
  LongContextModel model;
  for (int round = 0; round < 5; ++round) {
    auto first = std::make_unique<FakeRouter>();
    FakeRouter second;
    WorkerServerOptions o = Options(first->endpoint() + "," + second.endpoint(), model.Engine());
    o.router_lost_ms = 5000;
    RunningWorker worker(o);
    ASSERT_TRUE(first->Register(1).has_value());
    // Many running requests, so steps keep coming while the router goes.
    for (uint64_t id = 1; id <= 8; ++id) {
      first->Send(Greedy(id, {256, static_cast<int32_t>(id), 2, 3}, LongContextModel::kMaxLen / 2));
    }
    ASSERT_TRUE(first->WaitFor<StepTokensInfo>().has_value());
    first.reset();
    ASSERT_TRUE(second.Register(1).has_value());  // the same epoch number
    int stale_steps = 0;
    std::optional<HeartbeatInfo> hb = second.WaitFor<HeartbeatInfo>(
        [](const HeartbeatInfo& h) { return h.load.running == 0; },
        [&](const WorkerMessage& m) {
          if (std::holds_alternative<StepTokensInfo>(m)) ++stale_steps;
        });
    ASSERT_TRUE(hb.has_value());
    EXPECT_EQ(stale_steps, 0) << "round " << round << ": steps of the lost router's requests";
  }
}

TEST(WorkerServerTwoRoutersTest, SkipsARouterThatIsDownAfterRouterLostMs) {
  std::string down;
  {
    FakeRouter probe;  // only to find a port nobody listens on
    down = probe.endpoint();
  }
  FakeRouter up;
  WorkerServerOptions o = Options(down + "," + up.endpoint(), TinyEngine());
  o.router_lost_ms = 300;
  const int64_t start = NowMs();
  RunningWorker worker(o);
  ASSERT_TRUE(up.Register(5).has_value());
  EXPECT_GE(NowMs() - start, 250);
  std::optional<HeartbeatInfo> hb = up.WaitFor<HeartbeatInfo>();
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->epoch, 5u);
}

TEST(WorkerServerTwoRoutersTest, RouterListIsSplitAtCommasAndEmptyEntriesAreRefused) {
  EXPECT_EQ(WorkerServer::RouterEndpoints("tcp://a:1, tcp://b:2"),
            (std::vector<std::string>{"tcp://a:1", "tcp://b:2"}));
  WorkerServerOptions o = Options("tcp://a:1,,tcp://b:2", Echo());
  EXPECT_THAT(o.Validate().message(), ::testing::HasSubstr("empty endpoint"));
  o = Options("tcp://a:1,tcp://b:2", Echo());
  EXPECT_TRUE(o.Validate().ok());
  o.router_lost_ms = 0;
  EXPECT_THAT(o.Validate().message(), ::testing::HasSubstr("--router-lost-ms"));
}

// ---- echo

EngineOptions Echo() {
  EngineOptions o;
  o.model = "echo";
  o.scheduler.max_num_seqs = 32;
  o.scheduler.max_model_len = 0;  // as RegisterEngineFlags leaves it: echo's own default
  return o;
}

TEST_F(WorkerServerTest, EchoRegistersItsCapacity) {
  RunningWorker worker(Options(router_.endpoint(), Echo()));
  std::optional<RegisterInfo> r = router_.Register(3);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->model, "echo");
  EXPECT_EQ(r->max_num_seqs, 32);
  EXPECT_EQ(r->max_model_len, 1 << 20);
  EXPECT_EQ(r->vocab_size, 1 << 30);
  EXPECT_EQ(r->tokenizer, TokenizerKind::kByte);
  EXPECT_GT(r->num_kv_blocks, 0);
  EXPECT_EQ(r->embed_queue_size, 1024);
  EXPECT_EQ(r->hidden_size, kEchoEmbedDim);
}

TEST_F(WorkerServerTest, RegistersTheConfiguredEmbedQueueSize) {
  WorkerServerOptions o = Options(router_.endpoint(), Echo());
  o.embed.max_batch_size = 4;
  o.embed.max_queue_size = 77;
  RunningWorker worker(o);
  std::optional<RegisterInfo> r = router_.Register(3);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->embed_queue_size, 77);
}

TEST_F(WorkerServerTest, BadEmbedOptionsAreRefusedNamingTheFlag) {
  WorkerServerOptions o = Options(router_.endpoint(), Echo());
  o.embed.max_concurrent_batches = 2;
  EXPECT_THAT(WorkerServer::Create(o).status().message(),
              ::testing::HasSubstr("--embed-max-concurrent-batches"));
  o = Options(router_.endpoint(), Echo());
  o.embed.max_queue_size = 8;
  EXPECT_THAT(WorkerServer::Create(o).status().message(),
              ::testing::HasSubstr("--embed-queue-size"));
}

TEST_F(WorkerServerTest, EchoAnswersAnEmbedDispatch) {
  RunningWorker worker(Options(router_.endpoint(), Echo()));
  ASSERT_TRUE(router_.Register(3).has_value());
  EmbedDispatchInfo d;
  d.dispatch_id = 9;
  d.inputs = {{1, 2, 3}, {70000}, {5, 5}};
  d.pooling = Pooling::kMean;
  d.normalize = true;
  router_.Send(d);
  std::optional<EmbedDoneInfo> done = router_.WaitFor<EmbedDoneInfo>();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->epoch, 3u);
  EXPECT_EQ(done->dispatch_id, 9u);
  ASSERT_EQ(done->embeddings.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(done->embeddings[i], EchoEmbedding(d.inputs[i], Pooling::kMean, true));
    double ss = 0;
    for (float x : done->embeddings[i]) ss += x * x;
    EXPECT_NEAR(ss, 1.0, 1e-6);
  }
  EXPECT_EQ(EchoEmbedding({4, 9}, Pooling::kLast, false),
            EchoEmbedding({9}, Pooling::kMean, false));
}

TEST_F(WorkerServerTest, HeartbeatsCarryTheEmbedBatchersCounts) {
  WorkerServerOptions o = Options(router_.endpoint(), Echo());
  o.embed.max_batch_size = 4;
  o.embed.max_wait_micros = 0;
  RunningWorker worker(o);
  ASSERT_TRUE(router_.Register(3).has_value());
  // Present from the start, at zero.
  std::optional<HeartbeatInfo> hb = router_.WaitFor<HeartbeatInfo>(
      [](const HeartbeatInfo& h) { return h.embed_batcher.has_value(); });
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->embed_batcher->answered, 0);
  EXPECT_EQ(hb->embed_batcher->max_batch_size, 4);
  EmbedDispatchInfo d;
  d.dispatch_id = 9;
  d.inputs = {{1}, {2}, {3}, {4}, {5, 6}};  // a full batch of 4, then one of 1
  router_.Send(d);
  ASSERT_TRUE(router_.WaitFor<EmbedDoneInfo>().has_value());
  hb = router_.WaitFor<HeartbeatInfo>([](const HeartbeatInfo& h) {
    return h.embed_batcher.has_value() && h.embed_batcher->answered == 5;
  });
  ASSERT_TRUE(hb.has_value());
  const EmbedBatcherCounters& c = *hb->embed_batcher;
  EXPECT_EQ(c.submitted, 5);
  EXPECT_EQ(c.batches, 2);
  ASSERT_EQ(c.batch_size_counts.size(), 5u);
  EXPECT_EQ(c.batch_size_counts[4], 1);
  EXPECT_EQ(c.batch_size_counts[1], 1);
  EXPECT_EQ(c.queue_wait_count, 5);
  EXPECT_EQ(c.refused + c.failed + c.cancelled + c.timed_out, 0);
}

TEST_F(WorkerServerTest, EmbedDispatchMatchesTheEngine) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(7).has_value());
  EmbedDispatchInfo d;
  d.dispatch_id = 5;
  d.inputs = {{256, 10, 20, 30}, {256, 7}};
  d.pooling = Pooling::kLast;
  d.normalize = false;
  router_.Send(d);
  std::optional<EmbedDoneInfo> done = router_.WaitFor<EmbedDoneInfo>();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->dispatch_id, 5u);

  auto engine = Engine::Create(TinyEngine());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<EmbeddingInput> inputs(2);
  std::vector<const EmbeddingInput*> pointers;
  for (size_t i = 0; i < 2; ++i) {
    inputs[i].tokens = d.inputs[i];
    inputs[i].pooling = Pooling::kLast;
    inputs[i].normalize = false;
    pointers.push_back(&inputs[i]);
  }
  auto want = (*engine)->Embed(pointers);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(done->embeddings, *want);
  EXPECT_EQ(done->embeddings[0].size(), static_cast<size_t>((*engine)->model_config().hidden_size));
}

TEST_F(WorkerServerTest, DrainingRefusesEmbedDispatches) {
  RunningWorker worker(Options(router_.endpoint(), TinyEngine()));
  ASSERT_TRUE(router_.Register(3).has_value());
  // A long request keeps the drain from finishing, so the worker is still there, draining, when
  // the embed arrives (with nothing running it could exit first and never see it).
  router_.Send(Greedy(1, {256, 5, 6}, 2000));
  ASSERT_TRUE(router_.WaitFor<StepTokensInfo>().has_value());
  router_.Send(DrainInfo{});
  EmbedDispatchInfo d;
  d.dispatch_id = 12;
  d.inputs = {{1}};
  router_.Send(d);
  UntilDeregister rest = CollectUntilDeregister(router_);
  ASSERT_TRUE(rest.deregister.has_value());
  ASSERT_EQ(rest.failed.size(), 1u);
  EXPECT_EQ(rest.failed[0].dispatch_id, 12u);
  EXPECT_EQ(rest.failed[0].error.reason, reason::kDraining);
  ASSERT_TRUE(worker.WaitDone());
}

TEST_F(WorkerServerTest, EchoAnswersEachDispatchWithOneStep) {
  RunningWorker worker(Options(router_.endpoint(), Echo()));
  ASSERT_TRUE(router_.Register(3).has_value());
  for (const int max_tokens : {3, 10}) {
    router_.Send(Greedy(11, {5, 6, 7, 8}, max_tokens));
    std::optional<StepTokensInfo> step = router_.WaitFor<StepTokensInfo>();
    ASSERT_TRUE(step.has_value());
    EXPECT_EQ(step->epoch, 3u);
    const size_t n = std::min(4, max_tokens);
    ASSERT_EQ(step->events.size(), n);
    for (size_t i = 0; i < n; ++i) {
      const TokenEvent& e = step->events[i];
      EXPECT_EQ(e.dispatch_id, 11u);
      EXPECT_TRUE(e.has_token);
      EXPECT_EQ(e.token.token, static_cast<int32_t>(5 + i));
      EXPECT_EQ(e.token.logprob, 0.0f);
      EXPECT_EQ(e.finished, i + 1 == n);
    }
    EXPECT_EQ(step->events.back().finish_reason, "length");
  }
}

TEST_F(WorkerServerTest, RouterDrainMessageEndsAnEchoWorker) {
  RunningWorker worker(Options(router_.endpoint(), Echo()));
  ASSERT_TRUE(router_.Register(3).has_value());
  router_.Send(DrainInfo{});
  std::optional<DeregisterInfo> bye = router_.WaitFor<DeregisterInfo>();
  ASSERT_TRUE(bye.has_value());
  EXPECT_EQ(bye->epoch, 3u);
  ASSERT_TRUE(worker.WaitDone());
  EXPECT_TRUE(worker.status().ok()) << worker.status();
}

TEST_F(WorkerServerTest, DrainBeforeAnyRouterAnswersExits) {
  WorkerServerOptions o = Options("tcp://127.0.0.1:1", Echo());  // nobody listens there
  RunningWorker worker(o);
  worker.server()->RequestDrain();
  ASSERT_TRUE(worker.WaitDone());
  EXPECT_TRUE(worker.status().ok()) << worker.status();
}

// A tiny Llama checkpoint folder (tests/testing/checkpoint_writer.h) with whatever tokenizer
// files a test writes beside it. Removed at destruction.
class TokenizerFolder {
 public:
  explicit TokenizerFolder(std::vector<int32_t> config_eos = {2}) {
    dir_ = std::filesystem::temp_directory_path() /
           ("carpool_worker_tokenizer_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    testing::CheckpointSpec spec;
    spec.config = testing::TinyTestConfig();
    spec.config.eos_token_ids = std::move(config_eos);
    auto written = testing::WriteCheckpoint(dir_.string(), spec);
    EXPECT_TRUE(written.ok()) << written.status();
  }
  ~TokenizerFolder() { std::filesystem::remove_all(dir_); }

  void Write(const std::string& name, const std::string& contents) {
    EXPECT_TRUE(testing::WriteFile((dir_ / name).string(), contents).ok());
  }
  EngineOptions Engine() const {
    EngineOptions o = TinyEngine();
    o.model = dir_.string();
    return o;
  }

 private:
  std::filesystem::path dir_;
};

// Not a real vocabulary: the worker hands the bytes over without parsing them, so any bytes do.
const std::string kTokenizerJson =
    std::string("{\"version\":\"1.0\",\"added_tokens\":[{\"id\":9,\"content\":\"</s>\"}],") +
    "\"model\":{\"type\":\"BPE\"},\"x\":\"\xc3\xa9\"}";

TEST_F(WorkerServerTest, FolderWithTokenizerJsonHandsItsTokenizerOver) {
  TokenizerFolder folder;
  folder.Write("tokenizer.json", kTokenizerJson);
  folder.Write("tokenizer_config.json", "{\"add_bos_token\": true, \"eos_token\": \"</s>\"}");
  folder.Write("generation_config.json", "{\"bos_token_id\": 1, \"eos_token_id\": [7, 2]}");
  RunningWorker worker(Options(router_.endpoint(), folder.Engine()));
  std::optional<RegisterInfo> r = router_.Register(7);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->tokenizer, TokenizerKind::kHuggingFace);
  EXPECT_EQ(r->tokenizer_json, kTokenizerJson);
  EXPECT_EQ(r->tokenizer_config_json, "{\"add_bos_token\": true, \"eos_token\": \"</s>\"}");
  // generation_config.json's ids first; config.json's 2 is among them already.
  EXPECT_THAT(r->eos_token_ids, ElementsAreArray({7, 2}));
  EXPECT_EQ(r->bos_token_id, 1);
}

TEST_F(WorkerServerTest, EosIdsComeFromConfigThenFromTheTokenizerConfig) {
  {
    // No generation_config.json, no tokenizer_config.json: config.json's ids, an empty config.
    TokenizerFolder folder({2, 5});
    folder.Write("tokenizer.json", kTokenizerJson);
    FakeRouter router;
    RunningWorker worker(Options(router.endpoint(), folder.Engine()));
    std::optional<RegisterInfo> r = router.Register(1);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->tokenizer, TokenizerKind::kHuggingFace);
    EXPECT_EQ(r->tokenizer_config_json, "");
    EXPECT_THAT(r->eos_token_ids, ElementsAreArray({2, 5}));
  }
  {
    // Neither names one: tokenizer_config.json's eos_token (an AddedToken object) by its id.
    TokenizerFolder folder(std::vector<int32_t>{});
    folder.Write("tokenizer.json", kTokenizerJson);
    folder.Write("tokenizer_config.json", "{\"eos_token\": {\"content\": \"</s>\"}}");
    folder.Write("generation_config.json", "{\"eos_token_id\": null}");
    FakeRouter router;
    RunningWorker worker(Options(router.endpoint(), folder.Engine()));
    std::optional<RegisterInfo> r = router.Register(1);
    ASSERT_TRUE(r.has_value());
    EXPECT_THAT(r->eos_token_ids, ElementsAreArray({9}));
  }
}

TEST_F(WorkerServerTest, FolderWithoutTokenizerJsonHandsNothingOver) {
  TokenizerFolder folder;
  folder.Write("tokenizer.model", "sentencepiece bytes");
  folder.Write("tokenizer_config.json", "{}");
  RunningWorker worker(Options(router_.endpoint(), folder.Engine()));
  std::optional<RegisterInfo> r = router_.Register(7);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->tokenizer, TokenizerKind::kNone);
  EXPECT_EQ(r->tokenizer_json, "");
  EXPECT_EQ(r->tokenizer_config_json, "");
  EXPECT_TRUE(r->eos_token_ids.empty());
}

TEST_F(WorkerServerTest, FolderHandsItsChatTemplateFileOver) {
  const std::string jinja =
      "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}\xc3\xa9\n";
  {
    TokenizerFolder folder;
    folder.Write("tokenizer.json", kTokenizerJson);
    folder.Write("tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    folder.Write("chat_template.jinja", jinja);
    FakeRouter router;
    RunningWorker worker(Options(router.endpoint(), folder.Engine()));
    std::optional<RegisterInfo> r = router.Register(1);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->tokenizer, TokenizerKind::kHuggingFace);
    EXPECT_EQ(r->chat_template_jinja, jinja);  // as bytes, the trailing newline kept
    EXPECT_EQ(r->tokenizer_config_json, "{\"eos_token\": \"</s>\"}");
  }
  {
    // No chat_template.jinja: nothing (the template may be in tokenizer_config.json).
    TokenizerFolder folder;
    folder.Write("tokenizer.json", kTokenizerJson);
    FakeRouter router;
    RunningWorker worker(Options(router.endpoint(), folder.Engine()));
    std::optional<RegisterInfo> r = router.Register(1);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->chat_template_jinja, "");
  }
  {
    // Without a tokenizer.json the router cannot tokenize: the template stays behind too.
    TokenizerFolder folder;
    folder.Write("chat_template.jinja", jinja);
    FakeRouter router;
    RunningWorker worker(Options(router.endpoint(), folder.Engine()));
    std::optional<RegisterInfo> r = router.Register(1);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->tokenizer, TokenizerKind::kNone);
    EXPECT_EQ(r->chat_template_jinja, "");
  }
}

TEST(EngineBackendTest, MalformedGenerationConfigIsAnErrorNamingTheFile) {
  TokenizerFolder folder;
  folder.Write("tokenizer.json", kTokenizerJson);
  folder.Write("generation_config.json", "{\"eos_token_id\": [2,");
  auto backend = CreateEngineBackend(folder.Engine());
  ASSERT_FALSE(backend.ok());
  EXPECT_THAT(backend.status().message(), ::testing::HasSubstr("generation_config.json"));
  folder.Write("generation_config.json", "{\"eos_token_id\": \"</s>\"}");
  backend = CreateEngineBackend(folder.Engine());
  ASSERT_FALSE(backend.ok());
  EXPECT_THAT(backend.status().message(), ::testing::HasSubstr("eos_token_id"));
}

}  // namespace
}  // namespace carpool::worker
