#include "worker/kv_cache/kv_cache_manager.h"

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

constexpr int kBlockSize = 4;

std::vector<int32_t> Tokens(int n, int32_t first = 100) {
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

class KvCacheManagerTest : public ::testing::Test {
 protected:
  void Init(int num_blocks, bool prefix_caching = true, int sliding_window = 0) {
    KvCacheOptions options;
    options.num_blocks = num_blocks;
    options.block_size = kBlockSize;
    options.enable_prefix_caching = prefix_caching;
    options.sliding_window = sliding_window;
    auto kv = KvCacheManager::Create(options);
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = *std::move(kv);
  }

  // Allocates a whole prompt and marks all of it computed, as one prefill step would.
  bool Prefill(int64_t seq_id, const std::vector<int32_t>& tokens, uint64_t salt = 0) {
    if (!kv_->Allocate(seq_id, static_cast<int>(tokens.size()), TokenSpan(tokens), salt)) {
      return false;
    }
    kv_->MarkComputed(seq_id, static_cast<int>(tokens.size()), TokenSpan(tokens));
    return true;
  }

  std::vector<int32_t> Table(int64_t seq_id) const {
    auto span = kv_->BlockTable(seq_id);
    return std::vector<int32_t>(span.begin(), span.end());
  }

  void ExpectAllFree() const {
    EXPECT_EQ(kv_->num_free_blocks(), kv_->num_blocks());
    EXPECT_EQ(kv_->num_used_blocks(), 0);
    EXPECT_EQ(kv_->num_seqs(), 0);
    EXPECT_DOUBLE_EQ(kv_->usage(), 0.0);
    for (int32_t id = 0; id < kv_->num_blocks(); ++id) EXPECT_EQ(kv_->RefCount(id), 0) << id;
  }

  std::unique_ptr<KvCacheManager> kv_;
};

// The hash of every full block of `tokens`, in order: what MarkComputed registers.
std::vector<uint64_t> FullBlockHashes(const std::vector<int32_t>& tokens, uint64_t salt = 0) {
  std::vector<uint64_t> hashes;
  uint64_t parent = kRootBlockHash;
  for (size_t b = 0; (b + 1) * kBlockSize <= tokens.size(); ++b) {
    parent = BlockHash(parent, absl::MakeConstSpan(tokens).subspan(b * kBlockSize, kBlockSize),
                       salt);
    hashes.push_back(parent);
  }
  return hashes;
}

TEST(KvCacheOptionsTest, Validate) {
  KvCacheOptions options;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);  // num_blocks unset
  options.num_blocks = 8;
  EXPECT_TRUE(options.Validate().ok());
  options.block_size = 0;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(KvCacheManager::Create(options).ok());
  options.block_size = 16;
  options.sliding_window = -1;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvCacheManagerTest, AllocateGrowAndFreeAccounting) {
  Init(8);
  EXPECT_EQ(kv_->num_free_blocks(), 8);
  const auto tokens = Tokens(6);
  ASSERT_TRUE(kv_->Allocate(1, 6, TokenSpan(tokens), 0));
  EXPECT_THAT(Table(1), ElementsAre(0, 1));
  EXPECT_EQ(kv_->num_used_blocks(), 2);
  EXPECT_EQ(kv_->num_free_blocks(), 6);
  EXPECT_DOUBLE_EQ(kv_->usage(), 0.25);

  // Growing within the last block takes nothing; crossing a boundary takes one block.
  ASSERT_TRUE(kv_->Allocate(1, 8, TokenSpan(tokens), 0));
  EXPECT_EQ(kv_->num_used_blocks(), 2);
  ASSERT_TRUE(kv_->Allocate(1, 9, TokenSpan(tokens), 0));
  EXPECT_THAT(Table(1), ElementsAre(0, 1, 2));
  // Never shrinks.
  ASSERT_TRUE(kv_->Allocate(1, 1, TokenSpan(tokens), 0));
  EXPECT_EQ(Table(1).size(), 3u);

  ASSERT_TRUE(kv_->Allocate(2, 4, TokenSpan(tokens), 0));
  EXPECT_THAT(Table(2), ElementsAre(3));
  EXPECT_EQ(kv_->num_seqs(), 2);
  EXPECT_TRUE(kv_->Holds(2));

  EXPECT_TRUE(kv_->Free(1));
  EXPECT_FALSE(kv_->Free(1));
  EXPECT_THAT(Table(1), IsEmpty());
  EXPECT_EQ(kv_->num_used_blocks(), 1);
  EXPECT_TRUE(kv_->Free(2));
  ExpectAllFree();
  // Nothing was marked computed, so nothing is cached: all blocks went to the free list.
  EXPECT_EQ(kv_->num_evictable_blocks(), 0);
}

