// Tensor parallelism over MPI gives the whole model's answers: run as 2 ranks of one mpirun job
// (one TP-2 group). Rank 0 runs each workload twice, on the whole model alone (TP=1) and as the
// group's leader (TP=2) while rank 1 follows; greedy tokens must be identical and every logprob
// (the sampled token's and the top 5) within 1e-4. The Embeddings* tests do the same for
// Engine::Embed (every pooling, normalized or not, inputs of many lengths in one batch, split
// into several passes), between generation steps: every element within kEmbeddingTolerance.
//
// The Staged* tests run the group's ranks on a device without host memory
// (tests/testing/no_host_memory_device.h): every all-reduce and the logits gather go ToHost ->
// the MPI collective -> FromHost, the path a GPU rank takes, checked here on the CPU against the
// same TP=1 answers (a plain CPU device).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cluster/mpi_communicator.h"
#include "cluster/testing/mpi_test_main.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/no_host_memory_device.h"
#include "worker/engine.h"
#include "worker/mpi_worker.h"

namespace carpool {

cluster::MpiJobOptions cluster::testing::TestJobOptions(int, int) {
  return MpiJobOptions{.role = Role::kWorker, .tensor_parallel = 2};
}

namespace {

namespace fs = std::filesystem;
using worker::Completion;
using worker::Engine;
using worker::EngineOptions;
using worker::EngineRequest;
using worker::ModelConfig;

constexpr double kLogprobTolerance = 1e-4;
// TP=2 computes the same sums as TP=1 in another order: each rank's half of the heads (o_proj)
// and of the MLP's features (down_proj), added by the all-reduce; the vocabulary-parallel
// embedding adds zeros, exactly. So the final-norm hidden states differ by fp32 rounding only
// (a few ulps after 2 layers and the final RMSNorm), and pooling and normalization, in double on
// the leader, add none. The tests print the worst difference and the largest magnitude:
// 7e-7 and 9.5e-7 on values up to 2.8 and 3.3, i.e. 2-4 ulps there; 1e-5 leaves 10x for other
// compilers and CPUs and is still far below any real fault (a wrong shard, a missed collective
// or a mispooled row moves elements by 1e-2 or more).
constexpr double kEmbeddingTolerance = 1e-5;

ModelConfig Config(int heads, int kv_heads) {
  ModelConfig c = worker::SyntheticConfig("tiny").value();  // vocab 258, hidden 64, I 176
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = c.hidden_size / heads;
  c.max_position_embeddings = 512;
  return c;
}

// Prompts of 1..90 tokens (longer than one step's token budget, so prefill is chunked), several
// sharing a 40-token prefix.
std::vector<EngineRequest> Requests(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(0, 255), length(1, 90);
  std::vector<int32_t> prefix;
  for (int i = 0; i < 40; ++i) prefix.push_back(token(rng));
  std::vector<EngineRequest> requests;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.prompt_tokens.push_back(256);
    if (i % 3 == 0) r.prompt_tokens.insert(r.prompt_tokens.end(), prefix.begin(), prefix.end());
    for (int j = length(rng); j > 0; --j) r.prompt_tokens.push_back(token(rng));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 12 + i % 5;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 5;
    requests.push_back(std::move(r));
  }
  return requests;
}

class TpEquivalenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm comm = cluster::testing::Job().tp_comm();
    MPI_Comm_rank(comm, &rank_);
    // One folder for the group: rank 0 names it.
    int pid = getpid();
    MPI_Bcast(&pid, 1, MPI_INT, 0, comm);
    dir_ = fs::temp_directory_path() / ("carpool_tp_equivalence_" + std::to_string(pid));
    auto group = cluster::MpiCommunicator::Create(comm, {.timeout = absl::Seconds(60)});
    ASSERT_TRUE(group.ok()) << group.status();
    group_ = std::move(*group);
  }
  void TearDown() override {
    MPI_Barrier(cluster::testing::Job().tp_comm());
    if (rank_ == 0) fs::remove_all(dir_);
  }

  // Rank 0 writes the checkpoint; everyone waits for it.
  std::string Write(const std::string& name, const testing::CheckpointSpec& spec) {
    const fs::path path = dir_ / name;
    if (rank_ == 0) {
      auto written = testing::WriteCheckpoint(path.string(), spec);
      EXPECT_TRUE(written.ok()) << written.status();
    }
    MPI_Barrier(cluster::testing::Job().tp_comm());
    return path.string();
  }

  EngineOptions Options(const std::string& model) {
    EngineOptions o;
    o.model = model;
    o.scheduler.max_model_len = 256;
    o.scheduler.max_num_batched_tokens = 64;
    o.scheduler.max_num_seqs = 8;
    o.num_kv_blocks = 160;
    o.num_threads = 1;
    return o;
  }

  // Two rounds on one engine (the second reuses the first's cached prefix blocks).
  std::vector<Completion> Run(Engine* engine) {
    std::vector<Completion> out;
    for (uint32_t round : {1u, 2u}) {
      for (auto& r : engine->Generate(Requests(9, round))) {
        EXPECT_TRUE(r.ok()) << r.status();
        if (r.ok()) out.push_back(*std::move(r));
      }
    }
    return out;
  }

  // The device of a TP=2 rank: null (the engine's CPU device) or, staged, one without host
  // memory.
  enum class Collectives { kInPlace, kStaged };
  static std::unique_ptr<worker::ModelDevice> RankDevice(Collectives c) {
    if (c == Collectives::kInPlace) return nullptr;
    return std::make_unique<testing::NoHostMemoryDevice>();
  }

  // Rank 0: TP=1 (a plain CPU device) then TP=2 as leader, compared. Rank 1: follows.
  void ExpectSameAnswers(const std::string& model,
                         Collectives collectives = Collectives::kInPlace) {
    if (rank_ == 1) {
      EngineOptions o = Options(model);
      o.tensor_parallel_group = group_.get();
      auto follower = Engine::Create(o, nullptr, RankDevice(collectives));
      ASSERT_TRUE(follower.ok()) << follower.status();
      ASSERT_TRUE(worker::RunFollower(&(*follower)->model(), group_.get()).ok());
      return;
    }
    auto whole = Engine::Create(Options(model));
    ASSERT_TRUE(whole.ok()) << whole.status();
    const std::vector<Completion> expected = Run(whole->get());

    EngineOptions o = Options(model);
    o.tensor_parallel_group = group_.get();
    auto leader = Engine::Create(o, nullptr, RankDevice(collectives));
    ASSERT_TRUE(leader.ok()) << leader.status();
    auto probe = (*leader)->model().device().Allocate(1);
    ASSERT_TRUE(probe.ok());
    EXPECT_EQ((*leader)->model().device().HostData(*probe) == nullptr,
              collectives == Collectives::kStaged);
    EXPECT_EQ((*leader)->model().weights().shard.num_heads,
              (*whole)->model_config().num_heads / 2);
    const std::vector<Completion> got = Run(leader->get());
    ASSERT_TRUE(worker::StopFollowers(group_.get()).ok());
    EXPECT_GT((*leader)->model().collective_times().all_reduces, 0);

    ASSERT_EQ(got.size(), expected.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
      for (size_t j = 0; j < got[i].logprobs.size(); ++j) {
        const auto& a = got[i].logprobs[j];
        const auto& b = expected[i].logprobs[j];
        worst = std::max(worst, std::abs(double{a.logprob} - b.logprob));
        ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
        for (size_t k = 0; k < a.top_logprobs.size(); ++k) {
          worst = std::max(worst,
                           std::abs(double{a.top_logprobs[k].logprob} - b.top_logprobs[k].logprob));
        }
      }
    }
    EXPECT_LE(worst, kLogprobTolerance);
    std::printf("%s%s: %zu requests, greedy tokens identical, worst logprob difference %.3g\n",
                model.c_str(), collectives == Collectives::kStaged ? " (staged)" : "",
                got.size(), worst);
  }

  // Rank 0: the whole model's embeddings, then the group's (as leader, with generation steps
  // before, between and after, so the followers see embed passes mixed with generation steps),
  // compared. Rank 1: follows.
  void ExpectSameEmbeddings(const std::string& model,
                            Collectives collectives = Collectives::kInPlace) {
    const std::vector<worker::EmbeddingInput> inputs = EmbeddingInputs();
    std::vector<const worker::EmbeddingInput*> batch;
    for (const worker::EmbeddingInput& in : inputs) batch.push_back(&in);
    if (rank_ == 1) {
      EngineOptions o = Options(model);
      o.tensor_parallel_group = group_.get();
      auto follower = Engine::Create(o, nullptr, RankDevice(collectives));
      ASSERT_TRUE(follower.ok()) << follower.status();
      ASSERT_TRUE(worker::RunFollower(&(*follower)->model(), group_.get()).ok());
      return;
    }
    auto whole = Engine::Create(Options(model));
    ASSERT_TRUE(whole.ok()) << whole.status();
    auto expected = (*whole)->Embed(batch);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<Completion> expected_tokens = Run(whole->get());
    std::vector<absl::StatusOr<Completion>> expected_mixed = (*whole)->Generate(Requests(4, 3));

    EngineOptions o = Options(model);
    o.tensor_parallel_group = group_.get();
    auto leader = Engine::Create(o, nullptr, RankDevice(collectives));
    ASSERT_TRUE(leader.ok()) << leader.status();
    // A failed assertion below returns early: release the follower all the same, so that the
    // test fails instead of hanging.
    struct ReleaseFollowers {
      ~ReleaseFollowers() {
        if (group != nullptr) worker::StopFollowers(group).IgnoreError();
      }
      decltype(group_.get()) group;
    } release{group_.get()};
    auto first = (*leader)->Embed(batch);  // before any generation step
    ASSERT_TRUE(first.ok()) << first.status();
    // Embeddings between the steps of a generation.
    std::vector<absl::StatusOr<std::vector<std::vector<float>>>> between;
    std::vector<int64_t> ids;
    for (auto& r : Requests(4, 3)) {
      auto id = (*leader)->Add(std::move(r));
      ASSERT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    std::map<int64_t, Completion> mixed;
    while ((*leader)->has_unfinished()) {
      if (between.size() < 3) between.push_back((*leader)->Embed(batch));
      for (worker::EngineEvent& e : (*leader)->Step()) {
        if (e.finished) mixed[e.seq_id] = *e.completion;
      }
    }
    const std::vector<Completion> after_tokens = Run(leader->get());
    auto last = (*leader)->Embed(batch);  // after
    ASSERT_TRUE(last.ok()) << last.status();
    release.group = nullptr;
    ASSERT_TRUE(worker::StopFollowers(group_.get()).ok());

    double worst = 0, largest = 0;
    const auto compare = [&](const std::vector<std::vector<float>>& got, const char* when) {
      ASSERT_EQ(got.size(), expected->size()) << when;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].size(), (*expected)[i].size()) << when << ", input " << i;
        for (size_t j = 0; j < got[i].size(); ++j) {
          const double d = std::abs(double{got[i][j]} - (*expected)[i][j]);
          worst = std::max(worst, d);
          largest = std::max(largest, std::abs(double{(*expected)[i][j]}));
          ASSERT_LE(d, kEmbeddingTolerance) << when << ", input " << i << " element " << j;
        }
      }
    };
    compare(*first, "first");
    ASSERT_EQ(between.size(), 3u);
    for (const auto& b : between) {
      ASSERT_TRUE(b.ok()) << b.status();
      compare(*b, "between steps");
    }
    compare(*last, "last");
    // The generation around the embed passes is the whole model's too (greedy tokens).
    ASSERT_EQ(after_tokens.size(), expected_tokens.size());
    for (size_t i = 0; i < after_tokens.size(); ++i) {
      EXPECT_EQ(after_tokens[i].tokens, expected_tokens[i].tokens) << "request " << i;
    }
    ASSERT_EQ(mixed.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_TRUE(expected_mixed[i].ok());
      EXPECT_EQ(mixed[ids[i]].tokens, expected_mixed[i]->tokens) << "mixed request " << i;
    }
    std::printf("%s%s: %zu embeddings x 5 batches, worst difference %.3g (largest value %.3g)\n",
                model.c_str(), collectives == Collectives::kStaged ? " (staged)" : "",
                expected->size(), worst, largest);
  }

  // 16 inputs of 1..150 tokens: every (pooling, normalize) pair on short and long inputs, and
  // more tokens than one pass holds (Options: 64 a pass), some alone in a pass of their own.
  static std::vector<worker::EmbeddingInput> EmbeddingInputs() {
    std::mt19937 rng(21);
    std::uniform_int_distribution<int> token(0, 255);
    const int lengths[] = {1, 7, 33, 90, 2, 64, 150, 17, 5, 40, 1, 65, 12, 3, 28, 100};
    std::vector<worker::EmbeddingInput> inputs;
    for (size_t i = 0; i < std::size(lengths); ++i) {
      worker::EmbeddingInput in;
      for (int j = 0; j < lengths[i]; ++j) in.tokens.push_back(token(rng));
      in.pooling = i % 2 == 0 ? Pooling::kMean : Pooling::kLast;
      in.normalize = (i / 2) % 2 == 0;
      inputs.push_back(std::move(in));
    }
    return inputs;
  }

  int rank_ = 0;
  fs::path dir_;
  std::unique_ptr<cluster::MpiCommunicator> group_;
};

