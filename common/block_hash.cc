#include "common/block_hash.h"

#include <cstring>

namespace carpool {
namespace {

// XXH64 (Yann Collet's xxHash, 64-bit variant), seed 0. Little-endian reads.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t Read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
uint32_t Read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
uint64_t Round(uint64_t acc, uint64_t input) { return Rotl(acc + input * kP2, 31) * kP1; }
uint64_t MergeRound(uint64_t acc, uint64_t val) { return (acc ^ Round(0, val)) * kP1 + kP4; }

}  // namespace

namespace internal {

uint64_t Xxh64(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = kP1 + kP2, v2 = kP2, v3 = 0, v4 = 0 - kP1;
    for (; p + 32 <= end; p += 32) {
      v1 = Round(v1, Read64(p));
      v2 = Round(v2, Read64(p + 8));
      v3 = Round(v3, Read64(p + 16));
      v4 = Round(v4, Read64(p + 24));
    }
    h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18);
    h = MergeRound(MergeRound(MergeRound(MergeRound(h, v1), v2), v3), v4);
  } else {
    h = kP5;
  }
  h += len;
  for (; p + 8 <= end; p += 8) h = Rotl(h ^ Round(0, Read64(p)), 27) * kP1 + kP4;
  if (p + 4 <= end) {
    h = Rotl(h ^ (uint64_t{Read32(p)} * kP1), 23) * kP2 + kP3;
    p += 4;
  }
  for (; p < end; ++p) h = Rotl(h ^ (uint64_t{*p} * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace internal

uint64_t BlockHash(uint64_t parent_hash, absl::Span<const int32_t> block_tokens, uint64_t salt) {
  std::vector<uint8_t> bytes(16 + 4 * block_tokens.size());
  std::memcpy(bytes.data(), &parent_hash, 8);
  std::memcpy(bytes.data() + 8, &salt, 8);
  if (!block_tokens.empty()) {
    std::memcpy(bytes.data() + 16, block_tokens.data(), 4 * block_tokens.size());
  }
  return internal::Xxh64(bytes.data(), bytes.size());
}

std::vector<uint64_t> PromptBlockHashes(absl::Span<const int32_t> prompt, int block_size,
                                        uint64_t salt) {
  std::vector<uint64_t> chain;
  if (block_size <= 0 || prompt.empty()) return chain;
  const size_t blocks = (prompt.size() - 1) / block_size;
  uint64_t parent = kRootBlockHash;
  for (size_t b = 0; b < blocks; ++b) {
    parent = BlockHash(parent, prompt.subspan(b * block_size, block_size), salt);
    chain.push_back(parent);
  }
  return chain;
}

}  // namespace carpool
