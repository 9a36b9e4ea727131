#include "worker/kv_cache/kv_cache_manager.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace carpool::worker {
namespace {

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace

absl::Status KvCacheOptions::Validate() const {
  if (num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_blocks must be > 0, got ", num_blocks));
  }
  if (block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("block_size must be > 0, got ", block_size));
  }
  if (sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sliding_window must be >= 0, got ", sliding_window));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(
    const KvCacheOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(options));
}

KvCacheManager::KvCacheManager(const KvCacheOptions& options)
    : num_blocks_(options.num_blocks),
      block_size_(options.block_size),
      enable_prefix_caching_(options.enable_prefix_caching),
      sliding_window_(options.sliding_window),
      blocks_(options.num_blocks) {
  // Hand out block 0 first: the back of the stack is the lowest id.
  free_list_.reserve(num_blocks_);
  for (int32_t id = num_blocks_ - 1; id >= 0; --id) free_list_.push_back(id);
}

KvCacheManager::PrefixMatch KvCacheManager::MatchPrefix(const TokenSpan& tokens,
                                                        uint64_t salt) const {
  PrefixMatch match;
  if (!enable_prefix_caching_ || tokens.size() == 0) return match;
  // Never the block holding the last token: it must be computed to produce logits.
  const int max_blocks = (tokens.size() - 1) / block_size_;
  std::vector<int32_t> block_tokens(block_size_);
  for (int b = 0; b < max_blocks; ++b) {
    for (int i = 0; i < block_size_; ++i) block_tokens[i] = tokens[b * block_size_ + i];
    const uint64_t hash = BlockHash(match.last_hash, block_tokens, salt);
    auto it = cached_.find(hash);
    if (it == cached_.end()) break;
    match.blocks.push_back(it->second);
    match.last_hash = hash;
  }
  return match;
}

int KvCacheManager::LookupPrefix(const TokenSpan& tokens, uint64_t salt) const {
  return static_cast<int>(MatchPrefix(tokens, salt).blocks.size()) * block_size_;
}

int KvCacheManager::PeakBlocks(int num_tokens, int max_chunk_tokens) const {
  const int all = CeilDiv(num_tokens, block_size_);
  if (sliding_window_ == 0) return all;
  // A chunk [s, s + c) reads positions [s - window + 1, s + c): w - 1 + c positions, which
  // touch at most ceil((w - 1 + c) / block_size) + 1 blocks.
  const int chunk = std::min(max_chunk_tokens, num_tokens);
  return std::min(all, CeilDiv(sliding_window_ - 1 + chunk, block_size_) + 1);
}

int KvCacheManager::BlocksBeforeWindow(int position) const {
  if (sliding_window_ == 0) return 0;
  // Block b's last position, (b + 1) * block_size - 1, is before the window's first key
  // position - window + 1.
  return std::max(0, (position - sliding_window_ + 1) / block_size_);
}

int KvCacheManager::BlocksToTake(int64_t seq_id, int num_tokens, const PrefixMatch& match) const {
  auto it = seqs_.find(seq_id);
  if (it != seqs_.end()) {
    return std::max(0,
                    CeilDiv(num_tokens, block_size_) - static_cast<int>(it->second.blocks.size()));
  }
  const int matched = static_cast<int>(match.blocks.size());
  int take = std::max(0, CeilDiv(num_tokens, block_size_) - matched);
  // Matched blocks sitting in the LRU stop being available to others once adopted.
  const int skipped = BlocksBeforeWindow(matched * block_size_);
  for (int b = skipped; b < matched; ++b) {
    if (blocks_[match.blocks[b]].ref_count == 0) ++take;
  }
  return take;
}

bool KvCacheManager::Allocate(int64_t seq_id, int num_tokens, const TokenSpan& tokens,
                              uint64_t salt) {
  const bool is_new = !Holds(seq_id);
  const PrefixMatch match = is_new ? MatchPrefix(tokens, salt) : PrefixMatch{};
  if (BlocksToTake(seq_id, num_tokens, match) > num_free_blocks()) return false;

  SeqBlocks& seq = seqs_[seq_id];
  if (is_new) {
    seq.salt = salt;
    const int matched = static_cast<int>(match.blocks.size());
    // The first token computed is at position matched * block_size; no query reads what lies
    // wholly before its window.
    seq.num_released = std::min(matched, BlocksBeforeWindow(matched * block_size_));
    seq.blocks.assign(seq.num_released, kReleasedBlock);
    for (int b = seq.num_released; b < matched; ++b) {
      AddRef(match.blocks[b]);
      seq.blocks.push_back(match.blocks[b]);
    }
    seq.num_hashed_blocks = matched;
    seq.last_hash = match.last_hash;
    prefix_queries_ += tokens.size();
    prefix_hits_ += static_cast<int64_t>(match.blocks.size()) * block_size_;
  }
  const int needed = CeilDiv(num_tokens, block_size_);
  while (static_cast<int>(seq.blocks.size()) < needed) {
    const int32_t id = TakeBlock();
    AddRef(id);
    seq.blocks.push_back(id);
  }
  return true;
}

void KvCacheManager::MarkComputed(int64_t seq_id, int num_computed_tokens,
                                  const TokenSpan& tokens) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  SeqBlocks& seq = it->second;
  // Register first: the window releases only computed full blocks, and they keep their hash.
  if (enable_prefix_caching_) {
    RegisterComputed(seq, num_computed_tokens, tokens);
  }
  ReleaseBeforeWindow(seq, num_computed_tokens);
}

