#include "text/jinja/json_value.h"

#include <cmath>
#include <cstddef>
#include <iterator>
#include <random>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/jinja/pystr.h"

namespace carpool::text::jinja {
namespace {

using ::testing::HasSubstr;

struct JsonCase {
  const char* text;
  size_t size;
  const char* repr;   // Python's repr() of json.loads' result; nullptr when carpool refuses it
  const char* error;  // a fragment of carpool's message when it refuses
};
#include "text/jinja/json_value_test_cases.inc"

// The old path, nlohmann::ordered_json then Value::FromJson; `accepted` says whether it took it.
std::string NlohmannRepr(absl::string_view text, bool* accepted) {
  const nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  *accepted = !j.is_discarded();
  return *accepted ? Value::FromJson(j).Repr() : "";
}

TEST(ParseJsonValueTest, MatchesPythonJsonLoads) {
  for (const JsonCase& c : kJsonCases) {
    const absl::string_view text(c.text, c.size);
    SCOPED_TRACE(absl::StrCat("document: ", absl::CHexEscape(text.substr(0, 200))));
    absl::StatusOr<Value> v = ParseJsonValue(text, 100);
    if (c.repr != nullptr) {
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(v->Repr(), c.repr);
    } else {
      ASSERT_FALSE(v.ok()) << "parsed as " << v->Repr();
      EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(v.status().message()), HasSubstr(c.error));
    }
  }
}

// Every document the old path (nlohmann's parser) took, this takes to the same value, and what
// it refused this refuses: the chat template's behaviour does not change.
TEST(ParseJsonValueTest, AgreesWithNlohmannOnTheCorpus) {
  for (const JsonCase& c : kJsonCases) {
    const absl::string_view text(c.text, c.size);
    SCOPED_TRACE(absl::StrCat("document: ", absl::CHexEscape(text.substr(0, 200))));
    bool accepted = false;
    const std::string expected = NlohmannRepr(text, &accepted);
    absl::StatusOr<Value> v = ParseJsonValue(text, 100);
    ASSERT_EQ(v.ok(), accepted) << (v.ok() ? v->Repr() : v.status().ToString());
    if (accepted) {
      EXPECT_EQ(v->Repr(), expected);
    }
  }
}

TEST(ParseJsonValueTest, TypesAndOrder) {
  absl::StatusOr<Value> v = ParseJsonValue(R"({"z": 1, "a": 1.0, "m": [true, null, "s"]})", 10);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->kind(), Kind::kDict);
  const Dict& d = v->dict_value();
  ASSERT_EQ(d.entries.size(), 3u);
  EXPECT_EQ(d.entries[0].first.string_value(), "z");
  EXPECT_EQ(d.Find("z")->kind(), Kind::kInt);
  EXPECT_EQ(d.Find("a")->kind(), Kind::kFloat);
  EXPECT_EQ(d.Find("m")->list_value()[1].kind(), Kind::kNone);
  EXPECT_EQ(ParseJsonValue("9223372036854775807", 0)->kind(), Kind::kInt);
  EXPECT_EQ(ParseJsonValue("9223372036854775808", 0)->kind(), Kind::kFloat);
  EXPECT_EQ(ParseJsonValue("-9223372036854775808", 0)->kind(), Kind::kInt);
  EXPECT_EQ(ParseJsonValue("-9223372036854775809", 0)->kind(), Kind::kFloat);
}

TEST(ParseJsonValueTest, RepeatedKeysInBigObjectsUseTheIndex) {
  std::string doc = "{";
  for (int i = 0; i < 100; ++i) absl::StrAppend(&doc, "\"k", i, "\": ", i, ", ");
  doc += "\"k5\": \"five\", \"k50\": \"fifty\"}";
  absl::StatusOr<Value> v = ParseJsonValue(doc, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  const Dict& d = v->dict_value();
  ASSERT_EQ(d.entries.size(), 100u);
  EXPECT_EQ(d.entries[5].second.string_value(), "five");
  EXPECT_EQ(d.entries[50].second.string_value(), "fifty");
  EXPECT_EQ(d.Find("k50")->string_value(), "fifty");
  EXPECT_EQ(d.Find("k99")->int_value(), 99);
}

TEST(ParseJsonValueTest, Depth) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_TRUE(ParseJsonValue(nested(100), 100).ok());
  EXPECT_TRUE(ParseJsonValue("1", 0).ok());
  JsonErrorKind kind = JsonErrorKind::kSyntax;
  absl::StatusOr<Value> v = ParseJsonValue(nested(101), 100, &kind);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(kind, JsonErrorKind::kTooDeep);
  EXPECT_EQ(std::string(v.status().message()),
            "nests arrays and objects deeper than 100 levels (at byte 100)");
  v = ParseJsonValue(R"({"a": [{"b": {}}]})", 3, &kind);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(kind, JsonErrorKind::kTooDeep);
  EXPECT_EQ(std::string(v.status().message()),
            "nests arrays and objects deeper than 3 levels (at byte 13)");
  EXPECT_EQ(std::string(ParseJsonValue("[]", 0, &kind).status().message()),
            "nests arrays and objects deeper than 0 levels (at byte 0)");

  // Far too deep is refused without recursing (no stack overflow), and the part past the limit is
  // still checked: a syntax error anywhere wins, as when the whole text was parsed first.
  const std::string deep = nested(300000);
  EXPECT_EQ(std::string(ParseJsonValue(deep, 100, &kind).status().message()),
            "nests arrays and objects deeper than 100 levels (at byte 100)");
  EXPECT_EQ(kind, JsonErrorKind::kTooDeep);
  const std::string deep_mixed =
      absl::StrCat("[", std::string(150, '['), R"({"a": [1, "x", {"b": null}], "c": {}})",
                   std::string(150, ']'), ", 2]");
  EXPECT_EQ(std::string(ParseJsonValue(deep_mixed, 100, &kind).status().message()),
            "nests arrays and objects deeper than 100 levels (at byte 100)");
  for (const std::string& bad : {
           std::string(150, '[') + "1,]" + std::string(149, ']'),
           std::string(150, '[') + std::string(149, ']'),
           std::string(150, '[') + R"({"a" 1})" + std::string(150, ']'),
           std::string(150, '[') + R"({"a": 1,})" + std::string(150, ']'),
           std::string(150, '[') + R"("\x")" + std::string(150, ']'),
           std::string(150, '[') + std::string(150, ']') + "]",
           std::string(150, '[') + std::string(149, ']') + "}",
       }) {
    kind = JsonErrorKind::kTooDeep;
    v = ParseJsonValue(bad, 100, &kind);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(kind, JsonErrorKind::kSyntax) << v.status();
    bool accepted = true;
    NlohmannRepr(bad, &accepted);
    EXPECT_FALSE(accepted);
  }
}