TEST_F(KvCacheManagerTest, FullPoolReturnsFalseWithoutStateChange) {
  Init(4);
  const auto tokens = Tokens(16);
  ASSERT_TRUE(Prefill(1, Tokens(8, 500)));  // two cached blocks
  ASSERT_TRUE(kv_->Free(1));                // ... now evictable
  ASSERT_TRUE(kv_->Allocate(2, 8, TokenSpan(tokens), 0));
  EXPECT_EQ(kv_->num_free_blocks(), 2);
  EXPECT_EQ(kv_->num_evictable_blocks(), 2);

  // Seq 2 wants 12 more tokens (3 blocks); only 2 can be had.
  EXPECT_FALSE(kv_->Allocate(2, 20, TokenSpan(tokens), 0));
  EXPECT_EQ(Table(2).size(), 2u);
  EXPECT_EQ(kv_->num_free_blocks(), 2);
  EXPECT_EQ(kv_->num_evictable_blocks(), 2);  // nothing evicted by the failed attempt
  // A new sequence that does not fit is not registered at all.
  EXPECT_FALSE(kv_->Allocate(3, 12, TokenSpan(tokens), 0));
  EXPECT_FALSE(kv_->Holds(3));
  EXPECT_EQ(kv_->prefix_cache_queries(), 8 + 16);  // failed attempts count nothing
  // The cached prefix survived.
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(Tokens(9, 500)), 0), 8);

  EXPECT_TRUE(kv_->Allocate(2, 16, TokenSpan(tokens), 0));
  EXPECT_EQ(kv_->num_free_blocks(), 0);
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(Tokens(9, 500)), 0), 0);  // evicted
  kv_->Free(2);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, PrefixHitSharesBlocksAcrossSequences) {
  Init(16);
  const auto prompt = Tokens(10);  // blocks [0,4) [4,8) full, [8,10) partial
  ASSERT_TRUE(Prefill(1, prompt));
  EXPECT_EQ(kv_->prefix_cache_hits(), 0);
  EXPECT_TRUE(kv_->IsCached(Table(1)[0]));
  EXPECT_TRUE(kv_->IsCached(Table(1)[1]));
  EXPECT_FALSE(kv_->IsCached(Table(1)[2]));  // partial blocks are never shared

  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 0), 8);
  ASSERT_TRUE(kv_->Allocate(2, 10, TokenSpan(prompt), 0));
  const auto t1 = Table(1), t2 = Table(2);
  ASSERT_EQ(t2.size(), 3u);
  EXPECT_EQ(t2[0], t1[0]);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_NE(t2[2], t1[2]);
  EXPECT_EQ(kv_->RefCount(t1[0]), 2);
  EXPECT_EQ(kv_->RefCount(t1[2]), 1);
  EXPECT_EQ(kv_->num_used_blocks(), 4);
  EXPECT_EQ(kv_->prefix_cache_queries(), 20);
  EXPECT_EQ(kv_->prefix_cache_hits(), 8);

  // Shared blocks stay in use until the last holder frees them.
  kv_->Free(1);
  EXPECT_EQ(kv_->RefCount(t1[0]), 1);
  EXPECT_EQ(kv_->num_evictable_blocks(), 0);
  kv_->Free(2);
  EXPECT_EQ(kv_->num_evictable_blocks(), 2);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, HitNeverCoversTheLastToken) {
  Init(16);
  const auto prompt = Tokens(8);  // exactly two full blocks
  ASSERT_TRUE(Prefill(1, prompt));
  // Both blocks are cached, but the one holding token 7 must be recomputed.
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 0), 4);
  auto longer = Tokens(9);
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(longer), 0), 8);
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(Tokens(1)), 0), 0);
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(), 0), 0);
}

