// The worker's paged KV cache bookkeeping: which fixed-size blocks of the device pool belong to
// which sequence. No device memory lives here; the model runner reads the block tables.
//
//   Block pool:  ids [0, num_blocks), each holding block_size tokens' keys and values.
//   A block is in exactly one of three states:
//     used       ref_count > 0, in one or more sequences' block tables;
//     evictable  ref_count == 0 but hashed: keeps its contents for prefix-cache hits, sits in an
//                LRU and is handed out (losing its hash) only when no free block is left;
//     free       ref_count == 0, no hash, on the free list.
//
// Prefix caching: a FULL block whose tokens have all been computed is registered under
//   hash = BlockHash(parent block's hash, its block_size token ids, salt),
// so equal hashes mean equal token prefixes under the same salt (tenant). A new sequence whose
// leading full blocks are registered reuses them (ref_count++) instead of computing them again.
//
// Sliding window: when every layer of the model attends only to the last `sliding_window`
// positions (token i to keys j with i - sliding_window < j <= i), a running sequence's blocks
// that lie wholly before the window of its next query are released (ref_count--, as Free does)
// while it runs, so its footprint stays bounded by the window, not its length. Block tables keep
// their indexing (position p is entry p / block_size): a released entry holds kReleasedBlock,
// and such entries are always a leading run of the table. The kernels never read them: every
// key they read for a query at position q lies in [q - sliding_window + 1, q].
//   A released block is like one of a finished sequence: if registered it stays in the prefix
// cache as an evictable block with its contents, so a later sequence can still adopt the whole
// chain from block 0 until the block is handed out again (which drops its hash and so ends every
// chain through it). A prefix hit always needs every block of the prefix (the chain is walked
// from block 0); the adopting sequence then keeps only the blocks its own window reaches.
//
// Events: the manager records each change to the set of registered hashes, for the router's
// prefix index (KvEventsInfo): `stored` when a block is registered under a hash (MarkComputed),
// `removed` when a registered hash leaves the cache (its block handed out again by Allocate:
// TakeBlock is the one place a hash is dropped). TakeEvents returns them netted since the last
// call, so applying `removed` and then `stored` to what the previous calls reported gives
// exactly CachedHashes(). Every full computed block is registered, prompt or output, however
// long the sequence: a consumer that keeps at most num_blocks hashes (the router does) holds
// them all, since each hash names one block. Pending changes never exceed 2 * num_blocks, so
// an owner that never takes them (offline Generate) pays bounded memory.
//
// Plan, then commit: LookupPrefix has no side effects; Allocate is the one method that takes
// blocks, and it either succeeds completely or changes nothing, so trying it is the plan.
// "Full" is a normal answer (false), not an error.
//
// Thread-compatible: owned and driven by the engine loop alone.
#ifndef CARPOOL_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_
#define CARPOOL_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/block_hash.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace carpool::worker {

struct KvCacheOptions {
  // Blocks in the pool, > 0. Default: none (must be set).
  int num_blocks = 0;
  // Tokens per block, > 0. Default: 16.
  int block_size = 16;
  // Share computed full blocks between sequences with equal prefixes. Default: true.
  bool enable_prefix_caching = true;
  // > 0: every layer of the model attends only to the last sliding_window positions, and blocks
  // wholly before a sequence's window are released while it runs (see above). 0: no window,
  // every block is kept. Leave 0 when only some layers slide (Gemma 3): all layers share one
  // block table, and the global ones read every block. Default: 0.
  int sliding_window = 0;

  absl::Status Validate() const;
};

// A sequence's tokens as up to two contiguous pieces (prompt, then output), read as one list so
// callers need not copy them. Views only: the pieces must outlive the TokenSpan.
class TokenSpan {
 public:
  TokenSpan() = default;
  TokenSpan(absl::Span<const int32_t> first, absl::Span<const int32_t> second = {})
      : first_(first), second_(second) {}

