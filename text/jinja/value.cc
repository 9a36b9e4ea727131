#include "text/jinja/value.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "text/jinja/builtins.h"
#include "text/jinja/builtins_internal.h"
#include "text/jinja/pystr.h"

namespace carpool::text::jinja {
namespace {

absl::Status TypeError(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

std::string Quoted(absl::string_view s) { return py::StrRepr(s); }

// object_type_repr(obj) of Jinja2's messages: "None", or "dict object", "str object", ...
// Python's type name of a value (KindName, but "generator" for a generator).
const char* TypeName(const Value& v) { return v.is_generator() ? "generator" : KindName(v.kind()); }

std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.kind() == Kind::kNamespace) return "jinja2.utils.Namespace object";
  return absl::StrCat(TypeName(v), " object");
}

// Jinja2's undefined for a missing attribute `name` of `obj`.
Value NoAttribute(const Value& obj, absl::string_view name) {
  return Value::Undefined(
      absl::StrCat(Quoted(ObjectTypeRepr(obj)), " has no attribute ", Quoted(name)));
}

// Jinja2's undefined for a missing element `key` of `obj`.
Value NoElement(const Value& obj, const Value& key) {
  return Value::Undefined(absl::StrCat(ObjectTypeRepr(obj), " has no element ", key.Repr()));
}

Value Unsafe(const Value& obj, absl::string_view name) {
  return Value::Undefined(absl::StrCat("access to attribute ", Quoted(name), " of ",
                                       Quoted(TypeName(obj)), " object is unsafe."),
                          /*unsafe=*/true);
}

// Python special attributes (__class__, __len__, ...): every object has some; the sandbox
// refuses them all.
bool IsDunder(absl::string_view name) {
  return name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__";
}

// The methods Jinja2's ImmutableSandboxedEnvironment refuses because they mutate.
bool IsMutatingMethod(Kind kind, absl::string_view name) {
  if (kind == Kind::kList) {
    return name == "append" || name == "clear" || name == "extend" || name == "insert" ||
           name == "pop" || name == "remove" || name == "reverse" || name == "sort";
  }
  if (kind == Kind::kDict) {
    return name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" ||
           name == "update";
  }
  return false;
}

bool IsIntLike(const Value& v) { return v.kind() == Kind::kInt || v.kind() == Kind::kBool; }
bool IsNumeric(const Value& v) { return IsIntLike(v) || v.kind() == Kind::kFloat; }

// Three-way comparison of two numbers, exact across int and float (as Python's). nullopt when
// either is NaN.
std::optional<int> CompareNumbers(const Value& a, const Value& b) {
  if (IsIntLike(a) && IsIntLike(b)) {
    const int64_t x = a.int_value(), y = b.int_value();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  const long double x =
      IsIntLike(a) ? static_cast<long double>(a.int_value()) : a.float_value();
  const long double y =
      IsIntLike(b) ? static_cast<long double>(b.int_value()) : b.float_value();
  if (std::isnan(x) || std::isnan(y)) return std::nullopt;
  return x < y ? -1 : x > y ? 1 : 0;
}

const char* OpSymbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "+";
    case BinaryOp::kSub: return "-";
    case BinaryOp::kMul: return "*";
    case BinaryOp::kDiv: return "/";
    case BinaryOp::kFloorDiv: return "//";
    case BinaryOp::kMod: return "%";
    case BinaryOp::kPow: return "** or pow()";
  }
  return "?";
}

absl::Status Unsupported(BinaryOp op, const Value& a, const Value& b) {
  return TypeError(absl::StrCat("unsupported operand type(s) for ", OpSymbol(op), ": '",
                                TypeName(a), "' and '", TypeName(b), "'"));
}

absl::Status IntOverflow() {
  return absl::InvalidArgumentError(
      "integer overflow: the result does not fit in 64 bits (carpool's integers are 64-bit)");
}

