// The engine's asynchronous step (Engine::Step, --async-step) on a fake device whose steps take
// a fixed time and that checks no input of a step in flight is overwritten
// (worker/model/fake_async_device.h), wrapping the CPU device so the logits are real. The
// asynchronous engine must give every request the tokens (and logprobs) the synchronous one
// gives, whatever finishes when: max_tokens, stop tokens, EOS, cancels, preemption under a small
// KV pool, chunked prefill and penalties over a token the host does not know yet.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "tests/testing/engine_checks.h"
#include "worker/engine.h"
#include "worker/model/fake_async_device.h"
#include "worker/model/model_device.h"

namespace carpool::worker {
namespace {

constexpr int kVocab = 258;  // synthetic:tiny

// A short device step keeps the tests fast; the benchmark uses 10 ms.
constexpr int64_t kStepMicros = 2'000;

std::unique_ptr<ModelDevice> FakeDevice(bool async, FakeDeviceLog* log,
                                        bool samples_pending_penalties = true) {
  CpuDeviceOptions cpu;
  cpu.pad_decode_batch_sizes = {2, 4, 8, 16};  // padded decode steps, as a GPU pads for graphs
  FakeAsyncDeviceOptions o;
  o.step_micros = kStepMicros;
  o.async = async;
  o.vocab = kVocab;
  o.samples_pending_penalties = samples_pending_penalties;
  return std::make_unique<FakeAsyncDevice>(CreateCpuDevice(cpu), o, log);
}

EngineOptions Options(AsyncStep async) {
  EngineOptions o;
  o.model = "synthetic:tiny";
  o.scheduler.max_model_len = 256;
  o.scheduler.max_num_batched_tokens = 64;  // chunked prefill mixed with decodes
  o.scheduler.max_num_seqs = 12;
  o.num_threads = 1;
  o.async_step = async;
  return o;
}

std::unique_ptr<Engine> MakeEngine(const EngineOptions& options, bool async, FakeDeviceLog* log) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(options, nullptr, FakeDevice(async, log));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  EXPECT_TRUE((*engine)->samples_on_device());
  EXPECT_EQ((*engine)->steps_async(), async);
  return std::move(*engine);
}

SamplingParams Mode(int i) {
  SamplingParams p;
  p.has_seed = true;
  p.seed = 9100 + i;
  // Requests finish at different steps.
  p.max_tokens = 1 + (i * 7) % 17;
  p.ignore_eos = i % 3 != 0;
  switch (i % 8) {
    case 0:
      p.temperature = 0.0f;
      p.logprobs = 3;
      break;
    case 1:
      p.temperature = 0.8f;
      break;
    case 2:
      p.temperature = 1.3f;
      p.top_k = 20;
      p.top_p = 0.9f;
      p.logprobs = 2;
      break;
    case 3:  // penalties: step N + 1 samples over N's token, unknown to the host at launch
      p.temperature = 0.0f;
      p.repetition_penalty = 1.4f;
      p.frequency_penalty = 0.8f;
      p.presence_penalty = 0.3f;
      break;
    case 4:
      p.temperature = 0.9f;
      p.frequency_penalty = 1.2f;
      p.min_p = 0.05f;
      break;
    case 5:  // stop tokens: many, so some request stops by one early
      p.temperature = 1.0f;
      for (int t = 0; t < kVocab; t += 9) p.stop_token_ids.push_back(t);
      p.max_tokens = 24;
      break;
    case 6:
      p.temperature = 0.0f;
      for (int t = 3; t < kVocab; t += 13) p.stop_token_ids.push_back(t);
      p.max_tokens = 30;
      break;
    default:
      p.top_k = 1;
      p.logprobs = 1;
      break;
  }
  return p;
}

std::vector<EngineRequest> MixedRequests(int n, int seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> len(1, 80);
  std::uniform_int_distribution<int> token(0, kVocab - 1);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    const int m = i == 0 ? 1 : len(rng);
    // Shared prefixes for some (the prefix cache), repeats for the penalties.
    if (i % 5 == 4) r.prompt_tokens.assign(32, 7);
    for (int j = 0; j < m; ++j) r.prompt_tokens.push_back(token(rng) % 24);
    r.sampling = Mode(i);
    if (i % 6 == 5) {
      // A resumed stream: its output tokens count for max_tokens and the penalties.
      r.sampling.max_tokens = std::max(r.sampling.max_tokens, 4);
      for (int j = 0; j < 3; ++j) r.output_tokens.push_back(token(rng) % 24);
    }
    requests.push_back(std::move(r));
  }
  return requests;
}