TEST_F(TpEquivalenceTest, GroupedQueryAttentionSplitsKeyValueHeads) {
  testing::CheckpointSpec spec;
  spec.config = Config(8, 4);  // 4 kv heads over 2 ranks: 2 each
  spec.seed = 11;
  ExpectSameAnswers(Write("gqa", spec));
}

TEST_F(TpEquivalenceTest, FewerKeyValueHeadsThanRanksAreReplicated) {
  testing::CheckpointSpec spec;
  spec.config = Config(8, 1);  // 1 kv head, 2 ranks: both hold it
  spec.seed = 12;
  ExpectSameAnswers(Write("mqa", spec));
}

TEST_F(TpEquivalenceTest, Qwen2BiasesTiedHeadBf16Shards) {
  testing::CheckpointSpec spec;
  spec.config = Config(4, 2);
  spec.config.architecture = "Qwen2ForCausalLM";
  spec.config.attention_bias = true;
  spec.config.tie_word_embeddings = true;
  spec.dtype = worker::DType::kBF16;
  spec.num_shards = 2;
  spec.seed = 13;
  ExpectSameAnswers(Write("qwen2", spec));
}

TEST_F(TpEquivalenceTest, StagedGroupedQueryAttentionSplitsKeyValueHeads) {
  testing::CheckpointSpec spec;
  spec.config = Config(8, 4);
  spec.seed = 11;
  ExpectSameAnswers(Write("gqa", spec), Collectives::kStaged);
}

