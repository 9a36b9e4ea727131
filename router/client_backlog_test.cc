// ClientBacklog: order, limits, what an overflow drops and keeps, clients that are gone.
#include "router/client_backlog.h"

#include <map>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::router {
namespace {

using ::testing::ElementsAre;
using Added = ClientBacklog::Added;

// A fake pipe per client: takes `room` frames, then is full; `gone` clients answer UNAVAILABLE.
struct Pipes {
  std::map<std::string, int> room;
  std::map<std::string, std::vector<std::string>> got;
  std::set<std::string> gone;
  ClientBacklog::SendFn Fn() {
    return [this](const std::string& client, const std::string& frame) {
      if (gone.contains(client)) return absl::UnavailableError("gone");
      if (room[client] <= 0) return absl::ResourceExhaustedError("full");
      --room[client];
      got[client].push_back(frame);
      return absl::OkStatus();
    };
  }
};

ClientBacklog Small() {
  ClientBacklogOptions o;
  o.max_messages = 4;
  o.max_bytes = 1 << 20;
  return ClientBacklog(o);
}

TEST(ClientBacklogTest, DeliversInOrderAsThePipeMakesRoom) {
  ClientBacklog b = Small();
  EXPECT_FALSE(b.Has("a"));
  EXPECT_EQ(b.Add("a", "r1", "c1", true), Added::kQueued);
  EXPECT_EQ(b.Add("a", "r1", "c2", true), Added::kQueued);
  EXPECT_EQ(b.Add("a", "r1", "f1", false), Added::kQueued);
  EXPECT_TRUE(b.Has("a"));
  Pipes p;
  std::vector<std::string> gone;
  p.room["a"] = 2;
  b.Flush(p.Fn(), &gone);
  EXPECT_THAT(p.got["a"], ElementsAre("c1", "c2"));
  EXPECT_TRUE(b.Has("a"));
  p.room["a"] = 10;
  b.Flush(p.Fn(), &gone);
  EXPECT_THAT(p.got["a"], ElementsAre("c1", "c2", "f1"));
  EXPECT_FALSE(b.Has("a"));
  EXPECT_TRUE(b.empty());
  EXPECT_TRUE(gone.empty());
}

TEST(ClientBacklogTest, OverflowDropsChunksOfUnendedRequestsAndKeepsWholeStreams) {
  ClientBacklog b = Small();
  // r1 ended (final queued), r2 still streaming.
  EXPECT_EQ(b.Add("a", "r1", "r1c0", true), Added::kQueued);
  EXPECT_EQ(b.Add("a", "r2", "r2c0", true), Added::kQueued);
  EXPECT_EQ(b.Add("a", "r1", "r1f", false), Added::kQueued);
  EXPECT_EQ(b.Add("a", "r2", "r2c1", true), Added::kQueued);
  EXPECT_EQ(b.Add("a", "r2", "r2c2", true), Added::kTooSlow);
  EXPECT_TRUE(b.TooSlow("a"));
  EXPECT_TRUE(b.LostChunks("a", "r2"));
  EXPECT_FALSE(b.LostChunks("a", "r1"));
  // Later chunks are not queued; errors are.
  EXPECT_EQ(b.Add("a", "r2", "r2c3", true), Added::kDiscarded);
  EXPECT_EQ(b.Add("a", "r2", "r2err", false), Added::kQueued);
  EXPECT_FALSE(b.TooSlow("b"));  // another client is not affected
  EXPECT_EQ(b.Add("b", "x", "b1", true), Added::kQueued);
  Pipes p;
  p.room["a"] = 100;
  p.room["b"] = 100;
  std::vector<std::string> gone;
  b.Flush(p.Fn(), &gone);
  EXPECT_THAT(p.got["a"], ElementsAre("r1c0", "r1f", "r2err"));
  EXPECT_THAT(p.got["b"], ElementsAre("b1"));
  // Delivered: the client is served normally again.
  EXPECT_FALSE(b.TooSlow("a"));
  EXPECT_FALSE(b.LostChunks("a", "r2"));
  EXPECT_EQ(b.discarded(), 1);
}

TEST(ClientBacklogTest, ByteLimitCountsToo) {
  ClientBacklogOptions o;
  o.max_messages = 1000;
  o.max_bytes = 10;
  ClientBacklog b(o);
  EXPECT_EQ(b.Add("a", "r1", std::string(6, 'x'), true), Added::kQueued);
  EXPECT_EQ(b.Add("a", "r1", std::string(6, 'y'), true), Added::kTooSlow);
}

TEST(ClientBacklogTest, AnswersAreNeverDroppedButATooSlowClientsMessagesAreCounted) {
  ClientBacklog b = Small();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(b.TakeMessage("a"));
    EXPECT_EQ(b.Add("a", "", "stats", false), Added::kQueued);
  }
  EXPECT_EQ(b.Add("a", "", "stats", false), Added::kTooSlow);
  // Errors ending its requests (as many as it had) are all kept.
  for (int i = 0; i < 100; ++i) EXPECT_EQ(b.Add("a", "r", "e", false), Added::kQueued);
  const int allowed = ClientBacklog::kSaturationFactor * 4;
  for (int i = 0; i < allowed; ++i) {
    EXPECT_TRUE(b.TakeMessage("a")) << i;
    EXPECT_EQ(b.Add("a", "", "refused", false), Added::kQueued);
  }
  EXPECT_FALSE(b.TakeMessage("a"));
  EXPECT_TRUE(b.TakeMessage("b"));
  Pipes p;
  p.room["a"] = 1000;
  std::vector<std::string> gone;
  b.Flush(p.Fn(), &gone);
  EXPECT_EQ(p.got["a"].size(), static_cast<size_t>(5 + 100 + allowed));
  EXPECT_TRUE(b.TakeMessage("a"));  // delivered: counted afresh
}

TEST(ClientBacklogTest, GoneClientsAreReportedAndForgotten) {
  ClientBacklog b = Small();
  EXPECT_EQ(b.Add("a", "r1", "f", false), Added::kQueued);
  EXPECT_EQ(b.Add("b", "r1", "f", false), Added::kQueued);
  Pipes p;
  p.gone.insert("a");
  p.room["b"] = 0;
  std::vector<std::string> gone;
  b.Flush(p.Fn(), &gone);
  EXPECT_THAT(gone, ElementsAre("a"));
  EXPECT_FALSE(b.Has("a"));
  EXPECT_TRUE(b.Has("b"));
  b.Erase("b");
  EXPECT_TRUE(b.empty());
}

}  // namespace
}  // namespace carpool::router