TEST_F(KvCacheManagerTest, TokenSpanInTwoPiecesHashesLikeOne) {
  Init(16);
  const auto all = Tokens(12);
  ASSERT_TRUE(Prefill(1, all));
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 5);
  const std::vector<int32_t> output(all.begin() + 5, all.end());
  const TokenSpan split(prompt, output);
  ASSERT_EQ(split.size(), 12);
  EXPECT_EQ(split[6], all[6]);
  EXPECT_EQ(kv_->LookupPrefix(split, 0), 8);
}

TEST_F(KvCacheManagerTest, SaltIsolatesEqualTokens) {
  Init(16);
  const auto prompt = Tokens(9);
  ASSERT_TRUE(Prefill(1, prompt, /*salt=*/7));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 7), 8);
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 8), 0);
  ASSERT_TRUE(kv_->Allocate(2, 9, TokenSpan(prompt), 8));
  for (int32_t id : Table(2)) EXPECT_EQ(kv_->RefCount(id), 1);
  // Seq 2 registers its own copies under its salt; the two tenants still share nothing.
  kv_->MarkComputed(2, 9, TokenSpan(prompt));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 8), 8);
  ASSERT_TRUE(kv_->Allocate(3, 9, TokenSpan(prompt), 8));
  EXPECT_EQ(Table(3)[0], Table(2)[0]);
  EXPECT_NE(Table(3)[0], Table(1)[0]);
}

TEST_F(KvCacheManagerTest, OnlyComputedFullBlocksAreRegistered) {
  Init(16);
  const auto prompt = Tokens(12);
  ASSERT_TRUE(kv_->Allocate(1, 12, TokenSpan(prompt), 0));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 0), 0);
  kv_->MarkComputed(1, 7, TokenSpan(prompt));  // one full block computed so far
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 0), 4);
  kv_->MarkComputed(1, 12, TokenSpan(prompt));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(Tokens(13)), 0), 12);
}

