// Tensor-parallel slicing: PlanShard, and LoadWeights / SyntheticWeights giving each rank exactly
// its slices of the whole model.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/weights/safetensors.h"
#include "worker/weights/shard_layout.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

namespace fs = std::filesystem;
using ::carpool::testing::CheckpointSpec;
using ::carpool::testing::CheckpointTensors;
using ::testing::HasSubstr;

ModelConfig SmallConfig(int heads, int kv_heads) {
  ModelConfig c = SyntheticConfig("tiny").value();
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = 64 / heads;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// Rows or columns [begin, end) of a row-major tensor of `shape`.
template <typename T>
std::vector<T> Slice(const std::vector<T>& whole, const std::vector<int64_t>& shape, int dim,
                     int64_t begin, int64_t end) {
  if (dim < 0) return whole;
  const int64_t cols = shape.size() == 2 ? shape[1] : 1;
  std::vector<T> out;
  if (dim == 0) {
    out.assign(whole.begin() + begin * cols, whole.begin() + end * cols);
    return out;
  }
  for (int64_t r = 0; r < shape[0]; ++r) {
    out.insert(out.end(), whole.begin() + r * cols + begin, whole.begin() + r * cols + end);
  }
  return out;
}

std::vector<float> Values(const Tensor& t) { return {t.data(), t.data() + t.numel()}; }
std::vector<uint16_t> Bits(const Tensor& t) { return {t.bf16_data(), t.bf16_data() + t.numel()}; }

bool InsideMapping(const LlamaWeights& w, const void* p) {
  const auto* byte = static_cast<const uint8_t*>(p);
  for (const auto& file : w.files) {
    if (byte >= file->data() && byte < file->data() + file->size()) return true;
  }
  return false;
}

TEST(PlanShardTest, SplitsHeadsIntermediateAndVocabulary) {
  const ModelConfig c = SyntheticConfig("tiny").value();  // 4 heads, 2 kv heads, I 176, V 258
  auto r1 = PlanShard(c, {1, 2});
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->heads_begin, 2);
  EXPECT_EQ(r1->num_heads, 2);
  EXPECT_EQ(r1->kv_heads_begin, 1);
  EXPECT_EQ(r1->num_kv_heads, 1);
  EXPECT_EQ(r1->intermediate_begin, 88);
  EXPECT_EQ(r1->intermediate, 88);
  EXPECT_EQ(r1->vocab_begin, 129);
  EXPECT_EQ(r1->vocab, 129);

  auto whole = PlanShard(c, {});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->num_heads, 4);
  EXPECT_EQ(whole->num_kv_heads, 2);
  EXPECT_EQ(whole->vocab, 258);
}

TEST(PlanShardTest, FewerKvHeadsThanRanksAreReplicatedToTheRanksThatReadThem) {
  const ModelConfig c = SmallConfig(8, 2);  // query heads 0-3 read kv head 0, 4-7 kv head 1
  for (int r = 0; r < 4; ++r) {
    auto s = PlanShard(c, {r, 4});
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->heads_begin, 2 * r);
    EXPECT_EQ(s->num_kv_heads, 1);
    EXPECT_EQ(s->kv_heads_begin, r / 2) << r;
  }
  auto one_kv = PlanShard(SmallConfig(4, 1), {1, 2});
  ASSERT_TRUE(one_kv.ok());
  EXPECT_EQ(one_kv->kv_heads_begin, 0);
}

