// tojson as transformers defines it: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "text/jinja/builtins.h"
#include "text/jinja/builtins_internal.h"
#include "text/jinja/pystr.h"

namespace carpool::text::jinja {
namespace {

// Python's json module gives up where its recursion limit (about 1000 frames) is reached.
constexpr int kMaxDepth = 500;

struct Encoder {
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
  bool ensure_ascii = false;
  Budget* budget = nullptr;
  std::string out;

  // ensure_ascii: the code point at s[*i] as \uXXXX (a surrogate pair above U+FFFF); advances
  // *i past it.
  void AsciiEscape(absl::string_view s, size_t* i) {
    size_t end = *i + 1;
    while (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) ++end;
    const std::u32string cp = py::Decode(s.substr(*i, end - *i));
    *i = end;
    for (char32_t c : cp) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        out += absl::StrFormat("\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
      }
    }
  }

  void String(absl::string_view s) {
    out.push_back('"');
    for (size_t i = 0; i < s.size();) {
      const char c = s[i];
      const auto u = static_cast<unsigned char>(c);
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (u < 0x20 || (u == 0x7F && ensure_ascii)) {
            out += absl::StrFormat("\\u%04x", u);
          } else if (u >= 0x80 && ensure_ascii) {
            AsciiEscape(s, &i);
            continue;
          } else {
            out.push_back(c);
          }
      }
      ++i;
    }
    out.push_back('"');
  }

  static std::string Float(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    return py::FloatRepr(d);
  }

  void Newline(int depth) {
    out.push_back('\n');
    for (int i = 0; i < depth; ++i) out += *indent;
  }

  absl::Status Key(const Value& k) {
    switch (k.kind()) {
      case Kind::kString: String(k.string_value()); return absl::OkStatus();
      case Kind::kFloat: String(Float(k.float_value())); return absl::OkStatus();
      case Kind::kBool: String(k.bool_value() ? "true" : "false"); return absl::OkStatus();
      case Kind::kInt: String(absl::StrCat(k.int_value())); return absl::OkStatus();
      case Kind::kNone: String("null"); return absl::OkStatus();
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "keys must be str, int, float, bool or None, not ", KindName(k.kind())));
    }
  }

  absl::Status Encode(const Value& v, int depth) {
    if (depth > kMaxDepth) {
      return absl::InvalidArgumentError("maximum recursion depth exceeded while encoding a JSON object");
    }
    switch (v.kind()) {
      case Kind::kNone: out += "null"; break;
      case Kind::kBool: out += v.bool_value() ? "true" : "false"; break;
      case Kind::kInt: absl::StrAppend(&out, v.int_value()); break;
      case Kind::kFloat: out += Float(v.float_value()); break;
      case Kind::kString: String(v.string_value()); break;
      case Kind::kList:
      case Kind::kTuple: {
        if (v.is_generator()) {
          return absl::InvalidArgumentError("Object of type generator is not JSON serializable");
        }
        const List& items = v.list_value();
        if (items.empty()) {
          out += "[]";
          break;
        }
        RETURN_IF_ERROR(budget->Iterate(static_cast<int64_t>(items.size())));
        out.push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_separator;
          if (indent) Newline(depth + 1);
          RETURN_IF_ERROR(Encode(items[i], depth + 1));
        }
        if (indent) Newline(depth);
        out.push_back(']');
        break;
      }
      case Kind::kDict: {
        const Dict& dict = v.dict_value();
        if (dict.entries.empty()) {
          out += "{}";
          break;
        }
        RETURN_IF_ERROR(budget->Iterate(static_cast<int64_t>(dict.entries.size())));
        std::vector<const std::pair<Value, Value>*> entries;
        for (const auto& e : dict.entries) entries.push_back(&e);
        if (sort_keys) {
          absl::Status error;
          std::stable_sort(entries.begin(), entries.end(), [&](const auto* a, const auto* b) {
            if (!error.ok()) return false;
            absl::StatusOr<bool> less = Less(a->first, b->first);
            if (!less.ok()) {
              error = less.status();
              return false;
            }
            return *less;
          });
          RETURN_IF_ERROR(error);
        }
        out.push_back('{');
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i > 0) out += item_separator;
          if (indent) Newline(depth + 1);
          RETURN_IF_ERROR(Key(entries[i]->first));
          out += key_separator;
          RETURN_IF_ERROR(Encode(entries[i]->second, depth + 1));
        }
        if (indent) Newline(depth);
        out.push_back('}');
        break;
      }
      default: {
        const char* type = v.kind() == Kind::kCallable ? "function" : KindName(v.kind());
        return absl::InvalidArgumentError(
            absl::StrCat("Object of type ", type, " is not JSON serializable"));
      }
    }
    return budget->CheckSize(static_cast<int64_t>(out.size()));
  }
};

}  // namespace

namespace internal {

absl::StatusOr<std::string> Dumps(const Value& v, const Value& indent, const Value& separators,
                                  bool sort_keys, Budget& budget, bool ensure_ascii) {
  Encoder e;
  e.budget = &budget;
  e.sort_keys = sort_keys;
  e.ensure_ascii = ensure_ascii;
  if (indent.kind() == Kind::kInt || indent.kind() == Kind::kBool) {
    const int64_t width = std::max<int64_t>(0, indent.int_value());
    RETURN_IF_ERROR(budget.CheckSize(width));
    e.indent = std::string(static_cast<size_t>(width), ' ');
  } else if (indent.is_string()) {
    e.indent = indent.string_value();
  } else if (!indent.is_none() && !indent.is_undefined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "can't multiply sequence by non-int of type '", KindName(indent.kind()), "'"));
  }
  e.item_separator = e.indent ? "," : ", ";
  e.key_separator = ": ";
  if (!separators.is_none() && !separators.is_undefined()) {
    // item_separator, key_separator = separators
    if (!separators.is_sequence()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot unpack non-iterable ", KindName(separators.kind()), " object"));
    }
    const size_t n = separators.list_value().size();
    if (n < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("not enough values to unpack (expected 2, got ", n, ")"));
    }
    if (n > 2) return absl::InvalidArgumentError("too many values to unpack (expected 2)");
    if (!separators.list_value()[0].is_string() || !separators.list_value()[1].is_string()) {
      return absl::InvalidArgumentError("separators must be strings");
    }
    e.item_separator = separators.list_value()[0].string_value();
    e.key_separator = separators.list_value()[1].string_value();
  }
  RETURN_IF_ERROR(e.Encode(v, 0));
  return std::move(e.out);
}

}  // namespace internal

absl::StatusOr<std::string> ToJson(const Value& v, std::optional<int> indent,
                                   std::optional<std::pair<std::string, std::string>> separators,
                                   Budget& budget) {
  const Value indent_value = indent ? Value::Int(*indent) : Value::None();
  const Value separators_value =
      separators ? Value::MakeTuple({Value::String(separators->first),
                                     Value::String(separators->second)})
                 : Value::None();
  return internal::Dumps(v, indent_value, separators_value, false, budget);
}

}  // namespace carpool::text::jinja
