#include "common/block_hash.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace carpool {
namespace {

TEST(BlockHashTest, Xxh64KnownVectors) {
  EXPECT_EQ(internal::Xxh64("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(internal::Xxh64("abc", 3), 0x44BC2CF5AD770999ULL);
  const std::string long_input = "Nobody inspects the spammish repetition";
  EXPECT_EQ(internal::Xxh64(long_input.data(), long_input.size()), 0xFBCEA83C8A378BF1ULL);
}

TEST(BlockHashTest, DependsOnParentTokensAndSalt) {
  const std::vector<int32_t> a = {1, 2, 3, 4};
  const std::vector<int32_t> b = {1, 2, 3, 5};
  const uint64_t h = BlockHash(kRootBlockHash, a, 0);
  EXPECT_EQ(h, BlockHash(kRootBlockHash, a, 0));
  EXPECT_NE(h, BlockHash(kRootBlockHash, b, 0));
  EXPECT_NE(h, BlockHash(kRootBlockHash, a, 1));
  EXPECT_NE(h, BlockHash(h, a, 0));
}

// The chain is BlockHash folded over the prompt's full blocks before its last token.
TEST(BlockHashTest, PromptChainFoldsFullBlocksBeforeTheLastToken) {
  std::vector<int32_t> prompt(70);
  for (int i = 0; i < 70; ++i) prompt[i] = 3 * i + 1;
  const std::vector<uint64_t> chain = PromptBlockHashes(prompt, 16, 7);
  ASSERT_EQ(chain.size(), 4u);
  uint64_t parent = kRootBlockHash;
  for (size_t b = 0; b < chain.size(); ++b) {
    parent = BlockHash(parent, absl::MakeConstSpan(prompt).subspan(b * 16, 16), 7);
    EXPECT_EQ(chain[b], parent) << "block " << b;
  }
  EXPECT_TRUE(PromptBlockHashes(prompt, 0, 7).empty());
  EXPECT_TRUE(PromptBlockHashes({}, 16, 7).empty());
  EXPECT_TRUE(PromptBlockHashes(absl::MakeConstSpan(prompt).first(16), 16, 7).empty());
}

}  // namespace
}  // namespace carpool
