#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kernel_test_util.h"
#include "kernels/reference/reference_kernels.h"

namespace carpool::kernels::cpu {
namespace {

using test_util::AllNear;
using test_util::BitEqual;
using test_util::RandomFloats;
using test_util::TestPool;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

struct SeqSpec {
  int query_len;
  int context_len;
};

struct CacheShape {
  int block_size;
  int num_heads;
  int num_kv_heads;
  int head_dim;
};

// A batch of sequences over one paged cache. Physical blocks are handed out in a shuffled order
// so block tables are not contiguous; every cache slot no sequence owns holds NaN, so reading
// past a context (or a stale slot) poisons the output. With a sliding window, the table entries
// of blocks wholly before a sequence's first query's window point at a NaN block afterwards (as
// if the KV cache had freed them), so a kernel that reads outside the window fails.
//
// The same keys and values are also written by WriteKvCacheBf16 into a bf16 cache (NaN where the
// fp32 cache has NaN), and that cache's values widened into a third, fp32 cache: the bf16
// kernels must give exactly what the fp32 kernels give on the widened cache.
class AttentionBatch {
 public:
  // The cache a run reads.
  enum class Cache { kFp32, kBf16, kWidened };

  AttentionBatch(const CacheShape& shape, const std::vector<SeqSpec>& specs, uint32_t seed,
                 int sliding_window = 0, float logit_softcap = 0.0f)
      : shape_(shape) {
    params_.cache.block_size = shape.block_size;
    params_.cache.num_kv_heads = shape.num_kv_heads;
    params_.cache.head_dim = shape.head_dim;
    params_.num_heads = shape.num_heads;
    params_.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    params_.sliding_window = sliding_window;
    params_.logit_softcap = logit_softcap;
    AllocateBlocks(specs, seed);
    FillCache(seed + 1);
    if (sliding_window > 0) DropBlocksBeforeWindows();
    q_ = RandomFloats(num_tokens_ * RowWidth(shape.num_heads), seed + 2);
  }

  // Table entries pointed at the NaN block (blocks out of every query's window).
  int dropped_blocks() const { return dropped_blocks_; }

  const AttentionParams& params() const { return params_; }
  const float* q() const { return q_.data(); }
  const float* key_cache() const { return key_cache_.data(); }
  const float* value_cache() const { return value_cache_.data(); }
  int64_t out_size() const { return num_tokens_ * RowWidth(shape_.num_heads); }
  int64_t RowWidth(int heads) const { return static_cast<int64_t>(heads) * shape_.head_dim; }

  const std::vector<float>& widened_key_cache() const { return widened_key_cache_; }

  // The whole batch through PagedAttention (or PagedAttentionDecode), or its bf16 twin.
  std::vector<float> Run(Cache cache = Cache::kFp32, bool decode = false,
                         ThreadPool* pool = TestPool()) const {
    std::vector<float> out(out_size(), -1.0f);
    Attend(cache, decode, q(), params_, out.data(), pool);
    return out;
  }
  // The float64 reference on the fp32 cache, or on the widened one for kBf16 and kWidened.
  std::vector<double> Reference(Cache cache = Cache::kFp32) const {
    if (cache == Cache::kFp32) {
      return reference::PagedAttention(q(), key_cache(), value_cache(), params_);
    }
    return reference::PagedAttention(q(), widened_key_cache_.data(), widened_value_cache_.data(),
                                     params_);
  }

  // Runs sequence s on its own (a batch of one, its queries starting at row 0).
  std::vector<float> RunAlone(int s, Cache cache = Cache::kFp32) const {
    AttentionSeq seq = seqs_[s];
    AttentionParams alone = params_;
    alone.num_seqs = 1;
    alone.seqs = &seq;
    const float* q_alone = q() + seq.query_start * RowWidth(shape_.num_heads);
    seq.query_start = 0;
    std::vector<float> out(seq.query_len * RowWidth(shape_.num_heads));
    Attend(cache, /*decode=*/false, q_alone, alone, out.data(), TestPool());
    return out;
  }

