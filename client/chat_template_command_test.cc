#include "client/chat_template_command.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::client {
namespace {

using ::testing::HasSubstr;

struct Result {
  int code;
  std::string out;
  std::string err;
};

// A model folder and input files under a fresh temporary directory.
class ChatTemplateCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("chat_template_command_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "model");
    Write("model/tokenizer_config.json",
          R"({"bos_token": "<s>", "chat_template": [
              {"name": "default",
               "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"},
              {"name": "tool_use", "template": "T{{ tools | length }}{{ flavour }}"},
              {"name": "terse", "template": "{{ messages | length }}"}]})");
    Write("messages.json", R"([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}])");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  Result Run(std::vector<std::string> args) {
    std::vector<char*> argv = {const_cast<char*>("carpool"), const_cast<char*>("chat-template")};
    for (std::string& a : args) argv.push_back(a.data());
    std::ostringstream out, err;
    const int code = RunChatTemplate(static_cast<int>(argv.size()), argv.data(), 2, out, err);
    return {code, out.str(), err.str()};
  }

  std::filesystem::path dir_;
};

TEST_F(ChatTemplateCommandTest, PrintsThePromptExactly) {
  Result r = Run({"--model", Path("model"), "--messages-file", Path("messages.json")});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[system]S[user]hi[assistant]");  // no newline added
  EXPECT_EQ(r.err, "");

  r = Run({"--model", Path("model"), "--messages-file", Path("messages.json"),
           "--no-generation-prompt"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[system]S[user]hi");
}

TEST_F(ChatTemplateCommandTest, ToolsKwargsAndNamedTemplates) {
  Write("tools.json", R"([{"type": "function", "function": {"name": "f"}}])");
  Result r = Run({"--model", Path("model"), "--messages-file", Path("messages.json"),
                  "--tools-file", Path("tools.json"), "--kwargs", R"({"flavour": "!"})"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "T1!");

  r = Run({"--model", Path("model"), "--messages-file", Path("messages.json"), "--chat-template",
           "terse"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "2");

  const std::string file = Write("override.jinja", "{{ messages[1].content | upper }}\n");
  r = Run({"--model", Path("model"), "--messages-file", Path("messages.json"), "--chat-template",
           file});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "HI");  // Jinja2 drops one trailing newline of the source
}

TEST_F(ChatTemplateCommandTest, ChatTemplateJinjaAndSyntheticModels) {
  Write("model/chat_template.jinja", "file:{{ messages[0].role }}");
  Result r = Run({"--model", Path("model"), "--messages-file", Path("messages.json")});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "file:system");

  r = Run({"--model", "synthetic:tiny", "--messages-file", Path("messages.json")});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "system: S\nuser: hi\nassistant:");
}

TEST_F(ChatTemplateCommandTest, UsageErrorsExitTwo) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--messages-file", Path("messages.json")},
           {"--model", Path("model")},
           {"--model", Path("model"), "--messages-file", Path("nope.json")},
           {"--model", Path("model"), "--messages-file", Path("messages.json"), "--tools-file",
            Path("nope.json")},
           {"--model", Path("model"), "--messages-file", Path("messages.json"), "extra"},
           {"--model", Path("model"), "--messages-file", Path("messages.json"), "--bogus"},
       }) {
    Result r = Run(args);
    EXPECT_EQ(r.code, 2) << args.back();
    EXPECT_EQ(r.out, "");
    EXPECT_THAT(r.err, HasSubstr("carpool chat-template: "));
  }
  Result r = Run({"--messages-file", Path("nope.json"), "--model", Path("model")});
  EXPECT_THAT(r.err, HasSubstr("--messages-file: cannot read " + Path("nope.json")));
  r = Run({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--no-generation-prompt"));
}

TEST_F(ChatTemplateCommandTest, TemplateAndRenderErrorsExitOne) {
  Write("bad_role.json", R"([{"role": "bot", "content": "x"}])");
  Result r = Run({"--model", Path("model"), "--messages-file", Path("bad_role.json")});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("messages[0].role must be system, user, assistant, tool or "
                               "developer, not \"bot\""));

  r = Run({"--model", Path("model"), "--messages-file", Path("messages.json"), "--kwargs", "[1]"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("chat_template_kwargs must be a JSON object"));

  r = Run({"--model", Path("model"), "--messages-file", Path("messages.json"), "--chat-template",
           "chatml"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no chat template named 'chatml'"));

  std::filesystem::create_directories(dir_ / "bare");
  r = Run({"--model", Path("bare"), "--messages-file", Path("messages.json")});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("the model has no chat template"));

  r = Run({"--model", Path("no-such-model"), "--messages-file", Path("messages.json")});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("is not a folder"));

  Write("raise.jinja", "{{ raise_exception('no tools here') }}");
  r = Run({"--model", Path("model"), "--messages-file", Path("messages.json"), "--chat-template",
           Path("raise.jinja")});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no tools here"));
}

}  // namespace
}  // namespace carpool::client