TEST_F(KvCacheManagerTest, DuplicateContentStaysPrivate) {
  Init(16);
  const auto prompt = Tokens(9);
  // Both admitted before either computed anything: no sharing possible.
  ASSERT_TRUE(kv_->Allocate(1, 9, TokenSpan(prompt), 0));
  ASSERT_TRUE(kv_->Allocate(2, 9, TokenSpan(prompt), 0));
  kv_->MarkComputed(1, 9, TokenSpan(prompt));
  kv_->MarkComputed(2, 9, TokenSpan(prompt));
  EXPECT_TRUE(kv_->IsCached(Table(1)[0]));
  EXPECT_FALSE(kv_->IsCached(Table(2)[0]));
  // A third sequence shares seq 1's blocks.
  ASSERT_TRUE(kv_->Allocate(3, 9, TokenSpan(prompt), 0));
  EXPECT_EQ(Table(3)[1], Table(1)[1]);
  kv_->Free(2);  // its private copies go straight to the free list
  EXPECT_EQ(kv_->num_evictable_blocks(), 0);
  kv_->Free(1);
  kv_->Free(3);
  EXPECT_EQ(kv_->num_evictable_blocks(), 2);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, EvictsLeastRecentlyUsedCachedBlocksAfterFreeOnes) {
  Init(6);
  const auto a = Tokens(5, 100), b = Tokens(5, 200), c = Tokens(5, 300);
  ASSERT_TRUE(Prefill(1, a));  // 2 blocks, the first cached
  ASSERT_TRUE(Prefill(2, b));
  ASSERT_TRUE(Prefill(3, c));
  kv_->Free(2);  // b's cached block becomes the least recently used
  kv_->Free(1);
  kv_->Free(3);
  EXPECT_EQ(kv_->num_evictable_blocks(), 3);
  EXPECT_EQ(kv_->num_free_blocks(), 6);

  // Three blocks come from the free list; nothing is evicted yet.
  const auto other = Tokens(12, 900);
  ASSERT_TRUE(kv_->Allocate(4, 12, TokenSpan(other), 0));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(a), 0), 4);
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(b), 0), 4);
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(c), 0), 4);

  // A hit refreshes nothing by itself, but adopting a block takes it out of the LRU, and
  // freeing it again puts it at the most recently used end.
  ASSERT_TRUE(kv_->Allocate(5, 5, TokenSpan(b), 0));  // adopts b's block + 1 evicted block
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(a), 0), 0);   // a was least recently used
  kv_->Free(5);
  // One block from the free list (a's old block), then one evicted: c, now the oldest.
  ASSERT_TRUE(kv_->Allocate(6, 8, TokenSpan(other), 0));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(c), 0), 0);
  EXPECT_EQ(kv_->num_evictable_blocks(), 1);
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(b), 0), 4);
  kv_->Free(4);
  kv_->Free(6);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, FreeingPutsTheSequenceTailFirstInTheLru) {
  Init(4);
  ASSERT_TRUE(Prefill(1, Tokens(13)));  // 3 cached blocks + 1 partial
  kv_->Free(1);
  // One free block, then eviction must take the last cached block, keeping the prefix.
  ASSERT_TRUE(kv_->Allocate(2, 8, TokenSpan(Tokens(8, 900)), 0));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(Tokens(13)), 0), 8);
}

TEST_F(KvCacheManagerTest, AllocateCountsAdoptedEvictableBlocks) {
  Init(3);
  const auto prompt = Tokens(9);
  ASSERT_TRUE(Prefill(1, prompt));  // 2 cached blocks + 1 partial
  kv_->Free(1);
  EXPECT_EQ(kv_->num_free_blocks(), 3);
  // Adopting 2 evictable blocks leaves 1 block for the rest: 12 tokens fit, 13 do not.
  EXPECT_FALSE(kv_->Allocate(2, 13, TokenSpan(prompt), 0));
  EXPECT_EQ(kv_->num_evictable_blocks(), 2);
  ASSERT_TRUE(kv_->Allocate(2, 12, TokenSpan(prompt), 0));
  EXPECT_EQ(kv_->prefix_cache_hits(), 8);
  EXPECT_EQ(kv_->num_free_blocks(), 0);
  kv_->Free(2);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, PrefixCachingDisabled) {
  Init(8, /*prefix_caching=*/false);
  const auto prompt = Tokens(9);
  ASSERT_TRUE(Prefill(1, prompt));
  EXPECT_FALSE(kv_->IsCached(Table(1)[0]));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 0), 0);
  ASSERT_TRUE(kv_->Allocate(2, 9, TokenSpan(prompt), 0));
  EXPECT_NE(Table(2)[0], Table(1)[0]);
  kv_->Free(1);
  kv_->Free(2);
  EXPECT_EQ(kv_->num_evictable_blocks(), 0);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, EventsReportEachRegistrationOnceInOrder) {
  Init(16);
  EXPECT_TRUE(kv_->TakeEvents().empty());
  const auto prompt = Tokens(6), output = Tokens(7, 700);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), output.begin(), output.end());
  const std::vector<uint64_t> chain = FullBlockHashes(all, /*salt=*/5);  // 3 blocks
  ASSERT_TRUE(kv_->Allocate(1, 13, TokenSpan(prompt, output), 5));
  EXPECT_TRUE(kv_->TakeEvents().empty());  // nothing computed yet
  kv_->MarkComputed(1, 7, TokenSpan(prompt, output));
  KvCacheEvents events = kv_->TakeEvents();
  EXPECT_THAT(events.stored, ElementsAre(chain[0]));
  EXPECT_THAT(events.removed, IsEmpty());
  EXPECT_TRUE(kv_->TakeEvents().empty());  // taking empties them

  // Blocks of output tokens are registered like prompt blocks.
  kv_->MarkComputed(1, 13, TokenSpan(prompt, output));
  events = kv_->TakeEvents();
  EXPECT_THAT(events.stored, ElementsAre(chain[1], chain[2]));
  EXPECT_THAT(events.removed, IsEmpty());
  kv_->MarkComputed(1, 13, TokenSpan(prompt, output));  // again: already registered
  EXPECT_TRUE(kv_->TakeEvents().empty());
  EXPECT_THAT(kv_->CachedHashes(), UnorderedElementsAreArray(chain));
}

