#include "worker/scheduler/scheduler.h"

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/scheduler/scheduler_test_harness.h"

namespace carpool::worker {
namespace {

using ::testing::ElementsAre;

using scheduler_testing::Config;
using scheduler_testing::FakeRunner;
using scheduler_testing::Harness;
using scheduler_testing::Item;
using scheduler_testing::kEos;
using scheduler_testing::Result;
using scheduler_testing::SeqBuilder;

// ---------------------------------------------------------------------------------------------
// Options and small pieces.

TEST(SchedulerOptionsTest, Validate) {
  SchedulerOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.max_num_batched_tokens = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o = SchedulerOptions();
  o.max_num_seqs = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = SchedulerOptions();
  o.max_model_len = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = SchedulerOptions();
  o.enable_chunked_prefill = false;
  o.max_num_batched_tokens = o.max_model_len - 1;
  EXPECT_FALSE(o.Validate().ok());
  o.max_num_batched_tokens = o.max_model_len;
  EXPECT_TRUE(o.Validate().ok());
  o.static_batch_timeout_micros = -1;
  EXPECT_FALSE(o.Validate().ok());
}

TEST(SchedulerOptionsTest, CreateRejectsBadInput) {
  SchedulerOptions o;
  EXPECT_FALSE(CreateScheduler(o, nullptr).ok());
  KvCacheOptions kv_options;
  kv_options.num_blocks = 8;
  auto kv = *KvCacheManager::Create(kv_options);
  o.max_num_seqs = -1;
  EXPECT_FALSE(CreateScheduler(o, kv.get()).ok());
}

TEST(SequenceTest, FinishReasonName) {
  EXPECT_STREQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_STREQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_STREQ(FinishReasonName(FinishReason::kAborted), "abort");
  EXPECT_STREQ(FinishReasonName(FinishReason::kNone), "");
}

// ---------------------------------------------------------------------------------------------
// Continuous batching.

TEST(ContinuousSchedulerTest, EmptyPlanWhenIdle) {
  Harness h(Config{});
  EXPECT_TRUE(h.Step().empty());
  EXPECT_FALSE(h.scheduler().has_unfinished());
}

TEST(ContinuousSchedulerTest, ChunkedPrefillOfALongPrompt) {
  Config c;
  c.sched.max_num_batched_tokens = 32;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(100).MaxTokens(3).Build());
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 0, 32, false}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 32, 32, false}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 64, 32, false}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 96, 4, true}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 100, 1, true}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 101, 1, true}));
  EXPECT_FALSE(h.scheduler().has_unfinished());
  EXPECT_EQ(h.result(1).reason, FinishReason::kLength);
  EXPECT_EQ(h.result(1).tokens.size(), 3u);
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, DecodesFirstThenPrefillChunks) {
  Config c;
  c.sched.max_num_batched_tokens = 8;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(4).MaxTokens(10).Build());
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 0, 4, true}));
  h.Add(SeqBuilder(2).Prompt(20).MaxTokens(10).Build());
  h.Add(SeqBuilder(3).Prompt(5).MaxTokens(10).Build());
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 4, 1, true}, Item{2, 0, 7, false}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 5, 1, true}, Item{2, 7, 7, false}));
  // Seq 2's last chunk leaves one token of budget for seq 3's first chunk.
  EXPECT_THAT(h.Step(),
              ElementsAre(Item{1, 6, 1, true}, Item{2, 14, 6, true}, Item{3, 0, 1, false}));
  EXPECT_THAT(h.Step(),
              ElementsAre(Item{1, 7, 1, true}, Item{2, 20, 1, true}, Item{3, 1, 4, true}));
  EXPECT_THAT(h.Step(),
              ElementsAre(Item{1, 8, 1, true}, Item{2, 21, 1, true}, Item{3, 5, 1, true}));
}

TEST(ContinuousSchedulerTest, WithoutChunkingAPromptWaitsUntilItFitsWhole) {
  Config c;
  c.sched.enable_chunked_prefill = false;
  c.sched.max_num_batched_tokens = 32;
  c.sched.max_model_len = 32;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(20).MaxTokens(4).Build());
  h.Add(SeqBuilder(2).Prompt(20).MaxTokens(4).Build());
  h.Add(SeqBuilder(3).Prompt(2).MaxTokens(4).Build());
  // Seq 2 does not fit in the 12 tokens left, and seq 3 may not overtake it.
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 0, 20, true}));
  EXPECT_THAT(h.Step(),
              ElementsAre(Item{1, 20, 1, true}, Item{2, 0, 20, true}, Item{3, 0, 2, true}));
}

