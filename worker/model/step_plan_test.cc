// StepPlan's encoding, what a tensor-parallel leader broadcasts: both kinds of step survive a
// round trip, and bytes that are not a plan are refused with INVALID_ARGUMENT, never a crash.
#include "worker/model/step_plan.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::worker {
namespace {

using ::testing::HasSubstr;

StepPlan::Seq Seq(int64_t id, int32_t start, int32_t num, bool sample,
                  std::vector<int32_t> blocks) {
  StepPlan::Seq s;
  s.seq_id = id;
  s.start_position = start;
  s.num_tokens = num;
  s.sample = sample;
  s.block_table = std::move(blocks);
  return s;
}

// A prefill chunk that does not sample and two decodes.
StepPlan GenerateStep() {
  StepPlan p;
  p.seqs = {Seq(7, 0, 3, false, {4}), Seq(9, 40, 1, true, {1, 2, 8}), Seq(12, 5, 1, true, {0})};
  p.token_ids = {10, 11, 12, 99, 5};
  return p;
}

// Three whole inputs.
StepPlan EmbedStep() {
  StepPlan p;
  p.kind = StepPlan::Kind::kEmbed;
  p.seqs = {Seq(0, 0, 2, false, {}), Seq(1, 0, 1, false, {}), Seq(2, 0, 3, false, {})};
  p.token_ids = {1, 2, 3, 4, 5, 6};
  return p;
}

void ExpectEqual(const StepPlan& a, const StepPlan& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.token_ids, b.token_ids);
  ASSERT_EQ(a.seqs.size(), b.seqs.size());
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    EXPECT_EQ(a.seqs[i].seq_id, b.seqs[i].seq_id) << i;
    EXPECT_EQ(a.seqs[i].start_position, b.seqs[i].start_position) << i;
    EXPECT_EQ(a.seqs[i].num_tokens, b.seqs[i].num_tokens) << i;
    EXPECT_EQ(a.seqs[i].sample, b.seqs[i].sample) << i;
    EXPECT_EQ(a.seqs[i].block_table, b.seqs[i].block_table) << i;
  }
}

TEST(StepPlanTest, BothKindsRoundTrip) {
  for (const StepPlan& plan : {GenerateStep(), EmbedStep(), StepPlan{}}) {
    absl::StatusOr<StepPlan> decoded = DecodeStepPlan(EncodeStepPlan(plan));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectEqual(*decoded, plan);
  }
  EXPECT_EQ(GenerateStep().num_tokens(), 5);
  EXPECT_EQ(EmbedStep().num_tokens(), 6);
}

TEST(StepPlanTest, EveryTruncationAndExtensionIsRefused) {
  for (const StepPlan& plan : {GenerateStep(), EmbedStep()}) {
    const std::string bytes = EncodeStepPlan(plan);
    for (size_t n = 0; n < bytes.size(); ++n) {
      EXPECT_EQ(DecodeStepPlan(bytes.substr(0, n)).status().code(),
                absl::StatusCode::kInvalidArgument)
          << n << " of " << bytes.size() << " bytes";
    }
    EXPECT_EQ(DecodeStepPlan(bytes + "x").status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(StepPlanTest, InconsistentPlansAreRefusedNamingTheProblem) {
  std::string bytes = EncodeStepPlan(GenerateStep());
  bytes[0] = 9;  // the kind
  EXPECT_THAT(DecodeStepPlan(bytes).status().message(), HasSubstr("unknown kind 9"));

  StepPlan embed_with_blocks = EmbedStep();
  embed_with_blocks.seqs[1].block_table = {3};
  absl::Status s = DecodeStepPlan(EncodeStepPlan(embed_with_blocks)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("embed sequence 1"));

  StepPlan embed_midway = EmbedStep();
  embed_midway.seqs[2].start_position = 4;
  EXPECT_THAT(DecodeStepPlan(EncodeStepPlan(embed_midway)).status().message(),
              HasSubstr("embed sequence 2"));

  StepPlan empty_seq = GenerateStep();
  empty_seq.seqs[0].num_tokens = 0;
  empty_seq.token_ids.erase(empty_seq.token_ids.begin(), empty_seq.token_ids.begin() + 3);
  EXPECT_THAT(DecodeStepPlan(EncodeStepPlan(empty_seq)).status().message(),
              HasSubstr("invalid position range"));

  StepPlan short_tokens = GenerateStep();
  short_tokens.token_ids.pop_back();
  EXPECT_THAT(DecodeStepPlan(EncodeStepPlan(short_tokens)).status().message(),
              HasSubstr("token count"));
}

}  // namespace
}  // namespace carpool::worker