TEST(PlanShardTest, AModelThatDoesNotDivideIsRefusedNamingTheField) {
  const ModelConfig tiny = SyntheticConfig("tiny").value();
  EXPECT_THAT(PlanShard(tiny, {0, 3}).status().message(),
              HasSubstr("num_attention_heads 4 is not divisible by 3"));
  EXPECT_THAT(PlanShard(SmallConfig(8, 6), {0, 4}).status().message(),
              HasSubstr("num_key_value_heads 6 is not divisible by 4"));
  EXPECT_TRUE(PlanShard(SmallConfig(8, 2), {0, 8}).ok());  // kv head i on ranks 4i..4i+3
  // 3 kv heads cannot be spread evenly over 8 ranks.
  EXPECT_THAT(PlanShard(SmallConfig(24, 3), {0, 8}).status().message(),
              HasSubstr("num_key_value_heads 3 is smaller than 8 and does not divide it"));
  ModelConfig inter = SmallConfig(4, 2);
  inter.intermediate_size = 90;
  EXPECT_THAT(PlanShard(inter, {0, 4}).status().message(),
              HasSubstr("intermediate_size 90 is not divisible by 4"));
  ModelConfig vocab = SmallConfig(4, 2);
  vocab.vocab_size = 65;
  EXPECT_THAT(PlanShard(vocab, {0, 2}).status().message(), HasSubstr("vocab_size 65"));
  EXPECT_FALSE(PlanShard(tiny, {2, 2}).ok());

  auto load = LoadWeights("synthetic:tiny", {0, 3});
  EXPECT_EQ(load.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(load.status().message(), HasSubstr("synthetic:tiny"));
  EXPECT_THAT(load.status().message(), HasSubstr("--tp 3"));
}

// Every rank's tensors are exactly the slices of the whole model the rank's slots name.
void ExpectSlicesOf(LlamaWeights* part, const std::map<std::string, std::vector<float>>& whole) {
  for (const TensorSlot& slot : TensorSlots(part)) {
    SCOPED_TRACE(slot.name);
    auto it = whole.find(slot.name);
    ASSERT_NE(it, whole.end());
    EXPECT_EQ(slot.tensor->shape(), slot.LocalShape());
    EXPECT_EQ(Values(*slot.tensor),
              Slice(it->second, slot.shape, slot.split_dim, slot.split_begin, slot.split_end));
  }
}

TEST(ShardedSyntheticWeightsTest, EveryRankDrawsItsSlicesOfTheSameWholeModel) {
  for (const ModelConfig& config : {SmallConfig(4, 2), SmallConfig(4, 1)}) {
    auto whole = SyntheticWeights(config, 42);
    std::map<std::string, std::vector<float>> values;
    for (const TensorSlot& slot : TensorSlots(whole.get())) values[slot.name] = Values(*slot.tensor);
    for (int tp : {2, 4}) {
      for (int r = 0; r < tp; ++r) {
        SCOPED_TRACE(::testing::Message() << "rank " << r << " of " << tp);
        auto part = SyntheticWeights(config, 42, {r, tp});
        EXPECT_EQ(part->shard.num_heads, config.num_heads / tp);
        ExpectSlicesOf(part.get(), values);
      }
    }
  }
}

class ShardedCheckpointTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("carpool_shard_" + std::to_string(static_cast<int>(GetParam())));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(ShardedCheckpointTest, EachRankReadsOnlyItsSlices) {
  CheckpointSpec spec;
  spec.config = SmallConfig(4, 2);
  spec.config.attention_bias = true;  // biases are split with their heads
  spec.dtype = GetParam();
  spec.num_shards = 2;
  auto written = carpool::testing::WriteCheckpoint(dir_.string(), spec);
  ASSERT_TRUE(written.ok()) << written.status();
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, tensor] : *written) values[name] = tensor.values;

  for (int tp : {2, 4}) {
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r << " of " << tp);
      auto part = LoadWeights(dir_.string(), {r, tp});
      ASSERT_TRUE(part.ok()) << part.status();
      ExpectSlicesOf(part->get(), values);
      // Row slices of F32 are read in place; nothing of the whole tensor is copied.
      const LayerWeights& layer = (*part)->layers[0];
      EXPECT_EQ(InsideMapping(**part, layer.q_proj.data()), GetParam() == DType::kF32);
      EXPECT_EQ(InsideMapping(**part, layer.gate_proj.data()), GetParam() == DType::kF32);
      EXPECT_FALSE(InsideMapping(**part, layer.o_proj.data()));  // columns: an owned copy
      EXPECT_EQ(layer.o_proj.numel(), 64 * 64 / tp);
      EXPECT_EQ(layer.down_proj.numel(), 64 * 96 / tp);
    }
  }
  auto bad = LoadWeights(dir_.string(), {0, 3});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr(dir_.string()));
  EXPECT_THAT(bad.status().message(), HasSubstr("num_attention_heads 4 is not divisible by 3"));
}