 private:
  void AllocateBlocks(const std::vector<SeqSpec>& specs, uint32_t seed) {
    const int bs = shape_.block_size;
    int needed = 0;
    for (const SeqSpec& s : specs) needed += (s.context_len + bs - 1) / bs;
    params_.cache.num_blocks = needed + 3;  // spare blocks stay NaN
    std::vector<int32_t> physical(params_.cache.num_blocks);
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), std::mt19937(seed));
    int next = 0;
    tables_.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      for (int b = 0; b < (specs[i].context_len + bs - 1) / bs; ++b) {
        tables_[i].push_back(physical[next++]);
      }
      seqs_.push_back(AttentionSeq{static_cast<int>(num_tokens_), specs[i].query_len,
                                   specs[i].context_len, tables_[i].data()});
      num_tokens_ += specs[i].query_len;
    }
    params_.num_seqs = static_cast<int>(seqs_.size());
    params_.seqs = seqs_.data();
    nan_block_ = physical[next];  // spare: never written
  }

  void Attend(Cache cache, bool decode, const float* q, const AttentionParams& params, float* out,
              ThreadPool* pool) const {
    switch (cache) {
      case Cache::kFp32:
        (decode ? PagedAttentionDecode : PagedAttention)(q, key_cache(), value_cache(), params,
                                                         out, pool);
        return;
      case Cache::kWidened:
        (decode ? PagedAttentionDecode : PagedAttention)(q, widened_key_cache_.data(),
                                                         widened_value_cache_.data(), params,
                                                         out, pool);
        return;
      case Cache::kBf16:
        (decode ? PagedAttentionDecodeBf16 : PagedAttentionBf16)(
            q, key_cache_bf16_.data(), value_cache_bf16_.data(), params, out, pool);
        return;
    }
  }

  void DropBlocksBeforeWindows() {
    const int bs = shape_.block_size;
    for (size_t i = 0; i < seqs_.size(); ++i) {
      const AttentionSeq& seq = seqs_[i];
      const int first_key =
          std::max(0, seq.context_len - seq.query_len - params_.sliding_window + 1);
      for (int b = 0; b < first_key / bs; ++b) {
        tables_[i][b] = nan_block_;
        ++dropped_blocks_;
      }
    }
  }

  // Writes random keys and values for every context position through WriteKvCache and
  // WriteKvCacheBf16, then widens the bf16 cache.
  void FillCache(uint32_t seed) {
    const KvCacheLayout& c = params_.cache;
    const int64_t pool = int64_t{c.num_blocks} * c.block_size * RowWidth(c.num_kv_heads);
    key_cache_.assign(pool, std::numeric_limits<float>::quiet_NaN());
    value_cache_.assign(pool, std::numeric_limits<float>::quiet_NaN());
    const uint16_t nan_bf16 = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
    key_cache_bf16_.assign(pool, nan_bf16);
    value_cache_bf16_.assign(pool, nan_bf16);
    for (const AttentionSeq& seq : seqs_) {
      std::vector<int64_t> slots(seq.context_len);
      for (int p = 0; p < seq.context_len; ++p) {
        slots[p] = int64_t{seq.block_table[p / c.block_size]} * c.block_size + p % c.block_size;
      }
      const std::vector<float> k = RandomFloats(seq.context_len * RowWidth(c.num_kv_heads), seed++);
      const std::vector<float> v = RandomFloats(seq.context_len * RowWidth(c.num_kv_heads), seed++);
      WriteKvCache(k.data(), v.data(), slots.data(), seq.context_len, c, key_cache_.data(),
                   value_cache_.data());
      WriteKvCacheBf16(k.data(), v.data(), slots.data(), seq.context_len, c,
                       key_cache_bf16_.data(), value_cache_bf16_.data());
    }
    widened_key_cache_.resize(pool);
    widened_value_cache_.resize(pool);
    Bf16ToFloat(key_cache_bf16_.data(), pool, widened_key_cache_.data());
    Bf16ToFloat(value_cache_bf16_.data(), pool, widened_value_cache_.data());
  }

  CacheShape shape_;
  AttentionParams params_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<AttentionSeq> seqs_;
  int64_t num_tokens_ = 0;
  int nan_block_ = 0;
  int dropped_blocks_ = 0;
  std::vector<float> q_;
  std::vector<float> key_cache_;
  std::vector<float> value_cache_;
  std::vector<uint16_t> key_cache_bf16_;
  std::vector<uint16_t> value_cache_bf16_;
  std::vector<float> widened_key_cache_;
  std::vector<float> widened_value_cache_;
};

using Cache = AttentionBatch::Cache;