TEST(ContinuousSchedulerTest, MaxNumSeqsCapsTheBatch) {
  Config c;
  c.sched.max_num_seqs = 2;
  Harness h(c);
  for (int id = 1; id <= 3; ++id) h.Add(SeqBuilder(id).Prompt(4).MaxTokens(2).Build());
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 0, 4, true}, Item{2, 0, 4, true}));
  EXPECT_EQ(h.scheduler().num_waiting(), 1);
  EXPECT_EQ(h.scheduler().num_running(), 2);
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 4, 1, true}, Item{2, 4, 1, true}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{3, 0, 4, true}));
}

TEST(ContinuousSchedulerTest, AdmitsByPriorityThenArrival) {
  Config c;
  c.sched.max_num_seqs = 1;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(4).MaxTokens(1).WithPriority(Priority::kBatch).Build());
  h.Add(SeqBuilder(2).Prompt(4).MaxTokens(1).WithPriority(Priority::kDefault).Build());
  h.Add(SeqBuilder(3).Prompt(4).MaxTokens(1).WithPriority(Priority::kInteractive).Build());
  h.Add(SeqBuilder(4).Prompt(4).MaxTokens(1).WithPriority(Priority::kDefault).Build());
  h.Add(SeqBuilder(5).Prompt(4).MaxTokens(1).WithPriority(Priority::kInteractive).Build());
  std::vector<int64_t> order;
  while (h.scheduler().has_unfinished()) {
    for (const Item& item : h.Step()) order.push_back(item.seq_id);
  }
  EXPECT_THAT(order, ElementsAre(3, 5, 2, 4, 1));
}

// Priorities are strict: a stream of interactive requests that keeps the batch full would
// starve a batch request (aging belongs to the router). Below saturation it runs, and within a
// priority admission is first come, first served.
TEST(ContinuousSchedulerTest, BatchRequestRunsWhileInteractiveOnesKeepArriving) {
  Config c;
  c.sched.max_num_seqs = 4;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(8).MaxTokens(5).WithPriority(Priority::kBatch).Build());
  for (int step = 0; step < 200; ++step) {
    h.Add(
        SeqBuilder(100 + step).Prompt(6).MaxTokens(3).WithPriority(Priority::kInteractive).Build());
    h.Step();
  }
  EXPECT_TRUE(h.result(1).finished);
  ASSERT_TRUE(h.RunToCompletion());
  // First come, first served among the interactive ones: they finish in arrival order.
  int64_t last_finish = -1;
  for (int id = 100; id < 300; ++id) {
    EXPECT_GE(h.result(id).finish_step, last_finish) << id;
    last_finish = h.result(id).finish_step;
  }
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, FinishReasons) {
  Harness probe(Config{});
  probe.Add(SeqBuilder(1).Prompt(10).MaxTokens(6).Build());
  ASSERT_TRUE(probe.RunToCompletion());
  const std::vector<int32_t> expected = probe.result(1).tokens;
  ASSERT_EQ(expected.size(), 6u);

  Config c;
  c.sched.max_model_len = 14;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(10).MaxTokens(3).Build());                               // max_tokens
  h.Add(SeqBuilder(2).Prompt(10, 1).MaxTokens(4).StopTokens({expected[1]}).Build());  // stop
  h.Add(SeqBuilder(3).Prompt(10).MaxTokens(4).Build());                               // eos
  h.runner().EosAt(3, 11);  // the token at position 11 is its second
  h.Add(SeqBuilder(4).Prompt(10, 1).MaxTokens(4).IgnoreEos().Build());
  h.runner().EosAt(4, 10);                                    // its first token
  h.Add(SeqBuilder(5).Prompt(10, 1).MaxTokens(100).Build());  // max_model_len
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.result(1).reason, FinishReason::kLength);
  EXPECT_EQ(h.result(1).tokens.size(), 3u);
  EXPECT_EQ(h.result(2).reason, FinishReason::kStop);
  EXPECT_THAT(h.result(2).tokens, ElementsAre(expected[0], expected[1]));
  EXPECT_EQ(h.result(3).reason, FinishReason::kStop);
  EXPECT_EQ(h.result(3).tokens.size(), 2u);
  EXPECT_EQ(h.result(3).tokens.back(), kEos);
  EXPECT_EQ(h.result(4).reason, FinishReason::kLength);
  EXPECT_EQ(h.result(4).tokens.size(), 4u);
  EXPECT_EQ(h.result(4).tokens[0], kEos);
  EXPECT_EQ(h.result(5).reason, FinishReason::kLength);
  EXPECT_EQ(h.result(5).tokens.size(), 4u);  // 10 + 4 == max_model_len
  EXPECT_EQ(h.result(5).tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 4));
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, RecordsLogprobsOnTheSequence) {
  Harness h(Config{});
  h.Add(SeqBuilder(1).Prompt(5).MaxTokens(3).Build());
  h.Step();
  h.Step();
  BatchPlan plan = h.scheduler().Schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  const Sequence& seq = *plan.seqs[0].seq;
  ASSERT_EQ(seq.output_logprobs.size(), 2u);
  EXPECT_EQ(seq.output_logprobs[0].token, seq.output_tokens[0]);
  EXPECT_FLOAT_EQ(seq.output_logprobs[1].logprob, -0.06f);
  EXPECT_FLOAT_EQ(h.result(1).logprobs[0], -0.05f);
}