// With keep_bf16, a rank's bf16 tensors are the slices of the whole model's bf16 tensors, bit
// for bit: row slices (q/k/v, gate/up, biases, vocabulary rows) views of the mapping, column
// slices (o_proj, down_proj) owned copies of the columns; norms fp32 on every rank.
TEST_P(ShardedCheckpointTest, KeptBf16SlicesAreSlicesOfTheWhole) {
  CheckpointSpec spec;
  spec.config = SmallConfig(4, 2);
  spec.config.attention_bias = true;
  spec.dtype = GetParam();
  auto written = carpool::testing::WriteCheckpoint(dir_.string(), spec);
  ASSERT_TRUE(written.ok()) << written.status();
  const LoadOptions keep{.keep_bf16 = true};
  const bool bf16 = GetParam() == DType::kBF16;
  auto whole = LoadWeights(dir_.string(), {}, nullptr, keep);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::map<std::string, std::vector<uint16_t>> whole_bits;
  std::map<std::string, std::vector<float>> whole_values;
  for (const TensorSlot& slot : TensorSlots(whole->get())) {
    if (slot.tensor->type() == TensorType::kBF16) whole_bits[slot.name] = Bits(*slot.tensor);
    else whole_values[slot.name] = Values(*slot.tensor);
  }
  for (int tp : {2, 4}) {
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r << " of " << tp);
      auto part = LoadWeights(dir_.string(), {r, tp}, nullptr, keep);
      ASSERT_TRUE(part.ok()) << part.status();
      for (const TensorSlot& slot : TensorSlots(part->get())) {
        SCOPED_TRACE(slot.name);
        const Tensor& t = *slot.tensor;
        EXPECT_EQ(t.shape(), slot.LocalShape());
        ASSERT_EQ(t.type(), bf16 && !slot.norm ? TensorType::kBF16 : TensorType::kF32);
        if (t.type() == TensorType::kF32) {
          EXPECT_EQ(Values(t), Slice(whole_values.at(slot.name), slot.shape, slot.split_dim,
                                     slot.split_begin, slot.split_end));
          continue;
        }
        EXPECT_EQ(Bits(t), Slice(whole_bits.at(slot.name), slot.shape, slot.split_dim,
                                 slot.split_begin, slot.split_end));
        EXPECT_EQ(InsideMapping(**part, t.raw_data()), slot.split_dim <= 0);
      }
      const LayerWeights& layer = (*part)->layers[1];
      if (bf16) {
        EXPECT_EQ(layer.o_proj.nbytes(), 2 * 64 * 64 / tp);
        EXPECT_TRUE(InsideMapping(**part, layer.k_bias.raw_data()));
      }
      // Row slices are views and column slices copies, for either dtype.
      EXPECT_TRUE(InsideMapping(**part, layer.up_proj.raw_data()));
      EXPECT_FALSE(InsideMapping(**part, layer.down_proj.raw_data()));
    }
  }
}

TEST(ShardedSyntheticWeightsTest, KeptBf16RanksDrawSlicesOfTheWholeBf16Model) {
  const ModelConfig config = SmallConfig(4, 2);
  const LoadOptions keep{.keep_bf16 = true};
  auto whole = SyntheticWeights(config, 42, {}, nullptr, keep);
  std::map<std::string, std::vector<uint16_t>> bits;
  for (const TensorSlot& slot : TensorSlots(whole.get())) {
    if (!slot.norm) bits[slot.name] = Bits(*slot.tensor);
  }
  for (int r = 0; r < 2; ++r) {
    auto part = SyntheticWeights(config, 42, {r, 2}, nullptr, keep);
    for (const TensorSlot& slot : TensorSlots(part.get())) {
      SCOPED_TRACE(slot.name);
      if (slot.norm) {
        EXPECT_EQ(slot.tensor->type(), TensorType::kF32);
        continue;
      }
      EXPECT_EQ(Bits(*slot.tensor), Slice(bits.at(slot.name), slot.shape, slot.split_dim,
                                          slot.split_begin, slot.split_end));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, ShardedCheckpointTest,
                         ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace carpool::worker
