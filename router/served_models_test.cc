#include "router/served_models.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

RegisterInfo Info(const std::string& model, int max_model_len, TokenizerKind kind,
                  const std::string& json = "") {
  RegisterInfo r;
  r.model = model;
  r.max_model_len = max_model_len;
  r.vocab_size = 300;
  r.tokenizer = kind;
  r.tokenizer_json = json;
  return r;
}

TEST(ServedModelsTest, ResolvesByNameAndNamesTheServedOnes) {
  ServedModels m;
  EXPECT_FALSE(m.Register(Info("a", 64, TokenizerKind::kByte)).has_value());
  absl::StatusOr<const ServedModel*> only = m.Resolve("");
  ASSERT_TRUE(only.ok());
  EXPECT_EQ((*only)->name, "a");
  EXPECT_EQ((*only)->tokenizer_state, TokenizerState::kReady);
  EXPECT_FALSE(m.Register(Info("b", 32, TokenizerKind::kNone)).has_value());
  EXPECT_EQ(m.Find("b")->tokenizer_state, TokenizerState::kNone);
  absl::StatusOr<const ServedModel*> none = m.Resolve("");
  EXPECT_TRUE(absl::IsInvalidArgument(none.status()));
  EXPECT_THAT(none.status().message(), HasSubstr("a, b"));
  absl::StatusOr<const ServedModel*> unknown = m.Resolve("c");
  EXPECT_TRUE(absl::IsNotFound(unknown.status()));
  EXPECT_STREQ(ValidationReason(unknown.status()), reason::kUnknownModel);
  // max_model_len: the smallest of the model's workers.
  m.Register(Info("a", 128, TokenizerKind::kByte));
  EXPECT_EQ(m.Find("a")->limits.max_model_len, 64);
  m.Register(Info("a", 16, TokenizerKind::kByte));
  EXPECT_EQ(m.Find("a")->limits.max_model_len, 16);
}

TEST(ServedModelsTest, HandedOverFilesLoadOncePerContentAndAFailureIsRetried) {
  ServedModels m;
  std::optional<TokenizerLoad> load = m.Register(Info("a", 64, TokenizerKind::kHuggingFace, "{1}"));
  ASSERT_TRUE(load.has_value());
  EXPECT_EQ(m.Find("a")->tokenizer_state, TokenizerState::kLoading);
  // The same files for another model while they load: no second load; both get the result.
  EXPECT_FALSE(m.Register(Info("b", 64, TokenizerKind::kHuggingFace, "{1}")).has_value());
  auto tokenizer = std::make_shared<const ByteTokenizer>();
  m.SetTokenizer(*load, std::shared_ptr<const Tokenizer>(tokenizer));
  EXPECT_EQ(m.Find("a")->limits.tokenizer.get(), tokenizer.get());
  EXPECT_EQ(m.Find("b")->limits.tokenizer.get(), tokenizer.get());
  // Cached: a later model with the same files is ready at once.
  EXPECT_FALSE(m.Register(Info("c", 64, TokenizerKind::kHuggingFace, "{1}")).has_value());
  EXPECT_EQ(m.Find("c")->limits.tokenizer.get(), tokenizer.get());
  // Other files that fail: the model says why, and its next registration tries again.
  load = m.Register(Info("d", 64, TokenizerKind::kHuggingFace, "{2}"));
  ASSERT_TRUE(load.has_value());
  m.SetTokenizer(*load, absl::InvalidArgumentError("bad file"));
  EXPECT_EQ(m.Find("d")->tokenizer_state, TokenizerState::kFailed);
  EXPECT_EQ(m.Find("d")->tokenizer_error, "bad file");
  EXPECT_TRUE(m.Register(Info("d", 64, TokenizerKind::kHuggingFace, "{2}")).has_value());
}

}  // namespace
}  // namespace carpool::router
