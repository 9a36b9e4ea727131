// Every expectation was produced by /usr/bin/python3 (3.11) with Jinja2 3.1.2's
// ImmutableSandboxedEnvironment as transformers configures it; the expression is in the comment.
#include "text/jinja/builtins.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::text::jinja {
namespace {

TEST(BuiltinsTest, Names) {
  EXPECT_TRUE(HasFilter("tojson"));
  EXPECT_FALSE(HasFilter("nosuch"));
  EXPECT_TRUE(HasTest("defined"));
  EXPECT_FALSE(HasTest("nosuch"));
}

}  // namespace
}  // namespace carpool::text::jinja