TEST(ContinuousSchedulerTest, AbortFreesBlocks) {
  Harness h(Config{});
  EXPECT_FALSE(h.scheduler().Abort(42));
  h.Add(SeqBuilder(1).Prompt(9).Build());
  h.Step();
  h.Add(SeqBuilder(2).Prompt(9).Build());
  EXPECT_GT(h.kv().num_used_blocks(), 0);
  EXPECT_EQ(h.scheduler().num_waiting(), 1);
  EXPECT_TRUE(h.scheduler().Abort(2));  // waiting
  EXPECT_TRUE(h.scheduler().Abort(1));  // running
  EXPECT_FALSE(h.scheduler().Abort(1));
  EXPECT_FALSE(h.scheduler().has_unfinished());
  EXPECT_TRUE(h.Step().empty());
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, PrefixCacheServesARepeatedPrompt) {
  Harness h(Config{});  // block_size 4
  h.Add(SeqBuilder(1).Prompt(18, 7).MaxTokens(4).Build());
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.result(1).cached_prompt_tokens, 0);
  EXPECT_EQ(h.runner().computed_tokens(1), 18 + 3);

  h.Add(SeqBuilder(2).Prompt(18, 7).MaxTokens(4).Build());
  h.Add(SeqBuilder(3).Prompt(18, 7).MaxTokens(4).Salt(99).Build());  // another tenant
  EXPECT_THAT(h.Step(), ElementsAre(Item{2, 16, 2, true}, Item{3, 0, 18, true}));
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.result(2).cached_prompt_tokens, 16);
  EXPECT_EQ(h.runner().computed_tokens(2), 2 + 3);
  EXPECT_EQ(h.result(3).cached_prompt_tokens, 0);
  // Same context, same tokens, whether computed or read from shared blocks.
  EXPECT_EQ(h.result(2).tokens, h.result(1).tokens);
  EXPECT_EQ(h.result(3).tokens, h.result(1).tokens);
  EXPECT_EQ(h.kv().prefix_cache_hits(), 16);
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, PrefixCacheSharesWithARunningSequence) {
  Harness h(Config{});
  h.Add(SeqBuilder(1).Prompt(12, 3).MaxTokens(20).Build());
  h.Step();
  h.Add(SeqBuilder(2).Prompt(12, 3).MaxTokens(20).Build());
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 12, 1, true}, Item{2, 8, 4, true}));
  EXPECT_EQ(h.kv().RefCount(h.kv().BlockTable(2)[0]), 2);
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.result(2).tokens, h.result(1).tokens);
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, PreemptsLowestPriorityThenNewest) {
  Config c;
  c.kv.num_blocks = 6;
  c.kv.enable_prefix_caching = false;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(8).MaxTokens(4).WithPriority(Priority::kInteractive).Build());
  h.Add(SeqBuilder(2).Prompt(4).MaxTokens(4).WithPriority(Priority::kBatch).Build());
  h.Add(SeqBuilder(3).Prompt(4).MaxTokens(4).WithPriority(Priority::kBatch).Build());
  h.Add(SeqBuilder(4).Prompt(8).MaxTokens(4).WithPriority(Priority::kDefault).Build());
  h.Step();  // all admitted: 2 + 1 + 1 + 2 blocks, the pool is full
  EXPECT_EQ(h.kv().num_free_blocks(), 0);
  // Seq 1 needs a third block: seq 3 (batch, newest) goes. Seq 4 then needs a third block: seq 2
  // (batch) goes.
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 8, 1, true}, Item{4, 8, 1, true}));
  EXPECT_THAT(h.last_preempted(), ElementsAre(3, 2));
  EXPECT_EQ(h.scheduler().num_preemptions(), 2);
  EXPECT_EQ(h.scheduler().num_waiting(), 2);
  ASSERT_TRUE(h.RunToCompletion());
  // Resumed by recompute: prompt + output so far as one prefill, then the same tokens as an
  // unconstrained run.
  Harness reference(Config{});
  const int prompt_len[] = {0, 8, 4, 4, 8};
  for (int id = 1; id <= 4; ++id) {
    reference.Add(SeqBuilder(id).Prompt(prompt_len[id]).MaxTokens(4).Build());
  }
  ASSERT_TRUE(reference.RunToCompletion());
  for (int id = 1; id <= 4; ++id) {
    EXPECT_EQ(h.result(id).tokens, reference.result(id).tokens) << id;
    EXPECT_EQ(h.result(id).reason, FinishReason::kLength);
  }
  EXPECT_GT(h.runner().computed_tokens(2), 4 + 3);  // recomputed
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, RequesterCanBeItsOwnVictim) {
  Config c;
  c.kv.num_blocks = 4;
  c.kv.enable_prefix_caching = false;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(6).MaxTokens(4).WithPriority(Priority::kInteractive).Build());
  h.Add(SeqBuilder(2).Prompt(8).MaxTokens(4).WithPriority(Priority::kBatch).Build());
  h.Step();
  // Seq 2 needs a third block and is the least urgent running sequence: it yields its own.
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 6, 1, true}));
  EXPECT_THAT(h.last_preempted(), ElementsAre(2));
  EXPECT_EQ(h.kv().BlockTable(2).size(), 0u);
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.result(2).tokens.size(), 4u);
  h.ExpectAllBlocksFree();
}