void KvCacheManager::RegisterComputed(SeqBlocks& seq, int num_computed_tokens,
                                      const TokenSpan& tokens) {
  const int full = std::min(num_computed_tokens / block_size_, static_cast<int>(seq.blocks.size()));
  std::vector<int32_t> block_tokens(block_size_);
  // Every block past num_hashed_blocks is held: the window releases only blocks below
  // position num_computed_tokens - window + 1, which earlier calls have hashed.
  for (int b = seq.num_hashed_blocks; b < full; ++b) {
    CARPOOL_CHECK(b >= seq.num_released);
    for (int i = 0; i < block_size_; ++i) block_tokens[i] = tokens[b * block_size_ + i];
    const uint64_t hash = BlockHash(seq.last_hash, block_tokens, seq.salt);
    Block& block = blocks_[seq.blocks[b]];
    if (!block.hashed && cached_.emplace(hash, seq.blocks[b]).second) {
      block.hashed = true;
      block.hash = hash;
      RecordEvent(hash, /*stored=*/true);
    }
    seq.last_hash = hash;
    seq.num_hashed_blocks = b + 1;
  }
}

bool KvCacheManager::Free(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return false;
  const SeqBlocks& seq = it->second;
  for (int b = static_cast<int>(seq.blocks.size()) - 1; b >= seq.num_released; --b) {
    Release(seq.blocks[b]);
  }
  seqs_.erase(it);
  return true;
}

void KvCacheManager::Release(int32_t block_id) {
  Block& block = blocks_[block_id];
  if (--block.ref_count > 0) return;
  if (block.hashed) {
    LruPushBack(block_id);
  } else {
    free_list_.push_back(block_id);
  }
}

void KvCacheManager::ReleaseBeforeWindow(SeqBlocks& seq, int position) {
  const int end = std::min(BlocksBeforeWindow(position), static_cast<int>(seq.blocks.size()));
  for (; seq.num_released < end; ++seq.num_released) {
    Release(seq.blocks[seq.num_released]);
    seq.blocks[seq.num_released] = kReleasedBlock;
  }
}

absl::Span<const int32_t> KvCacheManager::BlockTable(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

KvCacheEvents KvCacheManager::TakeEvents() {
  std::vector<std::pair<uint64_t, uint64_t>> stored, removed;  // (order, hash)
  for (const auto& [hash, event] : pending_events_) {
    (event.stored ? stored : removed).emplace_back(event.order, hash);
  }
  pending_events_.clear();
  auto in_order = [](std::vector<std::pair<uint64_t, uint64_t>>& changes) {
    std::sort(changes.begin(), changes.end());
    std::vector<uint64_t> hashes;
    hashes.reserve(changes.size());
    for (const auto& [order, hash] : changes) hashes.push_back(hash);
    return hashes;
  };
  KvCacheEvents events;
  events.stored = in_order(stored);
  events.removed = in_order(removed);
  return events;
}

std::vector<uint64_t> KvCacheManager::CachedHashes() const {
  std::vector<uint64_t> hashes;
  hashes.reserve(cached_.size());
  for (const auto& [hash, block] : cached_) hashes.push_back(hash);
  return hashes;
}

void KvCacheManager::RecordEvent(uint64_t hash, bool stored) {
  auto [it, inserted] = pending_events_.try_emplace(hash, PendingEvent{stored, next_event_order_});
  ++next_event_order_;
  if (inserted) return;
  // The pending change was the opposite one (a hash is registered at most once at a time):
  // together they leave the hash as it was when last taken.
  CARPOOL_CHECK(it->second.stored != stored);
  pending_events_.erase(it);
}

int32_t KvCacheManager::TakeBlock() {
  if (!free_list_.empty()) {
    const int32_t id = free_list_.back();
    free_list_.pop_back();
    return id;
  }
  const int32_t id = lru_head_;
  CARPOOL_CHECK(id != kNone);
  LruRemove(id);
  Block& block = blocks_[id];
  auto it = cached_.find(block.hash);
  if (it != cached_.end() && it->second == id) {
    cached_.erase(it);
    RecordEvent(block.hash, /*stored=*/false);
  }
  block.hashed = false;
  block.hash = 0;
  return id;
}

void KvCacheManager::AddRef(int32_t block_id) {
  Block& block = blocks_[block_id];
  if (block.ref_count == 0 && block.hashed) LruRemove(block_id);
  ++block.ref_count;
}

void KvCacheManager::LruPushBack(int32_t block_id) {
  Block& block = blocks_[block_id];
  block.lru_prev = lru_tail_;
  block.lru_next = kNone;
  if (lru_tail_ != kNone) {
    blocks_[lru_tail_].lru_next = block_id;
  } else {
    lru_head_ = block_id;
  }
  lru_tail_ = block_id;
  ++num_evictable_;
}

void KvCacheManager::LruRemove(int32_t block_id) {
  Block& block = blocks_[block_id];
  if (block.lru_prev != kNone) {
    blocks_[block.lru_prev].lru_next = block.lru_next;
  } else {
    lru_head_ = block.lru_next;
  }
  if (block.lru_next != kNone) {
    blocks_[block.lru_next].lru_prev = block.lru_prev;
  } else {
    lru_tail_ = block.lru_prev;
  }
  block.lru_prev = block.lru_next = kNone;
  --num_evictable_;
}

}  // namespace carpool::worker