// Request by request, bit for bit (tests/testing/engine_checks.h).
void ExpectSame(const std::vector<absl::StatusOr<Completion>>& want,
                const std::vector<absl::StatusOr<Completion>>& got) {
  testing::ExpectSameCompletions(want, got, {.finish_reason_and_prompt_tokens = true});
}

void ExpectNoViolations(const FakeDeviceLog& log) {
  EXPECT_EQ(log.violations, 0);
  for (const std::string& note : log.violation_notes) ADD_FAILURE() << note;
}

// Step N + 1 was launched before step N finished, for some N: the host's work overlapped the
// device's.
int OverlappedSteps(const FakeDeviceLog& log) {
  absl::flat_hash_map<int64_t, size_t> launched, finished;
  for (size_t i = 0; i < log.events.size(); ++i) {
    const FakeDeviceLog::Event& e = log.events[i];
    (e.kind == FakeDeviceLog::Kind::kLaunch ? launched : finished)[e.step] = i;
  }
  int n = 0;
  for (const auto& [step, at] : finished) {
    auto next = launched.find(step + 1);
    if (next != launched.end() && next->second < at) ++n;
  }
  return n;
}

int CountReason(const std::vector<absl::StatusOr<Completion>>& results, FinishReason r) {
  int n = 0;
  for (const auto& c : results) n += c.ok() && c->finish_reason == r;
  return n;
}

TEST(EngineAsyncTest, AsyncEqualsSyncTokenForTokenInAMixedBatch) {
  FakeDeviceLog sync_log, async_log;
  auto sync = MakeEngine(Options(AsyncStep::kOff), /*async=*/false, &sync_log);
  auto async = MakeEngine(Options(AsyncStep::kAuto), /*async=*/true, &async_log);
  ASSERT_NE(sync, nullptr);
  ASSERT_NE(async, nullptr);
  const auto want = sync->Generate(MixedRequests(40, 77));
  const auto got = async->Generate(MixedRequests(40, 77));
  ExpectSame(want, got);
  // The batch covers what it should: stops by token and by length, and requests that stopped
  // by a token while their next step was already launched (a wasted row).
  EXPECT_GT(CountReason(want, FinishReason::kStop), 2);
  EXPECT_GT(CountReason(want, FinishReason::kLength), 2);
  EXPECT_GT(async->wasted_rows(), 0);
  ExpectNoViolations(async_log);
  ExpectNoViolations(sync_log);
  EXPECT_EQ(sync_log.async_steps, 0);
  EXPECT_GT(async_log.async_steps, 0);
  EXPECT_EQ(async_log.sync_steps, 0);
  EXPECT_GT(async_log.gathered_tokens, 0);  // decodes read the previous step's ids on the device
  EXPECT_GT(OverlappedSteps(async_log), async_log.async_steps / 2);
  EXPECT_FALSE(async->has_unfinished());
  EXPECT_EQ(async->kv_cache().num_free_blocks(), sync->kv_cache().num_free_blocks());
}

// A device that cannot gather a pending token into the penalties' histories (a GPU): the
// engine finishes the step before a step that needs one, and the tokens stay the same.
TEST(EngineAsyncTest, PenaltiesWithoutDeviceGatherFinishTheStepFirst) {
  FakeDeviceLog sync_log, async_log;
  auto sync = MakeEngine(Options(AsyncStep::kOff), false, &sync_log);
  ASSERT_NE(sync, nullptr);
  absl::StatusOr<std::unique_ptr<Engine>> async =
      Engine::Create(Options(AsyncStep::kOn), nullptr,
                     FakeDevice(true, &async_log, /*samples_pending_penalties=*/false));
  ASSERT_TRUE(async.ok()) << async.status();
  const auto want = sync->Generate(MixedRequests(40, 77));
  const auto got = (*async)->Generate(MixedRequests(40, 77));
  ExpectSame(want, got);
  EXPECT_GT((*async)->drained_steps(), 0);
  ExpectNoViolations(async_log);
}