// Python's float % and //.
double FloatMod(double a, double b) {
  double mod = std::fmod(a, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = std::copysign(0.0, b);
  }
  return mod;
}

double FloatFloorDiv(double a, double b) {
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div != 0) {
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
  }
  return std::copysign(0.0, a / b);
}

absl::StatusOr<Value> FloatPow(double a, double b) {
  if (a == 0 && b < 0) return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
  if (a < 0 && std::isfinite(b) && b != std::floor(b)) {
    return absl::InvalidArgumentError(
        "a negative number raised to a fractional power is complex (unsupported)");
  }
  const double r = std::pow(a, b);
  if (std::isinf(r) && std::isfinite(a) && std::isfinite(b)) {
    return absl::InvalidArgumentError("(34, 'Numerical result out of range')");
  }
  return Value::Float(r);
}

absl::StatusOr<Value> IntPow(int64_t base, int64_t exp) {
  int64_t result = 1;
  int64_t b = base;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, b, &result)) return IntOverflow();
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(b, b, &b)) return IntOverflow();
  }
  return Value::Int(result);
}

absl::StatusOr<Value> NumberOp(BinaryOp op, const Value& a, const Value& b) {
  if (IsIntLike(a) && IsIntLike(b)) {
    const int64_t x = a.int_value(), y = b.int_value();
    int64_t r = 0;
    switch (op) {
      case BinaryOp::kAdd:
        if (__builtin_add_overflow(x, y, &r)) return IntOverflow();
        return Value::Int(r);
      case BinaryOp::kSub:
        if (__builtin_sub_overflow(x, y, &r)) return IntOverflow();
        return Value::Int(r);
      case BinaryOp::kMul:
        if (__builtin_mul_overflow(x, y, &r)) return IntOverflow();
        return Value::Int(r);
      case BinaryOp::kDiv:
        if (y == 0) return absl::InvalidArgumentError("division by zero");
        return Value::Float(static_cast<double>(static_cast<long double>(x) / y));
      case BinaryOp::kFloorDiv:
      case BinaryOp::kMod: {
        if (y == 0) {
          return absl::InvalidArgumentError(op == BinaryOp::kMod
                                                ? "integer modulo by zero"
                                                : "integer division or modulo by zero");
        }
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (op == BinaryOp::kMod) return Value::Int(0);
          return IntOverflow();
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        return Value::Int(op == BinaryOp::kMod ? m : q);
      }
      case BinaryOp::kPow:
        if (y < 0) return FloatPow(static_cast<double>(x), static_cast<double>(y));
        return IntPow(x, y);
    }
  }
  const double x = a.float_value(), y = b.float_value();
  switch (op) {
    case BinaryOp::kAdd: return Value::Float(x + y);
    case BinaryOp::kSub: return Value::Float(x - y);
    case BinaryOp::kMul: return Value::Float(x * y);
    case BinaryOp::kDiv:
      if (y == 0) return absl::InvalidArgumentError("float division by zero");
      return Value::Float(x / y);
    case BinaryOp::kFloorDiv:
      if (y == 0) return absl::InvalidArgumentError("float floor division by zero");
      return Value::Float(FloatFloorDiv(x, y));
    case BinaryOp::kMod:
      if (y == 0) return absl::InvalidArgumentError("float modulo");
      return Value::Float(FloatMod(x, y));
    case BinaryOp::kPow:
      return FloatPow(x, y);
  }
  return Unsupported(op, a, b);
}

