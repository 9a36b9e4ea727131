#include "text/jinja/parser.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace carpool::text::jinja {
namespace {

// An S-expression of an expression tree: (+ a (* b c)), (filter abs (neg x)), ...
std::string Show(const Program& p, const Expr* e) {
  if (e == nullptr) return "null";
  auto kids = [&](size_t from = 0) {
    std::vector<std::string> parts;
    for (size_t i = from; i < e->a.size(); ++i) parts.push_back(Show(p, e->a[i].get()));
    return absl::StrJoin(parts, " ");
  };
  switch (e->kind) {
    case ExprKind::kConst:
      return e->value.Repr();
    case ExprKind::kName:
      return p.names[e->name];
    case ExprKind::kBlockValue:
      return "<block>";
    case ExprKind::kGetAttr:
      return absl::StrCat("(. ", kids(), " ", e->str, ")");
    case ExprKind::kGetItem:
      return absl::StrCat("([] ", kids(), ")");
    case ExprKind::kSlice:
      return absl::StrCat("(slice ", kids(), ")");
    case ExprKind::kCall:
      return absl::StrCat("(call ", kids(), " #", e->call.args.size(), ")");
    case ExprKind::kFilter:
      return absl::StrCat("(filter ", e->str, " ", kids(), ")");
    case ExprKind::kTest:
      return absl::StrCat("(is ", e->str, " ", kids(), ")");
    case ExprKind::kNeg:
      return absl::StrCat("(neg ", kids(), ")");
    case ExprKind::kPos:
      return absl::StrCat("(pos ", kids(), ")");
    case ExprKind::kNot:
      return absl::StrCat("(not ", kids(), ")");
    case ExprKind::kBinary: {
      static const char* kOps[] = {"+", "-", "*", "/", "//", "%", "**"};
      return absl::StrCat("(", kOps[static_cast<int>(e->op)], " ", kids(), ")");
    }
    case ExprKind::kConcat:
      return absl::StrCat("(~ ", kids(), ")");
    case ExprKind::kAnd:
      return absl::StrCat("(and ", kids(), ")");
    case ExprKind::kOr:
      return absl::StrCat("(or ", kids(), ")");
    case ExprKind::kCompare: {
      static const char* kOps[] = {"==", "!=", "<", "<=", ">", ">=", "in", "notin"};
      std::string s = absl::StrCat("(cmp ", Show(p, e->a[0].get()));
      for (size_t i = 0; i < e->compare_ops.size(); ++i) {
        absl::StrAppend(&s, " ", kOps[static_cast<int>(e->compare_ops[i])], " ",
                        Show(p, e->a[i + 1].get()));
      }
      return s + ")";
    }
    case ExprKind::kCondExpr:
      return absl::StrCat("(if ", kids(), ")");
    case ExprKind::kList:
      return absl::StrCat("[", kids(), "]");
    case ExprKind::kTuple:
      return absl::StrCat("(tuple ", kids(), ")");
    case ExprKind::kDict:
      return absl::StrCat("{", kids(), "}");
  }
  return "?";
}

// The tree of `{{ expression }}`.
std::string Tree(absl::string_view expression) {
  absl::StatusOr<std::unique_ptr<Program>> p = ParseProgram(absl::StrCat("{{ ", expression, " }}"));
  if (!p.ok()) return std::string(p.status().message());
  if ((*p)->body.size() != 1 || (*p)->body[0]->kind != StmtKind::kPrint) return "not one print";
  return Show(**p, (*p)->body[0]->expr.get());
}

TEST(ParserTest, PrecedenceAsJinja2) {
  EXPECT_EQ(Tree("a + b * c"), "(+ a (* b c))");
  EXPECT_EQ(Tree("a - b - c"), "(- (- a b) c)");
  // ~ sits between + and *.
  EXPECT_EQ(Tree("a ~ b + c"), "(+ (~ a b) c)");
  EXPECT_EQ(Tree("a * b ~ c * d"), "(~ (* a b) (* c d))");
  // ** is left-associative, and unary minus binds tighter: -2 ** 2 is 4.
  EXPECT_EQ(Tree("a ** b ** c"), "(** (** a b) c)");
  EXPECT_EQ(Tree("-a ** b"), "(** (neg a) b)");
  // Filters and tests bind at the unary/postfix level.
  EXPECT_EQ(Tree("-x | abs"), "(filter abs (neg x))");
  EXPECT_EQ(Tree("x | length - 1"), "(- (filter length x) 1)");
  EXPECT_EQ(Tree("a.b | join(', ') ~ c"), "(~ (filter join (. a b)) c)");
  EXPECT_EQ(Tree("not x is defined"), "(not (is defined x))");
  EXPECT_EQ(Tree("x is not none and y"), "(and (not (is none x)) y)");
  EXPECT_EQ(Tree("x is divisibleby 3"), "(is divisibleby x)");
  EXPECT_EQ(Tree("not a == b"), "(not (cmp a == b))");
  EXPECT_EQ(Tree("a or b and c"), "(or a (and b c))");
  EXPECT_EQ(Tree("a < b < c"), "(cmp a < b < c)");
  EXPECT_EQ(Tree("a not in b"), "(cmp a notin b)");
  EXPECT_EQ(Tree("a if b else c if d else e"), "(if b a (if d c e))");
  EXPECT_EQ(Tree("a if b"), "(if b a null)");
  EXPECT_EQ(Tree("x[::-1]"), "(slice x null null (neg 1))");
  EXPECT_EQ(Tree("x[1:]"), "(slice x 1 null null)");
  EXPECT_EQ(Tree("x.y[0].z(1, k=2)"), "(call (. ([] (. x y) 0) z) #1)");
  EXPECT_EQ(Tree("x.0"), "([] x 0)");
  EXPECT_EQ(Tree("1, 2"), "(tuple 1 2)");
  EXPECT_EQ(Tree("(1,)"), "(tuple 1)");
  EXPECT_EQ(Tree("()"), "(tuple )");
  EXPECT_EQ(Tree("[1, 'a', none, true]"), "[1 'a' None True]");
  EXPECT_EQ(Tree("{'a': 1}"), "{'a' 1}");
  EXPECT_EQ(Tree("'a' 'b'"), "'ab'");
}

TEST(ParserTest, StatementsAndTargets) {
  absl::StatusOr<std::unique_ptr<Program>> p = ParseProgram(
      "{% for k, v in d.items() if v %}{{ k }}{% else %}e{% endfor %}"
      "{% set ns.x = 1 %}{% set a, b = 1, 2 %}{% set c %}x{% endset %}"
      "{% macro m(a, b=1) %}{{ varargs }}{% endmacro %}");
  ASSERT_TRUE(p.ok()) << p.status();
  const Body& body = (*p)->body;
  ASSERT_EQ(body.size(), 5u);
  EXPECT_EQ(body[0]->kind, StmtKind::kFor);
  EXPECT_EQ(body[0]->target.kind, Target::Kind::kTuple);
  EXPECT_NE(body[0]->test, nullptr);
  EXPECT_EQ(body[0]->else_body.size(), 1u);
  EXPECT_EQ(body[1]->target.kind, Target::Kind::kNamespaceAttr);
  EXPECT_EQ(body[1]->target.attr, "x");
  EXPECT_EQ(body[2]->target.items.size(), 2u);
  EXPECT_EQ(body[3]->kind, StmtKind::kSetBlock);
  ASSERT_EQ(body[4]->kind, StmtKind::kMacro);
  EXPECT_EQ(body[4]->macro->params.size(), 2u);
  EXPECT_EQ(body[4]->macro->defaults.size(), 1u);
  EXPECT_TRUE(body[4]->macro->catch_varargs);
  EXPECT_FALSE(body[4]->macro->catch_kwargs);
}

TEST(ParserTest, RefusesSyntaxErrorsWithTheirLine) {
  const std::pair<const char*, const char*> refused[] = {
      {"{{ }}", "line 1: expected an expression, got 'end of print statement'"},
      {"{{ 1 2 }}", "line 1: expected end of print statement, got 'integer'"},
      {"\n{% set %}", "line 2: expected an expression, got 'end of statement block'"},
      {"{% for x %}{% endfor %}", "line 1: expected 'in', got 'end of statement block'"},
      {"{% set 1 = 2 %}", "line 1: can't assign to this expression"},
      {"{% macro m(a=1, b) %}{% endmacro %}",
       "line 1: non-default argument follows default argument"},
      {"{% call x %}{% endcall %}", "line 1: expected call"},
      {"{{ x is defined is none }}", "line 1: you cannot chain multiple tests with is"},
      {"{% for x in y %}{% endif %}", "line 1: unexpected 'endif'"},
      {"{% macro m() %}{% break %}{% endmacro %}", "line 1: 'break' outside of a loop"},
      {"{{ x | abs | wordwrap }}", "line 1: unsupported filter 'wordwrap'"},
      // Jinja2: "Can't assign to special loop variable in for-loop target".
      {"{% for loop in x %}{% endfor %}",
       "line 1: can't assign to special loop variable in for-loop target"},
      {"{% for x in y %}\n{% if x %}{% set a, loop = 1, 2 %}{% endif %}{% endfor %}",
       "line 2: can't assign to special loop variable in for-loop target"},
  };
  for (const auto& [source, message] : refused) {
    absl::StatusOr<std::unique_ptr<Program>> p = ParseProgram(source);
    ASSERT_FALSE(p.ok()) << source;
    EXPECT_EQ(p.status().message(), message) << source;
  }
}

TEST(ParserTest, BoundsNestingWithoutExhaustingTheStack) {
  const std::string parens =
      "{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}";
  absl::StatusOr<std::unique_ptr<Program>> p = ParseProgram(parens);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "line 1: the template nests deeper than 256 levels");
  std::string ifs;
  for (int i = 0; i < 10000; ++i) ifs += "{% if x %}";
  p = ParseProgram(ifs);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "line 1: the template nests deeper than 256 levels");
  std::string sum = "{{ 1";
  for (int i = 0; i < 10000; ++i) sum += " + 1";
  p = ParseProgram(sum + " }}");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "line 1: an expression nests deeper than 256 levels");
  // Jinja2 itself handles a few dozen levels, and so does carpool.
  p = ParseProgram("{{ " + std::string(50, '(') + "1" + std::string(50, ')') + " }}");
  EXPECT_TRUE(p.ok()) << p.status();
}

}  // namespace
}  // namespace carpool::text::jinja
