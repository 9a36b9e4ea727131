// The cluster launched with mpirun, as users run it: real carpool-router / carpool-worker ranks,
// driven through the C++ SDK.
//   MPMD (must-show 2): `mpirun -np 1 carpool-router : -np 2 carpool-worker [--tp 2]` serves
//     requests (the TP-2 group embeddings too) with no address flags, then shuts down cleanly:
//     the router's SIGTERM ends the whole job with exit 0, Ctrl-C on mpirun ends it too, and no
//     rank is left.
//   Rank failures (must-show 4): the router runs outside the workers' mpirun job; killing one
//     rank of a TP-2 group makes the router drop that worker within 2 s and keep serving through
//     another job's worker, and no rank of the broken group is left.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/carpool_client.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"
#include "worker/engine.h"

namespace carpool {
namespace {

using testing::RouterEndpoints;
using testing::Subprocess;
using testing::WaitForRouterEndpoints;

const std::string kBin = CARPOOL_BIN_DIR;

int64_t NowMs() { return Clock::Real()->NowMicros() / 1000; }

// A process that exists and is not a zombie.
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  if (text.empty()) return false;
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// Waits up to timeout_ms for every pid to be gone; returns those still alive.
std::vector<pid_t> Survivors(const std::vector<pid_t>& pids, int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  std::vector<pid_t> alive;
  do {
    alive.clear();
    for (pid_t p : pids) {
      if (Alive(p)) alive.push_back(p);
    }
    if (alive.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (NowMs() < deadline);
  return alive;
}

struct Rank {
  pid_t pid = 0;
  std::string role;  // "router" | "worker"
  int tp_rank = 0;   // workers
};

class TpMpirunTest : public ::testing::Test {
 protected:
  void TearDown() override {
    client_.reset();
    for (auto& job : jobs_) job.reset();  // SIGTERM, then SIGKILL
    router_.reset();
    // Whatever happened, no rank outlives the test.
    std::vector<pid_t> pids;
    for (const auto& [pid, rank] : ranks_) pids.push_back(pid);
    for (pid_t p : Survivors(pids, 5000)) kill(p, SIGKILL);
  }

  std::string LogPath(const std::string& name) { return dir_.Log(name); }

  std::vector<std::string> Mpirun(std::vector<std::string> rest) {
    std::vector<std::string> argv = {CARPOOL_MPIEXEC};
    for (absl::string_view flag : absl::StrSplit(CARPOOL_MPIRUN_FLAGS, ',', absl::SkipEmpty())) {
      argv.emplace_back(flag);
    }
    argv.insert(argv.end(), rest.begin(), rest.end());
    return argv;
  }

  std::vector<std::string> Worker(std::vector<std::string> extra) {
    std::vector<std::string> argv = {kBin + "/carpool-worker", "--model", "synthetic:tiny",
                                     "--threads", "1", "--max-model-len", "2048"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  Subprocess* StartJob(const std::string& name, std::vector<std::string> argv) {
    jobs_.push_back(std::make_unique<Subprocess>(std::move(argv), LogPath(name)));
    return jobs_.back().get();
  }

  // The ranks a job's log announces ("MPI world rank R/N on HOST (pid P), ROLE, ...").
  std::map<pid_t, Rank> WaitForRanks(Subprocess* job, int n) {
    static const std::regex kLine(
        R"(MPI world rank \d+/\d+ on \S+ \(pid (\d+)\), (router|worker)(?:, local rank \d+/\d+, tensor-parallel group \d+ rank (\d+))?)");
    std::map<pid_t, Rank> found;
    const int64_t deadline = NowMs() + 30000;
    while (static_cast<int>(found.size()) < n && NowMs() < deadline) {
      found.clear();
      const std::string log = job->Log();
      for (std::sregex_iterator it(log.begin(), log.end(), kLine), end; it != end; ++it) {
        Rank r;
        r.pid = std::stoi((*it)[1]);
        r.role = (*it)[2];
        r.tp_rank = (*it)[3].matched ? std::stoi((*it)[3]) : 0;
        found[r.pid] = r;
      }
      if (static_cast<int>(found.size()) < n) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    EXPECT_EQ(static_cast<int>(found.size()), n) << job->Log();
    ranks_.insert(found.begin(), found.end());
    return found;
  }

  void Connect(const std::string& frontend) {
    ClientOptions o;
    o.router_endpoint = frontend;
    o.default_timeout_ms = 60000;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  // Waits until the router lists exactly the workers named (any ids when `ids` is empty but n).
  void WaitForWorkers(int n) {
    for (int i = 0; i < 600; ++i) {
      auto s = client_->Stats(1000);
      if (s.ok() && static_cast<int>(s->workers.size()) == n) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "the router never listed " << n << " workers";
  }

  bool Listed(const std::string& worker_id) {
    auto s = client_->Stats(1000);
    if (!s.ok()) return true;  // unknown: not shown gone
    for (const auto& w : s->workers) {
      if (w.worker_id == worker_id) return true;
    }
    return false;
  }

  std::vector<pid_t> Pids(const std::map<pid_t, Rank>& ranks) {
    std::vector<pid_t> pids;
    for (const auto& [pid, rank] : ranks) pids.push_back(pid);
    return pids;
  }

  testing::TestDir dir_{"carpool_tp_mpirun_test"};
  std::vector<std::unique_ptr<Subprocess>> jobs_;
  std::unique_ptr<Subprocess> router_;
  std::unique_ptr<Client> client_;
  std::map<pid_t, Rank> ranks_;
};

GenerateInput Greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                     bool stream = false) {
  GenerateInput g;
  g.request_id = id;
  g.token_ids = std::move(prompt);
  g.sampling.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  g.sampling.ignore_eos = true;
  g.stream = stream;
  return g;
}

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> p = {256};
  for (int j = 0; j < 5 + i % 23; ++j) p.push_back((i * 37 + j * 11) % 256);
  return p;
}

// What the whole model alone answers (TP=1, in process).
std::vector<std::vector<int32_t>> Expected(int n, int max_tokens) {
  worker::EngineOptions o;
  o.model = "synthetic:tiny";
  o.scheduler.max_model_len = 2048;
  o.num_threads = 1;
  auto engine = worker::Engine::Create(o);
  EXPECT_TRUE(engine.ok());
  std::vector<worker::EngineRequest> requests;
  for (int i = 0; i < n; ++i) {
    worker::EngineRequest r;
    r.prompt_tokens = Prompt(i);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& c : (*engine)->Generate(std::move(requests))) {
    out.push_back(c.ok() ? c->tokens : std::vector<int32_t>{});
  }
  return out;
}

// Inputs of 1..40 token ids for an embed request.
std::vector<std::vector<int32_t>> EmbedTokens() {
  std::vector<std::vector<int32_t>> inputs;
  for (int len : {1, 9, 40, 3, 17}) inputs.push_back(Prompt(len));
  return inputs;
}

// What the whole model alone embeds (TP=1, in process).
std::vector<std::vector<float>> ExpectedEmbeddings(Pooling pooling, bool normalize) {
  worker::EngineOptions o;
  o.model = "synthetic:tiny";
  o.scheduler.max_model_len = 2048;
  o.num_threads = 1;
  auto engine = worker::Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::vector<worker::EmbeddingInput> inputs;
  for (auto& tokens : EmbedTokens()) {
    worker::EmbeddingInput in;
    in.tokens = std::move(tokens);
    in.pooling = pooling;
    in.normalize = normalize;
    inputs.push_back(std::move(in));
  }
  std::vector<const worker::EmbeddingInput*> batch;
  for (const auto& in : inputs) batch.push_back(&in);
  auto out = (*engine)->Embed(batch);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<std::vector<float>>{};
}

// One embed request of EmbedTokens() through the router equals the whole model's, within the
// float tolerance of tp_equivalence_test.cc (kEmbeddingTolerance: the group sums in another
// order).
void ExpectServedEmbeddings(Client* client, Pooling pooling, bool normalize) {
  EmbedInput in;
  in.request_id = absl::StrCat("embed-", static_cast<int>(pooling), normalize);
  for (auto& tokens : EmbedTokens()) {
    EmbedItem item;
    item.token_ids = std::move(tokens);
    in.inputs.push_back(std::move(item));
  }
  in.pooling = pooling;
  in.normalize = normalize;
  absl::StatusOr<EmbedResult> got = client->Embed(in);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<std::vector<float>> want = ExpectedEmbeddings(pooling, normalize);
  ASSERT_EQ(got->embeddings.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got->embeddings[i].size(), want[i].size()) << "input " << i;
    for (size_t j = 0; j < want[i].size(); ++j) {
      ASSERT_NEAR(got->embeddings[i][j], want[i][j], 1e-5) << "input " << i << " element " << j;
    }
  }
}

// n concurrent greedy requests through the router; their tokens.
std::vector<std::vector<int32_t>> Serve(Client* client, int n, int max_tokens) {
  std::vector<std::future<absl::StatusOr<GenerateResult>>> calls;
  for (int i = 0; i < n; ++i) {
    calls.push_back(std::async(std::launch::async, [client, i, max_tokens] {
      return client->Generate(Greedy(absl::StrCat("r", i), Prompt(i), max_tokens));
    }));
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& c : calls) {
    auto r = c.get();
    EXPECT_TRUE(r.ok()) << r.status();
    out.push_back(r.ok() ? r->TokenIds() : std::vector<int32_t>{});
  }
  return out;
}

TEST_F(TpMpirunTest, MpmdRouterAndTwoTp1WorkersServeThenTheRoutersSigtermEndsTheJob) {
  const std::string frontend = absl::StrCat("tcp://127.0.0.1:", testing::FreePort());
  Subprocess* job = StartJob(
      "job", Mpirun({"-np", "1", kBin + "/carpool-router", "--frontend", frontend, ":", "-np", "2",
                     kBin + "/carpool-worker", "--model", "synthetic:tiny", "--threads", "1",
                     "--max-model-len", "2048"}));
  const auto ranks = WaitForRanks(job, 3);
  Connect(frontend);
  WaitForWorkers(2);

  EXPECT_EQ(Serve(client_.get(), 16, 24), Expected(16, 24));
  auto stats = client_->Stats(2000);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->workers.size(), 2u);
  for (const auto& w : stats->workers) EXPECT_GT(w.requests_served, 0) << w.worker_id;

  pid_t router = 0;
  for (const auto& [pid, rank] : ranks) {
    if (rank.role == "router") router = pid;
  }
  ASSERT_GT(router, 0);
  ASSERT_EQ(kill(router, SIGTERM), 0);
  EXPECT_EQ(job->Wait(30000), 0) << job->Log();  // mpirun: every rank finished cleanly
  EXPECT_THAT(Survivors(Pids(ranks), 5000), ::testing::IsEmpty());
  EXPECT_THAT(job->Log(), ::testing::HasSubstr("carpool-router: stopped"));
}

TEST_F(TpMpirunTest, MpmdRouterAndOneTp2WorkerServeThenCtrlCEndsEveryRank) {
  const std::string frontend = absl::StrCat("tcp://127.0.0.1:", testing::FreePort());
  Subprocess* job = StartJob(
      "job", Mpirun({"-np", "1", kBin + "/carpool-router", "--frontend", frontend, ":", "-np", "2",
                     kBin + "/carpool-worker", "--tp", "2", "--model", "synthetic:tiny",
                     "--threads", "1", "--max-model-len", "2048"}));
  const auto ranks = WaitForRanks(job, 3);
  Connect(frontend);
  WaitForWorkers(1);

  // Greedy tokens of the TP-2 group equal the whole model's.
  EXPECT_EQ(Serve(client_.get(), 12, 24), Expected(12, 24));
  auto stats = client_->Stats(2000);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->workers.size(), 1u);
  EXPECT_EQ(stats->workers[0].requests_served, 12);
  // So do its embeddings (the leader runs each pass with its follower).
  ExpectServedEmbeddings(client_.get(), Pooling::kMean, true);
  ExpectServedEmbeddings(client_.get(), Pooling::kLast, false);

  job->Signal(SIGINT);  // Ctrl-C on mpirun
  EXPECT_NE(job->Wait(15000), -1000) << "mpirun did not exit after Ctrl-C\n" << job->Log();
  EXPECT_THAT(Survivors(Pids(ranks), 5000), ::testing::IsEmpty());
}

// The router on its own (a head node), a TP-2 worker under one mpirun job and a TP-1 worker as
// another job; one rank of the TP-2 group is killed while it serves.
class RankFailureTest : public TpMpirunTest {
 protected:
  void StartCluster(std::vector<std::string> group_mpirun_flags,
                    std::vector<std::string> group_worker_flags = {}) {
    router_ = std::make_unique<Subprocess>(
        std::vector<std::string>{kBin + "/carpool-router", "--frontend", "tcp://127.0.0.1:*",
                                 "--backend", "tcp://127.0.0.1:*"},
        LogPath("router"));
    RouterEndpoints ep;
    ASSERT_TRUE(WaitForRouterEndpoints(*router_, &ep)) << router_->Log();
    const std::string frontend = ep.frontend, backend = ep.backend;

    std::vector<std::string> group_args = {"-np", "2"};
    group_args.insert(group_args.begin(), group_mpirun_flags.begin(), group_mpirun_flags.end());
    std::vector<std::string> worker =
        Worker({"--tp", "2", "--router", backend, "--worker-id", "tp-group"});
    worker.insert(worker.end(), group_worker_flags.begin(), group_worker_flags.end());
    group_args.insert(group_args.end(), worker.begin(), worker.end());
    group_ = StartJob("tp-group", Mpirun(group_args));
    group_ranks_ = WaitForRanks(group_, 2);

    std::vector<std::string> other = {"-np", "1"};
    const std::vector<std::string> solo = Worker({"--router", backend, "--worker-id", "other"});
    other.insert(other.end(), solo.begin(), solo.end());
    other_ = StartJob("other", Mpirun(other));
    WaitForRanks(other_, 1);
    Connect(frontend);
    WaitForWorkers(2);
  }

  pid_t GroupRank(int tp_rank) {
    for (const auto& [pid, rank] : group_ranks_) {
      if (rank.tp_rank == tp_rank) return pid;
    }
    return 0;
  }

  // Sends `signo` to one rank of the group while four long streams run, and checks what
  // follows.
  void KillWhileServing(int tp_rank, int signo = SIGKILL) {
    std::vector<std::unique_ptr<Stream>> streams;
    constexpr int kTokens = 1900;
    for (int i = 0; i < 4; ++i) {
      auto s = client_->StartStream(Greedy(absl::StrCat("long", i), Prompt(i), kTokens, true));
      ASSERT_TRUE(s.ok()) << s.status();
      streams.push_back(std::move(*s));
    }
    // Wait until the group runs at least one of them.
    bool busy = false;
    for (int i = 0; i < 200 && !busy; ++i) {
      auto s = client_->Stats(1000);
      if (s.ok()) {
        for (const auto& w : s->workers) busy |= w.worker_id == "tp-group" && w.running > 0;
      }
      if (!busy) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(busy) << "the TP group never ran a request";

    const pid_t victim = GroupRank(tp_rank);
    ASSERT_GT(victim, 0);
    const int64_t killed = NowMs();
    ASSERT_EQ(kill(victim, signo), 0);
    while (Listed("tp-group") && NowMs() - killed < 10000) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const int64_t dead_after = NowMs() - killed;
    EXPECT_LT(dead_after, 2000) << "the router kept the broken group for " << dead_after << " ms";
    std::printf("signal %d to TP rank %d: router dropped the group after %lld ms\n", signo,
                tp_rank, static_cast<long long>(dead_after));

    // Every stream ends complete: those on the group move to the other worker and resume.
    for (auto& stream : streams) {
      absl::StatusOr<std::optional<GenerateChunkOut>> next;
      do {
        next = stream->Next();
      } while (next.ok() && next->has_value());
      ASSERT_TRUE(next.ok()) << stream->request_id() << ": " << next.status();
      EXPECT_EQ(stream->result().tokens.size(), static_cast<size_t>(kTokens));
    }
    // And new requests are served by the survivor.
    EXPECT_EQ(Serve(client_.get(), 4, 16), Expected(4, 16));
    auto stats = client_->Stats(2000);
    ASSERT_TRUE(stats.ok());
    ASSERT_EQ(stats->workers.size(), 1u);
    EXPECT_EQ(stats->workers[0].worker_id, "other");

    // Nothing of the broken group is left, and its mpirun has exited.
    EXPECT_THAT(Survivors(Pids(group_ranks_), 5000), ::testing::IsEmpty()) << group_->Log();
    EXPECT_NE(group_->Wait(5000), -1000) << group_->Log();
  }

  Subprocess* group_ = nullptr;
  Subprocess* other_ = nullptr;
  std::map<pid_t, Rank> group_ranks_;
};

TEST_F(RankFailureTest, KillingAFollowerDropsTheGroupWithinTwoSeconds) {
  StartCluster({});
  KillWhileServing(/*tp_rank=*/1);
}

TEST_F(RankFailureTest, KillingTheLeaderDropsTheGroupWithinTwoSeconds) {
  StartCluster({});
  KillWhileServing(/*tp_rank=*/0);
}

// A hung rank (stopped: alive, silent, invisible to mpirun) is found by the group's
// heartbeats alone; the leader exits (code 75) and mpirun then ends the job.
TEST_F(RankFailureTest, AHungFollowerIsFoundByTheGroupsHeartbeats) {
  StartCluster({}, {"--tp-timeout-ms", "500"});
  KillWhileServing(/*tp_rank=*/1, SIGSTOP);
  EXPECT_THAT(group_->Log(), ::testing::HasSubstr("has been silent for"));
}

// Open MPI's --enable-recovery keeps a job running when a rank dies (no SIGTERM from mpirun):
// the group itself notices the dead peer and ends the survivor.
TEST_F(RankFailureTest, WithoutMpirunsHelpTheGroupEndsTheSurvivor) {
  StartCluster({"--enable-recovery"});
  KillWhileServing(/*tp_rank=*/1);
  EXPECT_THAT(group_->Log(), ::testing::HasSubstr("tensor-parallel group failed"));
}

}  // namespace
}  // namespace carpool
