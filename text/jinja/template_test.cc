#include "text/jinja/template.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace carpool::text::jinja {
namespace {

struct Case {
  const char* source;
  const char* context_json;
  const char* expected;  // Jinja2's rendering
};
struct ErrorCase {
  const char* source;
  const char* context_json;
};

#include "text/jinja/template_test_cases.inc"
#include "text/jinja/template_test_real.inc"

Value Context(absl::string_view json) {
  return Value::FromJson(nlohmann::ordered_json::parse(json.begin(), json.end()));
}

absl::StatusOr<std::string> Render(absl::string_view source, absl::string_view context_json,
                                   const RenderOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return (*t)->Render(Context(context_json), options);
}

template <size_t N>
void ExpectAsJinja2(const Case (&cases)[N]) {
  for (const Case& c : cases) {
    absl::StatusOr<std::string> out = Render(c.source, c.context_json);
    ASSERT_TRUE(out.ok()) << c.source << "\n" << out.status();
    EXPECT_EQ(*out, c.expected) << c.source;
  }
}

TEST(TemplateTest, WhitespaceControlAsJinja2) { ExpectAsJinja2(kWhitespace); }
TEST(TemplateTest, ExpressionsAsJinja2) { ExpectAsJinja2(kExpressions); }
TEST(TemplateTest, StatementsAndScopesAsJinja2) { ExpectAsJinja2(kStatements); }
TEST(TemplateTest, MacrosAndCallBlocksAsJinja2) { ExpectAsJinja2(kMacros); }

TEST(TemplateTest, FailsWhereJinja2Raises) {
  for (const ErrorCase& c : kBothRaise) {
    absl::StatusOr<std::string> out = Render(c.source, c.context_json);
    ASSERT_FALSE(out.ok()) << c.source << " rendered " << *out;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << c.source;
  }
}

TEST(TemplateTest, RealTemplatesAsJinja2) {
  for (const RealCase& c : kRealCases) {
    const char* source = nullptr;
    for (const RealTemplate& t : kRealTemplates) {
      if (absl::string_view(t.name) == c.template_name) source = t.source;
    }
    ASSERT_NE(source, nullptr);
    absl::StatusOr<std::string> out = Render(source, c.context_json);
    ASSERT_TRUE(out.ok()) << c.template_name << " " << c.context_json << "\n" << out.status();
    EXPECT_EQ(*out, c.expected) << c.template_name << " " << c.context_json;
  }
}

TEST(TemplateTest, RaiseExceptionGivesTheTemplatesMessageAsIs) {
  absl::StatusOr<std::string> out = Render(
      "ok\n{% if messages|length == 0 %}{{ raise_exception('Conversation roles must "
      "alternate user/assistant/user/assistant/...') }}{% endif %}",
      R"({"messages": []})");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(TemplateTest, RenderErrorsNameTheLine) {
  absl::StatusOr<std::string> out = Render("a\n{{ 1 }}\n{{ x.y.z }}", "{}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "line 3: 'x' is undefined");
  out = Render("{% for m in messages %}\n{{ m.content + 1 }}{% endfor %}",
               R"({"messages": [{"content": "a"}]})");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "line 2: can only concatenate str (not \"int\") to str");
  out = Render("{% set x = 5 %}\n\n{% set x.y = 1 %}", "{}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "line 3: cannot assign attribute on non-namespace object");
  out = Render("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "{}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "line 1: macro 'm' takes not more than 1 argument(s)");
}

TEST(TemplateTest, UnknownFilterInsideAnIfFailsOnlyWhenItRuns) {
  // Jinja2 accepts an unknown filter in an `if` body at compile time and raises only when the
  // filter is called ("No filter named 'nosuch' found.").
  const char* source = "{% if x %}{{ x | nosuch }}{% else %}n{% endif %}";
  absl::StatusOr<std::string> out = Render(source, "{}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "n");
  out = Render(source, R"({"x": 1})");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "line 1: No filter named 'nosuch' found.");
  // An inline if is such a frame too, its value included: Jinja2 renders
  // "{{ x|nosuch if false }}ok" as "ok" and refuses "{{ x|nosuch }}{{ 1 if 2 }}" at compile time.
  out = Render("{{ x|nosuch if false }}ok", "{}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "ok");
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse("{{ x|nosuch }}{{ 1 if 2 }}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "line 1: unknown filter 'nosuch'");
}

TEST(TemplateTest, RecursiveLoopsAsJinja2) {
  const char* tree = R"({"t": [{"n": "a", "c": [{"n": "b", "c": []}, {"n": "c"}]}, {"n": "d"}]})";
  // Jinja2: each level has its own loop object, its filter and its else; the body's scope is
  // the loop's, not the caller's iteration.
  absl::StatusOr<std::string> out = Render(
      "{% for x in t recursive %}<{{ loop.depth }}{{ loop.depth0 }}{{ x.n }}{% if x.c is defined "
      "%}[{{ loop(x.c) }}]{% endif %}{{ loop.index }}{{ loop.length }}>{% else %}E{% endfor %}",
      tree);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<10a[<21b[E]12><21c22>]12><10d22>");
  out = Render(
      "{% for x in t if x.n != 'c' recursive %}{{ x.n }}{% if x.c %}({{ loop(x.c) }}){% endif "
      "%}{% endfor %}",
      tree);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "a(b)d");
  out = Render(
      "{% for x in [1] recursive %}{{ z }}{% set z = 5 %}{% if x < 3 %}{{ loop([x + 1]) }}"
      "{% endif %}{% endfor %}",
      "{}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "");
  // Jinja2: "The loop must have the 'recursive' marker to be called recursively."
  out = Render(
      "{% for x in [1] recursive %}{% for y in [2] %}{{ loop([]) }}{% endfor %}{% endfor %}", "{}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(),
            "line 1: The loop must have the 'recursive' marker to be called recursively.");
}

TEST(TemplateTest, SetLoopOutsideAForBodyIsAVariable) {
  // Jinja2: "{% set loop = 5 %}{{ loop }}" is "5"; a macro body is not the loop's body.
  absl::StatusOr<std::string> out = Render(
      "{% set loop = 5 %}{{ loop }}{% macro m() %}{% set loop = 1 %}{{ loop }}{% endmacro %}"
      "{% for x in [1] %}{{ m() }}{{ loop.index }}{% endfor %}",
      "{}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "511");
}

TEST(TemplateTest, ContextOverridesGlobalsAndSetOverridesContext) {
  // Jinja2: render args shadow globals; a top-level set shadows the render args.
  absl::StatusOr<std::string> out =
      Render("{{ range }}|{{ x }}{% set x = 2 %}{{ x }}", R"({"range": "r", "x": 1})");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "r|12");
}

TEST(TemplateTest, StrftimeNowFormatsTheInjectedClockInLocalTime) {
  setenv("TZ", "UTC", 1);
  tzset();
  RenderOptions options;
  options.now_unix_micros = [] { return int64_t{1700000000123456}; };
  // Python: datetime.fromtimestamp(1700000000.123456, timezone.utc).strftime(...)
  absl::StatusOr<std::string> out =
      Render("{{ strftime_now('%Y-%m-%d %H:%M:%S.%f %d %B %Y') }}", "{}", options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "2023-11-14 22:13:20.123456 14 November 2023");
  // datetime.now() is naive: Jinja2 renders "{{ strftime_now('%Z|%z|%%z') }}" as "||%z".
  out = Render("{{ strftime_now('%Z|%z|%%z') }}", "{}", options);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "||%z");
}

TEST(TemplateTest, ParseRefusesNamingTheConstructAndLine) {
  struct Refused {
    const char* source;
    const char* message;
  };
  const Refused refused[] = {
      {"a\n{% include 'x.j2' %}", "line 2: unsupported tag 'include'"},
      {"{% extends 'base' %}", "line 1: unsupported tag 'extends'"},
      {"\n\n{% block body %}{% endblock %}", "line 3: unsupported tag 'block'"},
      {"{% import 'm' as m %}", "line 1: unsupported tag 'import'"},
      {"{% from 'm' import x %}", "line 1: unsupported tag 'from'"},
      {"{% do x.append(1) %}", "line 1: unknown tag 'do'"},
      {"{{ x | nosuch }}", "line 1: unknown filter 'nosuch'"},
      {"{{ x is nosuch }}", "line 1: unknown test 'nosuch'"},
      {"{% break %}", "line 1: 'break' outside of a loop"},
      {"{% if x %}\n", "line 1: unexpected end of template, expected 'elif' or 'else' or 'endif'"},
      {"{% endif %}", "line 1: unexpected 'endif'"},
      {"{{ x ) }}", "line 1: unexpected ')'"},
      {"{{ 'abc }}", "line 1: unexpected char ''' (an unterminated string)"},
      {"{# never closed", "line 1: missing end of comment tag"},
  };
  for (const Refused& r : refused) {
    absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(r.source);
    ASSERT_FALSE(t.ok()) << r.source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t.status().message(), r.message) << r.source;
  }
}

TEST(TemplateTest, RendersFromSeveralThreadsAtOnce) {
  const RealTemplate& qwen = kRealTemplates[2];
  ASSERT_EQ(absl::string_view(qwen.name), "qwen3");
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(qwen.source);
  ASSERT_TRUE(t.ok()) << t.status();
  const RealCase& c = kRealCases[8];
  ASSERT_EQ(absl::string_view(c.template_name), "qwen3");
  const Value context = Context(c.context_json);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<std::string> out = (*t)->Render(context);
        if (!out.ok() || *out != c.expected) ++mismatches[k];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(TemplateTest, QwenTemplateOverTwentyMessagesIsFast) {
  const RealTemplate& qwen = kRealTemplates[2];
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(qwen.source);
  ASSERT_TRUE(t.ok()) << t.status();
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
  for (int i = 0; messages.size() < 20; ++i) {
    messages.push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + "?"}});
    messages.push_back({{"role", "assistant"}, {"content", "Answer " + std::to_string(i) + "."}});
  }
  nlohmann::ordered_json context = {{"messages", messages}, {"add_generation_prompt", true}};
  const Value value = Value::FromJson(context);
  constexpr int kRuns = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) ASSERT_TRUE((*t)->Render(value).ok());
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
      kRuns;
  // About 40 us on the development machine; the bound only catches a gross regression.
  EXPECT_LT(us, 2000.0);
}

}  // namespace
}  // namespace carpool::text::jinja