  int size() const { return static_cast<int>(first_.size() + second_.size()); }
  int32_t operator[](int i) const {
    const int n = static_cast<int>(first_.size());
    return i < n ? first_[i] : second_[i - n];
  }

 private:
  absl::Span<const int32_t> first_;
  absl::Span<const int32_t> second_;
};


// Changes to the registered hashes since the last KvCacheManager::TakeEvents, each list in the
// order the changes happened. A hash is in at most one of them.
struct KvCacheEvents {
  std::vector<uint64_t> stored;   // registered now, not when last taken
  std::vector<uint64_t> removed;  // registered when last taken, not now

  bool empty() const { return stored.empty() && removed.empty(); }
};

class KvCacheManager {
 public:
  // A block table entry whose block the sliding window released.
  static constexpr int32_t kReleasedBlock = -1;

  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(const KvCacheOptions& options);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // Number of leading tokens of `tokens` whose full blocks are registered under `salt`: a
  // multiple of block_size, at most tokens.size() - 1 (the last token is always computed, so
  // the runner produces logits for it). 0 when prefix caching is off. No side effects.
  int LookupPrefix(const TokenSpan& tokens, uint64_t salt) const;

  // Makes seq_id's block table cover at least `num_tokens` tokens (it never shrinks). For a
  // seq_id not held yet, first adopts the cached prefix of `tokens` under `salt`: exactly
  // LookupPrefix(tokens, salt) tokens, counted in the prefix-cache statistics. For a seq_id
  // already held, `tokens` and `salt` are ignored. New blocks come from the free list first,
  // then from the least recently used evictable block. Returns false and changes nothing when
  // the pool cannot supply enough blocks. With a sliding window, the cached blocks wholly
  // before the window of the first token to compute (position LookupPrefix(tokens, salt)) are
  // not adopted: their entries hold kReleasedBlock.
  bool Allocate(int64_t seq_id, int num_tokens, const TokenSpan& tokens, uint64_t salt);

  // Tells the manager that seq_id's tokens [0, num_computed_tokens) are in the cache; registers
  // the hashes of its blocks that are now full and computed, so other sequences can share them.
  // `tokens` holds at least num_computed_tokens tokens. A block whose hash is already
  // registered by another block stays private; nothing is registered when prefix caching is
  // off. With a sliding window, then releases the blocks wholly before the window of position
  // num_computed_tokens: the caller computes only later positions of seq_id from now on (a
  // released block does not come back; a sequence that must recompute is freed and allocated
  // again).
  // REQUIRES: seq_id is held and its block table covers num_computed_tokens.
  void MarkComputed(int64_t seq_id, int num_computed_tokens, const TokenSpan& tokens);

  // Releases seq_id's blocks (those the window has not released already): each ref_count--, and a block reaching 0 becomes evictable if
  // hashed (the sequence's last block first, so its first block is evicted last) or free
  // otherwise. False if seq_id is not held.
  bool Free(int64_t seq_id);