// The bf16 kernels against the fp32 ones on the widened cache (bit for bit) and the reference,
// both entry points (decode only where every query_len is 1), alone and batched, and over
// pool sizes.
void ExpectBf16MatchesFp32OnWidenedCache(const AttentionBatch& batch, bool decode) {
  const std::vector<float> bf16 = batch.Run(Cache::kBf16, decode);
  const std::vector<float> widened = batch.Run(Cache::kWidened, decode);
  EXPECT_TRUE(BitEqual(bf16.data(), widened.data(), bf16.size()));
  EXPECT_TRUE(AllNear(bf16, batch.Reference(Cache::kBf16), kAtol, kRtol));
  const std::vector<float> inline_run = batch.Run(Cache::kBf16, decode, /*pool=*/nullptr);
  EXPECT_TRUE(BitEqual(bf16.data(), inline_run.data(), bf16.size()));
  if (decode) {
    const std::vector<float> general = batch.Run(Cache::kBf16);
    EXPECT_TRUE(BitEqual(bf16.data(), general.data(), bf16.size()));
    return;
  }
  const int64_t width = batch.RowWidth(batch.params().num_heads);
  for (int s = 0; s < batch.params().num_seqs; ++s) {
    const AttentionSeq& seq = batch.params().seqs[s];
    const std::vector<float> alone = batch.RunAlone(s, Cache::kBf16);
    EXPECT_TRUE(BitEqual(alone.data(), bf16.data() + seq.query_start * width, alone.size()))
        << "seq " << s;
  }
}

// Decodes over context lengths around block boundaries.
std::vector<SeqSpec> DecodeSpecs() {
  return {{1, 1}, {1, 15}, {1, 16}, {1, 17}, {1, 33}, {1, 100}};
}

// Fresh prefills, chunked prefills continuing after cached tokens, and decodes, interleaved.
std::vector<SeqSpec> MixedSpecs() {
  return {{17, 17}, {1, 33}, {16, 100}, {1, 1}, {7, 33}, {15, 15}, {1, 16}, {3, 16}, {1, 100}};
}

// (block_size, query heads per kv head, head_dim)
class PagedAttentionTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {
 protected:
  CacheShape Shape() const {
    const auto [block_size, group, head_dim] = GetParam();
    return CacheShape{block_size, 2 * group, 2, head_dim};
  }
};

TEST_P(PagedAttentionTest, MixedBatchMatchesReference) {
  const AttentionBatch batch(Shape(), MixedSpecs(), 100);
  EXPECT_TRUE(AllNear(batch.Run(), batch.Reference(), kAtol, kRtol));
}

TEST_P(PagedAttentionTest, DecodeMatchesReferenceAndTheGeneralKernel) {
  const AttentionBatch batch(Shape(), DecodeSpecs(), 200);
  std::vector<float> decode(batch.out_size(), -1.0f);
  PagedAttentionDecode(batch.q(), batch.key_cache(), batch.value_cache(), batch.params(),
                       decode.data(), TestPool());
  EXPECT_TRUE(AllNear(decode, batch.Reference(), kAtol, kRtol));
  // A sequence may be decoded by either entry point depending on its batch; bits must agree.
  const std::vector<float> general = batch.Run();
  EXPECT_TRUE(BitEqual(decode.data(), general.data(), general.size()));
}

TEST_P(PagedAttentionTest, SequenceAloneEqualsSequenceInBatch) {
  const AttentionBatch batch(Shape(), MixedSpecs(), 300);
  const std::vector<float> together = batch.Run();
  const int64_t width = batch.RowWidth(batch.params().num_heads);
  for (int s = 0; s < batch.params().num_seqs; ++s) {
    const AttentionSeq& seq = batch.params().seqs[s];
    const std::vector<float> alone = batch.RunAlone(s);
    EXPECT_TRUE(BitEqual(alone.data(), together.data() + seq.query_start * width, alone.size()))
        << "seq " << s;
  }
}

TEST_P(PagedAttentionTest, Bf16CacheMixedBatchEqualsFp32OnWidenedCache) {
  ExpectBf16MatchesFp32OnWidenedCache(AttentionBatch(Shape(), MixedSpecs(), 250), false);
}

TEST_P(PagedAttentionTest, Bf16CacheDecodeEqualsFp32OnWidenedCache) {
  ExpectBf16MatchesFp32OnWidenedCache(AttentionBatch(Shape(), DecodeSpecs(), 260), true);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest,
                         ::testing::Combine(::testing::Values(1, 7, 16),   // block_size
                                            ::testing::Values(1, 2, 3, 4),  // GQA group
                                            // 120: tiles of 8, 4, 2 and 1 vectors
                                            ::testing::Values(64, 12, 13, 120)));  // head_dim

