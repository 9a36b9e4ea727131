// The less common methods of str (swapcase, casefold, expandtabs, translate, isidentifier,
// isprintable, isascii) and the attributes and methods of numbers (real, imag, numerator,
// denominator, bit_length, conjugate, is_integer), as Python 3.11's.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "text/jinja/builtins_internal.h"
#include "text/jinja/pystr.h"

namespace carpool::text::jinja::internal {
namespace {

absl::Status NoArguments(absl::string_view method, const CallArgs& args) {
  if (args.positional.empty() && args.keyword.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(method, "() takes no arguments (",
                                                 args.positional.size() + args.keyword.size(),
                                                 " given)"));
}

absl::StatusOr<Value> ExpandTabs(const std::string& s, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("expandtabs", args, {"tabsize"}));
  ASSIGN_OR_RETURN(int64_t tabsize, ToInt(a.Or(0, Value::Int(8)), "tabsize"));
  std::string out;
  int64_t column = 0;
  for (char32_t c : py::Decode(s)) {
    if (c == '\t') {
      if (tabsize > 0) {
        const int64_t n = tabsize - column % tabsize;
        RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(out.size()) + n));
        out.append(static_cast<size_t>(n), ' ');
        column += n;
      }
    } else {
      py::AppendCodePoint(c, &out);
      column = c == '\n' || c == '\r' ? 0 : column + 1;
    }
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Translate(const std::string& s, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("str.translate", args, {"table"}, false));
  if (!a.Has(0)) return absl::InvalidArgumentError("str.translate() takes exactly one argument (0 given)");
  const Value& table = *a.Get(0);
  if (table.kind() != Kind::kDict) {
    return absl::InvalidArgumentError(
        "str.translate() takes a dict of code points (carpool supports no other table)");
  }
  std::string out;
  for (char32_t c : py::Decode(s)) {
    const Value* m = table.dict_value().Find(Value::Int(static_cast<int64_t>(c)));
    if (m == nullptr) {
      py::AppendCodePoint(c, &out);
    } else if (m->is_none()) {
      continue;
    } else if (m->kind() == Kind::kInt || m->kind() == Kind::kBool) {
      if (m->int_value() < 0 || m->int_value() > 0x10FFFF) {
        return absl::InvalidArgumentError("character mapping must be in range(0x110000)");
      }
      py::AppendCodePoint(static_cast<char32_t>(m->int_value()), &out);
    } else if (m->is_string()) {
      out += m->string_value();
    } else {
      return absl::InvalidArgumentError("character mapping must return integer, None or str");
    }
    RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(out.size())));
  }
  return Value::String(std::move(out));
}

}  // namespace

std::optional<Function> MoreStrMethod(const Value& v, absl::string_view name) {
  const std::string n(name);
  if (n == "swapcase" || n == "casefold" || n == "isidentifier" || n == "isprintable" ||
      n == "isascii") {
    return [v, n](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
      RETURN_IF_ERROR(NoArguments(absl::StrCat("str.", n), args));
      const std::string& s = v.string_value();
      if (n == "swapcase") return Value::String(py::SwapCase(s));
      if (n == "casefold") return Value::String(py::CaseFold(s));
      const std::u32string u = py::Decode(s);
      bool ok = true;
      if (n == "isidentifier") {
        ok = !u.empty() && (u[0] == '_' || py::IsXidStart(u[0]));
        for (size_t i = 1; ok && i < u.size(); ++i) ok = py::IsXidContinue(u[i]);
      } else {
        for (char32_t c : u) ok = ok && (n == "isascii" ? c < 0x80 : py::IsPrintable(c));
      }
      return Value::Bool(ok);
    };
  }
  if (n == "expandtabs") {
    return [v](const CallArgs& args, Budget& budget) {
      return ExpandTabs(v.string_value(), args, budget);
    };
  }
  if (n == "translate") {
    return [v](const CallArgs& args, Budget& budget) {
      return Translate(v.string_value(), args, budget);
    };
  }
  return std::nullopt;
}

std::optional<Value> NumberAttribute(const Value& v, absl::string_view name) {
  const bool is_float = v.kind() == Kind::kFloat;
  if (name == "real") return is_float ? v : Value::Int(v.int_value());
  if (name == "imag") return is_float ? Value::Float(0.0) : Value::Int(0);
  if (!is_float && name == "numerator") return Value::Int(v.int_value());
  if (!is_float && name == "denominator") return Value::Int(1);
  const std::string n(name);
  const char* type = KindName(v.kind());
  if (n == "conjugate") {
    return MakeMethod(type, n, [v, is_float](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
      RETURN_IF_ERROR(NoArguments(is_float ? "float.conjugate" : "int.conjugate", args));
      return is_float ? v : Value::Int(v.int_value());
    });
  }
  if (!is_float && n == "bit_length") {
    return MakeMethod(type, n, [v](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
      RETURN_IF_ERROR(NoArguments("int.bit_length", args));
      const int64_t x = v.int_value();
      uint64_t a = x < 0 ? static_cast<uint64_t>(0) - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
      int64_t bits = 0;
      while (a != 0) {
        ++bits;
        a >>= 1;
      }
      return Value::Int(bits);
    });
  }
  if (is_float && n == "is_integer") {
    return MakeMethod(type, n, [v](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
      RETURN_IF_ERROR(NoArguments("float.is_integer", args));
      const double d = v.float_value();
      return Value::Bool(std::isfinite(d) && d == std::floor(d));
    });
  }
  return std::nullopt;
}

}  // namespace carpool::text::jinja::internal