// A batch-class sequence gives its slot to a more urgent one that finds none free, keeping its
// blocks: it resumes where it stopped, with no recompute, and ends as an unconstrained run does.
TEST(ContinuousSchedulerTest, BatchSequenceYieldsItsSlotAndKeepsItsBlocks) {
  Config c;
  c.sched.max_num_seqs = 2;
  c.kv.enable_prefix_caching = false;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(8).MaxTokens(6).WithPriority(Priority::kBatch).Build());
  h.Add(SeqBuilder(2).Prompt(8).MaxTokens(6).WithPriority(Priority::kBatch).Build());
  h.Step();
  h.Step();
  const size_t blocks_of_2 = h.kv().BlockTable(2).size();
  h.Add(SeqBuilder(3).Prompt(4).MaxTokens(2).WithPriority(Priority::kInteractive).Build());
  // The newest batch sequence (2) steps aside; the interactive one takes its slot at once.
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 9, 1, true}, Item{3, 0, 4, true}));
  EXPECT_EQ(h.scheduler().num_suspensions(), 1);
  EXPECT_EQ(h.scheduler().num_preemptions(), 0);
  EXPECT_EQ(h.scheduler().num_running(), 2);
  EXPECT_EQ(h.scheduler().num_waiting(), 1);
  EXPECT_EQ(h.kv().BlockTable(2).size(), blocks_of_2);
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 10, 1, true}, Item{3, 4, 1, true}));
  EXPECT_TRUE(h.result(3).finished);
  // Its slot free and nothing more urgent waiting, seq 2 goes on decoding at position 9.
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 11, 1, true}, Item{2, 9, 1, true}));
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.runner().computed_tokens(2), 8 + 6 - 1);  // every position once
  Harness reference(Config{});
  reference.Add(SeqBuilder(1).Prompt(8).MaxTokens(6).Build());
  reference.Add(SeqBuilder(2).Prompt(8).MaxTokens(6).Build());
  reference.Add(SeqBuilder(3).Prompt(4).MaxTokens(2).Build());
  ASSERT_TRUE(reference.RunToCompletion());
  for (int id = 1; id <= 3; ++id) EXPECT_EQ(h.result(id).tokens, reference.result(id).tokens) << id;
  h.ExpectAllBlocksFree();
}

// Only the batch class steps aside: a default-priority sequence keeps its slot, and the
// interactive one waits for a slot to free as before.
TEST(ContinuousSchedulerTest, OnlyBatchSequencesAreSuspended) {
  Config c;
  c.sched.max_num_seqs = 1;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(4).MaxTokens(3).WithPriority(Priority::kDefault).Build());
  h.Step();
  h.Add(SeqBuilder(2).Prompt(4).MaxTokens(1).WithPriority(Priority::kInteractive).Build());
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 4, 1, true}));
  EXPECT_EQ(h.scheduler().num_suspensions(), 0);
  ASSERT_TRUE(h.RunToCompletion());
  h.ExpectAllBlocksFree();
}