TEST_F(KvCacheManagerTest, EventsSkipHashesAlreadyHeld) {
  Init(16);
  const auto prompt = Tokens(9);
  // Two copies computed at once: only the first registers (the second stays private).
  ASSERT_TRUE(kv_->Allocate(1, 9, TokenSpan(prompt), 0));
  ASSERT_TRUE(kv_->Allocate(2, 9, TokenSpan(prompt), 0));
  kv_->MarkComputed(1, 9, TokenSpan(prompt));
  kv_->MarkComputed(2, 9, TokenSpan(prompt));
  EXPECT_THAT(kv_->TakeEvents().stored, ElementsAreArray(FullBlockHashes(prompt)));
  // Adopting the cached prefix, computing the rest, freeing: no hash changes.
  ASSERT_TRUE(kv_->Allocate(3, 9, TokenSpan(prompt), 0));
  kv_->MarkComputed(3, 9, TokenSpan(prompt));
  kv_->Free(1);
  kv_->Free(2);
  kv_->Free(3);  // the blocks stay cached, evictable
  EXPECT_TRUE(kv_->TakeEvents().empty());
  EXPECT_THAT(kv_->CachedHashes(), UnorderedElementsAreArray(FullBlockHashes(prompt)));
}

TEST_F(KvCacheManagerTest, EvictionReportsTheHashesRemoved) {
  Init(3);
  const auto prompt = Tokens(9);  // 2 cached blocks + 1 partial
  const std::vector<uint64_t> chain = FullBlockHashes(prompt);
  ASSERT_TRUE(Prefill(1, prompt));
  EXPECT_THAT(kv_->TakeEvents().stored, ElementsAreArray(chain));
  kv_->Free(1);
  // A failed Allocate evicts nothing, so reports nothing.
  const auto other = Tokens(16, 900);
  EXPECT_FALSE(kv_->Allocate(2, 16, TokenSpan(other), 0));
  EXPECT_TRUE(kv_->TakeEvents().empty());
  // One free block, then the two cached ones, the sequence's tail first.
  ASSERT_TRUE(kv_->Allocate(2, 12, TokenSpan(other), 0));
  KvCacheEvents events = kv_->TakeEvents();
  EXPECT_THAT(events.stored, IsEmpty());
  EXPECT_THAT(events.removed, ElementsAre(chain[1], chain[0]));
  EXPECT_THAT(kv_->CachedHashes(), IsEmpty());
  // The new owner's blocks are registered under their own hashes.
  kv_->MarkComputed(2, 12, TokenSpan(other));
  events = kv_->TakeEvents();
  EXPECT_THAT(events.stored, ElementsAreArray(FullBlockHashes(other).data(), 3));
  EXPECT_THAT(events.removed, IsEmpty());
}

