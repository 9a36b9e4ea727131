// The prefix-cache block hash chain. A worker's KV cache registers each full block of computed
// tokens under its hash, and the router predicts those hashes from a prompt to place requests by
// prefix (prefix_affinity), so both must compute them by this one definition.
#ifndef CARPOOL_COMMON_BLOCK_HASH_H_
#define CARPOOL_COMMON_BLOCK_HASH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace carpool {

// The parent of a sequence's first block.
inline constexpr uint64_t kRootBlockHash = 0;

// Hash of one full block: 64-bit XXH64 over (parent_hash, salt, the block's token ids), a pure
// function of its arguments, the same in every process. Equal hashes mean equal token prefixes
// under the same salt (a tenant's).
uint64_t BlockHash(uint64_t parent_hash, absl::Span<const int32_t> block_tokens, uint64_t salt);

// The hash chain of the full blocks of `prompt` that a prefix cache could supply: the blocks
// wholly before the prompt's last token (that one is always computed), under `salt`.
std::vector<uint64_t> PromptBlockHashes(absl::Span<const int32_t> prompt, int block_size,
                                        uint64_t salt);

namespace internal {
// XXH64 with seed 0 over `len` bytes; exposed for tests.
uint64_t Xxh64(const void* data, size_t len);
}  // namespace internal

}  // namespace carpool

#endif  // CARPOOL_COMMON_BLOCK_HASH_H_