// When the pool is short, a suspended sequence's blocks go first (it is not in the step), and a
// waiting interactive sequence takes them from a suspended batch one rather than waiting.
TEST(ContinuousSchedulerTest, SuspendedSequencesGiveTheirBlocksFirst) {
  Config c;
  c.sched.max_num_seqs = 1;
  c.kv.num_blocks = 3;
  c.kv.enable_prefix_caching = false;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(8).MaxTokens(4).WithPriority(Priority::kBatch).Build());
  h.Step();  // the batch sequence holds 2 of the 3 blocks (4 tokens each)
  EXPECT_EQ(h.kv().num_free_blocks(), 1);
  h.Add(SeqBuilder(2).Prompt(10).MaxTokens(1).WithPriority(Priority::kInteractive).Build());
  // Seq 1 is suspended, then preempted for its blocks: seq 2 needs all three.
  EXPECT_THAT(h.Step(), ElementsAre(Item{2, 0, 10, true}));
  EXPECT_EQ(h.scheduler().num_suspensions(), 1);
  EXPECT_EQ(h.scheduler().num_preemptions(), 1);
  EXPECT_THAT(h.last_preempted(), ElementsAre(1));
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.result(1).tokens.size(), 4u);
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, AbortOfASuspendedSequenceFreesItsBlocks) {
  Config c;
  c.sched.max_num_seqs = 1;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(8).MaxTokens(4).WithPriority(Priority::kBatch).Build());
  h.Step();
  h.Add(SeqBuilder(2).Prompt(4).MaxTokens(4).WithPriority(Priority::kInteractive).Build());
  h.Step();
  EXPECT_EQ(h.scheduler().num_suspensions(), 1);
  EXPECT_TRUE(h.scheduler().Abort(1));
  EXPECT_EQ(h.scheduler().num_waiting(), 0);
  ASSERT_TRUE(h.RunToCompletion());
  h.ExpectAllBlocksFree();
}

TEST(ContinuousSchedulerTest, RecomputeCatchesUpBeforeSampling) {
  Config c;
  c.kv.num_blocks = 5;
  c.kv.enable_prefix_caching = false;
  c.sched.max_num_batched_tokens = 3;
  Harness h(c);
  h.Add(SeqBuilder(1).Prompt(8).MaxTokens(8).Build());
  h.Add(SeqBuilder(2).Prompt(4).MaxTokens(8).Build());
  bool resumed = false;
  std::vector<Item> resumed_items;
  while (h.scheduler().has_unfinished()) {
    for (const Item& item : h.Step()) {
      if (item.seq_id != 2) continue;
      if (h.scheduler().num_preemptions() > 0 && item.start == 0) resumed = true;
      if (resumed && resumed_items.size() < 4) resumed_items.push_back(item);
    }
  }
  ASSERT_TRUE(resumed);
  // Seq 2 was preempted holding tokens; its recompute comes in budget-sized chunks that do not
  // sample until the last known token.
  ASSERT_GE(resumed_items.size(), 2u);
  EXPECT_FALSE(resumed_items[0].sample);
  EXPECT_EQ(h.result(2).tokens.size(), 8u);
  h.ExpectAllBlocksFree();
}

// ---------------------------------------------------------------------------------------------
// Sliding window (every layer slides): blocks behind a running sequence's window go back to the
// pool. The fake runner reads only each query's window, and its tokens depend on the whole
// context, so they must equal a run that keeps every block.

constexpr int kWindow = 16;  // 4 blocks of 4

Config WindowConfig(int num_blocks) {
  Config c;
  c.kv.sliding_window = kWindow;
  c.kv.num_blocks = num_blocks;
  return c;
}

// The same requests with every block kept: the reference outputs.
Harness RunWithoutWindow(const std::vector<std::unique_ptr<Sequence>>& seqs) {
  Harness reference(Config{});
  for (const auto& seq : seqs) reference.Add(std::make_unique<Sequence>(*seq));
  EXPECT_TRUE(reference.RunToCompletion());
  return reference;
}

TEST(SlidingWindowSchedulerTest, GenerationFourWindowsLongHoldsAtMostTheWindow) {
  std::vector<std::unique_ptr<Sequence>> seqs;
  seqs.push_back(SeqBuilder(1).Prompt(5).MaxTokens(4 * kWindow).IgnoreEos().Build());
  Harness reference = RunWithoutWindow(seqs);
  // Kept whole, the sequence's 68 computed tokens (the last sampled one is never computed) take
  // 17 blocks; the window's bound is 16 / 4 + 2 = 6, and the pool has just that.
  constexpr int kBound = kWindow / 4 + 2;
  EXPECT_EQ(reference.peak_used_blocks(), (5 + 4 * kWindow - 1 + 3) / 4);
  Harness h(WindowConfig(kBound));
  h.Add(std::make_unique<Sequence>(*seqs[0]));
  while (h.scheduler().has_unfinished()) {
    h.Step();
    ASSERT_LE(h.kv().num_used_blocks(), kBound) << "step " << h.steps();
    ASSERT_LT(h.steps(), 1000);
  }
  EXPECT_LE(h.peak_used_blocks(), kBound);
  EXPECT_GE(h.peak_used_blocks(), kWindow / 4);
  EXPECT_EQ(h.scheduler().num_preemptions(), 0);
  EXPECT_EQ(h.result(1).tokens.size(), 4u * kWindow);
  EXPECT_EQ(h.result(1).tokens, reference.result(1).tokens);
  h.ExpectAllBlocksFree();
}

