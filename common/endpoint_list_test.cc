#include "common/endpoint_list.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace carpool {
namespace {

using Endpoints = std::vector<std::string>;

TEST(SplitEndpointListTest, OneEndpointIsOneEntry) {
  EXPECT_EQ(SplitEndpointList("tcp://127.0.0.1:5555"), Endpoints{"tcp://127.0.0.1:5555"});
}

TEST(SplitEndpointListTest, SplitsAtCommasAndStripsWhiteSpace) {
  EXPECT_EQ(SplitEndpointList(" tcp://a:1 ,\ttcp://b:2\n,tcp://c:3"),
            (Endpoints{"tcp://a:1", "tcp://b:2", "tcp://c:3"}));
}

TEST(SplitEndpointListTest, KeepsEmptyEntriesForTheCallerToRefuse) {
  EXPECT_EQ(SplitEndpointList(""), Endpoints{""});
  EXPECT_EQ(SplitEndpointList("tcp://a:1,"), (Endpoints{"tcp://a:1", ""}));
  EXPECT_EQ(SplitEndpointList("tcp://a:1, ,tcp://b:2"), (Endpoints{"tcp://a:1", "", "tcp://b:2"}));
  EXPECT_EQ(SplitEndpointList(" "), Endpoints{""});
}

}  // namespace
}  // namespace carpool