// A prefill split into chunks gives the same rows as the prefill in one go.
TEST(PagedAttentionChunkingTest, ChunkedPrefillEqualsWholePrefill) {
  const CacheShape shape{16, 4, 2, 64};
  const AttentionBatch whole(shape, {{100, 100}}, 400);
  const std::vector<float> all_rows = whole.Run();
  // Same cache and queries; the last 37 queries run as a chunk after 63 cached tokens.
  AttentionParams chunk = whole.params();
  AttentionSeq seq = chunk.seqs[0];
  seq.query_len = 37;
  chunk.seqs = &seq;
  const int64_t width = whole.RowWidth(shape.num_heads);
  std::vector<float> out(37 * width);
  PagedAttention(whole.q() + 63 * width, whole.key_cache(), whole.value_cache(), chunk, out.data(),
                 TestPool());
  EXPECT_TRUE(BitEqual(out.data(), all_rows.data() + 63 * width, out.size()));
}

// Large score gaps: the running max must rescale without overflow or lost mass.
TEST(PagedAttentionChunkingTest, SharpSoftmaxMatchesReference) {
  const CacheShape shape{7, 2, 1, 16};
  AttentionBatch batch(shape, {{5, 100}}, 500);
  AttentionParams sharp = batch.params();
  sharp.scale = 40.0f;
  std::vector<float> out(batch.out_size());
  PagedAttention(batch.q(), batch.key_cache(), batch.value_cache(), sharp, out.data(), TestPool());
  EXPECT_TRUE(AllNear(
      out, reference::PagedAttention(batch.q(), batch.key_cache(), batch.value_cache(), sharp),
      kAtol, kRtol));
}

// Sequences longer than the windows below, prefills across window boundaries, decodes.
std::vector<SeqSpec> LongSpecs() {
  return {{40, 40}, {1, 100}, {16, 100}, {1, 5}, {9, 70}, {1, 33}, {3, 16}};
}

// (window, softcap)
class WindowedAttentionTest : public ::testing::TestWithParam<std::tuple<int, float>> {};

TEST_P(WindowedAttentionTest, MixedBatchMatchesReference) {
  const auto [window, cap] = GetParam();
  for (const int block_size : {1, 7, 16}) {
    SCOPED_TRACE(::testing::Message() << "block_size=" << block_size);
    const AttentionBatch batch(CacheShape{block_size, 4, 2, 64}, LongSpecs(), 600, window, cap);
    if (window > 0 && window < 30) {
      EXPECT_GT(batch.dropped_blocks(), 0);
    }
    EXPECT_TRUE(AllNear(batch.Run(), batch.Reference(), kAtol, kRtol));
  }
}

TEST_P(WindowedAttentionTest, DecodeMatchesReferenceAndTheGeneralKernel) {
  const auto [window, cap] = GetParam();
  const AttentionBatch batch(CacheShape{7, 8, 2, 12}, DecodeSpecs(), 700, window, cap);
  std::vector<float> decode(batch.out_size(), -1.0f);
  PagedAttentionDecode(batch.q(), batch.key_cache(), batch.value_cache(), batch.params(),
                       decode.data(), TestPool());
  EXPECT_TRUE(AllNear(decode, batch.Reference(), kAtol, kRtol));
  const std::vector<float> general = batch.Run();
  EXPECT_TRUE(BitEqual(decode.data(), general.data(), general.size()));
}

TEST_P(WindowedAttentionTest, SequenceAloneEqualsSequenceInBatch) {
  const auto [window, cap] = GetParam();
  const AttentionBatch batch(CacheShape{16, 4, 1, 64}, LongSpecs(), 800, window, cap);
  const std::vector<float> together = batch.Run();
  const int64_t width = batch.RowWidth(batch.params().num_heads);
  for (int s = 0; s < batch.params().num_seqs; ++s) {
    const AttentionSeq& seq = batch.params().seqs[s];
    const std::vector<float> alone = batch.RunAlone(s);
    EXPECT_TRUE(BitEqual(alone.data(), together.data() + seq.query_start * width, alone.size()))
        << "seq " << s;
  }
}

TEST_P(WindowedAttentionTest, Bf16CacheEqualsFp32OnWidenedCache) {
  const auto [window, cap] = GetParam();
  for (const int block_size : {1, 16}) {
    SCOPED_TRACE(::testing::Message() << "block_size=" << block_size);
    ExpectBf16MatchesFp32OnWidenedCache(
        AttentionBatch(CacheShape{block_size, 4, 2, 64}, LongSpecs(), 650, window, cap), false);
  }
  ExpectBf16MatchesFp32OnWidenedCache(
      AttentionBatch(CacheShape{7, 8, 2, 12}, DecodeSpecs(), 750, window, cap), true);
}