TEST(SlidingWindowSchedulerTest, ChunkedPrefillAcrossTheWindowBoundary) {
  // A 50-token prompt in chunks of 7: each chunk reads back to its first query - 15.
  std::vector<std::unique_ptr<Sequence>> seqs;
  seqs.push_back(SeqBuilder(1).Prompt(50).MaxTokens(20).IgnoreEos().Build());
  Harness reference = RunWithoutWindow(seqs);
  Config c = WindowConfig(64);
  c.sched.max_num_batched_tokens = 7;
  Harness h(c);
  h.Add(std::make_unique<Sequence>(*seqs[0]));
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.result(1).tokens, reference.result(1).tokens);
  EXPECT_LE(h.peak_used_blocks(), h.kv().PeakBlocks(70, 7));
  EXPECT_EQ(h.kv().PeakBlocks(70, 7), (kWindow - 1 + 7 + 3) / 4 + 1);
  h.ExpectAllBlocksFree();
}

TEST(SlidingWindowSchedulerTest, PreemptedSlidingSequenceRecomputesFromTheStart) {
  Config c = WindowConfig(9);
  c.kv.enable_prefix_caching = false;
  std::vector<std::unique_ptr<Sequence>> seqs;
  seqs.push_back(SeqBuilder(1).Prompt(6).MaxTokens(40).WithPriority(Priority::kInteractive)
                     .IgnoreEos().Build());
  seqs.push_back(SeqBuilder(2).Prompt(10).MaxTokens(40).WithPriority(Priority::kBatch)
                     .IgnoreEos().Build());
  Harness reference = RunWithoutWindow(seqs);
  Harness h(c);
  for (const auto& seq : seqs) h.Add(std::make_unique<Sequence>(*seq));
  ASSERT_TRUE(h.RunToCompletion());
  // Two sequences of up to 6 blocks each do not fit in 9: seq 2 yields, and comes back by
  // recompute (its released blocks are gone: it recomputes from position 0).
  EXPECT_GT(h.scheduler().num_preemptions(), 0);
  EXPECT_GT(h.runner().computed_tokens(2), 10 + 39);
  for (int64_t id : {1, 2}) EXPECT_EQ(h.result(id).tokens, reference.result(id).tokens) << id;
  h.ExpectAllBlocksFree();
}

TEST(SlidingWindowSchedulerTest, PrefixCacheServesASlidingSequence) {
  Harness h(WindowConfig(64));
  std::vector<std::unique_ptr<Sequence>> seqs;
  seqs.push_back(SeqBuilder(1).Prompt(42, 5).MaxTokens(6).Build());
  seqs.push_back(SeqBuilder(2).Prompt(42, 5).MaxTokens(6).Build());
  Harness reference = RunWithoutWindow(seqs);
  h.Add(std::make_unique<Sequence>(*seqs[0]));
  ASSERT_TRUE(h.RunToCompletion());
  // Seq 1's blocks, released by its window or by its end, are cached: the whole 40-token chain
  // serves seq 2, which keeps only the blocks its window reaches (40 - 15 = 25: blocks 6 on).
  h.Add(std::make_unique<Sequence>(*seqs[1]));
  EXPECT_THAT(h.Step(), ElementsAre(Item{2, 40, 2, true}));
  const auto table = h.kv().BlockTable(2);
  ASSERT_EQ(table.size(), 11u);
  for (int b = 0; b < 6; ++b) EXPECT_EQ(table[b], KvCacheManager::kReleasedBlock) << b;
  EXPECT_GE(table[6], 0);
  ASSERT_TRUE(h.RunToCompletion());
  EXPECT_EQ(h.result(2).cached_prompt_tokens, 40);
  EXPECT_EQ(h.runner().computed_tokens(2), 2 + 5);
  for (int64_t id : {1, 2}) EXPECT_EQ(h.result(id).tokens, reference.result(id).tokens) << id;
  h.ExpectAllBlocksFree();
}

// ---------------------------------------------------------------------------------------------
// Static batching.

