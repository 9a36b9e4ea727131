// Every expectation was produced by /usr/bin/python3 (3.11) with Jinja2 3.1.2's
// ImmutableSandboxedEnvironment as transformers configures it (tojson = json.dumps(x,
// ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)); the Jinja
// expression or Python call that produced it is in the comment beside it.
#include "text/jinja/builtins.h"

#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::text::jinja {
namespace {

using ::testing::HasSubstr;

class TestBudget : public Budget {
 public:
  absl::Status Iterate(int64_t n) override {
    iterations += n;
    return iterations > max_iterations ? absl::InvalidArgumentError("too many iterations")
                                       : absl::OkStatus();
  }
  absl::Status CheckSize(int64_t bytes) override {
    return bytes > max_bytes ? absl::InvalidArgumentError("output limit") : absl::OkStatus();
  }
  int64_t iterations = 0;
  int64_t max_iterations = 1000000;
  int64_t max_bytes = 1 << 20;
};

Value S(const char* s) { return Value::String(s); }
Value I(int64_t i) { return Value::Int(i); }
Value F(double d) { return Value::Float(d); }
Value B(bool b) { return Value::Bool(b); }
Value L(List items) { return Value::MakeList(std::move(items)); }
Value T(List items) { return Value::MakeTuple(std::move(items)); }
Value J(const char* json) { return Value::FromJson(nlohmann::ordered_json::parse(json)); }
Value Undef() { return Value::Undefined("'x' is undefined"); }

CallArgs Args(List positional = {}, std::vector<std::pair<std::string, Value>> keyword = {}) {
  CallArgs args;
  args.positional.assign(positional.begin(), positional.end());
  args.keyword = std::move(keyword);
  return args;
}

// The filter's result as {{ }} prints it (a generator as `|list` prints it), or
// "ERROR: message".
std::string Filter(const char* name, const Value& input, const CallArgs& args = {}) {
  TestBudget budget;
  absl::StatusOr<Value> r = ApplyFilter(name, input, args, budget);
  if (!r.ok()) return "ERROR: " + std::string(r.status().message());
  if (r->is_generator()) return Value::MakeList(r->list_value()).Str();
  return r->Str();
}

std::string IsTest(const char* name, const Value& input, const CallArgs& args = {}) {
  TestBudget budget;
  absl::StatusOr<bool> r = ApplyTest(name, input, args, budget);
  if (!r.ok()) return "ERROR: " + std::string(r.status().message());
  return *r ? "True" : "False";
}

// obj.name(args) as {{ }} prints it, or "ERROR: message".
std::string Call(const Value& obj, const char* name, const CallArgs& args = {}) {
  std::optional<Value> m = BoundMethod(obj, name);
  if (!m.has_value()) return "NO METHOD";
  TestBudget budget;
  absl::StatusOr<Value> r = m->callable_value().fn(args, budget);
  if (!r.ok()) return "ERROR: " + std::string(r.status().message());
  return r->Str();
}

std::string Json(const Value& v, std::optional<int> indent = std::nullopt,
                 std::optional<std::pair<std::string, std::string>> separators = std::nullopt) {
  TestBudget budget;
  absl::StatusOr<std::string> r = ToJson(v, indent, separators, budget);
  return r.ok() ? *r : "ERROR: " + std::string(r.status().message());
}

const char* kNested = R"({"z": 1, "a": {"y": [1, {"q": "é\"\n\t\u0001"}], "x": {}}, "e": []})";

TEST(ToJsonTest, NestedOrderedDictsKeepTheirOrder) {
  // {{ nested|tojson }}
  EXPECT_EQ(Json(J(kNested)),
            "{\"z\": 1, \"a\": {\"y\": [1, {\"q\": \"é\\\"\\n\\t\\u0001\"}], \"x\": {}}, \"e\": []}");
  // {{ nested|tojson(indent=2) }}
  EXPECT_EQ(Json(J(kNested), 2),
            "{\n  \"z\": 1,\n  \"a\": {\n    \"y\": [\n      1,\n      {\n        \"q\": "
            "\"é\\\"\\n\\t\\u0001\"\n      }\n    ],\n    \"x\": {}\n  },\n  \"e\": []\n}");
  // {{ nested|tojson(indent=4, separators=(', ', ' = ')) }}: the item separator's space stays
  EXPECT_EQ(Json(J(R"({"a": [1, 2]})"), 4, std::make_pair(", ", " = ")),
            "{\n    \"a\" = [\n        1, \n        2\n    ]\n}");
  // {{ [1,2]|tojson(indent=0) }}
  EXPECT_EQ(Json(J("[1, 2]"), 0), "[\n1,\n2\n]");
  EXPECT_EQ(Json(J("[1, 2]"), -3), "[\n1,\n2\n]");  // json.dumps([1,2], indent=-3)
  EXPECT_EQ(Json(J("[1, 2]"), std::nullopt, std::make_pair(",", ":")), "[1,2]");
}

TEST(ToJsonTest, Scalars) {
  // {{ [1.0, 1e16, 1e-5, -0.0, 0.1, true, none, 'é'] |tojson }}
  EXPECT_EQ(Json(L({F(1.0), F(1e16), F(1e-5), F(-0.0), F(0.1), B(true), Value::None(), S("é")})),
            "[1.0, 1e+16, 1e-05, -0.0, 0.1, true, null, \"é\"]");
  // json.dumps([float('nan'), float('inf'), -float('inf')])
  EXPECT_EQ(Json(L({F(std::nan("")), F(std::numeric_limits<double>::infinity()),
                    F(-std::numeric_limits<double>::infinity())})),
            "[NaN, Infinity, -Infinity]");
  // {{ 'a\u2028"\\/\x7f'|tojson }}: ensure_ascii=False keeps U+2028 and DEL, escapes " and \.
  EXPECT_EQ(Json(S("a\u2028\"\\/\x7f")), "\"a\u2028\\\"\\\\/\x7f\"");
  EXPECT_EQ(Json(S("\b\f\r\x1f")), "\"\\b\\f\\r\\u001f\"");
  // {{ (1, 2)|tojson }}
  EXPECT_EQ(Json(T({I(1), I(2)})), "[1, 2]");
  // {{ []|tojson(indent=2) }}{{ {}|tojson(indent=2) }}{{ [[]]|tojson(indent=2) }}
  EXPECT_EQ(Json(L({}), 2), "[]");
  EXPECT_EQ(Json(J("{}"), 2), "{}");
  EXPECT_EQ(Json(L({L({})}), 2), "[\n  []\n]");
}