INSTANTIATE_TEST_SUITE_P(Windows, WindowedAttentionTest,
                         ::testing::Combine(::testing::Values(0, 1, 5, 16, 17, 64),
                                            ::testing::Values(0.0f, 0.5f, 30.0f)));

// The window changes the result (a test that passes with the window ignored would prove
// nothing), and a window at least as long as every context changes nothing, bit for bit.
TEST(SlidingWindowTest, WindowMattersAndALongWindowIsNoWindow) {
  const CacheShape shape{16, 4, 2, 64};
  const AttentionBatch full(shape, LongSpecs(), 900);
  const AttentionBatch long_window(shape, LongSpecs(), 900, /*sliding_window=*/100);
  const std::vector<float> a = full.Run();
  EXPECT_TRUE(BitEqual(a.data(), long_window.Run().data(), a.size()));
  const AttentionBatch windowed(shape, LongSpecs(), 900, /*sliding_window=*/8);
  EXPECT_FALSE(AllNear(windowed.Run(), full.Reference(), 1e-3, 1e-3));
}

// Softcapping changes large scores (checked against the reference above) and, with a cap far
// above every score, hardly anything.
TEST(SoftCapAttentionTest, SharpScoresAreCapped) {
  const CacheShape shape{7, 2, 1, 16};
  AttentionBatch batch(shape, {{5, 100}}, 1000, /*sliding_window=*/0, /*logit_softcap=*/3.0f);
  AttentionParams sharp = batch.params();
  sharp.scale = 40.0f;
  std::vector<float> out(batch.out_size());
  PagedAttention(batch.q(), batch.key_cache(), batch.value_cache(), sharp, out.data(), TestPool());
  const std::vector<double> want =
      reference::PagedAttention(batch.q(), batch.key_cache(), batch.value_cache(), sharp);
  EXPECT_TRUE(AllNear(out, want, kAtol, kRtol));
  AttentionParams uncapped = sharp;
  uncapped.logit_softcap = 0.0f;
  EXPECT_FALSE(AllNear(
      out, reference::PagedAttention(batch.q(), batch.key_cache(), batch.value_cache(), uncapped),
      1e-3, 1e-3));
}

// A prefill split into chunks across the window boundary gives the rows of the whole prefill.
TEST(SlidingWindowTest, ChunkedPrefillAcrossTheWindowEqualsWholePrefill) {
  const CacheShape shape{16, 4, 2, 64};
  const int window = 24;
  const AttentionBatch whole(shape, {{100, 100}}, 1100, window);
  const std::vector<float> all_rows = whole.Run();
  AttentionParams chunk = whole.params();
  const int64_t width = whole.RowWidth(shape.num_heads);
  for (const int cached : {10, 23, 24, 25, 63}) {
    SCOPED_TRACE(::testing::Message() << "cached=" << cached);
    AttentionSeq seq = whole.params().seqs[0];
    seq.query_len = 100 - cached;
    chunk.seqs = &seq;
    std::vector<float> out(seq.query_len * width);
    PagedAttention(whole.q() + cached * width, whole.key_cache(), whole.value_cache(), chunk,
                   out.data(), TestPool());
    EXPECT_TRUE(BitEqual(out.data(), all_rows.data() + cached * width, out.size()));
  }
}

// The KV cache may mark freed blocks before the window with negative entries: never read.
TEST(SlidingWindowTest, NegativeEntriesBeforeTheWindowAreNotRead) {
  const CacheShape shape{4, 2, 1, 16};
  const AttentionBatch batch(shape, {{1, 50}, {3, 30}}, 1200, /*sliding_window=*/6);
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttentionSeq> seqs(batch.params().seqs, batch.params().seqs + 2);
  for (AttentionSeq& seq : seqs) {
    const int blocks = (seq.context_len + 3) / 4;
    tables.emplace_back(seq.block_table, seq.block_table + blocks);
    const int first_key = seq.context_len - seq.query_len - 6 + 1;
    for (int b = 0; b < first_key / 4; ++b) tables.back()[b] = -1 - b * 1000000;
    seq.block_table = tables.back().data();
  }
  AttentionParams params = batch.params();
  params.seqs = seqs.data();
  std::vector<float> out(batch.out_size());
  PagedAttention(batch.q(), batch.key_cache(), batch.value_cache(), params, out.data(), TestPool());
  EXPECT_TRUE(AllNear(out, batch.Reference(), kAtol, kRtol));
}