TEST_F(KvCacheManagerTest, EventsNotTakenYetCancelOut) {
  Init(3);
  const auto prompt = Tokens(9);
  const std::vector<uint64_t> chain = FullBlockHashes(prompt);
  // Registered and evicted between two takes: the taker never knew it, so nothing.
  ASSERT_TRUE(Prefill(1, prompt));
  kv_->Free(1);
  ASSERT_TRUE(kv_->Allocate(2, 12, TokenSpan(Tokens(12, 900)), 0));
  EXPECT_TRUE(kv_->TakeEvents().empty());
  kv_->Free(2);
  // Taken, then evicted and registered again (in other blocks): held as before, so nothing.
  ASSERT_TRUE(Prefill(3, prompt));
  EXPECT_THAT(kv_->TakeEvents().stored, ElementsAreArray(chain));
  kv_->Free(3);
  ASSERT_TRUE(kv_->Allocate(4, 12, TokenSpan(Tokens(12, 900)), 0));
  kv_->Free(4);
  ASSERT_TRUE(Prefill(5, prompt));
  EXPECT_TRUE(kv_->TakeEvents().empty());
  EXPECT_THAT(kv_->CachedHashes(), UnorderedElementsAreArray(chain));
}

// Whatever the sequence of calls, applying each take's `removed` then `stored` (as the router's
// PrefixIndex::Apply does) to what was reported before gives exactly the hashes held.
TEST_F(KvCacheManagerTest, EventsAppliedInOrderTrackTheCachedHashes) {
  Init(12);
  std::mt19937 rng(12);
  absl::flat_hash_set<uint64_t> reported;
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 6; ++p) prompts.push_back(Tokens(4 + 3 * p, p % 3 == 0 ? 100 : 100 * p));
  std::vector<int64_t> live;
  for (int64_t step = 1; step <= 2000; ++step) {
    if (!live.empty() && (live.size() >= 3 || rng() % 2 == 0)) {
      const size_t i = rng() % live.size();
      kv_->Free(live[i]);
      live.erase(live.begin() + i);
    } else {
      const auto& prompt = prompts[rng() % prompts.size()];
      if (Prefill(step, prompt, /*salt=*/rng() % 2)) live.push_back(step);
    }
    if (rng() % 3 != 0) continue;
    const KvCacheEvents events = kv_->TakeEvents();
    for (uint64_t h : events.removed) ASSERT_TRUE(reported.erase(h)) << "step " << step;
    for (uint64_t h : events.stored) ASSERT_TRUE(reported.insert(h).second) << "step " << step;
    const std::vector<uint64_t> held = kv_->CachedHashes();
    ASSERT_EQ(absl::flat_hash_set<uint64_t>(held.begin(), held.end()), reported)
        << "step " << step;
    ASSERT_LE(static_cast<int>(held.size()), kv_->num_blocks());
  }
}

TEST_F(KvCacheManagerTest, NoEventsWithoutPrefixCaching) {
  Init(3, /*prefix_caching=*/false);
  ASSERT_TRUE(Prefill(1, Tokens(9)));
  kv_->Free(1);
  ASSERT_TRUE(kv_->Allocate(2, 12, TokenSpan(Tokens(12, 900)), 0));
  EXPECT_TRUE(kv_->TakeEvents().empty());
  EXPECT_THAT(kv_->CachedHashes(), IsEmpty());
}

// ---------------------------------------------------------------------------------------------
// Sliding window: token q attends keys k with q - window < k <= q.

// Whether any query at position `from` or later reads a key of block b: the definition, walked
// position by position (queries past from + window + block_size read later blocks only).
bool ReadLater(int b, int from, int window) {
  for (int q = from; q <= from + window + kBlockSize; ++q) {
    for (int k = b * kBlockSize; k < (b + 1) * kBlockSize; ++k) {
      if (q - window < k && k <= q) return true;
    }
  }
  return false;
}