  // seq_id's blocks, in token order, kReleasedBlock for those the sliding window released; empty
  // when not held. Valid until the next Allocate, MarkComputed or Free.
  absl::Span<const int32_t> BlockTable(int64_t seq_id) const;
  bool Holds(int64_t seq_id) const { return seqs_.contains(seq_id); }

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }
  int sliding_window() const { return sliding_window_; }
  // The most blocks a sequence of num_tokens tokens holds at once when each step computes at
  // most max_chunk_tokens of them (>= 1) from its earliest uncomputed position: every block of it
  // without a sliding window; with one, at most those covering a chunk and the window before the
  // chunk's first token (ceil(window / block_size) + 1 for decode steps).
  int PeakBlocks(int num_tokens, int max_chunk_tokens) const;
  // Blocks Allocate can hand out: free plus evictable.
  int num_free_blocks() const { return static_cast<int>(free_list_.size()) + num_evictable_; }
  int num_evictable_blocks() const { return num_evictable_; }
  // Blocks with ref_count > 0.
  int num_used_blocks() const { return num_blocks_ - num_free_blocks(); }
  // num_used_blocks / num_blocks, in [0, 1].
  double usage() const { return static_cast<double>(num_used_blocks()) / num_blocks_; }
  int num_seqs() const { return static_cast<int>(seqs_.size()); }
  int RefCount(int32_t block_id) const { return blocks_[block_id].ref_count; }
  bool IsCached(int32_t block_id) const { return blocks_[block_id].hashed; }

  // The changes to the registered hashes since the last call (since creation for the first),
  // and forgets them. Always empty when prefix caching is off.
  KvCacheEvents TakeEvents();
  // Every hash registered now, in no particular order; at most num_blocks of them.
  std::vector<uint64_t> CachedHashes() const;

  // Cumulative prefix-cache statistics, in tokens: tokens looked up by first allocations, and
  // tokens those allocations found cached.
  int64_t prefix_cache_queries() const { return prefix_queries_; }
  int64_t prefix_cache_hits() const { return prefix_hits_; }

 private:
  static constexpr int32_t kNone = -1;  // LRU link to no block

  struct Block {
    int ref_count = 0;
    bool hashed = false;
    uint64_t hash = 0;
    // Evictable LRU links (kNone at the ends or when not in the LRU).
    int32_t lru_prev = kNone;
    int32_t lru_next = kNone;
  };
  struct SeqBlocks {
    std::vector<int32_t> blocks;
    uint64_t salt = 0;
    int num_released = 0;                 // leading entries the window released (kReleasedBlock)
    int num_hashed_blocks = 0;            // leading blocks whose hash is known (chain position)
    uint64_t last_hash = kRootBlockHash;  // hash of block num_hashed_blocks - 1
  };
  struct PrefixMatch {
    std::vector<int32_t> blocks;
    uint64_t last_hash = kRootBlockHash;
  };
  // A hash's change not taken yet: registered (or dropped) since the last TakeEvents.
  struct PendingEvent {
    bool stored = false;
    uint64_t order = 0;  // when it happened, for TakeEvents' order
  };

  explicit KvCacheManager(const KvCacheOptions& options);

  PrefixMatch MatchPrefix(const TokenSpan& tokens, uint64_t salt) const;
  // Leading blocks no query at `position` or later reads: 0 without a sliding window.
  int BlocksBeforeWindow(int position) const;
  // Blocks Allocate would take out of num_free_blocks(): new blocks, plus matched prefix blocks
  // it adopts that would leave the evictable LRU.
  int BlocksToTake(int64_t seq_id, int num_tokens, const PrefixMatch& match) const;
  int32_t TakeBlock();
  void AddRef(int32_t block_id);
  // ref_count--; at 0 the block becomes evictable if hashed, else free.
  void Release(int32_t block_id);
  // MarkComputed's prefix-cache part: hashes and registers seq's newly full computed blocks.
  void RegisterComputed(SeqBlocks& seq, int num_computed_tokens, const TokenSpan& tokens);
  // Releases seq's blocks wholly before the window of `position`.
  void ReleaseBeforeWindow(SeqBlocks& seq, int position);
  void LruPushBack(int32_t block_id);
  void LruRemove(int32_t block_id);
  // Records that `hash` was registered (stored) or dropped. A hash alternates between the two,
  // so a change that undoes a pending one cancels it.
  void RecordEvent(uint64_t hash, bool stored);

  const int num_blocks_;
  const int block_size_;
  const bool enable_prefix_caching_;
  const int sliding_window_;

  std::vector<Block> blocks_;
  std::vector<int32_t> free_list_;  // stack; the back is handed out first
  int32_t lru_head_ = kNone;        // least recently used evictable block
  int32_t lru_tail_ = kNone;
  int num_evictable_ = 0;
  absl::flat_hash_map<uint64_t, int32_t> cached_;  // registered hash -> block
  absl::flat_hash_map<int64_t, SeqBlocks> seqs_;
  absl::flat_hash_map<uint64_t, PendingEvent> pending_events_;  // hash -> its untaken change
  uint64_t next_event_order_ = 0;

  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_
