#include "router/placement.h"

#include <set>

#include "gtest/gtest.h"
#include "router/prefix_index.h"

namespace carpool::router {
namespace {

std::vector<WorkerSnapshot> Workers(std::vector<int64_t> outstanding, int credit = 4) {
  std::vector<WorkerSnapshot> w;
  for (int64_t o : outstanding) w.push_back({credit, o, 0, 0});
  return w;
}

TEST(PlacementTest, ParsesEveryPolicyName) {
  for (const char* name : {"round_robin", "least_loaded", "power_of_two", "prefix_affinity"}) {
    auto p = ParsePlacementPolicy(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_STREQ(PlacementPolicyName(*p), name);
  }
  EXPECT_FALSE(ParsePlacementPolicy("random").ok());
}

TEST(PlacementTest, OnlyWorkersWithCreditAndRoomAreCandidates) {
  std::vector<WorkerSnapshot> w = {{0, 0, 0, 0}, {2, 90, 100, 0}, {2, 0, 100, 0}};
  PlacementInput in;
  in.request_tokens = 20;
  for (PlacementPolicy p : {PlacementPolicy::kRoundRobin, PlacementPolicy::kLeastLoaded,
                            PlacementPolicy::kPowerOfTwo, PlacementPolicy::kPrefixAffinity}) {
    for (uint64_t r = 0; r < 10; ++r) {
      in.cursor = r;
      in.random = r * 7919;
      EXPECT_EQ(Place(p, w, in), 2) << PlacementPolicyName(p);
    }
  }
  // A worker holding nothing takes even a request larger than its capacity.
  in.request_tokens = 500;
  EXPECT_EQ(Place(PlacementPolicy::kLeastLoaded, w, in), 2);
  EXPECT_EQ(Place(PlacementPolicy::kLeastLoaded, Workers({1, 1}, 0), in), std::nullopt);
}

TEST(PlacementTest, RoundRobinCyclesLeastLoadedAndPowerOfTwoPreferLight) {
  const auto w = Workers({50, 10, 30});
  PlacementInput in;
  std::vector<int> order;
  for (uint64_t c = 0; c < 6; ++c) {
    in.cursor = c;
    order.push_back(*Place(PlacementPolicy::kRoundRobin, w, in));
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(Place(PlacementPolicy::kLeastLoaded, w, in), 1);
  std::set<int> picked;
  for (uint64_t r = 0; r < 200; ++r) {
    in.random = r * 2654435761u;
    const int i = *Place(PlacementPolicy::kPowerOfTwo, w, in);
    picked.insert(i);
    EXPECT_NE(i, 0) << "the heaviest worker never wins a pair";
  }
  EXPECT_EQ(picked, (std::set<int>{1, 2}));
}

TEST(PlacementTest, PrefixAffinityTradesCachedTokensAgainstLoad) {
  auto w = Workers({100, 0});
  w[0].cached_prefix_tokens = 256;
  PlacementInput in;
  EXPECT_EQ(Place(PlacementPolicy::kPrefixAffinity, w, in), 0);  // 256 - 100 > 0 - 0
  w[0].outstanding_tokens = 300;
  EXPECT_EQ(Place(PlacementPolicy::kPrefixAffinity, w, in), 1);  // 256 - 300 < 0
  in.affinity_load_weight = 0.5;
  EXPECT_EQ(Place(PlacementPolicy::kPrefixAffinity, w, in), 0);  // 256 - 150 > 0
  // Without cached blocks anywhere it is least_loaded.
  w[0].cached_prefix_tokens = 0;
  EXPECT_EQ(Place(PlacementPolicy::kPrefixAffinity, w, in), 1);
}

TEST(PrefixIndexTest, MatchesLeadingBlocksAndAppliesEvents) {
  std::vector<int32_t> prompt(70);
  for (int i = 0; i < 70; ++i) prompt[i] = i;
  const auto chain = PromptBlockHashes(prompt, 16, 7);
  ASSERT_EQ(chain.size(), 4u);  // 69 reusable tokens: 4 full blocks
  EXPECT_NE(PromptBlockHashes(prompt, 16, 8), chain) << "salted";
  std::vector<int32_t> exact(64);
  for (int i = 0; i < 64; ++i) exact[i] = i;
  EXPECT_EQ(PromptBlockHashes(exact, 16, 7).size(), 3u) << "the last token is always computed";

  PrefixIndex index;
  index.Apply("w1", KvEventsInfo{1, false, {chain[0], chain[1], chain[3]}, {}}, 100);
  EXPECT_EQ(index.MatchedBlocks("w1", chain), 2);
  EXPECT_EQ(index.MatchedBlocks("w2", chain), 0);
  index.Apply("w1", KvEventsInfo{1, false, {chain[2]}, {chain[0]}}, 100);
  EXPECT_EQ(index.MatchedBlocks("w1", chain), 0);
  index.Apply("w1", KvEventsInfo{1, true, {chain[0]}, {}}, 100);
  EXPECT_EQ(index.Size("w1"), 1);
  index.Apply("w1", KvEventsInfo{1, false, {chain[1], chain[2], chain[3]}, {}}, 2);
  EXPECT_EQ(index.Size("w1"), 2) << "bounded by the worker's cache size";
  index.RemoveWorker("w1");
  EXPECT_EQ(index.Size("w1"), 0);
}

}  // namespace
}  // namespace carpool::router
