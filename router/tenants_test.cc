#include "router/tenants.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

TEST(TenantsTest, ParsesTheDocumentedFormat) {
  auto t = TenantTable::Parse(R"pb(
    # comments are fine
    tenant {
      key: "sk-alpha-0123456789"
      name: "alpha"
      max_concurrent: 8
      tokens_per_minute: 60000
      max_priority: PRIORITY_INTERACTIVE
    }
    tenant {
      key: "sk-beta"
      name: "beta"
      burst_tokens: 10
      tokens_per_minute: 600
      batch_tokens_per_minute: 120000
    }
  )pb");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2);
  EXPECT_TRUE(t->enabled());
  EXPECT_EQ(t->at(0).max_concurrent, 8);
  EXPECT_EQ(t->at(0).burst_tokens, 60000);  // defaults to a minute's worth
  EXPECT_EQ(t->at(0).max_priority, Priority::kInteractive);
  EXPECT_EQ(t->at(1).max_priority, Priority::kDefault);
  EXPECT_EQ(t->at(1).burst_tokens, 10);
  EXPECT_EQ(t->at(0).batch_tokens_per_minute, 0);  // no limit
  EXPECT_EQ(t->at(1).batch_tokens_per_minute, 120000);
  EXPECT_NE(t->at(0).cache_salt, 0u);
  EXPECT_NE(t->at(0).cache_salt, t->at(1).cache_salt);
  EXPECT_EQ(t->Authenticate("sk-beta"), 1);
  EXPECT_EQ(t->Authenticate("sk-alpha-0123456789"), 0);
  EXPECT_EQ(t->Authenticate("sk-alpha-012345678"), -1);
  EXPECT_EQ(t->Authenticate(""), -1);
  EXPECT_FALSE(TenantTable().enabled());
}

TEST(TenantsTest, RejectsBadFilesNamingTheProblem) {
  EXPECT_THAT(TenantTable::Parse("tenant { key: \"a\" }").status().message(),
              HasSubstr("name is empty"));
  EXPECT_THAT(TenantTable::Parse("tenant { key: \"a\" name: \"x\" } tenant { key: \"a\" "
                                 "name: \"y\" }")
                  .status()
                  .message(),
              HasSubstr("key is used twice"));
  EXPECT_THAT(TenantTable::Parse("tenant { key: \"a\" name: \"x\" max_concurrent: -1 }")
                  .status()
                  .message(),
              HasSubstr(">= 0"));
  EXPECT_THAT(TenantTable::Parse("tenant { key: \"a\" name: \"x\" batch_tokens_per_minute: -5 }")
                  .status()
                  .message(),
              HasSubstr(">= 0"));
  EXPECT_THAT(TenantTable::Parse("tenant { nonsense: 1 }").status().message(),
              HasSubstr("line 1"));
  EXPECT_EQ(TenantTable::Load("/nonexistent/tenants.txtpb").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TenantsTest, ConstantTimeEqualsAndPriorityOrder) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(PriorityAllowed(Priority::kBatch, Priority::kDefault));
  EXPECT_TRUE(PriorityAllowed(Priority::kDefault, Priority::kDefault));
  EXPECT_FALSE(PriorityAllowed(Priority::kInteractive, Priority::kDefault));
  EXPECT_TRUE(PriorityAllowed(Priority::kInteractive, Priority::kInteractive));
}

TEST(TenantsTest, ARequestNamingNoClassTakesTheTenantsHighest) {
  // A batch-only tenant: no class named (PRIORITY_DEFAULT) runs as batch, not refused.
  EXPECT_EQ(ResolvePriority(Priority::kDefault, Priority::kBatch), Priority::kBatch);
  EXPECT_EQ(ResolvePriority(Priority::kBatch, Priority::kBatch), Priority::kBatch);
  // An explicit class above the tenant's stays, to be refused by admission.
  EXPECT_EQ(ResolvePriority(Priority::kInteractive, Priority::kBatch), Priority::kInteractive);
  // Tenants allowed default or more keep what was asked.
  EXPECT_EQ(ResolvePriority(Priority::kDefault, Priority::kDefault), Priority::kDefault);
  EXPECT_EQ(ResolvePriority(Priority::kDefault, Priority::kInteractive), Priority::kDefault);
  EXPECT_EQ(ResolvePriority(Priority::kBatch, Priority::kInteractive), Priority::kBatch);
}

}  // namespace
}  // namespace carpool::router