Config StaticConfig(int batch) {
  Config c;
  c.sched.policy = SchedulerPolicy::kStatic;
  c.sched.max_num_seqs = batch;
  c.sched.static_batch_timeout_micros = 1000;
  return c;
}

TEST(StaticSchedulerTest, StartsWhenTheBatchIsFull) {
  FakeClock clock;
  Harness h(StaticConfig(3), &clock);
  h.Add(SeqBuilder(1).Prompt(4).Build());
  h.Add(SeqBuilder(2).Prompt(4).Build());
  EXPECT_TRUE(h.Step().empty());
  clock.AdvanceMicros(500);
  EXPECT_TRUE(h.Step().empty());
  h.Add(SeqBuilder(3).Prompt(4).Build());
  EXPECT_EQ(h.Step().size(), 3u);
}

TEST(StaticSchedulerTest, StartsWhenTheOldestHasWaitedTheTimeout) {
  FakeClock clock;
  Harness h(StaticConfig(3), &clock);
  h.Add(SeqBuilder(1).Prompt(4).Build());
  clock.AdvanceMicros(600);
  h.Add(SeqBuilder(2).Prompt(4).Build());
  clock.AdvanceMicros(399);
  EXPECT_TRUE(h.Step().empty());
  EXPECT_EQ(h.scheduler().num_waiting(), 2);
  clock.AdvanceMicros(1);
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 0, 4, true}, Item{2, 0, 4, true}));
}

TEST(StaticSchedulerTest, NobodyJoinsUntilTheWholeBatchHasFinished) {
  FakeClock clock;
  Harness h(StaticConfig(2), &clock);
  h.Add(SeqBuilder(1).Prompt(4).MaxTokens(2).Build());
  h.Add(SeqBuilder(2).Prompt(4).MaxTokens(6).Build());
  EXPECT_EQ(h.Step().size(), 2u);
  h.Add(SeqBuilder(3).Prompt(4).MaxTokens(2).Build());
  clock.AdvanceMicros(1'000'000);
  while (!h.result(2).finished) {
    for (const Item& item : h.Step()) EXPECT_NE(item.seq_id, 3);
  }
  EXPECT_TRUE(h.result(1).finished);
  EXPECT_LT(h.result(1).finish_step, h.result(2).finish_step);  // a seat was free meanwhile
  EXPECT_THAT(h.Step(), ElementsAre(Item{3, 0, 4, true}));
  ASSERT_TRUE(h.RunToCompletion());
  h.ExpectAllBlocksFree();
}

TEST(StaticSchedulerTest, ChunksTheBatchPrefillsWithinTheBudget) {
  FakeClock clock;
  Config c = StaticConfig(2);
  c.sched.max_num_batched_tokens = 16;
  Harness h(c, &clock);
  h.Add(SeqBuilder(1).Prompt(12).MaxTokens(2).Build());
  h.Add(SeqBuilder(2).Prompt(12).MaxTokens(2).Build());
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 0, 12, true}, Item{2, 0, 4, false}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{1, 12, 1, true}, Item{2, 4, 8, true}));
  EXPECT_THAT(h.Step(), ElementsAre(Item{2, 12, 1, true}));
  EXPECT_FALSE(h.scheduler().has_unfinished());
}

// ---------------------------------------------------------------------------------------------
// Random workloads: budgets hold every step, every request finishes within a bound, outputs
// equal an unconstrained run's, and every block is free at the end.

struct Arrival {
  int step;
  int64_t id;
  int prompt_len;
  int prompt_variant;  // shared prefixes when equal
  int max_tokens;
  Priority priority;
  uint64_t salt;
  int eos_at;  // -1: never
};

std::vector<Arrival> RandomWorkload(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<Arrival> workload;
  int step = 0;
  for (int64_t id = 1; id <= n; ++id) {
    step += uniform(0, 2);
    Arrival a;
    a.step = step;
    a.id = id;
    a.prompt_len = uniform(1, 100);
    a.prompt_variant = uniform(0, 3) == 0 ? uniform(0, 2) : static_cast<int>(1000 + id);
    a.max_tokens = uniform(1, 40);
    a.priority = static_cast<Priority>(uniform(0, 2));
    a.salt = static_cast<uint64_t>(uniform(0, 1));
    a.eos_at = uniform(0, 4) == 0 ? a.prompt_len + uniform(1, 40) : -1;
    workload.push_back(a);
  }
  return workload;
}