TEST_F(KvCacheManagerTest, WindowReleasesExactlyTheBlocksNoLaterQueryReads) {
  for (int window : {1, 3, 4, 6, 8, 9}) {
    SCOPED_TRACE(window);
    for (bool prefix_caching : {false, true}) {
      Init(64, prefix_caching, window);
      const auto tokens = Tokens(60);
      ASSERT_TRUE(kv_->Allocate(1, 1, TokenSpan(tokens), 0));
      // Decode one token at a time: after computing [0, n), the next query is at n.
      for (int n = 1; n < 60; ++n) {
        kv_->MarkComputed(1, n, TokenSpan(tokens));
        ASSERT_TRUE(kv_->Allocate(1, n + 1, TokenSpan(tokens), 0));
        const auto table = Table(1);
        ASSERT_EQ(static_cast<int>(table.size()), (n + 1 + kBlockSize - 1) / kBlockSize);
        int held = 0;
        for (int b = 0; b < static_cast<int>(table.size()); ++b) {
          if (ReadLater(b, n, window)) {
            EXPECT_GE(table[b], 0) << "n " << n << " block " << b;
            ++held;
          } else {
            EXPECT_EQ(table[b], KvCacheManager::kReleasedBlock) << "n " << n << " block " << b;
          }
        }
        EXPECT_EQ(kv_->num_used_blocks(), held) << n;
        EXPECT_LE(held, window / kBlockSize + 2) << n;
        EXPECT_LE(held, kv_->PeakBlocks(60, 1)) << n;
      }
      kv_->Free(1);
      ExpectAllFree();
      // Released blocks that were registered are evictable; the others went to the free list.
      EXPECT_EQ(kv_->num_evictable_blocks(), prefix_caching ? 59 / kBlockSize : 0);
    }
  }
}

TEST_F(KvCacheManagerTest, WindowBlockBoundaries) {
  Init(16, /*prefix_caching=*/true, /*window=*/8);
  const auto tokens = Tokens(40);
  ASSERT_TRUE(kv_->Allocate(1, 12, TokenSpan(tokens), 0));
  const int32_t first = Table(1)[0];
  // Next query 11 reads keys 4..11: block 0 (positions 0..3) is no longer read.
  kv_->MarkComputed(1, 10, TokenSpan(tokens));  // next query 10 reads 3..10
  EXPECT_GE(Table(1)[0], 0);
  kv_->MarkComputed(1, 11, TokenSpan(tokens));
  EXPECT_EQ(Table(1)[0], KvCacheManager::kReleasedBlock);
  EXPECT_EQ(kv_->RefCount(first), 0);
  EXPECT_TRUE(kv_->IsCached(first));  // evictable, contents kept
  EXPECT_EQ(kv_->num_used_blocks(), 2);
  // Table indices stay put: position p is still entry p / block_size.
  ASSERT_TRUE(kv_->Allocate(1, 13, TokenSpan(tokens), 0));
  EXPECT_EQ(Table(1).size(), 4u);
  kv_->MarkComputed(1, 14, TokenSpan(tokens));  // next query 14 reads 7..14: block 1 is kept
  EXPECT_GE(Table(1)[1], 0);
  kv_->MarkComputed(1, 15, TokenSpan(tokens));  // next query 15 reads 8..15
  EXPECT_EQ(Table(1)[1], KvCacheManager::kReleasedBlock);
  EXPECT_EQ(kv_->num_used_blocks(), 2);
  kv_->Free(1);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, WindowWithChunkedPrefill) {
  Init(16, /*prefix_caching=*/false, /*window=*/6);
  const auto tokens = Tokens(40);
  // Chunk [0, 10): when it runs, every block is there.
  ASSERT_TRUE(kv_->Allocate(1, 10, TokenSpan(tokens), 0));
  EXPECT_THAT(Table(1), ElementsAre(0, 1, 2));
  kv_->MarkComputed(1, 10, TokenSpan(tokens));
  // The next chunk's first query, at 10, reads keys 5..10: block 0 goes, block 1 stays even
  // though the chunk's later queries would not read it.
  EXPECT_THAT(Table(1), ElementsAre(KvCacheManager::kReleasedBlock, 1, 2));
  // Chunk [10, 22).
  ASSERT_TRUE(kv_->Allocate(1, 22, TokenSpan(tokens), 0));
  EXPECT_EQ(Table(1).size(), 6u);
  EXPECT_EQ(kv_->num_used_blocks(), 5);
  kv_->MarkComputed(1, 22, TokenSpan(tokens));  // next query 22 reads 17..22
  const auto table = Table(1);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(table[b], KvCacheManager::kReleasedBlock) << b;
  EXPECT_GE(table[4], 0);
  EXPECT_GE(table[5], 0);
  EXPECT_EQ(kv_->num_used_blocks(), 2);
  // Released blocks are reused, here by the same sequence.
  ASSERT_TRUE(kv_->Allocate(1, 30, TokenSpan(tokens), 0));
  EXPECT_EQ(kv_->num_used_blocks(), 4);
  kv_->Free(1);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, WindowPeakBlocks) {
  Init(64, /*prefix_caching=*/true, /*window=*/16);
  EXPECT_EQ(kv_->PeakBlocks(10, 1), 3);       // shorter than the window: all of it
  EXPECT_EQ(kv_->PeakBlocks(100, 1), 16 / 4 + 1);
  // A chunk of 8 from position s reads [s - 15, s + 8): 23 positions, at most 7 blocks.
  EXPECT_EQ(kv_->PeakBlocks(100, 8), 7);
  EXPECT_EQ(kv_->PeakBlocks(100, 1000), 25);  // one chunk: the whole sequence
  Init(64);
  EXPECT_EQ(kv_->PeakBlocks(100, 1), 25);  // no window: every block
}