TEST_F(TpEquivalenceTest, StagedFewerKeyValueHeadsThanRanksAreReplicated) {
  testing::CheckpointSpec spec;
  spec.config = Config(8, 1);
  spec.seed = 12;
  ExpectSameAnswers(Write("mqa", spec), Collectives::kStaged);
}

TEST_F(TpEquivalenceTest, EmbeddingsGroupedQueryAttention) {
  testing::CheckpointSpec spec;
  spec.config = Config(8, 4);
  spec.seed = 11;
  ExpectSameEmbeddings(Write("gqa", spec));
}

TEST_F(TpEquivalenceTest, EmbeddingsStagedQwen2BiasesTiedHeadFewerKeyValueHeadsThanRanks) {
  testing::CheckpointSpec spec;
  spec.config = Config(4, 1);  // 1 kv head over 2 ranks: replicated
  spec.config.architecture = "Qwen2ForCausalLM";
  spec.config.attention_bias = true;
  spec.config.tie_word_embeddings = true;
  spec.dtype = worker::DType::kBF16;
  spec.seed = 14;
  ExpectSameEmbeddings(Write("qwen2_embed", spec), Collectives::kStaged);
}

TEST_F(TpEquivalenceTest, SyntheticWeightsAreTheSameWholeModelAtAnyTp) {
  ExpectSameAnswers("synthetic:tiny");
}

}  // namespace
}  // namespace carpool