TEST(ToJsonTest, KeysAndErrors) {
  Dict d;
  d.Set(I(1), I(2));
  d.Set(F(1.5), I(3));
  d.Set(Value::None(), I(5));
  d.Set(B(false), I(6));
  // {{ {1: 2, 1.5: 3, none: 5, false: 6}|tojson }}
  EXPECT_EQ(Json(Value::MakeDict(d)), "{\"1\": 2, \"1.5\": 3, \"null\": 5, \"false\": 6}");
  // {{ x|tojson }}, {{ [x]|tojson }}, {{ namespace(a=1)|tojson }}
  EXPECT_EQ(Json(Undef()), "ERROR: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(Json(L({Undef()})), "ERROR: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(Json(Value::Namespace({})), "ERROR: Object of type Namespace is not JSON serializable");
  Dict tuple_key;
  tuple_key.Set(T({I(1)}), I(1));
  // json.dumps({(1,): 1})
  EXPECT_EQ(Json(Value::MakeDict(tuple_key)),
            "ERROR: keys must be str, int, float, bool or None, not tuple");
}

TEST(ToJsonTest, FilterArguments) {
  // {{ nested|tojson(sort_keys=true) }}
  EXPECT_EQ(Filter("tojson", J(kNested), Args({}, {{"sort_keys", B(true)}})),
            "{\"a\": {\"x\": {}, \"y\": [1, {\"q\": \"é\\\"\\n\\t\\u0001\"}]}, \"e\": [], \"z\": 1}");
  // transformers' tojson(x, ensure_ascii=False, indent=None, ...): {{ {'a': 'é'}|tojson(2) }}
  // sets ensure_ascii, not the indent.
  EXPECT_EQ(Filter("tojson", J(R"({"a": "é"})"), Args({I(2)})), "{\"a\": \"\\u00e9\"}");
  EXPECT_EQ(Filter("tojson", J(R"({"a": 1})"), Args({B(false), I(2)})), "{\n  \"a\": 1\n}");
  // {{ 'é😀'|tojson(ensure_ascii=true) }}
  EXPECT_EQ(Filter("tojson", S("é\U0001F600\x7f"), Args({}, {{"ensure_ascii", B(true)}})),
            "\"\\u00e9\\ud83d\\ude00\\u007f\"");
  // [1]|tojson(separators=5), [1]|tojson(separators=[','])
  EXPECT_EQ(Filter("tojson", L({I(1)}), Args({}, {{"separators", I(5)}})),
            "ERROR: cannot unpack non-iterable int object");
  EXPECT_EQ(Filter("tojson", L({I(1)}), Args({}, {{"separators", L({S(",")})}})),
            "ERROR: not enough values to unpack (expected 2, got 1)");
  // {{ {'a': [1]}|tojson(separators=(',', ':')) }}
  EXPECT_EQ(Filter("tojson", J(R"({"a": [1, 2]})"), Args({}, {{"separators", T({S(","), S(":")})}})),
            "{\"a\":[1,2]}");
}

TEST(ToJsonTest, DeepNestingIsAnErrorNotACrash) {
  Value v = I(1);
  for (int i = 0; i < 100000; ++i) v = L({v});
  EXPECT_THAT(Json(v), HasSubstr("maximum recursion depth"));
}

TEST(ToJsonTest, OutputIsCharged) {
  TestBudget budget;
  budget.max_bytes = 100;
  List big(200, S("aaaa"));
  EXPECT_FALSE(ToJson(L(big), std::nullopt, std::nullopt, budget).ok());
}

TEST(FiltersTest, Strings) {
  EXPECT_EQ(Filter("trim", S("  a  ")), "a");                              // '  a  '|trim
  EXPECT_EQ(Filter("trim", S("xxaxx"), Args({S("x")})), "a");              // 'xxaxx'|trim('x')
  EXPECT_EQ(Filter("trim", S("\u3000a\u00a0\x1c")), "a");                  // Python's isspace
  EXPECT_EQ(Filter("trim", Undef()), "");                                  // x|trim
  EXPECT_EQ(Filter("upper", S("ǆemal ßtraße")), "ǄEMAL SSTRASSE");
  EXPECT_EQ(Filter("lower", S("ΣΑΣ İ")), "σας i̇");                         // 'ΣΑΣ İ'|lower
  EXPECT_EQ(Filter("capitalize", S("ßa")), "Ssa");                         // 'ßa'|capitalize
  EXPECT_EQ(Filter("capitalize", S("hELLO")), "Hello");
  // "hello world-foo(bar) [x]<y>z o'neil"|title
  EXPECT_EQ(Filter("title", S("hello world-foo(bar) [x]<y>z o'neil")),
            "Hello World-Foo(Bar) [X]<Y>z O'neil");
  EXPECT_EQ(Filter("title", S("ǆemal ßtraße")), "Ǆemal SStraße");          // Jinja2 uppercases
  EXPECT_EQ(Filter("replace", S("aXbX"), Args({S("X"), S("y"), I(1)})), "aybX");
  EXPECT_EQ(Filter("replace", I(5), Args({I(5), I(6)})), "6");             // 5|replace(5, 6)
  EXPECT_EQ(Filter("replace", S("abc"), Args({S(""), S("-")})), "-a-b-c-");
  EXPECT_EQ(Filter("string", L({S("a")})), "['a']");
  EXPECT_EQ(Filter("safe", S("<b>")), "<b>");
  EXPECT_EQ(Filter("e", S("<a href=\"x\">&'</a>")), "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(Filter("escape", Value::None()), "None");
  EXPECT_EQ(Filter("center", S("ab"), Args({I(7)})), "   ab  ");          // 'ab'|center(7)
  EXPECT_EQ(Filter("wordcount", S("hello wörld_1 foo-bar")), "4");
  EXPECT_EQ(Filter("reverse", S("héllo")), "olléh");
  EXPECT_EQ(Filter("format", S("%s-%d"), Args({S("a"), I(3)})), "a-3");
  EXPECT_EQ(Filter("format", S("%(x)s"), Args({}, {{"x", I(1)}})), "1");
  EXPECT_EQ(Filter("format", S("%.2f|%5s|%-5s|%r"), Args({F(3.14159), S("a"), S("b"), S("c")})),
            "3.14|    a|b    |'c'");
}

TEST(FiltersTest, Indent) {
  EXPECT_EQ(Filter("indent", S("a\nb\n\nc"), Args({I(2)})), "a\n  b\n\n  c");
  // "a\nb\n\nc\n"|indent(2, true, true)
  EXPECT_EQ(Filter("indent", S("a\nb\n\nc\n"), Args({I(2), B(true), B(true)})),
            "  a\n  b\n  \n  c\n  ");
  EXPECT_EQ(Filter("indent", S("")), "");
  EXPECT_EQ(Filter("indent", S("x"), Args({S(">> "), B(true)})), ">> x");
  // "a\r\nb\u2028c"|indent(1): splitlines boundaries become \n
  EXPECT_EQ(Filter("indent", S("a\r\nb\u2028c"), Args({I(1)})), "a\n b\n c");
  EXPECT_EQ(Filter("indent", S("a"), Args({L({})})),
            "ERROR: can't multiply sequence by non-int of type 'list'");  // 'a'|indent([])
  EXPECT_EQ(Filter("indent", L({I(1)})), "ERROR: 'list' object has no attribute 'splitlines'");
  EXPECT_EQ(Filter("indent", S("a\nb"), Args({}, {{"width", I(3)}, {"first", B(true)}})),
            "   a\n   b");
}

TEST(FiltersTest, Truncate) {
  // "foo bar baz qux"|truncate(9) / (9, True) / (11) / (11, False, '...', 0)
  EXPECT_EQ(Filter("truncate", S("foo bar baz qux"), Args({I(9)})), "foo...");
  EXPECT_EQ(Filter("truncate", S("foo bar baz qux"), Args({I(9), B(true)})), "foo ba...");
  EXPECT_EQ(Filter("truncate", S("foo bar baz qux"), Args({I(11)})), "foo bar baz qux");
  EXPECT_EQ(Filter("truncate", S("foo bar baz qux"), Args({I(11), B(false), S("..."), I(0)})),
            "foo bar...");
  EXPECT_EQ(Filter("truncate", S("x"), Args({I(2)})), "ERROR: expected length >= 3, got 2");
}

TEST(FiltersTest, Numbers) {
  // '42.23'|int, '0x1A'|int(base=16), '0x1A'|int(0, 0), ' 1_000 '|int, 'nan'|int(5), 3.9|int,
  // -3.9|int, none|int, true|int, '1e3'|int
  EXPECT_EQ(Filter("int", S("42.23")), "42");
  EXPECT_EQ(Filter("int", S("0x1A"), Args({}, {{"base", I(16)}})), "26");
  EXPECT_EQ(Filter("int", S("0x1A"), Args({I(0), I(0)})), "26");
  EXPECT_EQ(Filter("int", S(" 1_000 ")), "1000");
  EXPECT_EQ(Filter("int", S("nan"), Args({I(5)})), "5");
  EXPECT_EQ(Filter("int", F(3.9)), "3");
  EXPECT_EQ(Filter("int", F(-3.9)), "-3");
  EXPECT_EQ(Filter("int", Value::None()), "0");
  EXPECT_EQ(Filter("int", B(true)), "1");
  EXPECT_EQ(Filter("int", S("1e3")), "1000");
  EXPECT_EQ(Filter("int", Undef()), "ERROR: 'x' is undefined");  // {{ undefined_var|int }}
  EXPECT_EQ(Filter("float", Undef()), "ERROR: 'x' is undefined");
  EXPECT_EQ(Filter("int", S("-9223372036854775808")), "-9223372036854775808");
  EXPECT_THAT(Filter("int", S("9223372036854775808")), HasSubstr("integer overflow"));
  // 'inf'|float, ' 1_0.5 '|float, 'x'|float, '1e400'|float, 'Infinity'|float, '-nan'|float
  EXPECT_EQ(Filter("float", S("inf")), "inf");
  EXPECT_EQ(Filter("float", S(" 1_0.5 ")), "10.5");
  EXPECT_EQ(Filter("float", S("x")), "0.0");
  EXPECT_EQ(Filter("float", S("1e400")), "inf");
  EXPECT_EQ(Filter("float", S("Infinity")), "inf");
  EXPECT_EQ(Filter("float", S("-nan")), "nan");
  EXPECT_EQ(Filter("float", S("0x10")), "0.0");   // float('0x10') raises
  EXPECT_EQ(Filter("float", I(3)), "3.0");
  // 42.55|round(1), 2.675|round(2), 42|round, 42.5|round, 43.5|round,
  // 42.1|round(method='ceil'), 42|round(-1), 45.0|round(-1)
  EXPECT_EQ(Filter("round", F(42.55), Args({I(1)})), "42.5");
  EXPECT_EQ(Filter("round", F(2.675), Args({I(2)})), "2.67");
  EXPECT_EQ(Filter("round", I(42)), "42");
  EXPECT_EQ(Filter("round", F(42.5)), "42.0");
  EXPECT_EQ(Filter("round", F(43.5)), "44.0");
  EXPECT_EQ(Filter("round", F(42.1), Args({}, {{"method", S("ceil")}})), "43.0");
  EXPECT_EQ(Filter("round", I(42), Args({I(-1)})), "40");
  EXPECT_EQ(Filter("round", F(45.0), Args({I(-1)})), "40.0");
  EXPECT_EQ(Filter("round", S("abc")), "ERROR: type str doesn't define __round__ method");
  // (-0.0)|round(1, 'floor'), -0.00001|round(1, 'ceil'), -0.04|round(1)
  EXPECT_EQ(Filter("round", F(-0.0), Args({I(1), S("floor")})), "0.0");
  EXPECT_EQ(Filter("round", F(-0.00001), Args({I(1), S("ceil")})), "0.0");
  EXPECT_EQ(Filter("round", F(-0.04), Args({I(1)})), "-0.0");
  EXPECT_EQ(Filter("abs", I(-5)), "5");
  EXPECT_EQ(Filter("abs", F(-5.5)), "5.5");
  EXPECT_EQ(Filter("abs", S("a")), "ERROR: bad operand type for abs(): 'str'");
  // [1,2]|sum, [1.5,2]|sum(start=1), ['a','b']|sum
  EXPECT_EQ(Filter("sum", L({I(1), I(2)})), "3");
  EXPECT_EQ(Filter("sum", L({F(1.5), I(2)}), Args({}, {{"start", I(1)}})), "4.5");
  EXPECT_EQ(Filter("sum", L({S("a"), S("b")})),
            "ERROR: unsupported operand type(s) for +: 'int' and 'str'");
}

TEST(FiltersTest, Sequences) {
  Value l = L({I(1), I(2), I(3)});
  Value d = J(R"({"a": 1, "_p": 2, "items": 3})");
  EXPECT_EQ(Filter("length", S("héllo")), "5");
  EXPECT_EQ(Filter("count", Undef()), "0");
  EXPECT_EQ(Filter("first", l), "1");
  EXPECT_EQ(Filter("last", l), "3");
  EXPECT_EQ(Filter("first", S("abc")), "a");
  EXPECT_EQ(Filter("first", d), "a");
  EXPECT_EQ(Filter("last", d), "items");
  {
    TestBudget budget;
    Value empty = *ApplyFilter("first", L({}), {}, budget);
    EXPECT_EQ(empty.undefined_hint(), "No first item, sequence was empty.");
  }
  EXPECT_EQ(Filter("list", S("ab")), "['a', 'b']");
  EXPECT_EQ(Filter("list", d), "['a', '_p', 'items']");
  EXPECT_EQ(Filter("list", Undef()), "[]");
  EXPECT_EQ(Filter("reverse", l), "[3, 2, 1]");
  EXPECT_EQ(Filter("reverse", I(5)), "ERROR: argument must be iterable");
  EXPECT_EQ(Filter("items", d), "[('a', 1), ('_p', 2), ('items', 3)]");
  EXPECT_EQ(Filter("items", Undef()), "[]");
  EXPECT_EQ(Filter("items", I(5)), "ERROR: Can only get item pairs from a mapping.");
  EXPECT_EQ(Filter("join", l, Args({S(", ")})), "1, 2, 3");
  // [{'a':{'b':1}},{'a':{'b':2}}]|join('-', attribute='a.b')
  EXPECT_EQ(Filter("join", J(R"([{"a": {"b": 1}}, {"a": {"b": 2}}])"), Args({S("-")}, {{"attribute", S("a.b")}})),
            "1-2");
  EXPECT_EQ(Filter("join", Undef()), "");
  // [1,2,3,4,5]|batch(2)|list, |batch(2, 'x')|list, |slice(2)|list, |slice(3, 0)|list
  Value five = L({I(1), I(2), I(3), I(4), I(5)});
  EXPECT_EQ(Filter("batch", five, Args({I(2)})), "[[1, 2], [3, 4], [5]]");
  EXPECT_EQ(Filter("batch", five, Args({I(2), S("x")})), "[[1, 2], [3, 4], [5, 'x']]");
  EXPECT_EQ(Filter("slice", five, Args({I(2)})), "[[1, 2, 3], [4, 5]]");
  EXPECT_EQ(Filter("slice", five, Args({I(3), I(0)})), "[[1, 2], [3, 4], [5, 0]]");
  // ['b','A','a','B']|sort, (case_sensitive=true), (reverse=true)
  Value letters = L({S("b"), S("A"), S("a"), S("B")});
  EXPECT_EQ(Filter("sort", letters), "['A', 'a', 'b', 'B']");
  EXPECT_EQ(Filter("sort", letters, Args({}, {{"case_sensitive", B(true)}})), "['A', 'B', 'a', 'b']");
  EXPECT_EQ(Filter("sort", letters, Args({}, {{"reverse", B(true)}})), "['b', 'B', 'A', 'a']");
  EXPECT_EQ(Filter("sort", L({S("b"), I(1)})),
            "ERROR: '<' not supported between instances of 'int' and 'str'");
  // [{'a':2,'b':1},{'a':1,'b':2}]|sort(attribute='a')
  EXPECT_EQ(Filter("sort", J(R"([{"a": 2, "b": 1}, {"a": 1, "b": 2}])"), Args({}, {{"attribute", S("a")}})),
            "[{'a': 1, 'b': 2}, {'a': 2, 'b': 1}]");
  // {'b':1,'A':2,'a':3}|dictsort, dictsort(by='value', reverse=true)
  EXPECT_EQ(Filter("dictsort", J(R"({"b": 1, "A": 2, "a": 3})")), "[('A', 2), ('a', 3), ('b', 1)]");
  EXPECT_EQ(Filter("dictsort", J(R"({"b": 1, "a": 2})"), Args({}, {{"by", S("value")}, {"reverse", B(true)}})),
            "[('a', 2), ('b', 1)]");
  // ['a','A','b']|unique|list, unique(true), [[1],[1]]|unique
  EXPECT_EQ(Filter("unique", L({S("a"), S("A"), S("b")})), "['a', 'b']");
  EXPECT_EQ(Filter("unique", L({S("a"), S("A"), S("b")}), Args({B(true)})), "['a', 'A', 'b']");
  EXPECT_EQ(Filter("unique", L({L({I(1)}), L({I(1)})})), "ERROR: unhashable type: 'list'");
  // ['a','B','c']|max, max(true), [3,1,2]|min, [{'x':1},{'x':3}]|max(attribute='x')
  EXPECT_EQ(Filter("max", L({S("a"), S("B"), S("c")})), "c");
  EXPECT_EQ(Filter("min", L({I(3), I(1), I(2)})), "1");
  EXPECT_EQ(Filter("max", J(R"([{"x": 1}, {"x": 3}])"), Args({}, {{"attribute", S("x")}})), "{'x': 3}");
  EXPECT_EQ(Filter("max", L({})), "");
  EXPECT_EQ(Filter("default", Undef(), Args({S("z")})), "z");
  EXPECT_EQ(Filter("d", S(""), Args({S("z"), B(true)})), "z");
  EXPECT_EQ(Filter("default", Value::None(), Args({S("z")})), "None");
  EXPECT_EQ(Filter("default", S(""), Args({S("z")})), "");
}

TEST(FiltersTest, MapAndSelect) {
  Value msgs = J(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
                     {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}])");
  // msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(' ')
  {
    TestBudget budget;
    Value users = *ApplyFilter("selectattr", msgs, Args({S("role"), S("equalto"), S("user")}), budget);
    Value contents = *ApplyFilter("map", users, Args({}, {{"attribute", S("content")}}), budget);
    EXPECT_EQ(Filter("list", contents), "['U1', 'U2']");
  }
  EXPECT_EQ(Filter("rejectattr", msgs, Args({S("role"), S("in"), L({S("user"), S("system")})})),
            "[{'role': 'assistant', 'content': 'A1'}]");
  // [{'a':1},{}]|map(attribute='a')|list and with default='z'
  EXPECT_EQ(Filter("map", J(R"([{"a": 1}, {}])"), Args({}, {{"attribute", S("a")}})), "[1, Undefined]");
  EXPECT_EQ(Filter("map", J(R"([{"a": 1}, {}])"), Args({}, {{"attribute", S("a")}, {"default", S("z")}})),
            "[1, 'z']");
  // [{'a':{'b':1}},{}]|map(attribute='a.b')|list: looking into the Undefined raises
  EXPECT_EQ(Filter("map", J(R"([{"a": {"b": 1}}, {}])"), Args({}, {{"attribute", S("a.b")}})),
            "ERROR: 'dict object' has no attribute 'a'");
  // [{'r':'u'},{'r':'s'},{}]|rejectattr('r')|list, selectattr('r','defined')
  EXPECT_EQ(Filter("rejectattr", J(R"([{"r": "u"}, {"r": "s"}, {}])"), Args({S("r")})), "[{}]");
  EXPECT_EQ(Filter("selectattr", J(R"([{"r": "u"}, {"r": "s"}, {}])"), Args({S("r"), S("defined")})),
            "[{'r': 'u'}, {'r': 's'}]");
  Value l = L({I(1), I(2), I(3)});
  EXPECT_EQ(Filter("select", l, Args({S("odd")})), "[1, 3]");
  EXPECT_EQ(Filter("reject", l, Args({S("gt"), I(1)})), "[1]");
  EXPECT_EQ(Filter("select", L({I(1), I(0)})), "[1]");
  EXPECT_EQ(Filter("map", l, Args({S("string")})), "['1', '2', '3']");
  EXPECT_EQ(Filter("map", L({S("a b")}), Args({S("replace"), S(" "), S("_")})), "['a_b']");
  EXPECT_EQ(Filter("select", l, Args({S("nosuchtest")})), "ERROR: No test named 'nosuchtest'.");
  EXPECT_EQ(Filter("map", l, Args({S("nosuch")})), "ERROR: No filter named 'nosuch'.");
  EXPECT_EQ(Filter("map", Undef(), Args({S("nosuch")})), "[]");  // falsy input: nothing to map
}

TEST(FiltersTest, LazyResultsAreGenerators) {
  TestBudget budget;
  const Value l = L({I(1), I(2), I(3)});
  Value none = *ApplyFilter("select", l, Args({S("gt"), I(5)}), budget);
  EXPECT_TRUE(none.is_generator());
  EXPECT_TRUE(none.Truthy());  // {{ 'yes' if l|select('gt', 5) else 'no' }} -> yes
  EXPECT_EQ(none.Str(), "<generator object>");
  EXPECT_EQ(Filter("length", none), "ERROR: object of type 'generator' has no len()");
  EXPECT_EQ(Filter("last", none), "ERROR: 'generator' object is not reversible");
  EXPECT_EQ(Filter("tojson", none), "ERROR: Object of type generator is not JSON serializable");
  EXPECT_EQ(Filter("first", none), "");  // l|select('gt', 5)|first is undefined
  EXPECT_EQ(IsTest("sequence", none), "False");
  EXPECT_EQ(IsTest("iterable", none), "True");
  Value as_list = *ApplyFilter("list", none, {}, budget);
  EXPECT_FALSE(as_list.is_generator());
  EXPECT_FALSE(as_list.Truthy());  // l|select('gt', 5)|list is false
  Value mapped = *ApplyFilter("map", l, Args({S("string")}), budget);
  EXPECT_TRUE(mapped.is_generator());
  EXPECT_EQ(Filter("join", mapped, Args({S(",")})), "1,2,3");
  EXPECT_FALSE(ApplyFilter("reverse", mapped, {}, budget)->is_generator());  // a list
  EXPECT_TRUE(ApplyFilter("reverse", l, {}, budget)->is_generator());        // an iterator
  EXPECT_FALSE(Equals(mapped, *ApplyFilter("list", mapped, {}, budget)));
  EXPECT_EQ(GetItem(mapped, I(0)).undefined_hint(), "generator object has no element 0");
}

TEST(FiltersTest, Attr) {
  Value d = J(R"({"a": 1})");
  EXPECT_EQ(Filter("attr", d, Args({S("a")})), "");  // d|attr('a') is undefined
  EXPECT_EQ(Filter("attr", d, Args({S("items")})), "<built-in method items of dict object>");
  Dict attrs;
  attrs.Set(S("a"), I(1));
  EXPECT_EQ(Filter("attr", Value::Namespace(attrs), Args({S("a")})), "1");
}

TEST(FiltersTest, Unicode) {
  EXPECT_EQ(Filter("length", S("\U0001F600é")), "2");
  EXPECT_EQ(Filter("list", S("\U0001F600é")), "['\U0001F600', 'é']");
  EXPECT_EQ(Filter("center", S("é"), Args({I(3)})), " é ");
  EXPECT_EQ(Filter("upper", S("straße")), "STRASSE");
}

TEST(TestsTest, Kinds) {
  // x is sequence / iterable / callable / mapping for an undefined x: True True True False
  EXPECT_EQ(IsTest("sequence", Undef()), "True");
  EXPECT_EQ(IsTest("iterable", Undef()), "True");
  EXPECT_EQ(IsTest("callable", Undef()), "True");
  EXPECT_EQ(IsTest("mapping", Undef()), "False");
  EXPECT_EQ(IsTest("iterable", Value::None()), "False");
  EXPECT_EQ(IsTest("sequence", J("{}")), "True");
  EXPECT_EQ(IsTest("defined", Undef()), "False");
  EXPECT_EQ(IsTest("undefined", Undef()), "True");
  EXPECT_EQ(IsTest("none", Value::None()), "True");
  EXPECT_EQ(IsTest("string", S("")), "True");
  // 1.0 is integer, true is number, true is integer, 1 is float
  EXPECT_EQ(IsTest("integer", F(1.0)), "False");
  EXPECT_EQ(IsTest("number", B(true)), "True");
  EXPECT_EQ(IsTest("integer", B(true)), "False");
  EXPECT_EQ(IsTest("float", I(1)), "False");
  EXPECT_EQ(IsTest("boolean", B(false)), "True");
  EXPECT_EQ(IsTest("true", I(1)), "False");
  EXPECT_EQ(IsTest("false", B(false)), "True");
  EXPECT_EQ(IsTest("escaped", S("a")), "False");
  EXPECT_EQ(IsTest("filter", S("tojson")), "True");
  EXPECT_EQ(IsTest("test", S("nosuch")), "False");
}

TEST(TestsTest, Comparisons) {
  EXPECT_EQ(IsTest("eq", I(1), Args({F(1.0)})), "True");
  EXPECT_EQ(IsTest("==", S("a"), Args({S("a")})), "True");
  EXPECT_EQ(IsTest("ne", S("a"), Args({S("b")})), "True");
  EXPECT_EQ(IsTest("lt", I(1), Args({I(2)})), "True");
  EXPECT_EQ(IsTest(">=", I(2), Args({I(2)})), "True");
  EXPECT_EQ(IsTest("gt", S("a"), Args({I(1)})),
            "ERROR: '>' not supported between instances of 'str' and 'int'");
  EXPECT_EQ(IsTest("in", I(2), Args({L({I(1), I(2)})})), "True");
  EXPECT_EQ(IsTest("in", S("b"), Args({S("abc")})), "True");
  // 1 is sameas 1, 300 is sameas 300, [1] is sameas [1], none is sameas none
  EXPECT_EQ(IsTest("sameas", I(1), Args({I(1)})), "True");
  EXPECT_EQ(IsTest("sameas", I(300), Args({I(300)})), "False");
  EXPECT_EQ(IsTest("sameas", L({I(1)}), Args({L({I(1)})})), "False");
  Value l = L({I(1)});
  EXPECT_EQ(IsTest("sameas", l, Args({l})), "True");
  EXPECT_EQ(IsTest("sameas", Value::None(), Args({Value::None()})), "True");
  EXPECT_EQ(IsTest("odd", I(3)), "True");
  EXPECT_EQ(IsTest("even", I(-2)), "True");
  EXPECT_EQ(IsTest("odd", Undef()), "ERROR: 'x' is undefined");  // x is odd
  EXPECT_EQ(IsTest("divisibleby", I(9), Args({I(3)})), "True");
  EXPECT_EQ(IsTest("divisibleby", I(9), Args({I(0)})), "ERROR: integer modulo by zero");
  // x is lower, 'abc' is lower, 'Ab' is upper, 'ǅ' is upper
  EXPECT_EQ(IsTest("lower", Undef()), "False");
  EXPECT_EQ(IsTest("lower", S("abc1")), "True");
  EXPECT_EQ(IsTest("upper", S("Ab")), "False");
  EXPECT_EQ(IsTest("upper", S("ǅ")), "False");
}

TEST(MethodsTest, StripSplit) {
  EXPECT_EQ(Call(S("  a b  "), "strip"), "a b");
  EXPECT_EQ(Call(S("xxaxx"), "strip", Args({S("x")})), "a");
  EXPECT_EQ(Call(S("  a "), "lstrip"), "a ");
  EXPECT_EQ(Call(S(" a  "), "rstrip"), " a");
  EXPECT_EQ(Call(S("a"), "strip", Args({I(1)})), "ERROR: strip arg must be None or str");
  EXPECT_EQ(Call(S("abc"), "strip", Args({}, {{"chars", S("a")}})),
            "ERROR: str.strip() takes no keyword arguments");
  // '  a  b c  '.split(), .split(none, 1), .rsplit(none, 1)
  EXPECT_EQ(Call(S("  a  b c  "), "split"), "['a', 'b', 'c']");
  EXPECT_EQ(Call(S("  a  b c  "), "split", Args({Value::None(), I(1)})), "['a', 'b c  ']");
  EXPECT_EQ(Call(S("  a  b c  "), "rsplit", Args({Value::None(), I(1)})), "['  a  b', 'c']");
  // 'a,b,,c'.split(','), .split(',', 1), .rsplit(',', 1), ''.split(), ''.split(',')
  EXPECT_EQ(Call(S("a,b,,c"), "split", Args({S(",")})), "['a', 'b', '', 'c']");
  EXPECT_EQ(Call(S("a,b,,c"), "split", Args({S(","), I(1)})), "['a', 'b,,c']");
  EXPECT_EQ(Call(S("a,b,,c"), "rsplit", Args({S(","), I(1)})), "['a,b,', 'c']");
  EXPECT_EQ(Call(S(""), "split"), "[]");
  EXPECT_EQ(Call(S(""), "split", Args({S(",")})), "['']");
  EXPECT_EQ(Call(S("a<>b<>c"), "rsplit", Args({S("<>")})), "['a', 'b', 'c']");
  EXPECT_EQ(Call(S("a b c"), "split", Args({}, {{"maxsplit", I(1)}})), "['a', 'b c']");
  EXPECT_EQ(Call(S("a"), "split", Args({S("")})), "ERROR: empty separator");
  // 'a\nb\r\nc\rd\x0be\u2028f'.splitlines(), 'a\nb\r\n'.splitlines(true)
  EXPECT_EQ(Call(S("a\nb\r\nc\rd\x0b" "e\u2028f"), "splitlines"), "['a', 'b', 'c', 'd', 'e', 'f']");
  EXPECT_EQ(Call(S("a\nb\r\n"), "splitlines", Args({B(true)})), "['a\\n', 'b\\r\\n']");
  EXPECT_EQ(Call(S("a\nb"), "splitlines", Args({S("x")})),
            "ERROR: 'str' object cannot be interpreted as an integer");
}

TEST(MethodsTest, Affixes) {
  EXPECT_EQ(Call(S("hello"), "startswith", Args({S("he")})), "True");
  EXPECT_EQ(Call(S("hello"), "startswith", Args({T({S("x"), S("hel")})})), "True");
  EXPECT_EQ(Call(S("hello"), "startswith", Args({S("l"), I(2)})), "True");
  EXPECT_EQ(Call(S("hello"), "endswith", Args({S("l"), I(0), I(4)})), "True");
  EXPECT_EQ(Call(S("hello"), "startswith", Args({S(""), I(6)})), "False");
  EXPECT_EQ(Call(S("héllo"), "endswith", Args({S("llo"), I(-3)})), "True");
  EXPECT_EQ(Call(S("hello"), "startswith", Args({I(1)})),
            "ERROR: startswith first arg must be str or a tuple of str, not int");
}

TEST(MethodsTest, CaseMappingsMatchPython) {
  // 'ǆemal ßtraße ΣΑΣ'.upper() / .lower() / .title() / .capitalize()
  EXPECT_EQ(Call(S("ǆemal ßtraße ΣΑΣ"), "upper"), "ǄEMAL SSTRASSE ΣΑΣ");
  EXPECT_EQ(Call(S("ǆemal ßtraße ΣΑΣ İ"), "lower"), "ǆemal ßtraße σας i̇");
  EXPECT_EQ(Call(S("ǆemal ßtraße ΣΑΣ"), "title"), "ǅemal Sstraße Σας");
  EXPECT_EQ(Call(S("ǆemal ßtraße ΣΑΣ"), "capitalize"), "ǅemal ßtraße σας");
  EXPECT_EQ(Call(S("they're bill's 1st"), "title"), "They'Re Bill'S 1St");
}

TEST(MethodsTest, SearchAndReplace) {
  EXPECT_EQ(Call(S("aaa"), "replace", Args({S("a"), S("b"), I(2)})), "bba");
  EXPECT_EQ(Call(S("aaa"), "replace", Args({S(""), S("-"), I(2)})), "-a-aa");
  EXPECT_EQ(Call(S("héllo"), "replace", Args({S("é"), S("e")})), "hello");
  EXPECT_EQ(Call(S("a"), "replace", Args({I(1), I(2)})),
            "ERROR: replace() argument 1 must be str, not int");
  // 'héllo'.find('l'), .rfind, .find('z'), 'hello'.find('l', -2), .find('', 10)
  EXPECT_EQ(Call(S("héllo"), "find", Args({S("l")})), "2");
  EXPECT_EQ(Call(S("héllo"), "rfind", Args({S("l")})), "3");
  EXPECT_EQ(Call(S("hello"), "find", Args({S("z")})), "-1");
  EXPECT_EQ(Call(S("hello"), "find", Args({S("l"), I(-2)})), "3");
  EXPECT_EQ(Call(S("hello"), "find", Args({S(""), I(10)})), "-1");
  EXPECT_EQ(Call(S("hello"), "index", Args({S("z")})), "ERROR: substring not found");
  EXPECT_EQ(Call(S("aaaa"), "count", Args({S("aa")})), "2");
  EXPECT_EQ(Call(S("abc"), "count", Args({S("")})), "4");
  EXPECT_EQ(Call(S("abc"), "find", Args({I(1)})), "ERROR: must be str, not int");  // 'abc'.find(1)
  EXPECT_EQ(Call(S("-"), "join", Args({L({S("a"), S("b")})})), "a-b");
  EXPECT_EQ(Call(S("-"), "join", Args({L({I(1)})})),
            "ERROR: sequence item 0: expected str instance, int found");
}

TEST(MethodsTest, PredicatesAndPadding) {
  EXPECT_EQ(Call(S("123"), "isdigit"), "True");
  EXPECT_EQ(Call(S(""), "isdigit"), "False");
  EXPECT_EQ(Call(S("²"), "isdigit"), "True");     // '²'.isdigit()
  EXPECT_EQ(Call(S("²"), "isdecimal"), "False");  // '²'.isdecimal()
  EXPECT_EQ(Call(S("½"), "isnumeric"), "True");
  EXPECT_EQ(Call(S("ab1"), "isalnum"), "True");
  EXPECT_EQ(Call(S(" \t"), "isspace"), "True");
  EXPECT_EQ(Call(S("AbC"), "isupper"), "False");
  EXPECT_EQ(Call(S("abc1"), "islower"), "True");
  EXPECT_EQ(Call(S("Ab Cd"), "istitle"), "True");
  EXPECT_EQ(Call(S("-42"), "zfill", Args({I(5)})), "-0042");
  // 'ab'.center(6, '*'), 'ab'.center(5, '*'), 'abc'.center(6, '*'), 'ab'.ljust(4, '.')
  EXPECT_EQ(Call(S("ab"), "center", Args({I(6), S("*")})), "**ab**");
  EXPECT_EQ(Call(S("ab"), "center", Args({I(5), S("*")})), "**ab*");
  EXPECT_EQ(Call(S("abc"), "center", Args({I(6), S("*")})), "*abc**");
  EXPECT_EQ(Call(S("ab"), "ljust", Args({I(4), S(".")})), "ab..");
  EXPECT_EQ(Call(S("ab"), "rjust", Args({I(4)})), "  ab");
  EXPECT_EQ(Call(S("ab"), "center", Args({I(4), S("**")})),
            "ERROR: The fill character must be exactly one character long");
  EXPECT_EQ(Call(S("a=b=c"), "partition", Args({S("=")})), "('a', '=', 'b=c')");
  EXPECT_EQ(Call(S("a=b=c"), "rpartition", Args({S("=")})), "('a=b', '=', 'c')");
}

TEST(MethodsTest, Format) {
  // '{} {}'.format(1, 'a') etc.
  EXPECT_EQ(Call(S("{} {}"), "format", Args({I(1), S("a")})), "1 a");
  EXPECT_EQ(Call(S("{0}{1}{0}"), "format", Args({S("x"), S("y")})), "xyx");
  EXPECT_EQ(Call(S("{name}!"), "format", Args({}, {{"name", S("bob")}})), "bob!");
  EXPECT_EQ(Call(S("{:>5}|{:<5}|{:^5}|{:*^7}"), "format", Args({S("a"), S("b"), S("c"), S("d")})),
            "    a|b    |  c  |***d***");
  EXPECT_EQ(Call(S("{:.2f} {:5.1f} {:e} {:g} {:%}"), "format",
                 Args({F(3.14159), F(2.25), F(12345.678), F(0.00001), F(0.25)})),
            "3.14   2.2 1.234568e+04 1e-05 25.000000%");
  EXPECT_EQ(Call(S("{:d} {:5d} {:05d} {:+d} {:x} {:#x} {:X} {:o} {:b} {:,} {:_}"), "format",
                 Args({I(42), I(42), I(-42), I(42), I(255), I(255), I(255), I(8), I(5),
                       I(1234567), I(1234567)})),
            "42    42 -0042 +42 ff 0xff FF 10 101 1,234,567 1_234_567");
  Value d = J(R"({"a": 1})");
  EXPECT_EQ(Call(S("{!r} {!s} {!a}"), "format", Args({S("é"), S("é"), S("é")})), "'é' é '\\xe9'");
  EXPECT_EQ(Call(S("{0[0]} {0[a]}"), "format", Args({L({I(7)})})), "7 ");  // an Undefined prints ""
  EXPECT_EQ(Call(S("{0[a]} {0.a}"), "format", Args({d})), "1 1");
  EXPECT_EQ(Call(S("{{}} {}"), "format", Args({I(1)})), "{} 1");
  EXPECT_EQ(Call(S("{:{w}}|"), "format", Args({S("a")}, {{"w", I(4)}})), "a   |");
  EXPECT_EQ(Call(S("{}{:.3}{:10}|"), "format", Args({F(1.0), F(1.0), F(1.5)})), "1.01.0       1.5|");
  EXPECT_EQ(Call(S("{} {}"), "format", Args({I(1)})), "ERROR: tuple index out of range");
  EXPECT_EQ(Call(S("{0} {}"), "format", Args({I(1), I(2)})),
            "ERROR: cannot switch from manual field specification to automatic field numbering");
  EXPECT_EQ(Call(S("{x}"), "format", Args({}, {{"y", I(1)}})), "ERROR: 'x'");
  EXPECT_EQ(Call(S("{"), "format", Args({I(1)})), "ERROR: Single '{' encountered in format string");
  EXPECT_EQ(Call(S("}"), "format", Args({I(1)})), "ERROR: Single '}' encountered in format string");
  EXPECT_EQ(Call(S("{:d}"), "format", Args({S("a")})),
            "ERROR: Unknown format code 'd' for object of type 'str'");
  EXPECT_EQ(Call(S("{:5}"), "format", Args({Value::None()})),
            "ERROR: unsupported format string passed to NoneType.__format__");
}

TEST(MethodsTest, FormatWidthsAreCharged) {
  // '{:>1000000000}'.format('x') would build a 1 GB string
  EXPECT_EQ(Call(S("{:>1000000000}"), "format", Args({S("x")})), "ERROR: output limit");
  EXPECT_EQ(Call(S("{:>100}"), "format", Args({S("x")})).size(), 100u);
  EXPECT_EQ(Filter("tojson", L({I(1)}), Args({}, {{"indent", I(1000000000)}})), "ERROR: output limit");
  EXPECT_EQ(Filter("indent", S("a\nb"), Args({I(1000000000)})), "ERROR: output limit");
}

TEST(MethodsTest, LessCommonStringMethods) {
  EXPECT_EQ(Call(S("AbC ß"), "swapcase"), "aBc SS");                  // 'AbC ß'.swapcase()
  EXPECT_EQ(Call(S("ß ΣΑΣ"), "casefold"), "ss σασ");                   // 'ß ΣΑΣ'.casefold()
  EXPECT_EQ(Call(S("a\tb\n\tc"), "expandtabs", Args({I(4)})), "a   b\n    c");
  EXPECT_EQ(Call(S("a\tb"), "expandtabs"), "a       b");
  EXPECT_EQ(Call(S("_x1"), "isidentifier"), "True");
  EXPECT_EQ(Call(S("1x"), "isidentifier"), "False");
  EXPECT_EQ(Call(S(""), "isprintable"), "True");
  EXPECT_EQ(Call(S("a\n"), "isprintable"), "False");
  EXPECT_EQ(Call(S("é"), "isascii"), "False");
  Dict table;
  table.Set(I('a'), S("xy"));
  table.Set(I('b'), Value::None());
  table.Set(I('c'), I('C'));
  // 'abcd'.translate({97: 'xy', 98: None, 99: 67})
  EXPECT_EQ(Call(S("abcd"), "translate", Args({Value::MakeDict(table)})), "xyCd");
}

TEST(MethodsTest, DictAndList) {
  Value d = J(R"({"a": 1, "_p": 2, "items": 3})");
  EXPECT_EQ(Call(d, "items"), "[('a', 1), ('_p', 2), ('items', 3)]");
  EXPECT_EQ(Call(d, "keys"), "['a', '_p', 'items']");
  EXPECT_EQ(Call(d, "values"), "[1, 2, 3]");
  EXPECT_EQ(Call(d, "get", Args({S("a")})), "1");
  EXPECT_EQ(Call(d, "get", Args({S("zz")})), "None");
  EXPECT_EQ(Call(d, "get", Args({S("zz"), I(5)})), "5");
  EXPECT_EQ(Call(d, "get"), "ERROR: get expected at least 1 argument, got 0");
  Value l = L({I(1), I(2), I(3)});
  EXPECT_EQ(Call(l, "index", Args({I(2)})), "1");
  EXPECT_EQ(Call(l, "count", Args({I(1)})), "1");
  EXPECT_EQ(Call(l, "index", Args({I(5)})), "ERROR: 5 is not in list");
  EXPECT_EQ(Call(T({I(1)}), "index", Args({I(5)})), "ERROR: tuple.index(x): x not in tuple");
  EXPECT_EQ(Call(l, "append"), "NO METHOD");  // GetAttr gives the sandbox's unsafe Undefined
  EXPECT_EQ(BoundMethod(I(5), "real")->Str(), "5");              // (5).real
  EXPECT_EQ(BoundMethod(B(true), "real")->Str(), "1");           // true.real
  EXPECT_EQ(BoundMethod(F(1.5), "imag")->Str(), "0.0");
  EXPECT_EQ(Call(F(1.5), "is_integer"), "False");                // 1.5.is_integer()
  EXPECT_EQ(Call(F(2.0), "is_integer"), "True");
  EXPECT_EQ(Call(I(-5), "bit_length"), "3");
  EXPECT_EQ(Call(I(5), "is_integer"), "NO METHOD");              // not in Python 3.11
  EXPECT_EQ(Call(I(5), "upper"), "NO METHOD");
}

}  // namespace
}  // namespace carpool::text::jinja
