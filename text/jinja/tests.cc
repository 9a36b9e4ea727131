// Jinja2's tests (`x is name(args)`), as jinja2/tests.py defines them.
#include <array>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "text/jinja/builtins.h"
#include "text/jinja/builtins_internal.h"

namespace carpool::text::jinja {
namespace {

constexpr std::array<const char*, 39> kTests = {
    "defined", "undefined", "none",     "string",      "number",   "integer", "float",
    "boolean", "true",      "false",    "mapping",     "iterable", "sequence", "callable",
    "sameas",  "eq",        "equalto",  "==",          "ne",       "!=",      "lt",
    "lessthan", "<",        "le",       "<=",          "gt",       "greaterthan", ">",
    "ge",      ">=",        "in",       "odd",         "even",     "divisibleby", "lower",
    "upper",   "escaped",   "filter",   "test"};

// `x is sameas y` is Python's `is`: None, True and False are singletons; small ints are cached
// (-5..256); a container or string is only the same as itself.
bool SameAs(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kNone:
    case Kind::kUndefined:
      return a.kind() == Kind::kNone;
    case Kind::kBool:
      return a.bool_value() == b.bool_value();
    case Kind::kInt:
      return a.int_value() == b.int_value() && a.int_value() >= -5 && a.int_value() <= 256;
    case Kind::kString:
      return &a.string_value() == &b.string_value();
    case Kind::kList:
    case Kind::kTuple:
      return &a.list_value() == &b.list_value();
    case Kind::kDict:
    case Kind::kNamespace:
      return &a.dict_value() == &b.dict_value();
    case Kind::kCallable:
      return &a.callable_value() == &b.callable_value();
    default:
      return false;
  }
}

absl::StatusOr<const Value*> Operand(absl::string_view name, const CallArgs& args) {
  if (args.positional.size() + args.keyword.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("test '", name, "' takes 1 argument (",
                                                   args.positional.size() + args.keyword.size(),
                                                   " given)"));
  }
  return args.positional.empty() ? &args.keyword[0].second : &args.positional[0];
}

absl::Status NoArguments(absl::string_view name, const CallArgs& args) {
  if (args.positional.empty() && args.keyword.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("test '", name, "' takes no arguments"));
}

}  // namespace

bool HasTest(absl::string_view name) {
  for (const char* t : kTests) {
    if (name == t) return true;
  }
  return false;
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, const CallArgs& args,
                               Budget& budget) {
  const Kind k = v.kind();
  if (name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=") {
    ASSIGN_OR_RETURN(const Value* other, Operand(name, args));
    const bool eq = Equals(v, *other);
    return name == "ne" || name == "!=" ? !eq : eq;
  }
  if (name == "lt" || name == "lessthan" || name == "<") {
    ASSIGN_OR_RETURN(const Value* other, Operand(name, args));
    return Compare(CompareOp::kLt, v, *other);
  }
  if (name == "le" || name == "<=") {
    ASSIGN_OR_RETURN(const Value* other, Operand(name, args));
    return Compare(CompareOp::kLe, v, *other);
  }
  if (name == "gt" || name == "greaterthan" || name == ">") {
    ASSIGN_OR_RETURN(const Value* other, Operand(name, args));
    return Compare(CompareOp::kGt, v, *other);
  }
  if (name == "ge" || name == ">=") {
    ASSIGN_OR_RETURN(const Value* other, Operand(name, args));
    return Compare(CompareOp::kGe, v, *other);
  }
  if (name == "in") {
    ASSIGN_OR_RETURN(const Value* seq, Operand(name, args));
    return Contains(*seq, v);
  }
  if (name == "sameas") {
    ASSIGN_OR_RETURN(const Value* other, Operand(name, args));
    return SameAs(v, *other);
  }
  if (name == "divisibleby") {
    ASSIGN_OR_RETURN(const Value* num, Operand(name, args));
    ASSIGN_OR_RETURN(Value mod, Arithmetic(BinaryOp::kMod, v, *num, budget));
    return Equals(mod, Value::Int(0));
  }
  if (name == "odd" || name == "even") {
    RETURN_IF_ERROR(NoArguments(name, args));
    ASSIGN_OR_RETURN(Value mod, Arithmetic(BinaryOp::kMod, v, Value::Int(2), budget));
    return Equals(mod, Value::Int(name == "odd" ? 1 : 0));
  }
  RETURN_IF_ERROR(NoArguments(name, args));
  if (name == "defined") return k != Kind::kUndefined;
  if (name == "undefined") return k == Kind::kUndefined;
  if (name == "none") return k == Kind::kNone;
  if (name == "string") return k == Kind::kString;
  if (name == "number") return k == Kind::kInt || k == Kind::kFloat || k == Kind::kBool;
  if (name == "integer") return k == Kind::kInt;
  if (name == "float") return k == Kind::kFloat;
  if (name == "boolean") return k == Kind::kBool;
  if (name == "true") return k == Kind::kBool && v.bool_value();
  if (name == "false") return k == Kind::kBool && !v.bool_value();
  if (name == "mapping") return k == Kind::kDict;
  // Jinja2's Undefined iterates (as empty), has a length (0) and __getitem__ and __call__.
  if (name == "iterable") {
    return k == Kind::kUndefined || k == Kind::kString || k == Kind::kList ||
           k == Kind::kTuple || k == Kind::kDict;
  }
  if (name == "sequence") {
    if (v.is_generator()) return false;  // no len()
    return k == Kind::kUndefined || k == Kind::kString || k == Kind::kList ||
           k == Kind::kTuple || k == Kind::kDict;
  }
  if (name == "callable") return k == Kind::kCallable || k == Kind::kUndefined;
  if (name == "lower" || name == "upper") {  // str(value).islower() / isupper()
    const std::optional<Value> method =
        BoundMethod(Value::String(v.Str()), name == "lower" ? "islower" : "isupper");
    ASSIGN_OR_RETURN(Value result, method->callable_value().fn(CallArgs{}, budget));
    return result.Truthy();
  }
  if (name == "escaped") return false;  // no Markup values: autoescape is off
  if (name == "filter") return v.is_string() && HasFilter(v.string_value());
  if (name == "test") return v.is_string() && HasTest(v.string_value());
  return absl::InvalidArgumentError(absl::StrCat("No test named '", name, "'."));
}

}  // namespace carpool::text::jinja