// A random value: strings of code points of every UTF-8 length and the characters JSON escapes,
// numbers of every size, containers up to 6 deep.
nlohmann::ordered_json RandomJson(std::mt19937_64& rng, int depth) {
  switch (rng() % (depth >= 6 ? 5 : 7)) {
    case 0:
      return rng() % 3 == 0 ? nlohmann::ordered_json(nullptr)
                            : nlohmann::ordered_json(rng() % 2 == 0);
    case 1:
      return static_cast<int64_t>(rng()) >> (rng() % 64);
    case 2:
      return rng() % 2 == 0 ? nlohmann::ordered_json(rng())
                            : nlohmann::ordered_json(static_cast<int64_t>(rng() % 1000) - 500);
    case 3: {
      std::uniform_real_distribution<double> unit(-1, 1);
      return unit(rng) * std::pow(10.0, static_cast<double>(rng() % 600) - 300);
    }
    case 4: {
      static const char32_t kSome[] = {'"',    '\\',    '/',     '\n',     '\t',   0x01,   0x1f,
                                       0x7f,   0xe9,    0x7ff,   0x800,    0x20ac, 0xfffd, 0xffff,
                                       0x2028, 0x10000, 0x1f600, 0x10ffff, ' '};
      std::string s;
      const size_t n = rng() % 48;
      for (size_t i = 0; i < n; ++i) {
        py::AppendCodePoint(rng() % 3 == 0 ? kSome[rng() % std::size(kSome)]
                                  : static_cast<char32_t>('a' + rng() % 26),
                   &s);
      }
      return s;
    }
    case 5: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (size_t n = rng() % 5; n > 0; --n) a.push_back(RandomJson(rng, depth + 1));
      return a;
    }
    default: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (size_t n = rng() % 6; n > 0; --n) {
        o[std::string(1, static_cast<char>('a' + rng() % 5))] = RandomJson(rng, depth + 1);
      }
      return o;
    }
  }
}

TEST(ParseJsonValueTest, RandomDocumentsReadBackAsNlohmannReadsThem) {
  std::mt19937_64 rng(14);
  for (int i = 0; i < 3000; ++i) {
    const nlohmann::ordered_json j = RandomJson(rng, 0);
    // Compact, indented, and with every non-ASCII character as \u escapes (surrogate pairs).
    const std::string doc = i % 3 == 0   ? j.dump()
                            : i % 3 == 1 ? j.dump(1)
                                         : j.dump(-1, ' ', /*ensure_ascii=*/true);
    SCOPED_TRACE(doc);
    absl::StatusOr<Value> v = ParseJsonValue(doc, 100);
    ASSERT_TRUE(v.ok()) << v.status();
    bool accepted = false;
    EXPECT_EQ(v->Repr(), NlohmannRepr(doc, &accepted));
    EXPECT_TRUE(accepted);
  }
}

// Documents with a byte changed, dropped or added: refused exactly when nlohmann refuses them,
// and equal to its reading when both take them.
TEST(ParseJsonValueTest, MutatedDocumentsAgreeWithNlohmann) {
  std::mt19937_64 rng(15);
  static const char kBytes[] = "[]{}\":,\\ -+.eE0123456789tfnu\xc3\xa9\xed\xa0\x80\xff\x01";
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string doc = RandomJson(rng, 3).dump(-1, ' ', rng() % 2 == 0);
    for (int edits = 1 + static_cast<int>(rng() % 2); edits > 0; --edits) {
      const size_t at = doc.empty() ? 0 : rng() % doc.size();
      const char byte = kBytes[rng() % (sizeof(kBytes) - 1)];
      switch (rng() % 3) {
        case 0:
          if (!doc.empty()) doc[at] = byte;
          break;
        case 1:
          if (!doc.empty()) doc.erase(at, 1);
          break;
        default:
          doc.insert(at, 1, byte);
      }
    }
    SCOPED_TRACE(absl::CHexEscape(doc));
    bool accepted = false;
    const std::string expected = NlohmannRepr(doc, &accepted);
    absl::StatusOr<Value> v = ParseJsonValue(doc, 100);
    ASSERT_EQ(v.ok(), accepted) << (v.ok() ? v->Repr() : v.status().ToString());
    if (accepted) {
      EXPECT_EQ(v->Repr(), expected);
    } else {
      ++refused;
      EXPECT_THAT(std::string(v.status().message()), HasSubstr(" at byte "));
    }
  }
  EXPECT_GT(refused, 5000);  // the mutations do break documents
}

}  // namespace
}  // namespace carpool::text::jinja