TEST(EngineAsyncTest, AsyncEqualsSyncUnderPreemption) {
  EngineOptions o = Options(AsyncStep::kAuto);
  o.num_kv_blocks = 40;  // 640 slots for 12 running sequences of up to ~110 tokens
  o.enable_prefix_caching = false;
  EngineOptions sync_options = o;
  sync_options.async_step = AsyncStep::kOff;
  FakeDeviceLog sync_log, async_log;
  auto sync = MakeEngine(sync_options, false, &sync_log);
  auto async = MakeEngine(o, true, &async_log);
  ASSERT_NE(sync, nullptr);
  ASSERT_NE(async, nullptr);
  std::vector<EngineRequest> requests = MixedRequests(24, 5);
  for (EngineRequest& r : requests) {
    r.sampling.max_tokens += 20;
    r.sampling.stop_token_ids.clear();
    r.sampling.ignore_eos = true;
  }
  const auto want = sync->Generate(requests);
  const auto got = async->Generate(requests);
  ExpectSame(want, got);
  EXPECT_GT(sync->scheduler().num_preemptions(), 0);
  EXPECT_GT(async->scheduler().num_preemptions(), 0);
  ExpectNoViolations(async_log);
}

// Cancels between steps: the sequence is in the step already launched; its row is dropped and no
// event of it comes back after Abort, and the other requests are unchanged.
TEST(EngineAsyncTest, CancelBetweenStepsMatchesSync) {
  const auto run = [](Engine& engine) {
    std::vector<int64_t> ids;
    for (EngineRequest& r : MixedRequests(10, 31)) {
      r.sampling.max_tokens = 20;
      r.sampling.stop_token_ids.clear();
      r.sampling.ignore_eos = true;
      ids.push_back(*engine.Add(std::move(r)));
    }
    absl::flat_hash_map<int64_t, std::vector<int32_t>> tokens;
    std::vector<int64_t> aborted;
    int step = 0;
    while (engine.has_unfinished()) {
      for (const EngineEvent& e : engine.Step()) {
        EXPECT_EQ(std::count(aborted.begin(), aborted.end(), e.seq_id), 0)
            << "event after abort for " << e.seq_id;
        if (e.has_token) tokens[e.seq_id].push_back(e.sample.token);
      }
      ++step;
      if (step == 3 || step == 6) {
        const int64_t id = ids[step == 3 ? 2 : 7];
        EXPECT_TRUE(engine.Abort(id));
        EXPECT_FALSE(engine.Abort(id));
        aborted.push_back(id);
      }
    }
    return tokens;
  };
  FakeDeviceLog sync_log, async_log;
  auto sync = MakeEngine(Options(AsyncStep::kOff), false, &sync_log);
  auto async = MakeEngine(Options(AsyncStep::kOn), true, &async_log);
  ASSERT_NE(sync, nullptr);
  ASSERT_NE(async, nullptr);
  const auto want = run(*sync);
  const auto got = run(*async);
  EXPECT_EQ(got, want);
  EXPECT_GT(async->wasted_rows(), 0);  // the aborted rows of launched steps
  EXPECT_EQ(async->kv_cache().num_free_blocks(), sync->kv_cache().num_free_blocks());
  ExpectNoViolations(async_log);
}

// Embeddings between asynchronous steps run synchronously in device order and change nothing.
TEST(EngineAsyncTest, EmbedBetweenAsyncSteps) {
  FakeDeviceLog log, sync_log;
  auto async = MakeEngine(Options(AsyncStep::kOn), true, &log);
  auto sync = MakeEngine(Options(AsyncStep::kOff), false, &sync_log);
  ASSERT_NE(async, nullptr);
  ASSERT_NE(sync, nullptr);
  EmbeddingInput input;
  input.tokens = {5, 6, 7, 8};
  const EmbeddingInput* inputs[] = {&input};
  for (Engine* e : {async.get(), sync.get()}) {
    for (EngineRequest& r : MixedRequests(6, 3)) ASSERT_TRUE(e->Add(std::move(r)).ok());
  }
  absl::flat_hash_map<int64_t, std::vector<int32_t>> a, s;
  std::vector<std::vector<float>> ea, es;
  for (int i = 0; i < 4; ++i) {
    for (const EngineEvent& e : async->Step()) a[e.seq_id].push_back(e.sample.token);
    for (const EngineEvent& e : sync->Step()) s[e.seq_id].push_back(e.sample.token);
  }
  absl::StatusOr<std::vector<std::vector<float>>> got = async->Embed(inputs);
  absl::StatusOr<std::vector<std::vector<float>>> want = sync->Embed(inputs);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(*got, *want);
  while (async->has_unfinished()) {
    for (const EngineEvent& e : async->Step()) a[e.seq_id].push_back(e.sample.token);
  }
  while (sync->has_unfinished()) {
    for (const EngineEvent& e : sync->Step()) s[e.seq_id].push_back(e.sample.token);
  }
  EXPECT_EQ(a, s);
  ExpectNoViolations(log);
}

