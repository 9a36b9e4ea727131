// Hostile templates: each ends with a clear INVALID_ARGUMENT naming what stopped it, fast, and
// without crashing (deep nesting, cycles) or allocating what it asks for.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "text/jinja/template.h"

namespace carpool::text::jinja {
namespace {

absl::StatusOr<std::string> Render(const std::string& source, const RenderOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  const Value context = Value::FromJson(nlohmann::ordered_json::parse(
      R"({"x": [1, 2], "d": {"k": "v"}, "s": "text", "messages": [{"role": "user", "content": "hi"}]})"));
  return (*t)->Render(context, options);
}

// Renders `source` and expects an INVALID_ARGUMENT containing `message` within a second.
void ExpectStopped(const std::string& source, absl::string_view message,
                   const RenderOptions& options = {}) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> out = Render(source, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(out.ok()) << source.substr(0, 100) << " rendered " << out->substr(0, 100);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(out.status().message(), message))
      << source.substr(0, 100) << ": " << out.status();
  EXPECT_LT(seconds, 1.0) << source.substr(0, 100);
}

TEST(SandboxTest, AttributesReachOnlyValues) {
  // As Jinja2's sandbox: internals are unsafe Undefined (printing one is empty, using it fails),
  // and mutating methods are refused.
  for (const char* probe : {"{{ ''.__class__ }}", "{{ x.__dict__ }}", "{{ d.__class__ }}",
                            "{{ range.__self__ }}", "{{ namespace.__init__ }}"}) {
    absl::StatusOr<std::string> out = Render(probe);
    ASSERT_TRUE(out.ok()) << probe << ": " << out.status();
    EXPECT_EQ(*out, "") << probe;
  }
  ExpectStopped("{{ ''.__class__.__mro__ }}",
                "access to attribute '__class__' of 'str' object is unsafe");
  ExpectStopped("{{ x.__class__.__init__.__globals__ }}", "is unsafe");
  ExpectStopped("{{ x.append(3) }}", "access to attribute 'append' of 'list' object is unsafe");
  ExpectStopped("{{ d.update({'a': 1}) }}",
                "access to attribute 'update' of 'dict' object is unsafe");
  ExpectStopped("{{ d.clear() }}", "unsafe");
  ExpectStopped("{{ messages.pop() }}", "unsafe");
}

TEST(SandboxTest, LoopsAreBounded) {
  ExpectStopped("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                "the template ran more than 1000000 loop iterations");
  ExpectStopped("{% for i in range(10**9) %}{% endfor %}",
                "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  ExpectStopped(
      "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}"
      "{% endfor %}{% endfor %}{% endfor %}",
      "loop iterations");
  RenderOptions small;
  small.limits.max_loop_iterations = 10;
  ExpectStopped("{% for i in range(11) %}{% endfor %}", "more than 10 loop iterations", small);
  EXPECT_TRUE(Render("{% for i in range(5) %}{% endfor %}ok", small).ok());
}

TEST(SandboxTest, RunTimeIsBounded) {
  RenderOptions options;
  options.limits.max_run_time_us = 20'000;
  options.limits.max_loop_iterations = int64_t{1} << 40;
  options.limits.max_output_bytes = int64_t{1} << 40;
  ExpectStopped("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
                "the template ran longer than 20000 microseconds", options);
}

TEST(SandboxTest, RecursionIsBounded) {
  ExpectStopped("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                "the template nested macro calls deeper than 64 levels");
  ExpectStopped("{% macro f() %}{% call f() %}{{ caller() }}{% endcall %}{% endmacro %}{{ f() }}",
                "deeper than 64 levels");
  ExpectStopped("{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}",
                "the template nested macro calls deeper than 64 levels");
  // Even with a generous macro limit the evaluation depth (and so the C++ stack) is bounded.
  RenderOptions deep;
  deep.limits.max_recursion_depth = 1'000'000;
  ExpectStopped("{% macro f(n) %}{{ [[(f(n + 1))]] }}{% endmacro %}{{ f(0) }}",
                "the template nested evaluation deeper than", deep);
}

TEST(SandboxTest, DeepSourceNestingIsRefusedAtParse) {
  for (const std::string& source :
       {"{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}",
        "{{ " + std::string(10000, '[') + std::string(10000, ']') + " }}",
        "{{ " + std::string(10000, '-') + "1 }}"}) {
    absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(source);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().message(), "line 1: the template nests deeper than 256 levels");
  }
}

TEST(SandboxTest, OutputAndStringsAreBounded) {
  ExpectStopped("{{ 'x' * 10**9 }}", "the template built a string of more than 8388608 bytes");
  ExpectStopped("{{ 'x' * 1000000 * 1000 }}", "more than 8388608 bytes");
  ExpectStopped(
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}",
      "more than 8388608 bytes");
  ExpectStopped(
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      "more than 8388608 bytes");
  ExpectStopped(
      "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}",
      "more than 8388608 bytes");
  ExpectStopped("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
                "the template wrote more than 8388608 bytes of output");
  RenderOptions small;
  small.limits.max_output_bytes = 100;
  ExpectStopped("{% for i in range(101) %}x{% endfor %}", "more than 100 bytes", small);
  ExpectStopped("{% set x %}{% for i in range(101) %}x{% endfor %}{% endset %}",
                "more than 100 bytes", small);
  EXPECT_TRUE(Render("{% for i in range(100) %}x{% endfor %}", small).ok());
}

TEST(SandboxTest, NamespacesCannotHoldThemselvesOrNestWithoutBound) {
  // Values are reference counted: a cycle would outlive the render, and printing it recurse.
  ExpectStopped("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
                "a namespace cannot hold itself");
  ExpectStopped("{% set a = namespace() %}{% set b = namespace(x=[a]) %}{% set a.y = {'b': b} %}",
                "a namespace cannot hold itself");
  ExpectStopped(
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
      "{% endfor %}",
      "nested lists, dicts and namespaces deeper than 200 levels");
}

TEST(SandboxTest, LargeLiteralsStayLinear) {
  std::string dict = "{{ {";
  for (int i = 0; i < 100000; ++i) dict += (i ? ", " : "") + ("'k" + std::to_string(i) + "': 1");
  dict += "} | length }}";
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> out = Render(dict);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "100000");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

}  // namespace
}  // namespace carpool::text::jinja
