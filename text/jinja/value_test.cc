// Every expectation was produced by /usr/bin/python3 (3.11) or Jinja2 3.1.2's
// ImmutableSandboxedEnvironment; the expression is in the comment beside it.
#include "text/jinja/value.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::text::jinja {
namespace {

using ::testing::HasSubstr;

class TestBudget : public Budget {
 public:
  absl::Status Iterate(int64_t n) override {
    iterations += n;
    return iterations > 1000000 ? absl::InvalidArgumentError("too many iterations")
                                : absl::OkStatus();
  }
  absl::Status CheckSize(int64_t bytes) override {
    return bytes > max_bytes ? absl::InvalidArgumentError("output limit") : absl::OkStatus();
  }
  int64_t iterations = 0;
  int64_t max_bytes = 1 << 20;
};

Value S(const char* s) { return Value::String(s); }
Value I(int64_t i) { return Value::Int(i); }
Value F(double d) { return Value::Float(d); }
Value L(List items) { return Value::MakeList(std::move(items)); }
Value T(List items) { return Value::MakeTuple(std::move(items)); }
Value D(std::vector<std::pair<Value, Value>> entries) {
  Dict d;
  for (auto& [k, v] : entries) d.Set(k, v);
  return Value::MakeDict(std::move(d));
}
Value J(const char* json) { return Value::FromJson(nlohmann::ordered_json::parse(json)); }

std::string Err(const absl::Status& s) { return std::string(s.message()); }
template <typename T>
std::string Err(const absl::StatusOr<T>& s) {
  return std::string(s.status().message());
}

TEST(ValueTest, SameBytesComparesEveryByteOfEveryLength) {
  const std::string base = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
  for (size_t n = 0; n <= base.size(); ++n) {
    const std::string a = base.substr(0, n);
    std::string b = a;
    EXPECT_TRUE(SameBytes(a.data(), b.data(), n)) << n;
    for (size_t i = 0; i < n; ++i) {
      b[i] ^= 0x20;
      EXPECT_FALSE(SameBytes(a.data(), b.data(), n)) << n << " differing at " << i;
      b[i] ^= 0x20;
    }
  }
  Dict d;
  d.Set(Value::String("rolf"), Value::Int(1));
  d.Set(Value::String("role"), Value::Int(2));
  d.Set(Value::String("reasoning_content"), Value::Int(3));
  d.Set(Value::String("reasoning_contenu"), Value::Int(4));
  ASSERT_NE(d.Find(absl::string_view("role")), nullptr);
  EXPECT_EQ(d.Find(absl::string_view("role"))->int_value(), 2);
  EXPECT_EQ(d.Find(absl::string_view("reasoning_contenu"))->int_value(), 4);
  EXPECT_EQ(d.Find(absl::string_view("rola")), nullptr);
}

TEST(ValueTest, StringRepr) {
  // repr('a\x7f\x00\u200b\U0001F600\t\n\r\\\'\x1b\ud7ff\U000e0001\xa0é')
  const std::string nul(1, '\0');
  EXPECT_EQ(Value::String("a\x7f" + nul).Repr(), "'a\\x7f\\x00'");
  EXPECT_EQ(Value::String("a\x7f" + nul + "\u200b\U0001F600\t\n\r\\'\x1b\uD7FF\U000E0001\u00A0\u00E9")
                .Repr(),
            "\"a\\x7f\\x00\\u200b\U0001F600\\t\\n\\r\\\\'\\x1b\\ud7ff\\U000e0001\\xa0\u00E9\"");
  EXPECT_EQ(S("it's").Repr(), "\"it's\"");                      // repr("it's")
  EXPECT_EQ(S("it's \"x\"").Repr(), "'it\\'s \"x\"'");          // repr("it's \"x\"")
  EXPECT_EQ(S("\u00ad\u2028").Repr(), "'\\xad\\u2028'");        // repr('\xad\u2028')
  EXPECT_EQ(S("").Repr(), "''");
}

TEST(ValueTest, FloatRepr) {
  EXPECT_EQ(F(1.0).Str(), "1.0");                                  // str(1.0)
  EXPECT_EQ(F(1e-5).Str(), "1e-05");                               // str(1e-5)
  EXPECT_EQ(F(1e16).Str(), "1e+16");                               // str(1e16)
  EXPECT_EQ(F(1e15).Str(), "1000000000000000.0");                  // str(1e15)
  EXPECT_EQ(F(0.0001).Str(), "0.0001");                            // str(0.0001)
  EXPECT_EQ(F(2.5e-05).Str(), "2.5e-05");                          // str(2.5e-05)
  EXPECT_EQ(F(1.0 / 3).Str(), "0.3333333333333333");               // str(1/3)
  EXPECT_EQ(F(0.1 + 0.2).Str(), "0.30000000000000004");            // str(0.1+0.2)
  EXPECT_EQ(F(123456789.123).Str(), "123456789.123");              // str(123456789.123)
  EXPECT_EQ(F(5e-324).Str(), "5e-324");                            // str(5e-324)
  EXPECT_EQ(F(1.7976931348623157e+308).Str(), "1.7976931348623157e+308");
  EXPECT_EQ(F(1e22).Str(), "1e+22");                               // str(1e22)
  EXPECT_EQ(F(1e16 + 2).Str(), "1.0000000000000002e+16");          // str(1e16+2)
  EXPECT_EQ(F(12345678901234567.0).Str(), "1.2345678901234568e+16");
  EXPECT_EQ(F(-0.0).Str(), "-0.0");                                // str(-0.0)
  EXPECT_EQ(F(std::numeric_limits<double>::infinity()).Str(), "inf");
  EXPECT_EQ(F(-std::numeric_limits<double>::infinity()).Str(), "-inf");
  EXPECT_EQ(F(std::nan("")).Str(), "nan");
  EXPECT_EQ(F(100.0).Str(), "100.0");
}

TEST(ValueTest, ContainerRepr) {
  // str([1, 'a', None, True, 1.5, (1,), (), {'a': [1, (2, 3)]}])
  Value v = L({I(1), S("a"), Value::None(), Value::Bool(true), F(1.5), T({I(1)}), T({}),
               D({{S("a"), L({I(1), T({I(2), I(3)})})}})});
  EXPECT_EQ(v.Str(), "[1, 'a', None, True, 1.5, (1,), (), {'a': [1, (2, 3)]}]");
  // str({"k'": "it's", 'q"': 'both \' "'})
  EXPECT_EQ(D({{S("k'"), S("it's")}, {S("q\""), S("both ' \"")}}).Str(),
            "{\"k'\": \"it's\", 'q\"': 'both \\' \"'}");
  // {{ namespace(a=1) }} and {{ [x] }} in Jinja2
  Dict attrs;
  attrs.Set(S("a"), I(1));
  EXPECT_EQ(Value::Namespace(attrs).Str(), "<Namespace {'a': 1}>");
  EXPECT_EQ(L({Value::Undefined("'x' is undefined")}).Str(), "[Undefined]");
  EXPECT_EQ(Value::Undefined("x").Str(), "");
  // {% macro m() %}x{% endmacro %}{{ m }}
  EXPECT_EQ(Value::MakeCallable("m", nullptr).Str(), "<Macro 'm'>");
  EXPECT_EQ(GetAttr(S("a"), "upper").Str(), "<built-in method upper of str object>");
  EXPECT_EQ(Value::None().Str(), "None");
  EXPECT_EQ(Value::Bool(false).Str(), "False");
  EXPECT_EQ(I(-42).Str(), "-42");
}

TEST(ValueTest, Truthiness) {
  EXPECT_FALSE(Value::Undefined().Truthy());
  EXPECT_FALSE(Value::None().Truthy());
  EXPECT_FALSE(I(0).Truthy());
  EXPECT_FALSE(F(0.0).Truthy());
  EXPECT_TRUE(F(std::nan("")).Truthy());  // bool(float('nan'))
  EXPECT_FALSE(S("").Truthy());
  EXPECT_TRUE(S(" ").Truthy());
  EXPECT_FALSE(L({}).Truthy());
  EXPECT_FALSE(D({}).Truthy());
  EXPECT_TRUE(T({Value::None()}).Truthy());
  EXPECT_TRUE(Value::Namespace({}).Truthy());
}

TEST(ValueTest, Equality) {
  EXPECT_TRUE(Equals(I(1), F(1.0)));             // 1 == 1.0
  EXPECT_TRUE(Equals(Value::Bool(true), I(1)));  // True == 1
  EXPECT_TRUE(Equals(L({I(1)}), L({F(1.0)})));   // [1] == [1.0]
  EXPECT_FALSE(Equals(T({S("a")}), L({S("a")})));  // ('a',) == ['a']
  // {'a':1,'b':2} == {'b':2,'a':1.0}
  EXPECT_TRUE(Equals(D({{S("a"), I(1)}, {S("b"), I(2)}}), D({{S("b"), I(2)}, {S("a"), F(1.0)}})));
  EXPECT_FALSE(Equals(F(std::nan("")), F(std::nan(""))));
  // 2**53+1 == float(2**53)
  EXPECT_FALSE(Equals(I((int64_t{1} << 53) + 1), F(static_cast<double>(int64_t{1} << 53))));
  EXPECT_FALSE(Equals(S("1"), I(1)));
  EXPECT_TRUE(Equals(Value::Undefined("a"), Value::Undefined("b")));
  EXPECT_FALSE(Equals(Value::None(), Value::Undefined()));
}

TEST(ValueTest, Ordering) {
  EXPECT_TRUE(*Less(S("z"), S("\u00e9")));               // 'é' > 'z'
  EXPECT_TRUE(*Less(L({I(1)}), L({I(1), I(0)})));        // [1] < [1, 0]
  EXPECT_TRUE(*Less(I(1), F(1.5)));
  EXPECT_TRUE(*Compare(CompareOp::kGe, I(2), F(2.0)));
  // 'a'<1
  EXPECT_EQ(Err(Less(S("a"), I(1))), "'<' not supported between instances of 'str' and 'int'");
  // [1]<(1,)
  EXPECT_EQ(Err(Less(L({I(1)}), T({I(1)}))),
            "'<' not supported between instances of 'list' and 'tuple'");
  // [1,2] >= [1,'a']
  EXPECT_EQ(Err(Compare(CompareOp::kGe, L({I(1), I(2)}), L({I(1), S("a")}))),
            "'>=' not supported between instances of 'int' and 'str'");
  // None<None
  EXPECT_EQ(Err(Less(Value::None(), Value::None())),
            "'<' not supported between instances of 'NoneType' and 'NoneType'");
  // {{ x < 1 }} in Jinja2: UndefinedError 'x' is undefined
  EXPECT_EQ(Err(Less(Value::Undefined("'x' is undefined"), I(1))), "'x' is undefined");
}

absl::StatusOr<Value> Op(BinaryOp op, const Value& a, const Value& b) {
  TestBudget budget;
  return Arithmetic(op, a, b, budget);
}

TEST(ValueTest, IntegerArithmetic) {
  EXPECT_EQ(Op(BinaryOp::kFloorDiv, I(-7), I(2))->Str(), "-4");  // -7//2
  EXPECT_EQ(Op(BinaryOp::kMod, I(-7), I(2))->Str(), "1");        // -7%2
  EXPECT_EQ(Op(BinaryOp::kMod, I(7), I(-2))->Str(), "-1");       // 7%-2
  EXPECT_EQ(Op(BinaryOp::kDiv, I(10), I(4))->Str(), "2.5");      // 10/4
  EXPECT_EQ(Op(BinaryOp::kDiv, I(4), I(2))->Str(), "2.0");       // 4/2
  EXPECT_EQ(Op(BinaryOp::kPow, I(2), I(10))->Str(), "1024");
  EXPECT_EQ(Op(BinaryOp::kPow, I(2), I(-1))->Str(), "0.5");      // 2**-1
  EXPECT_EQ(Op(BinaryOp::kPow, I(-2), I(-1))->Str(), "-0.5");    // (-2)**-1
  EXPECT_EQ(Op(BinaryOp::kAdd, Value::Bool(true), I(1))->Str(), "2");
  EXPECT_EQ(Op(BinaryOp::kSub, I(-9223372036854775807), I(1))->Str(), "-9223372036854775808");
  EXPECT_EQ(Op(BinaryOp::kMod, I(std::numeric_limits<int64_t>::min()), I(-1))->Str(), "0");
  // Python has big ints (2**62*2 == 9223372036854775808); carpool's are 64-bit: an error.
  EXPECT_THAT(Err(Op(BinaryOp::kMul, I(int64_t{1} << 62), I(2))), HasSubstr("integer overflow"));
  EXPECT_THAT(Err(Op(BinaryOp::kAdd, I(std::numeric_limits<int64_t>::max()), I(1))),
              HasSubstr("integer overflow"));
  EXPECT_THAT(Err(Op(BinaryOp::kPow, I(10), I(20))), HasSubstr("integer overflow"));
  EXPECT_THAT(Err(Op(BinaryOp::kFloorDiv, I(std::numeric_limits<int64_t>::min()), I(-1))),
              HasSubstr("integer overflow"));
  EXPECT_EQ(Err(Op(BinaryOp::kFloorDiv, I(1), I(0))), "integer division or modulo by zero");
  EXPECT_EQ(Err(Op(BinaryOp::kMod, I(1), I(0))), "integer modulo by zero");
  EXPECT_EQ(Err(Op(BinaryOp::kDiv, I(1), I(0))), "division by zero");
  EXPECT_EQ(Err(Op(BinaryOp::kPow, I(0), I(-1))), "0.0 cannot be raised to a negative power");
}

TEST(ValueTest, FloatArithmetic) {
  EXPECT_EQ(Op(BinaryOp::kFloorDiv, F(-7.5), I(2))->Str(), "-4.0");  // -7.5//2
  EXPECT_EQ(Op(BinaryOp::kMod, F(-7.5), I(2))->Str(), "0.5");        // -7.5%2
  EXPECT_EQ(Op(BinaryOp::kMod, F(7.5), I(-2))->Str(), "-0.5");       // 7.5%-2
  EXPECT_EQ(Op(BinaryOp::kFloorDiv, F(5.5), I(-2))->Str(), "-3.0");  // 5.5 // -2
  EXPECT_EQ(Op(BinaryOp::kMod, F(-5.5), I(-2))->Str(), "-1.5");      // -5.5 % -2
  EXPECT_EQ(Op(BinaryOp::kMod, F(-0.0), I(5))->Str(), "0.0");        // -0.0%5
  EXPECT_EQ(Op(BinaryOp::kFloorDiv, I(-1), F(5.0))->Str(), "-1.0");  // -1 // 5.0
  EXPECT_EQ(Op(BinaryOp::kPow, I(2), F(0.5))->Str(), "1.4142135623730951");
  EXPECT_EQ(Op(BinaryOp::kPow, I(-2), F(2.0))->Str(), "4.0");
  EXPECT_EQ(Op(BinaryOp::kMul, F(1e308), I(10))->Str(), "inf");     // 1e308 * 10
  EXPECT_EQ(Op(BinaryOp::kAdd, F(0.1), F(0.2))->Str(), "0.30000000000000004");
  EXPECT_EQ(Err(Op(BinaryOp::kFloorDiv, F(1.0), I(0))), "float floor division by zero");
  EXPECT_EQ(Err(Op(BinaryOp::kMod, F(1.0), I(0))), "float modulo");
  EXPECT_EQ(Err(Op(BinaryOp::kDiv, F(1.0), I(0))), "float division by zero");
  EXPECT_EQ(Err(Op(BinaryOp::kPow, F(10.0), I(400))), "(34, 'Numerical result out of range')");
}

TEST(ValueTest, SequenceArithmetic) {
  EXPECT_EQ(Op(BinaryOp::kAdd, S("a"), S("\u00e9"))->Str(), "a\u00e9");
  EXPECT_EQ(Op(BinaryOp::kMul, S("ab"), I(3))->Str(), "ababab");
  EXPECT_EQ(Op(BinaryOp::kMul, I(2), S("ab"))->Str(), "abab");
  EXPECT_EQ(Op(BinaryOp::kMul, S("ab"), Value::Bool(true))->Str(), "ab");  // 'ab' * True
  EXPECT_EQ(Op(BinaryOp::kMul, S("ab"), I(-1))->Str(), "");
  EXPECT_EQ(Op(BinaryOp::kMul, L({I(1)}), I(2))->Str(), "[1, 1]");
  EXPECT_EQ(Op(BinaryOp::kAdd, L({I(1)}), L({S("a")}))->Str(), "[1, 'a']");
  EXPECT_EQ(Op(BinaryOp::kAdd, T({I(1)}), T({I(2)}))->Str(), "(1, 2)");
  EXPECT_EQ(Err(Op(BinaryOp::kAdd, S("a"), I(1))), "can only concatenate str (not \"int\") to str");
  EXPECT_EQ(Err(Op(BinaryOp::kAdd, I(1), S("a"))),
            "unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(Err(Op(BinaryOp::kAdd, L({I(1)}), T({I(1)}))),
            "can only concatenate list (not \"tuple\") to list");
  EXPECT_EQ(Err(Op(BinaryOp::kMul, S("a"), F(1.5))),
            "can't multiply sequence by non-int of type 'float'");
  EXPECT_EQ(Err(Op(BinaryOp::kMul, S("a"), Value::None())),
            "can't multiply sequence by non-int of type 'NoneType'");  // 'a' * None
  EXPECT_EQ(Err(Op(BinaryOp::kMul, D({}), L({}))),
            "can't multiply sequence by non-int of type 'dict'");  // {} * []
  EXPECT_EQ(Err(Op(BinaryOp::kMul, S("a"), S("b"))),
            "can't multiply sequence by non-int of type 'str'");
  EXPECT_EQ(Err(Op(BinaryOp::kSub, I(1), S("a"))),
            "unsupported operand type(s) for -: 'int' and 'str'");
  EXPECT_EQ(Err(Op(BinaryOp::kAdd, Value::None(), Value::None())),
            "unsupported operand type(s) for +: 'NoneType' and 'NoneType'");
  EXPECT_EQ(Err(Op(BinaryOp::kAdd, Value::Undefined("'x' is undefined"), I(1))),
            "'x' is undefined");  // {{ x + 1 }}
}

TEST(ValueTest, PrintfStyleFormatting) {
  Dict mapping;
  mapping.Set(S("a"), I(1));
  Value d = Value::MakeDict(mapping);
  EXPECT_EQ(Op(BinaryOp::kMod, S("%s-%s"), T({I(1), S("a")}))->Str(), "1-a");  // '%s-%s' % (1, 'a')
  EXPECT_EQ(Op(BinaryOp::kMod, S("%(a)s"), d)->Str(), "1");                    // '%(a)s' % {'a': 1}
  EXPECT_EQ(Op(BinaryOp::kMod, S("%s"), d)->Str(), "{'a': 1}");                // '%s' % {'a': 1}
  EXPECT_EQ(Op(BinaryOp::kMod, S("%s"), L({I(1), I(2)}))->Str(), "[1, 2]");
  EXPECT_EQ(Op(BinaryOp::kMod, S("%d%%"), I(5))->Str(), "5%");
  EXPECT_EQ(Op(BinaryOp::kMod, S("%s"), Value::Undefined("'x' is undefined"))->Str(), "");
  // '%05.1f|%-6d|%+.2e|%#x|%c|%c|%3c|' % (2.25, 3, 12345.678, 255, 'a', 66, 'z')
  EXPECT_EQ(Op(BinaryOp::kMod, S("%05.1f|%-6d|%+.2e|%#x|%c|%c|%3c|"),
               T({F(2.25), I(3), F(12345.678), I(255), S("a"), I(66), S("z")}))->Str(),
            "002.2|3     |+1.23e+04|0xff|a|B|  z|");
  // '%.1s|%5.1s|%-3s|' % ('abc', 'xyz', 'é')
  EXPECT_EQ(Op(BinaryOp::kMod, S("%.1s|%5.1s|%-3s|"), T({S("abc"), S("xyz"), S("é")}))->Str(),
            "a|    x|é  |");
  EXPECT_EQ(Err(Op(BinaryOp::kMod, S("%s %s"), T({I(1)}))), "not enough arguments for format string");
  EXPECT_EQ(Err(Op(BinaryOp::kMod, S("x"), I(5))),
            "not all arguments converted during string formatting");
  EXPECT_EQ(Err(Op(BinaryOp::kMod, S("%z"), I(1))),
            "unsupported format character 'z' (0x7a) at index 1");
  EXPECT_EQ(Err(Op(BinaryOp::kMod, S("%d"), S("a"))), "%d format: a real number is required, not str");
}

TEST(ValueTest, RepetitionIsChargedBeforeAllocating) {
  TestBudget budget;
  budget.max_bytes = 1000;
  EXPECT_EQ(Err(Arithmetic(BinaryOp::kMul, S("ab"), I(int64_t{1} << 40), budget)), "output limit");
  EXPECT_EQ(Err(Arithmetic(BinaryOp::kMul, L({I(1)}), I(std::numeric_limits<int64_t>::max()),
                           budget)),
            "output limit");
  EXPECT_TRUE(Arithmetic(BinaryOp::kMul, S("ab"), I(500), budget).ok());
}

TEST(ValueTest, NegateAndConcat) {
  EXPECT_EQ(Negate(I(5))->Str(), "-5");
  EXPECT_EQ(Negate(F(0.0))->Str(), "-0.0");
  EXPECT_EQ(Negate(Value::Bool(true))->Str(), "-1");
  EXPECT_EQ(Err(Negate(S("a"))), "bad operand type for unary -: 'str'");  // -'a'
  EXPECT_EQ(Err(Negate(Value::None())), "bad operand type for unary -: 'NoneType'");
  EXPECT_THAT(Err(Negate(I(std::numeric_limits<int64_t>::min()))), HasSubstr("integer overflow"));
  TestBudget budget;
  EXPECT_EQ(Concat(I(1), S("a"), budget)->Str(), "1a");
  EXPECT_EQ(Concat(Value::Undefined("'x' is undefined"), I(1), budget)->Str(), "1");  // {{ x ~ 1 }}
  EXPECT_EQ(Concat(L({S("a")}), Value::None(), budget)->Str(), "['a']None");
}

TEST(ValueTest, Membership) {
  EXPECT_TRUE(*Contains(S("h\u00e9llo"), S("\u00e9l")));
  EXPECT_TRUE(*Contains(L({I(1), S("a")}), F(1.0)));
  EXPECT_TRUE(*Contains(D({{S("a"), I(1)}}), S("a")));
  EXPECT_FALSE(*Contains(D({{S("a"), I(1)}}), I(1)));
  EXPECT_FALSE(*Contains(Value::Undefined("'x' is undefined"), I(1)));  // {{ 1 in x }}
  EXPECT_EQ(Err(Contains(S("a"), I(1))), "'in <string>' requires string as left operand, not int");
  EXPECT_EQ(Err(Contains(I(1), S("a"))), "argument of type 'int' is not iterable");
  EXPECT_EQ(Err(Contains(Value::None(), I(1))), "argument of type 'NoneType' is not iterable");
}

TEST(ValueTest, AttributesAsTheSandboxSeesThem) {
  Value d = D({{S("a"), I(1)}, {S("_p"), I(2)}, {S("items"), I(3)}});
  EXPECT_EQ(GetAttr(d, "a").Str(), "1");
  EXPECT_EQ(GetAttr(d, "_p").Str(), "2");                     // {{ d._p }}
  EXPECT_EQ(GetAttr(d, "items").kind(), Kind::kCallable);     // {{ d.items }} is the method
  EXPECT_EQ(GetItem(d, S("items")).Str(), "3");               // {{ d['items'] }}
  EXPECT_EQ(GetItem(d, S("keys")).kind(), Kind::kCallable);   // d['keys'] falls back to the method
  EXPECT_EQ(GetAttr(d, "foo").undefined_hint(), "'dict object' has no attribute 'foo'");
  EXPECT_EQ(GetItem(d, S("foo")).undefined_hint(), "'dict object' has no attribute 'foo'");
  EXPECT_EQ(GetItem(d, I(5)).undefined_hint(), "dict object has no element 5");  // d[5]
  Value unsafe = GetAttr(d, "__class__");
  EXPECT_TRUE(unsafe.undefined_is_unsafe());
  EXPECT_EQ(Err(CheckDefined(unsafe)), "access to attribute '__class__' of 'dict' object is unsafe.");
  EXPECT_EQ(Err(CheckDefined(GetAttr(d, "pop"))),
            "access to attribute 'pop' of 'dict' object is unsafe.");
  Value l = L({I(1), I(2), I(3)});
  EXPECT_EQ(Err(CheckDefined(GetAttr(l, "append"))),
            "access to attribute 'append' of 'list' object is unsafe.");  // {{ l.append(1) }}
  EXPECT_EQ(Err(CheckDefined(GetAttr(l, "pop"))),
            "access to attribute 'pop' of 'list' object is unsafe.");
  EXPECT_EQ(Err(CheckDefined(GetAttr(l, "__len__"))),
            "access to attribute '__len__' of 'list' object is unsafe.");
  EXPECT_EQ(GetItem(l, S("x")).undefined_hint(), "'list object' has no attribute 'x'");
  EXPECT_EQ(GetAttr(Value::None(), "foo").undefined_hint(), "'None' has no attribute 'foo'");
  EXPECT_EQ(GetAttr(I(5), "x").undefined_hint(), "'int object' has no attribute 'x'");
  EXPECT_EQ(GetAttr(F(1.5), "x").undefined_hint(), "'float object' has no attribute 'x'");
  EXPECT_EQ(GetAttr(Value::Bool(true), "x").undefined_hint(), "'bool object' has no attribute 'x'");
  EXPECT_EQ(GetAttr(T({I(1)}), "x").undefined_hint(), "'tuple object' has no attribute 'x'");
  EXPECT_EQ(GetAttr(S("s"), "x").undefined_hint(), "'str object' has no attribute 'x'");
  EXPECT_EQ(GetAttr(S("s"), "upper").kind(), Kind::kCallable);
  Dict attrs;
  attrs.Set(S("a"), I(1));
  Value ns = Value::Namespace(attrs);
  EXPECT_EQ(GetAttr(ns, "a").Str(), "1");
  EXPECT_EQ(GetItem(ns, S("a")).Str(), "1");
  EXPECT_EQ(GetAttr(ns, "b").undefined_hint(),
            "'jinja2.utils.Namespace object' has no attribute 'b'");
  Value x = Value::Undefined("'x' is undefined");
  EXPECT_EQ(GetAttr(x, "y").undefined_hint(), "'x' is undefined");
}

TEST(ValueTest, Items) {
  Value l = L({I(1), I(2), I(3)});
  EXPECT_EQ(GetItem(l, I(-1)).Str(), "3");
  EXPECT_EQ(GetItem(l, Value::Bool(true)).Str(), "2");  // l[True]
  EXPECT_EQ(GetItem(l, I(5)).undefined_hint(), "list object has no element 5");
  EXPECT_EQ(GetItem(l, I(-4)).undefined_hint(), "list object has no element -4");
  EXPECT_EQ(GetItem(l, F(1.0)).undefined_hint(), "list object has no element 1.0");
  Value s = S("h\u00e9llo");
  EXPECT_EQ(GetItem(s, I(1)).Str(), "\u00e9");  // 'héllo'[1]
  EXPECT_EQ(GetItem(s, I(-1)).Str(), "o");
  EXPECT_EQ(GetItem(s, I(10)).undefined_hint(), "str object has no element 10");
  EXPECT_EQ(GetItem(D({{I(1), I(2)}}), F(1.0)).Str(), "2");  // {1:2}[1.0]
  EXPECT_EQ(GetItem(Value::None(), I(0)).undefined_hint(), "None has no element 0");
}

TEST(ValueTest, Slices) {
  auto slice = [](const Value& v, std::optional<int64_t> a, std::optional<int64_t> b,
                  std::optional<int64_t> c) { return Slice(v, a, b, c)->Str(); };
  Value l = L({I(1), I(2), I(3), I(4), I(5)});
  EXPECT_EQ(slice(S("h\u00e9llo"), {}, {}, -1), "oll\u00e9h");         // 'héllo'[::-1]
  EXPECT_EQ(slice(S("h\u00e9llo"), -2, {}, {}), "lo");                // 'héllo'[-2:]
  EXPECT_EQ(slice(S("abc"), 10, {}, {}), "");                         // 'abc'[10:]
  EXPECT_EQ(slice(l, {}, {}, -2), "[5, 3, 1]");                       // [1,2,3,4,5][::-2]
  EXPECT_EQ(slice(l, -100, 100, 3), "[1, 4]");                        // [-100:100:3]
  EXPECT_EQ(slice(l, 5, 1, -1), "[5, 4, 3]");                         // [5:1:-1]
  EXPECT_EQ(slice(l, 1, -1, {}), "[2, 3, 4]");
  EXPECT_EQ(slice(l, {}, {}, std::numeric_limits<int64_t>::min()), "[5]");
  EXPECT_EQ(slice(l, {}, {}, std::numeric_limits<int64_t>::max()), "[1]");
  EXPECT_EQ(slice(T({I(1), I(2), I(3)}), 1, {}, {}), "(2, 3)");       // (1,2,3)[1:]
  EXPECT_EQ(Err(Slice(l, {}, {}, 0)), "slice step cannot be zero");
  EXPECT_EQ(Err(Slice(Value::None(), 1, {}, {})), "'NoneType' object is not subscriptable");
  EXPECT_EQ(Err(Slice(Value::Undefined("'x' is undefined"), 1, {}, {})), "'x' is undefined");
}

TEST(ValueTest, IterationAndLength) {
  EXPECT_EQ(Value::MakeList(*Iterate(S("h\u00e9"))).Str(), "['h', '\u00e9']");
  EXPECT_EQ(Value::MakeList(*Iterate(D({{S("a"), I(1)}, {S("b"), I(2)}}))).Str(), "['a', 'b']");
  EXPECT_TRUE(Iterate(Value::Undefined())->empty());
  EXPECT_EQ(Err(Iterate(I(5))), "'int' object is not iterable");
  EXPECT_EQ(Err(Iterate(Value::None())), "'NoneType' object is not iterable");
  EXPECT_EQ(*Length(S("h\u00e9llo\U0001F600")), 6);
  EXPECT_EQ(*Length(Value::Undefined()), 0);  // {{ x | length }}
  EXPECT_EQ(Err(Length(I(5))), "object of type 'int' has no len()");
  EXPECT_EQ(Err(Length(Value::None())), "object of type 'NoneType' has no len()");
}

TEST(ValueTest, FromJsonKeepsOrderAndTypes) {
  Value v = J(R"({"z": 1, "a": [1.0, 2.5, true, null, "x"], "m": {"b": 1, "a": 2}})");
  // json.loads(...) printed by str()
  EXPECT_EQ(v.Str(), "{'z': 1, 'a': [1.0, 2.5, True, None, 'x'], 'm': {'b': 1, 'a': 2}}");
  EXPECT_EQ(J("18446744073709551615").kind(), Kind::kFloat);
  EXPECT_EQ(J("9223372036854775807").Str(), "9223372036854775807");
  EXPECT_EQ(J("-5").Str(), "-5");
  EXPECT_EQ(J("1e5").Str(), "100000.0");  // json.loads('1e5')
}

TEST(ValueTest, DictSetKeepsThePlaceAndTheFirstKey) {
  Dict d;
  d.Set(I(1), S("a"));
  d.Set(S("b"), S("b"));
  d.Set(F(1.0), S("c"));  // d = {1: 'a', 'b': 'b'}; d[1.0] = 'c'
  EXPECT_EQ(Value::MakeDict(d).Str(), "{1: 'c', 'b': 'b'}");
}

TEST(ValueTest, BigDictsAreBuiltInLinearTime) {
  // 200,000 distinct keys through Set: quadratic would take minutes.
  Dict d;
  for (int i = 0; i < 200000; ++i) d.Set(Value::String(absl::StrCat("k", i)), I(i));
  d.Set(S("k7"), S("again"));  // replaces in place
  ASSERT_EQ(d.entries.size(), 200000u);
  EXPECT_EQ(d.Find("k7")->Str(), "again");
  EXPECT_EQ(d.entries[7].second.Str(), "again");
  EXPECT_EQ(d.Find("k199999")->Str(), "199999");
  EXPECT_EQ(d.Find("nope"), nullptr);
  // Entries appended directly are found, and Set sees them.
  d.entries.emplace_back(S("direct"), I(1));
  EXPECT_EQ(d.Find("direct")->Str(), "1");
  d.Set(S("direct"), I(2));
  EXPECT_EQ(d.entries.size(), 200001u);
  EXPECT_EQ(d.Find(S("direct"))->Str(), "2");
  // Non-string keys keep Python's equality (1 == 1.0 == True).
  d.Set(I(1), S("one"));
  d.Set(F(1.0), S("uno"));
  EXPECT_EQ(d.entries.size(), 200002u);
  EXPECT_EQ(d.Find(Value::Bool(true))->Str(), "uno");
  // A copy has its own index.
  Dict copy = d;
  copy.Set(S("k0"), S("changed"));
  EXPECT_EQ(d.Find("k0")->Str(), "0");
  EXPECT_EQ(copy.Find("k0")->Str(), "changed");
}

}  // namespace
}  // namespace carpool::text::jinja