// seq * n for a string, list or tuple.
absl::StatusOr<Value> Repeat(const Value& seq, int64_t n, Budget& budget) {
  if (n <= 0) {
    if (seq.is_string()) return Value::String("");
    return seq.kind() == Kind::kList ? Value::MakeList({}) : Value::MakeTuple({});
  }
  const int64_t unit = seq.is_string()
                           ? static_cast<int64_t>(seq.string_value().size())
                           : static_cast<int64_t>(seq.list_value().size()) *
                                 static_cast<int64_t>(sizeof(Value));
  int64_t total = 0;
  if (__builtin_mul_overflow(unit, n, &total)) total = std::numeric_limits<int64_t>::max();
  RETURN_IF_ERROR(budget.CheckSize(total));
  if (seq.is_string()) {
    std::string out;
    out.reserve(static_cast<size_t>(total));
    for (int64_t i = 0; i < n; ++i) out += seq.string_value();
    return Value::String(std::move(out));
  }
  List out;
  out.reserve(seq.list_value().size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out.insert(out.end(), seq.list_value().begin(), seq.list_value().end());
  }
  return seq.kind() == Kind::kList ? Value::MakeList(std::move(out))
                                   : Value::MakeTuple(std::move(out));
}

bool IsRepeatable(const Value& v) { return v.is_string() || v.is_sequence(); }

void ReprList(const List& items, const char* open, const char* close, bool tuple,
              std::string* out) {
  out->append(open);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out->append(", ");
    out->append(items[i].Repr());
  }
  if (tuple && items.size() == 1) out->push_back(',');
  out->append(close);
}

void ReprDict(const Dict& dict, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : dict.entries) {
    if (!first) out->append(", ");
    first = false;
    out->append(k.Repr());
    out->append(": ");
    out->append(v.Repr());
  }
  out->push_back('}');
}

// Python's slice index normalisation (PySlice_AdjustIndices) for one bound.
int64_t AdjustBound(std::optional<int64_t> bound, int64_t length, int64_t step, bool is_start) {
  if (!bound.has_value()) {
    if (step > 0) return is_start ? 0 : length;
    return is_start ? length - 1 : -1;
  }
  int64_t v = *bound;
  if (v < 0) {
    v += length;
    if (v < 0) v = step < 0 ? -1 : 0;
  } else if (v >= length) {
    v = step < 0 ? length - 1 : length;
  }
  return v;
}

// The indexes a slice of a sequence of `length` selects.
std::vector<int64_t> SliceIndexes(int64_t length, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  const int64_t begin = AdjustBound(start, length, step, true);
  const int64_t end = AdjustBound(stop, length, step, false);
  std::vector<int64_t> out;
  if (step > 0) {
    for (int64_t i = begin; i < end; i += step) {
      out.push_back(i);
      if (end - i <= step) break;
    }
  } else {
    const uint64_t stride = static_cast<uint64_t>(-(step + 1)) + 1;
    for (int64_t i = begin; i > end;) {
      out.push_back(i);
      if (static_cast<uint64_t>(i - end) <= stride) break;
      i = static_cast<int64_t>(static_cast<uint64_t>(i) - stride);
    }
  }
  return out;
}

}  // namespace

// ---- Dict ---------------------------------------------------------------------------------

namespace {
// Dicts smaller than this are searched linearly (faster than hashing, and no index is kept).
constexpr size_t kIndexFrom = 16;

}  // namespace