// Runs `workload`, adding each request at its step; returns the harness for inspection.
std::unique_ptr<Harness> RunWorkload(const Config& config, const std::vector<Arrival>& workload,
                                     FakeClock* clock) {
  auto h = std::make_unique<Harness>(config, clock);
  size_t next = 0;
  for (int step = 0; step < 20'000; ++step) {
    while (next < workload.size() && workload[next].step <= step) {
      const Arrival& a = workload[next++];
      h->Add(SeqBuilder(a.id)
                 .Prompt(a.prompt_len, a.prompt_variant)
                 .MaxTokens(a.max_tokens)
                 .WithPriority(a.priority)
                 .Salt(a.salt)
                 .Build());
      if (a.eos_at >= 0) h->runner().EosAt(a.id, a.eos_at);
    }
    if (next == workload.size() && !h->scheduler().has_unfinished()) break;
    h->Step();
    clock->AdvanceMicros(100);
  }
  return h;
}

struct RandomCase {
  const char* name;
  SchedulerPolicy policy;
  bool chunked;
  int num_blocks;
  bool prefix_caching;
  int sliding_window = 0;
};

void PrintTo(const RandomCase& c, std::ostream* os) { *os << c.name; }

class RandomWorkloadTest : public ::testing::TestWithParam<RandomCase> {};

TEST_P(RandomWorkloadTest, BudgetsHoldAndOutputsMatchAnUnconstrainedRun) {
  const RandomCase& rc = GetParam();
  const std::vector<Arrival> workload = RandomWorkload(/*seed=*/20240601, /*n=*/120);

  Config reference_config;
  reference_config.sched.max_num_batched_tokens = 1 << 16;
  reference_config.sched.max_num_seqs = 1024;
  reference_config.kv.num_blocks = 1 << 14;
  FakeClock reference_clock;
  auto reference = RunWorkload(reference_config, workload, &reference_clock);

  Config c;
  c.sched.policy = rc.policy;
  c.sched.enable_chunked_prefill = rc.chunked;
  c.sched.max_model_len = 160;
  c.sched.max_num_batched_tokens = rc.chunked ? 48 : 160;
  c.sched.max_num_seqs = 6;
  c.sched.static_batch_timeout_micros = 500;
  c.kv.num_blocks = rc.num_blocks;
  c.kv.enable_prefix_caching = rc.prefix_caching;
  c.kv.sliding_window = rc.sliding_window;
  FakeClock clock;
  auto h = RunWorkload(c, workload, &clock);

  ASSERT_FALSE(h->scheduler().has_unfinished()) << "did not drain";
  for (const Arrival& a : workload) {
    const Result& got = h->result(a.id);
    const Result& want = reference->result(a.id);
    ASSERT_TRUE(got.finished) << a.id;
    EXPECT_EQ(got.tokens, want.tokens) << "seq " << a.id;
    EXPECT_EQ(got.reason, want.reason) << "seq " << a.id;
  }
  EXPECT_LE(h->max_latency_steps(), 1500);
  h->ExpectAllBlocksFree();
  std::printf("[%s] steps %lld, preemptions %lld, worst latency %lld steps, prefix hits %lld\n",
              rc.name, static_cast<long long>(h->steps()),
              static_cast<long long>(h->scheduler().num_preemptions()),
              static_cast<long long>(h->max_latency_steps()),
              static_cast<long long>(h->kv().prefix_cache_hits()));
}

INSTANTIATE_TEST_SUITE_P(
    Policies, RandomWorkloadTest,
    ::testing::Values(
        RandomCase{"continuous", SchedulerPolicy::kContinuous, true, 512, true},
        RandomCase{"continuous_tiny_pool", SchedulerPolicy::kContinuous, true, 48, true},
        RandomCase{"continuous_no_chunking_tiny_pool", SchedulerPolicy::kContinuous, false, 48,
                   true},
        RandomCase{"continuous_no_prefix_cache", SchedulerPolicy::kContinuous, true, 48, false},
        RandomCase{"static", SchedulerPolicy::kStatic, true, 512, true},
        RandomCase{"static_tiny_pool", SchedulerPolicy::kStatic, true, 48, true},
        RandomCase{"continuous_window", SchedulerPolicy::kContinuous, true, 512, true, 10},
        RandomCase{"continuous_window_tiny_pool", SchedulerPolicy::kContinuous, true, 24, true,
                   10},
        RandomCase{"continuous_no_chunking_window", SchedulerPolicy::kContinuous, false, 48,
                   true, 10},
        RandomCase{"continuous_window_no_prefix_cache", SchedulerPolicy::kContinuous, true, 24,
                   false, 10},
        RandomCase{"static_window_tiny_pool", SchedulerPolicy::kStatic, true, 24, true, 10}),
    [](const ::testing::TestParamInfo<RandomCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace carpool::worker