TEST(EngineAsyncTest, AutoIsSynchronousOnTheCpuAndOnNeedsAnAsyncDevice) {
  absl::StatusOr<std::unique_ptr<Engine>> cpu =
      Engine::Create(Options(AsyncStep::kAuto), nullptr, CreateCpuDevice());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE((*cpu)->steps_async());
  cpu = Engine::Create(Options(AsyncStep::kOn), nullptr, CreateCpuDevice());
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cpu.status().message().find("--async-step"), std::string::npos) << cpu.status();
  // An asynchronous device that must sample on the host cannot step asynchronously.
  FakeDeviceLog log;
  EngineOptions o = Options(AsyncStep::kOn);
  o.device_sampling = DeviceSampling::kOff;
  absl::StatusOr<std::unique_ptr<Engine>> off = Engine::Create(o, nullptr, FakeDevice(true, &log));
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.status().code(), absl::StatusCode::kFailedPrecondition);
  o.async_step = AsyncStep::kAuto;
  off = Engine::Create(o, nullptr, FakeDevice(true, &log));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE((*off)->steps_async());
}

TEST(EngineAsyncTest, FlagTakesAutoOnOff) {
  EngineOptions o;
  EXPECT_EQ(o.async_step, AsyncStep::kAuto);
  ASSERT_TRUE(testing::ParseEngineFlags({"--async-step", "off"}, &o).ok());
  EXPECT_EQ(o.async_step, AsyncStep::kOff);
  ASSERT_TRUE(testing::ParseEngineFlags({"--async-step=on"}, &o).ok());
  EXPECT_EQ(o.async_step, AsyncStep::kOn);
  ASSERT_TRUE(testing::ParseEngineFlags({"--async-step", "auto"}, &o).ok());
  EXPECT_EQ(o.async_step, AsyncStep::kAuto);
  const absl::Status bad = testing::ParseEngineFlags({"--async-step", "yes"}, &o);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--async-step"), std::string::npos) << bad;
  EXPECT_STREQ(AsyncStepName(AsyncStep::kOn), "on");
}

// The device's check can fail: a view whose memory changes while its step is in flight, and a
// third step launched, are violations.
TEST(FakeAsyncDeviceTest, ReportsInputsOverwrittenInFlight) {
  FakeDeviceLog log;
  FakeAsyncDeviceOptions o;
  o.step_micros = 100;
  o.vocab = kVocab;
  FakeAsyncDevice device(nullptr, o, &log);
  std::vector<int32_t> ids = {1, 2, 3};
  std::vector<int32_t> positions = {0, 1, 2};
  std::vector<int64_t> slots = {0, 1, 2};
  std::vector<int64_t> rows = {2};
  const int32_t table[1] = {0};
  kernels::AttentionSeq seq;
  seq.query_start = 0;
  seq.query_len = 3;
  seq.context_len = 3;
  seq.block_table = table;
  StepView view;
  view.token_ids = ids;
  view.positions = positions;
  view.slots = slots;
  view.seqs = absl::MakeConstSpan(&seq, 1);
  view.block_size = 16;
  view.sample_rows = rows;
  view.async = true;
  SamplingParams params;
  SampleRequest request;
  request.params = &params;
  request.position = 3;
  const SampleRequest requests[] = {request};
  DeviceArray logits;
  std::vector<SampleResult> out;

  device.SetStep(view);
  device.SampleAsync(logits, kVocab, requests);
  device.FinishSample(&out);
  EXPECT_EQ(log.violations, 0);
  ASSERT_EQ(out.size(), 1u);

  device.SetStep(view);
  device.SampleAsync(logits, kVocab, requests);
  ids[1] = 9;  // the host rewrites the step's inputs while the device may still read them
  device.FinishSample(&out);
  EXPECT_EQ(log.violations, 1);

  // A step that reads the previous one's token, and the same memory launched twice.
  ids = {PendingTokenId(0), 2, 3};
  device.SetStep(view);
  device.SampleAsync(logits, kVocab, requests);
  device.SetStep(view);  // overlaps the step in flight
  device.SampleAsync(logits, kVocab, requests);
  EXPECT_EQ(log.violations, 2);
  EXPECT_EQ(log.gathered_tokens, 2);
  device.SetStep(view);  // a third in flight
  device.SampleAsync(logits, kVocab, requests);
  EXPECT_GE(log.violations, 4);
  for (int i = 0; i < 3; ++i) device.FinishSample(&out);
  EXPECT_EQ(log.events.size(), 10u);
}

}  // namespace
}  // namespace carpool::worker