const Value* Dict::Find(const Value& key) const {
  if (key.is_string()) return Find(absl::string_view(key.string_value()));
  for (const auto& [k, v] : entries) {
    if (!k.is_string() && Equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::FindIndexed(absl::string_view key) const {
  size_t from = 0;
  if (indexed_ <= entries.size()) {
    const auto it = index_.find(key);
    if (it != index_.end() && it->second < entries.size() && entries[it->second].first.is_string() &&
        entries[it->second].first.string_value() == key) {
      return &entries[it->second].second;
    }
    from = indexed_;  // entries appended since the index was brought up to date
  }
  for (size_t i = from; i < entries.size(); ++i) {
    const auto& [k, v] = entries[i];
    if (k.is_string() && k.string_value() == key) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  if (key.is_string() && entries.size() >= kIndexFrom) {
    if (indexed_ > entries.size()) {
      index_.clear();
      indexed_ = 0;
    }
    for (; indexed_ < entries.size(); ++indexed_) {
      const Value& k = entries[indexed_].first;
      if (k.is_string()) index_.try_emplace(k.string_value(), indexed_);
    }
    const auto it = index_.find(key.string_value());
    if (it != index_.end()) {
      entries[it->second].second = std::move(value);
      return;
    }
    index_.try_emplace(key.string_value(), entries.size());
    entries.emplace_back(std::move(key), std::move(value));
    indexed_ = entries.size();
    return;
  }
  for (auto& [k, v] : entries) {
    if (Equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

// ---- Kinds and construction ---------------------------------------------------------------

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

Value Value::Undefined(std::string hint, bool unsafe) {
  if (hint.empty() && !unsafe) return Value();
  return MakeBoxed(UndefinedData{std::move(hint), unsafe}, Kind::kUndefined);
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bits_.b = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.bits_.i = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.bits_.d = d;
  return v;
}
Value Value::String(std::string s) { return MakeBoxed(std::move(s), Kind::kString); }
Value Value::MakeList(List items) { return MakeBoxed(std::move(items), Kind::kList); }
Value Value::MakeGenerator(List items) {
  Value v = MakeList(std::move(items));
  v.generator_ = true;
  return v;
}
Value Value::MakeTuple(List items) { return MakeBoxed(std::move(items), Kind::kTuple); }
Value Value::MakeDict(Dict dict) { return MakeBoxed(std::move(dict), Kind::kDict); }
Value Value::Namespace(Dict attributes) {
  return MakeBoxed(std::move(attributes), Kind::kNamespace);
}
Value Value::MakeCallable(std::string name, Function fn) {
  return MakeBoxed(Callable{std::move(name), std::move(fn)}, Kind::kCallable);
}

void Value::Destroy() {
  switch (kind_) {
    case Kind::kUndefined:
      delete static_cast<Boxed<UndefinedData>*>(bits_.box);
      return;
    case Kind::kString:
      delete static_cast<Boxed<std::string>*>(bits_.box);
      return;
    case Kind::kList:
    case Kind::kTuple:
      delete static_cast<Boxed<List>*>(bits_.box);
      return;
    case Kind::kDict:
    case Kind::kNamespace:
      delete static_cast<Boxed<Dict>*>(bits_.box);
      return;
    case Kind::kCallable:
      delete static_cast<Boxed<Callable>*>(bits_.box);
      return;
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
      return;  // never boxed
  }
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Int(static_cast<int64_t>(u));
      }
      return Float(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      dict.entries.reserve(json.size());
      for (const auto& [k, v] : json.items()) dict.entries.emplace_back(String(k), FromJson(v));
      return MakeDict(std::move(dict));
    }
    default:
      return None();  // binary and discarded values do not come from a parse
  }
}

const std::string& Value::undefined_hint() const {
  static const std::string* const kNoHint = new std::string();
  return boxed_ ? Unbox<UndefinedData>().hint : *kNoHint;
}
bool Value::undefined_is_unsafe() const { return boxed_ && Unbox<UndefinedData>().unsafe; }

// ---- Printing -----------------------------------------------------------------------------

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_value();
    case Kind::kInt:
      return int_value() != 0;
    case Kind::kFloat:
      return float_value() != 0;  // NaN is true, as in Python
    case Kind::kString:
      return !string_value().empty();
    case Kind::kList:
    case Kind::kTuple:
      return generator_ || !list_value().empty();  // a generator is always true
    case Kind::kDict:
      return !dict_value().entries.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return string_value();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  std::string out;
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_value() ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(int_value());
    case Kind::kFloat:
      return py::FloatRepr(float_value());
    case Kind::kString:
      return py::StrRepr(string_value());
    case Kind::kList:
      if (generator_) return "<generator object>";  // Python adds its name and address
      ReprList(list_value(), "[", "]", false, &out);
      return out;
    case Kind::kTuple:
      ReprList(list_value(), "(", ")", true, &out);
      return out;
    case Kind::kDict:
      ReprDict(dict_value(), &out);
      return out;
    case Kind::kNamespace:
      out = "<Namespace ";
      ReprDict(dict_value(), &out);
      out.push_back('>');
      return out;
    case Kind::kCallable: {
      // Jinja2 prints a macro as <Macro 'name'>; a bound method as Python does, less the
      // address ("<built-in method upper of str object>"). Other functions print the same way
      // as macros (Python's repr of them holds an address, never reproducible).
      const std::string& name = callable_value().name;
      const size_t dot = name.find('.');
      if (dot == std::string::npos) return absl::StrCat("<Macro ", py::StrRepr(name), ">");
      return absl::StrCat("<built-in method ", name.substr(dot + 1), " of ", name.substr(0, dot),
                          " object>");
    }
  }
  return out;
}

// ---- Comparison ---------------------------------------------------------------------------

bool Equals(const Value& a, const Value& b) {
  if (a.is_generator() || b.is_generator()) {  // generators compare by identity
    return a.is_generator() && b.is_generator() && &a.list_value() == &b.list_value();
  }
  if (IsNumeric(a) && IsNumeric(b)) {
    const std::optional<int> c = CompareNumbers(a, b);
    return c.has_value() && *c == 0;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.string_value() == b.string_value();
    case Kind::kList:
    case Kind::kTuple: {
      const List& x = a.list_value();
      const List& y = b.list_value();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.dict_value();
      const Dict& y = b.dict_value();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.Find(k);
        if (other == nullptr || !Equals(v, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return &a.namespace_attributes() == &b.namespace_attributes();
    case Kind::kCallable:
      return &a.callable_value() == &b.callable_value();
    default:
      return false;
  }
}

absl::StatusOr<bool> Compare(CompareOp op, const Value& a, const Value& b) {
  RETURN_IF_ERROR(CheckDefined(a));
  RETURN_IF_ERROR(CheckDefined(b));
  auto apply = [op](int c) {
    switch (op) {
      case CompareOp::kLt: return c < 0;
      case CompareOp::kLe: return c <= 0;
      case CompareOp::kGt: return c > 0;
      case CompareOp::kGe: return c >= 0;
    }
    return false;
  };
  if (IsNumeric(a) && IsNumeric(b)) {
    const std::optional<int> c = CompareNumbers(a, b);
    return c.has_value() && apply(*c);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order.
    return apply(a.string_value().compare(b.string_value()));
  }
  if (a.is_sequence() && a.kind() == b.kind()) {
    const List& x = a.list_value();
    const List& y = b.list_value();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Compare(op, x[i], y[i]);
    }
    return apply(x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0);
  }
  const char* symbol = op == CompareOp::kLt   ? "<"
                       : op == CompareOp::kLe ? "<="
                       : op == CompareOp::kGt ? ">"
                                              : ">=";
  return TypeError(absl::StrCat("'", symbol, "' not supported between instances of '",
                                KindName(a.kind()), "' and '", KindName(b.kind()), "'"));
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) { return Compare(CompareOp::kLt, a, b); }

// ---- Operators ----------------------------------------------------------------------------

absl::StatusOr<Value> Arithmetic(BinaryOp op, const Value& a, const Value& b, Budget& budget) {
  if (op == BinaryOp::kMod && a.is_string()) {
    // printf-style formatting: a tuple gives the arguments, a dict the %(name)s values (and is
    // also the one argument of a plain %s), anything else is the one argument.
    CallArgs args;
    if (b.kind() == Kind::kTuple) {
      args.positional.assign(b.list_value().begin(), b.list_value().end());
    } else {
      args.positional.push_back(b);
      if (b.kind() == Kind::kDict) {
        for (const auto& [k, v] : b.dict_value().entries) {
          if (k.is_string()) args.keyword.emplace_back(k.string_value(), v);
        }
      }
    }
    ASSIGN_OR_RETURN(std::string out, internal::PercentFormat(a.string_value(), args, budget));
    return Value::String(std::move(out));
  }
  RETURN_IF_ERROR(CheckDefined(a));
  RETURN_IF_ERROR(CheckDefined(b));
  if (IsNumeric(a) && IsNumeric(b)) return NumberOp(op, a, b);
  if (a.is_generator() || b.is_generator()) return Unsupported(op, a, b);
  if (op == BinaryOp::kAdd) {
    if (a.is_string() || a.is_sequence()) {
      if (a.kind() != b.kind()) {
        return TypeError(absl::StrCat("can only concatenate ", KindName(a.kind()), " (not \"",
                                      KindName(b.kind()), "\") to ", KindName(a.kind())));
      }
      if (a.is_string()) {
        RETURN_IF_ERROR(budget.CheckSize(
            static_cast<int64_t>(a.string_value().size() + b.string_value().size())));
        return Value::String(absl::StrCat(a.string_value(), b.string_value()));
      }
      RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(
          (a.list_value().size() + b.list_value().size()) * sizeof(Value))));
      List items = a.list_value();
      items.insert(items.end(), b.list_value().begin(), b.list_value().end());
      return a.kind() == Kind::kList ? Value::MakeList(std::move(items))
                                     : Value::MakeTuple(std::move(items));
    }
  }
  if (op == BinaryOp::kMul && (IsRepeatable(a) || IsRepeatable(b))) {
    const Value& seq = IsRepeatable(a) ? a : b;
    const Value& n = IsRepeatable(a) ? b : a;
    if (IsIntLike(n)) return Repeat(seq, n.int_value(), budget);
    return TypeError(absl::StrCat("can't multiply sequence by non-int of type '",
                                  KindName(n.kind()), "'"));
  }
  return Unsupported(op, a, b);
}

absl::StatusOr<Value> Negate(const Value& a) {
  RETURN_IF_ERROR(CheckDefined(a));
  if (IsIntLike(a)) {
    if (a.int_value() == std::numeric_limits<int64_t>::min()) return IntOverflow();
    return Value::Int(-a.int_value());
  }
  if (a.kind() == Kind::kFloat) return Value::Float(-a.float_value());
  return TypeError(absl::StrCat("bad operand type for unary -: '", KindName(a.kind()), "'"));
}

absl::StatusOr<Value> Concat(const Value& a, const Value& b, Budget& budget) {
  std::string x = a.Str();
  const std::string y = b.Str();
  RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(x.size() + y.size())));
  x += y;
  return Value::String(std::move(x));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;  // Jinja2's Undefined iterates as empty
    case Kind::kString:
      if (!item.is_string()) {
        return TypeError(absl::StrCat("'in <string>' requires string as left operand, not ",
                                      KindName(item.kind())));
      }
      return container.string_value().find(item.string_value()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
      for (const Value& v : container.list_value()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (item.kind() == Kind::kList || item.kind() == Kind::kDict) {
        return TypeError(absl::StrCat("unhashable type: '", KindName(item.kind()), "'"));
      }
      return container.dict_value().Find(item) != nullptr;
    default:
      return TypeError(absl::StrCat("argument of type '", KindName(container.kind()),
                                    "' is not iterable"));
  }
}

// ---- Lookups ------------------------------------------------------------------------------

Value GetAttr(const Value& obj, absl::string_view name) {
  if (obj.is_undefined()) return obj;
  if (IsDunder(name)) return Unsafe(obj, name);
  if (obj.is_generator()) return NoAttribute(obj, name);
  if (IsMutatingMethod(obj.kind(), name)) return Unsafe(obj, name);
  if (obj.kind() == Kind::kNamespace) {
    const Value* v = obj.dict_value().Find(name);
    return v != nullptr ? *v : NoAttribute(obj, name);
  }
  if (std::optional<Value> method = BoundMethod(obj, name)) return *std::move(method);
  if (obj.kind() == Kind::kDict) {
    const Value* v = obj.dict_value().Find(name);
    if (v != nullptr) return *v;
  }
  return NoAttribute(obj, name);
}

bool DictAttributeIsSpecial(absl::string_view name) {
  static const Value* const kEmptyDict = new Value(Value::MakeDict(Dict()));
  return name.empty() || name[0] == '_' || IsMutatingMethod(Kind::kDict, name) ||
         BoundMethod(*kEmptyDict, name).has_value();
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return obj;
  switch (obj.kind()) {
    case Kind::kDict: {
      const Value* v = obj.dict_value().Find(key);
      if (v != nullptr) return *v;
      break;
    }
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kString: {
      if (!IsIntLike(key) || obj.is_generator()) break;
      const int64_t length = obj.is_string() ? py::CodePointCount(obj.string_value())
                                             : static_cast<int64_t>(obj.list_value().size());
      int64_t i = key.int_value();
      if (i < 0) i += length;
      if (i < 0 || i >= length) break;
      if (!obj.is_string()) return obj.list_value()[static_cast<size_t>(i)];
      const std::u32string chars = py::Decode(obj.string_value());
      std::string out;
      py::AppendCodePoint(chars[static_cast<size_t>(i)], &out);
      return Value::String(std::move(out));
    }
    default:
      break;
  }
  if (key.is_string()) return GetAttr(obj, key.string_value());
  return NoElement(obj, key);
}

absl::StatusOr<Value> Slice(const Value& obj, std::optional<int64_t> start,
                            std::optional<int64_t> stop, std::optional<int64_t> step) {
  RETURN_IF_ERROR(CheckDefined(obj));
  if (obj.is_generator()) return TypeError("'generator' object is not subscriptable");
  if (!obj.is_string() && !obj.is_sequence()) {
    if (obj.kind() == Kind::kDict) return TypeError("unhashable type: 'slice'");
    return TypeError(absl::StrCat("'", KindName(obj.kind()), "' object is not subscriptable"));
  }
  const int64_t s = step.value_or(1);
  if (s == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  if (obj.is_string()) {
    const std::u32string chars = py::Decode(obj.string_value());
    std::string out;
    for (int64_t i : SliceIndexes(static_cast<int64_t>(chars.size()), start, stop, s)) {
      py::AppendCodePoint(chars[static_cast<size_t>(i)], &out);
    }
    return Value::String(std::move(out));
  }
  const List& items = obj.list_value();
  List out;
  for (int64_t i : SliceIndexes(static_cast<int64_t>(items.size()), start, stop, s)) {
    out.push_back(items[static_cast<size_t>(i)]);
  }
  return obj.kind() == Kind::kList ? Value::MakeList(std::move(out))
                                   : Value::MakeTuple(std::move(out));
}

absl::StatusOr<List> Iterate(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined:
      return List{};
    case Kind::kList:
    case Kind::kTuple:
      return value.list_value();
    case Kind::kDict: {
      List keys;
      keys.reserve(value.dict_value().entries.size());
      for (const auto& entry : value.dict_value().entries) keys.push_back(entry.first);
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (char32_t c : py::Decode(value.string_value())) {
        std::string s;
        py::AppendCodePoint(c, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    default:
      return TypeError(absl::StrCat("'", KindName(value.kind()), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined:
      return 0;  // Jinja2's Undefined has length 0
    case Kind::kString:
      return py::CodePointCount(value.string_value());
    case Kind::kList:
    case Kind::kTuple:
      if (value.is_generator()) return TypeError("object of type 'generator' has no len()");
      return static_cast<int64_t>(value.list_value().size());
    case Kind::kDict:
      return static_cast<int64_t>(value.dict_value().entries.size());
    default:
      return TypeError(absl::StrCat("object of type '", KindName(value.kind()), "' has no len()"));
  }
}

absl::Status UndefinedError(const Value& value) {
  if (value.undefined_hint().empty()) return absl::InvalidArgumentError("undefined value");
  return absl::InvalidArgumentError(value.undefined_hint());
}

}  // namespace carpool::text::jinja