TEST_F(KvCacheManagerTest, WindowSharedBlocksStayWithTheOtherHolder) {
  Init(16, /*prefix_caching=*/true, /*window=*/4);
  const auto prompt = Tokens(9);
  ASSERT_TRUE(Prefill(1, prompt));  // next query 9 reads 6..9: block 0 released
  const auto t1 = Table(1);
  EXPECT_EQ(t1[0], KvCacheManager::kReleasedBlock);
  // Seq 2 (same prompt) adopts blocks 0 and 1 from the cache; its first computed token is at 8,
  // whose window (5..8) does not reach block 0, so only block 1 is adopted.
  ASSERT_TRUE(kv_->Allocate(2, 9, TokenSpan(prompt), 0));
  EXPECT_EQ(kv_->prefix_cache_hits(), 8);
  const auto t2 = Table(2);
  ASSERT_EQ(t2.size(), 3u);
  EXPECT_EQ(t2[0], KvCacheManager::kReleasedBlock);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_EQ(kv_->RefCount(t1[1]), 2);
  // Seq 1 moves on: its release of block 1 leaves seq 2's reference.
  ASSERT_TRUE(kv_->Allocate(1, 13, TokenSpan(Tokens(13)), 0));
  kv_->MarkComputed(1, 12, TokenSpan(Tokens(13)));  // next query 12 reads 9..12
  EXPECT_EQ(Table(1)[1], KvCacheManager::kReleasedBlock);
  EXPECT_EQ(kv_->RefCount(t2[1]), 1);
  kv_->Free(1);
  kv_->Free(2);
  ExpectAllFree();
}

TEST_F(KvCacheManagerTest, WindowReleasedBlocksServePrefixHitsUntilEvicted) {
  Init(6, /*prefix_caching=*/true, /*window=*/4);
  const auto prompt = Tokens(14);  // blocks 0..2 full, 3 partial
  ASSERT_TRUE(Prefill(1, prompt));  // next query 14 reads 11..14: blocks 0, 1 released
  EXPECT_EQ(kv_->num_used_blocks(), 2);
  EXPECT_EQ(kv_->num_evictable_blocks(), 2);
  // The whole chain is still in the cache (blocks 0, 1 evictable, block 2 in use).
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 0), 12);
  // Another sequence takes the two free blocks, then one more: the LRU's oldest, block 0,
  // goes, and with it every chain through it.
  ASSERT_TRUE(kv_->Allocate(2, 12, TokenSpan(Tokens(12, 900)), 0));
  EXPECT_EQ(kv_->LookupPrefix(TokenSpan(prompt), 0), 0);
  kv_->Free(1);
  kv_->Free(2);
  ExpectAllFree();
}

}  // namespace
}  // namespace carpool::worker