// bf16 bits of fp32 bits rounded to nearest, ties to even, written out longhand; a NaN keeps
// its upper bits with the quiet bit set.
uint16_t RoundedBits(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t upper = bits >> 16;
  const uint32_t lower = bits & 0xffffu;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u) != 0)) ++upper;
  return static_cast<uint16_t>(upper);
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t ToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

TEST(WriteKvCacheBf16Test, RoundsToNearestEvenIntoTheSlotsAndSkipsPadding) {
  // Rows of 26 values: three 8-lane groups and a tail of 2.
  const KvCacheLayout layout{/*num_blocks=*/4, /*block_size=*/3, /*num_kv_heads=*/2,
                             /*head_dim=*/13};
  const int64_t row = layout.num_kv_heads * layout.head_dim;
  const int64_t pool = layout.num_blocks * layout.block_size * row;
  const std::vector<int64_t> slots = {7, -1, 0, 11, -5};
  const int64_t t = slots.size();
  std::vector<float> k = RandomFloats(t * row, 21, -100.0f, 100.0f);
  const std::vector<float> v = RandomFloats(t * row, 22, -1e-3f, 1e-3f);
  // Ties to even both ways, either side of a tie, overflow to infinity, infinities, quiet and
  // signalling NaNs, subnormal ties, -0: at the start of row 0 and the end of row 3 (slot 11),
  // so both the 8-lane and the scalar tail conversion see them.
  const std::vector<uint32_t> special = {
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
      0xff800000u, 0x7fc00001u, 0x7f800001u, 0xffa12345u, 0x00008000u, 0x00018000u, 0x80000000u};
  const int64_t specials = special.size();
  for (int64_t i = 0; i < specials; ++i) {
    k[i] = FromBits(special[i]);
    k[4 * row - specials + i] = FromBits(special[i]);
  }
  std::vector<uint16_t> key_cache(pool, 0x1234);
  std::vector<uint16_t> value_cache(pool, 0x4321);
  WriteKvCacheBf16(k.data(), v.data(), slots.data(), t, layout, key_cache.data(),
                   value_cache.data());
  EXPECT_EQ(key_cache[7 * row + 0], 0x3f80);         // tie to even, down
  EXPECT_EQ(key_cache[7 * row + 1], 0x3f82);         // tie to even, up
  EXPECT_EQ(key_cache[7 * row + 4], 0x7f80);         // overflow: +inf
  EXPECT_EQ(key_cache[11 * row + row - 1], 0x8000);  // -0
  for (int64_t s = 0; s < layout.num_blocks * layout.block_size; ++s) {
    int64_t source = -1;
    for (int64_t r = 0; r < t; ++r) {
      if (slots[r] == s) source = r;
    }
    for (int64_t i = 0; i < row; ++i) {
      const uint16_t want_k = source < 0 ? 0x1234 : RoundedBits(ToBits(k[source * row + i]));
      const uint16_t want_v = source < 0 ? 0x4321 : RoundedBits(ToBits(v[source * row + i]));
      ASSERT_EQ(key_cache[s * row + i], want_k) << "slot " << s << " element " << i;
      ASSERT_EQ(value_cache[s * row + i], want_v) << "slot " << s << " element " << i;
    }
  }
  EXPECT_TRUE(std::isnan(Bf16ToFloat(key_cache[7 * row + 9])));  // signalling NaN stays NaN
}

// The bf16 tests above compare against a cache that really was rounded.
TEST(Bf16KvCacheTest, WidenedCacheHoldsTheRoundedValues) {
  const AttentionBatch batch(CacheShape{7, 4, 2, 12}, MixedSpecs(), 1300);
  const std::vector<float>& widened = batch.widened_key_cache();
  int64_t changed = 0;
  int64_t stored = 0;
  for (size_t i = 0; i < widened.size(); ++i) {
    const float original = batch.key_cache()[i];
    if (std::isnan(original)) {
      ASSERT_TRUE(std::isnan(widened[i])) << i;
      continue;
    }
    ASSERT_EQ(ToBits(widened[i]), ToBits(RoundToBf16(original))) << i;
    ++stored;
    if (widened[i] != original) ++changed;
  }
  EXPECT_GT(changed, stored * 9 / 10);
}

}  // namespace
}  // namespace carpool::kernels::cpu
