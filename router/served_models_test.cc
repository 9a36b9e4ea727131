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

TEST(ServedModelsTest, ChatTemplatesComeWithTheTokenizerAndTheirErrorsNameEachModel) {
  ServedModels m;
  // Byte models: the built-in template.
  m.Register(Info("bytes", 64, TokenizerKind::kByte));
  EXPECT_EQ(m.Find("bytes")->chat_template, text::ChatTemplate::Builtin());
  // Token-id models have none (and no tokenizer either).
  m.Register(Info("ids", 64, TokenizerKind::kNone));
  EXPECT_EQ(m.Find("ids")->chat_template, nullptr);
  // An hf model's: the load's, shared with a later model of the same files through the cache.
  RegisterInfo a = Info("a", 64, TokenizerKind::kHuggingFace, "{1}");
  a.chat_template_jinja = "{{ messages[0].content }}";
  std::optional<TokenizerLoad> load = m.Register(a);
  ASSERT_TRUE(load.has_value());
  EXPECT_EQ(load->chat_template_jinja, a.chat_template_jinja);
  auto tmpl = text::ChatTemplate::FromModelFiles("", a.chat_template_jinja, {});
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  m.SetTokenizer(*load, std::shared_ptr<const Tokenizer>(std::make_shared<ByteTokenizer>()),
                 ChatTemplateLoad{*tmpl, absl::OkStatus()});
  EXPECT_EQ(m.Find("a")->chat_template, *tmpl);
  RegisterInfo a2 = a;
  a2.model = "a2";
  EXPECT_FALSE(m.Register(a2).has_value());
  EXPECT_EQ(m.Find("a2")->chat_template, *tmpl);
  // Another chat_template.jinja with the same tokenizer files is another load.
  RegisterInfo b = Info("b", 64, TokenizerKind::kHuggingFace, "{1}");
  load = m.Register(b);
  ASSERT_TRUE(load.has_value());
  EXPECT_EQ(load->chat_template_jinja, "");
  m.SetTokenizer(*load, std::shared_ptr<const Tokenizer>(std::make_shared<ByteTokenizer>()),
                 ChatTemplateLoad{nullptr, absl::NotFoundError("the model has no chat template")});
  EXPECT_EQ(m.Find("b")->chat_template, nullptr);
  EXPECT_THAT(m.Find("b")->chat_template_error,
              HasSubstr("model 'b' has no chat template (tokenizer_config.json has no "
                        "chat_template and the folder no chat_template.jinja): start the router "
                        "with --chat-template FILE"));
  RegisterInfo b2 = b;
  b2.model = "b2";
  EXPECT_FALSE(m.Register(b2).has_value());
  EXPECT_THAT(m.Find("b2")->chat_template_error, HasSubstr("model 'b2' has no chat template"));
  EXPECT_THAT(ChatTemplateError("c", absl::InvalidArgumentError("line 3: unsupported tag 'x'")),
              HasSubstr("the chat template of model 'c' did not load (line 3: unsupported tag "
                        "'x')"));
}

TEST(ServedModelsTest, ByteModelsTakeTheRoutersTemplateFile) {
  text::ChatTemplateOptions file;
  file.override_source = "{{ messages | length }}";
  ChatTemplateLoad t = ByteModelsChatTemplate(file);
  ASSERT_NE(t.chat_template, nullptr) << t.status;
  EXPECT_EQ(t.chat_template->source(), file.override_source);
  ServedModels m(t);
  m.Register(Info("bytes", 64, TokenizerKind::kByte));
  EXPECT_EQ(m.Find("bytes")->chat_template, t.chat_template);
  // A name picks from a model's list, which byte models have not: they keep the built-in one.
  text::ChatTemplateOptions name;
  name.override_name = "tool_use";
  EXPECT_EQ(ByteModelsChatTemplate(name).chat_template, text::ChatTemplate::Builtin());
  text::ChatTemplateOptions bad;
  bad.override_source = "{% include 'x' %}";
  ChatTemplateLoad b = ByteModelsChatTemplate(bad);
  EXPECT_EQ(b.chat_template, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(b.status)) << b.status;
}

}  // namespace
}  // namespace carpool::router
