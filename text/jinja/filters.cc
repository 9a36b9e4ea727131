// Jinja2's filters, as jinja2/filters.py defines them with autoescape off (the chat-template
// configuration), plus transformers' tojson. Results that Jinja2 yields lazily (map, select,
// reject, selectattr, rejectattr, unique, batch, slice, items, reverse) are generators
// (Value::MakeGenerator): always true, without len(), turned into a list by the list filter.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "text/jinja/builtins.h"
#include "text/jinja/builtins_internal.h"
#include "text/jinja/format.h"
#include "text/jinja/pystr.h"

namespace carpool::text::jinja {
namespace {

using internal::BoundArgs;
using internal::SoftStr;

absl::Status Error(absl::string_view m) { return absl::InvalidArgumentError(m); }

absl::StatusOr<List> Items(const Value& v, Budget& budget) {
  ASSIGN_OR_RETURN(List items, Iterate(v));
  RETURN_IF_ERROR(budget.Iterate(static_cast<int64_t>(items.size())));
  return items;
}

// Jinja2's attribute path (make_attrgetter): "a.b.0" looks up a, then b, then the item 0, each
// with the sandbox's getitem. Looking into an Undefined is its error.
std::vector<Value> AttributeParts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) return {attribute};
  for (absl::string_view part : absl::StrSplit(attribute.string_value(), '.')) {
    const bool digits = !part.empty() && part.size() < 18 &&
                        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    parts.push_back(digits ? Value::Int(std::atoll(std::string(part).c_str()))
                           : Value::String(std::string(part)));
  }
  return parts;
}

absl::StatusOr<Value> Lookup(Value item, const std::vector<Value>& parts,
                             const Value* fallback = nullptr) {
  for (const Value& part : parts) {
    RETURN_IF_ERROR(CheckDefined(item));
    item = GetItem(item, part);
    if (fallback != nullptr && item.is_undefined()) item = *fallback;
  }
  return item;
}

// ignore_case: strings compare lowercased unless case_sensitive.
Value CaseKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(py::Lower(v.string_value()));
  return v;
}

bool IntLike(const Value& v) { return v.kind() == Kind::kInt || v.kind() == Kind::kBool; }

// ---- Numbers from strings, as Python's int() and float() read them -------------------------

std::string StripSpace(const std::string& s) { return internal::Strip(s, std::nullopt, true, true); }

// Removes Python's digit-group underscores; false when one is misplaced.
bool RemoveUnderscores(const std::string& s, std::string* out, bool allow_after_prefix) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_') {
      out->push_back(s[i]);
      continue;
    }
    const bool before = i > 0 && (std::isalnum(static_cast<unsigned char>(s[i - 1])) != 0);
    const bool after = i + 1 < s.size() && (std::isalnum(static_cast<unsigned char>(s[i + 1])) != 0);
    if (!after || (!before && !allow_after_prefix)) return false;
    if (i > 0 && s[i - 1] == '_') return false;
  }
  return true;
}

// int(s, base). nullopt when Python raises ValueError; *overflow when it fits no int64.
std::optional<int64_t> ParseInt(const std::string& text, int64_t base, bool* overflow) {
  *overflow = false;
  std::string s = StripSpace(text);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  s = s.substr(i);
  auto has_prefix = [&](char p) {
    return s.size() >= 2 && s[0] == '0' && (s[1] | 32) == p;
  };
  if (base == 0) {
    if (has_prefix('x')) base = 16;
    else if (has_prefix('o')) base = 8;
    else if (has_prefix('b')) base = 2;
    else base = 10;
    if (base == 10 && s.size() > 1 && s[0] == '0' &&
        s.find_first_not_of("0_") != std::string::npos) {
      return std::nullopt;  // int('010', 0)
    }
  } else if (base < 2 || base > 36) {
    return std::nullopt;
  }
  bool prefixed = false;
  if ((base == 16 && has_prefix('x')) || (base == 8 && has_prefix('o')) ||
      (base == 2 && has_prefix('b'))) {
    s = s.substr(2);
    prefixed = true;
  }
  std::string digits;
  if (s.empty() || !RemoveUnderscores(s, &digits, prefixed) || digits.empty()) return std::nullopt;
  uint64_t value = 0;
  for (char c : digits) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if ((c | 32) >= 'a' && (c | 32) <= 'z') d = (c | 32) - 'a' + 10;
    else return std::nullopt;
    if (d >= base) return std::nullopt;
    if (value > (std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(d)) /
                    static_cast<uint64_t>(base)) {
      *overflow = true;
      value = std::numeric_limits<uint64_t>::max();
      continue;
    }
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  if (*overflow || value > limit) {
    *overflow = true;
    return std::nullopt;
  }
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

// float(s); nullopt when Python raises ValueError.
std::optional<double> ParseFloat(const std::string& text) {
  const std::string s = StripSpace(text);
  std::string lower;
  for (char c : s) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  std::string body = lower;
  double sign = 1;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    sign = body[0] == '-' ? -1 : 1;
    body = body.substr(1);
  }
  if (body == "inf" || body == "infinity") return sign * std::numeric_limits<double>::infinity();
  if (body == "nan") return std::nan("");
  std::string clean;
  if (s.empty() || !RemoveUnderscores(s, &clean, false)) return std::nullopt;
  if (clean.find_first_not_of("0123456789.eE+-") != std::string::npos) return std::nullopt;
  const char* begin = clean.c_str();
  char* end = nullptr;
  const double d = std::strtod(begin, &end);
  if (end != begin + clean.size() || clean.empty()) return std::nullopt;
  return d;
}

}  // namespace

namespace internal {

absl::StatusOr<Value> FloatToInt(double d) {
  if (std::isinf(d)) return absl::InvalidArgumentError("cannot convert float infinity to integer");
  const double t = std::trunc(d);
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) {
    return absl::InvalidArgumentError("integer overflow: the result does not fit in 64 bits (carpool's integers are 64-bit)");
  }
  return Value::Int(static_cast<int64_t>(t));
}

}  // namespace internal

namespace {

using internal::FloatToInt;

// ---- The filters ---------------------------------------------------------------------------

absl::StatusOr<Value> FAbs(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("abs", args, {}, false));
  (void)a;
  if (IntLike(v)) {
    if (v.int_value() == std::numeric_limits<int64_t>::min()) {
      return Error("integer overflow: the result does not fit in 64 bits (carpool's integers are 64-bit)");
    }
    return Value::Int(std::llabs(v.int_value()));
  }
  if (v.kind() == Kind::kFloat) return Value::Float(std::fabs(v.float_value()));
  RETURN_IF_ERROR(CheckDefined(v));
  return Error(absl::StrCat("bad operand type for abs(): '", KindName(v.kind()), "'"));
}

absl::StatusOr<Value> FAttr(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_attr", args, {"name"}));
  if (!a.Has(0)) return Error("do_attr() missing 1 required positional argument: 'name'");
  RETURN_IF_ERROR(CheckDefined(v));
  const std::string name = SoftStr(*a.Get(0));
  if (v.kind() == Kind::kDict && !BoundMethod(v, name).has_value()) {
    const Value attr = GetAttr(v, name);
    if (attr.is_undefined()) return attr;  // unsafe names
    return Value::Undefined(absl::StrCat("'dict object' has no attribute ", py::StrRepr(name)));
  }
  return GetAttr(v, name);
}

absl::StatusOr<Value> FBatch(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_batch", args, {"linecount", "fill_with"}));
  if (!a.Has(0)) return Error("do_batch() missing 1 required positional argument: 'linecount'");
  ASSIGN_OR_RETURN(int64_t n, internal::ToInt(*a.Get(0), "linecount"));
  const Value fill = a.Or(1, Value::None());
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  List out;
  List batch;
  for (const Value& item : items) {
    if (static_cast<int64_t>(batch.size()) == n) {
      out.push_back(Value::MakeList(std::move(batch)));
      batch.clear();
    }
    batch.push_back(item);
  }
  if (!batch.empty()) {
    if (!fill.is_none() && static_cast<int64_t>(batch.size()) < n) {
      RETURN_IF_ERROR(budget.Iterate(n - static_cast<int64_t>(batch.size())));
      while (static_cast<int64_t>(batch.size()) < n) batch.push_back(fill);
    }
    out.push_back(Value::MakeList(std::move(batch)));
  }
  return Value::MakeGenerator(std::move(out));
}

absl::StatusOr<Value> FSlice(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_slice", args, {"slices", "fill_with"}));
  if (!a.Has(0)) return Error("do_slice() missing 1 required positional argument: 'slices'");
  ASSIGN_OR_RETURN(int64_t slices, internal::ToInt(*a.Get(0), "slices"));
  const Value fill = a.Or(1, Value::None());
  ASSIGN_OR_RETURN(List seq, Items(v, budget));
  if (slices == 0) return Error("integer division or modulo by zero");
  if (slices < 0) return Value::MakeGenerator({});
  RETURN_IF_ERROR(budget.Iterate(slices));
  const int64_t length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices;
  const int64_t extra = length % slices;
  int64_t offset = 0;
  List out;
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t start = offset + k * per;
    if (k < extra) ++offset;
    const int64_t end = offset + (k + 1) * per;
    List part(seq.begin() + start, seq.begin() + end);
    if (!fill.is_none() && k >= extra) part.push_back(fill);
    out.push_back(Value::MakeList(std::move(part)));
  }
  return Value::MakeGenerator(std::move(out));
}

absl::StatusOr<Value> CallStrMethod(const std::string& s, absl::string_view method,
                                    const CallArgs& args, Budget& budget) {
  const std::optional<Value> m = BoundMethod(Value::String(s), method);
  return m->callable_value().fn(args, budget);
}

absl::StatusOr<Value> FCapitalize(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_capitalize", args, {}));
  (void)a;
  return Value::String(py::Capitalize(SoftStr(v)));
}

absl::StatusOr<Value> FCenter(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_center", args, {"width"}));
  CallArgs call;
  call.positional.push_back(a.Or(0, Value::Int(80)));
  return CallStrMethod(SoftStr(v), "center", call, budget);
}

absl::StatusOr<Value> FLength(const Value& v, const CallArgs& args, Budget&) {
  if (!args.positional.empty() || !args.keyword.empty()) {
    return BoundArgs::Bind("len", args, {}, false).status();  // the error for arguments
  }
  ASSIGN_OR_RETURN(int64_t n, Length(v));
  return Value::Int(n);
}

absl::StatusOr<Value> FDefault(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_default", args, {"default_value", "boolean"}));
  const bool boolean = a.Or(1, Value::Bool(false)).Truthy();
  if (v.is_undefined() || (boolean && !v.Truthy())) return a.Or(0, Value::String(""));
  return v;
}

absl::StatusOr<Value> FDictSort(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_dictsort", args,
                                                {"case_sensitive", "by", "reverse"}));
  const bool case_sensitive = a.Or(0, Value::Bool(false)).Truthy();
  const Value by = a.Or(1, Value::String("key"));
  const bool reverse = a.Or(2, Value::Bool(false)).Truthy();
  size_t pos;
  if (by.is_string() && by.string_value() == "key") {
    pos = 0;
  } else if (by.is_string() && by.string_value() == "value") {
    pos = 1;
  } else {
    return Error("You can only sort by either \"key\" or \"value\"");
  }
  RETURN_IF_ERROR(CheckDefined(v));
  if (v.kind() != Kind::kDict) {
    return Error(absl::StrCat("'", KindName(v.kind()), "' object has no attribute 'items'"));
  }
  RETURN_IF_ERROR(budget.Iterate(static_cast<int64_t>(v.dict_value().entries.size())));
  std::vector<std::pair<Value, Value>> keyed;  // (key, item)
  for (const auto& [k, val] : v.dict_value().entries) {
    keyed.emplace_back(CaseKey(pos == 0 ? k : val, case_sensitive), Value::MakeTuple({k, val}));
  }
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    if (!error.ok()) return false;
    absl::StatusOr<bool> less = reverse ? Less(y.first, x.first) : Less(x.first, y.first);
    if (!less.ok()) error = less.status();
    return less.ok() && *less;
  });
  RETURN_IF_ERROR(error);
  List out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<Value> FEscape(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("escape", args, {}, false));
  (void)a;
  std::string out = HtmlEscape(SoftStr(v));
  RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(out.size())));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FFirst(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_first", args, {}));
  (void)a;
  ASSIGN_OR_RETURN(List items, Iterate(v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> FLast(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_last", args, {}));
  (void)a;
  absl::StatusOr<List> items = Iterate(v);
  if (!items.ok() || v.is_generator()) {
    return Error(absl::StrCat("'", v.is_generator() ? "generator" : KindName(v.kind()),
                              "' object is not reversible"));
  }
  if (items->empty()) return Value::Undefined("No last item, sequence was empty.");
  return items->back();
}

absl::StatusOr<Value> FFloat(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_float", args, {"default"}));
  const Value fallback = a.Or(0, Value::Float(0.0));
  RETURN_IF_ERROR(CheckDefined(v));  // float(Undefined) raises Jinja2's UndefinedError
  if (v.kind() == Kind::kFloat) return v;
  if (IntLike(v)) return Value::Float(static_cast<double>(v.int_value()));
  if (v.is_string()) {
    if (std::optional<double> d = ParseFloat(v.string_value())) return Value::Float(*d);
  }
  return fallback;
}

absl::StatusOr<Value> FInt(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_int", args, {"default", "base"}));
  const Value fallback = a.Or(0, Value::Int(0));
  RETURN_IF_ERROR(CheckDefined(v));  // int(Undefined) raises Jinja2's UndefinedError
  if (IntLike(v)) return Value::Int(v.int_value());
  if (v.kind() == Kind::kFloat) {
    if (std::isnan(v.float_value())) return fallback;
    return FloatToInt(v.float_value());
  }
  if (!v.is_string()) return fallback;
  int64_t base = 10;
  if (a.Has(1)) {
    ASSIGN_OR_RETURN(base, internal::ToInt(*a.Get(1), "base"));
  }
  bool overflow = false;
  if (std::optional<int64_t> i = ParseInt(v.string_value(), base, &overflow)) return Value::Int(*i);
  if (overflow) {
    return Error("integer overflow: the result does not fit in 64 bits (carpool's integers are 64-bit)");
  }
  if (std::optional<double> d = ParseFloat(v.string_value())) {
    if (std::isnan(*d)) return fallback;
    return FloatToInt(*d);
  }
  return fallback;
}

absl::StatusOr<Value> FIndent(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_indent", args, {"width", "first", "blank"}));
  const Value width = a.Or(0, Value::Int(4));
  const bool first = a.Or(1, Value::Bool(false)).Truthy();
  const bool blank = a.Or(2, Value::Bool(false)).Truthy();
  std::string indention;
  if (width.is_string()) {
    indention = width.string_value();
  } else {
    if (!IntLike(width)) {  // " " * width
      return Error(absl::StrCat("can't multiply sequence by non-int of type '",
                                KindName(width.kind()), "'"));
    }
    ASSIGN_OR_RETURN(int64_t n, internal::ToInt(width, "width"));
    RETURN_IF_ERROR(budget.CheckSize(n));
    if (n > 0) indention.assign(static_cast<size_t>(n), ' ');
  }
  RETURN_IF_ERROR(CheckDefined(v));
  if (v.kind() == Kind::kList) return Error("'list' object has no attribute 'splitlines'");
  if (!v.is_string()) {
    return Error(absl::StrCat("unsupported operand type(s) for +=: '", KindName(v.kind()),
                              "' and 'str'"));
  }
  ASSIGN_OR_RETURN(Value lines_value, CallStrMethod(v.string_value() + "\n", "splitlines", {}, budget));
  const List& lines = lines_value.list_value();
  RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(
      v.string_value().size() + (lines.size() + 1) * (indention.size() + 1))));
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i].string_value();
    }
  } else {
    rv = lines[0].string_value();
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].string_value().empty()) rv += indention;
      rv += lines[i].string_value();
    }
  }
  if (first) rv = indention + rv;
  return Value::String(std::move(rv));
}

absl::StatusOr<Value> FItems(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_items", args, {}));
  (void)a;
  if (v.is_undefined()) return Value::MakeGenerator({});
  if (v.kind() != Kind::kDict) return Error("Can only get item pairs from a mapping.");
  RETURN_IF_ERROR(budget.Iterate(static_cast<int64_t>(v.dict_value().entries.size())));
  List out;
  for (const auto& [k, val] : v.dict_value().entries) out.push_back(Value::MakeTuple({k, val}));
  return Value::MakeGenerator(std::move(out));
}

absl::StatusOr<Value> FJoin(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_join", args, {"d", "attribute"}));
  const std::string sep = SoftStr(a.Or(0, Value::String("")));
  const std::vector<Value> parts = AttributeParts(a.Or(1, Value::None()));
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    ASSIGN_OR_RETURN(Value item, Lookup(items[i], parts));
    if (i > 0) out += sep;
    out += item.Str();
    RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(out.size())));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FList(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_list", args, {}));
  (void)a;
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> FLower(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_lower", args, {}));
  (void)a;
  return Value::String(py::Lower(SoftStr(v)));
}

absl::StatusOr<Value> FUpper(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_upper", args, {}));
  (void)a;
  return Value::String(py::Upper(SoftStr(v)));
}

absl::StatusOr<Value> FMap(const Value& v, const CallArgs& args, Budget& budget) {
  if (!v.Truthy()) return Value::MakeGenerator({});
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  List out;
  out.reserve(items.size());
  const bool by_attribute =
      args.positional.empty() &&
      std::any_of(args.keyword.begin(), args.keyword.end(),
                  [](const auto& kw) { return kw.first == "attribute"; });
  if (by_attribute) {
    Value attribute, fallback = Value::None();
    for (const auto& [k, val] : args.keyword) {
      if (k == "attribute") attribute = val;
      else if (k == "default") fallback = val;
      else return Error(absl::StrCat("Unexpected keyword argument ", py::StrRepr(k)));
    }
    const std::vector<Value> parts = AttributeParts(attribute);
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value x, Lookup(item, parts, fallback.is_none() ? nullptr : &fallback));
      out.push_back(std::move(x));
    }
    return Value::MakeGenerator(std::move(out));
  }
  if (args.positional.empty()) return Error("map requires a filter argument");
  const std::string name = SoftStr(args.positional[0]);
  if (!HasFilter(name)) return Error(absl::StrCat("No filter named ", py::StrRepr(name), "."));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value x, ApplyFilter(name, item, rest, budget));
    out.push_back(std::move(x));
  }
  return Value::MakeGenerator(std::move(out));
}

absl::StatusOr<Value> SelectOrReject(const Value& v, const CallArgs& args, Budget& budget,
                                     bool select, bool by_attribute) {
  if (!v.Truthy()) return Value::MakeGenerator({});
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  size_t off = 0;
  std::vector<Value> parts;
  if (by_attribute) {
    if (args.positional.empty()) return Error("Missing parameter for attribute name");
    parts = AttributeParts(args.positional[0]);
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs rest;
  if (args.positional.size() > off) {
    test = SoftStr(args.positional[off]);
    if (!HasTest(*test)) return Error(absl::StrCat("No test named ", py::StrRepr(*test), "."));
    rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(off + 1),
                           args.positional.end());
    rest.keyword = args.keyword;
  }
  List out;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value x, Lookup(item, parts));
    bool ok;
    if (test) {
      ASSIGN_OR_RETURN(ok, ApplyTest(*test, x, rest, budget));
    } else {
      ok = x.Truthy();
    }
    if (ok == select) out.push_back(item);
  }
  return Value::MakeGenerator(std::move(out));
}

absl::StatusOr<Value> FSelect(const Value& v, const CallArgs& args, Budget& budget) {
  return SelectOrReject(v, args, budget, true, false);
}
absl::StatusOr<Value> FReject(const Value& v, const CallArgs& args, Budget& budget) {
  return SelectOrReject(v, args, budget, false, false);
}
absl::StatusOr<Value> FSelectAttr(const Value& v, const CallArgs& args, Budget& budget) {
  return SelectOrReject(v, args, budget, true, true);
}
absl::StatusOr<Value> FRejectAttr(const Value& v, const CallArgs& args, Budget& budget) {
  return SelectOrReject(v, args, budget, false, true);
}

// max / min: the first item whose key is largest / smallest.
absl::StatusOr<Value> MinOrMax(const Value& v, const CallArgs& args, Budget& budget, bool max) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(max ? "do_max" : "do_min", args,
                                                {"case_sensitive", "attribute"}));
  const bool case_sensitive = a.Or(0, Value::Bool(false)).Truthy();
  const std::vector<Value> parts = AttributeParts(a.Or(1, Value::None()));
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  ASSIGN_OR_RETURN(Value best_key, Lookup(items[0], parts));
  best_key = CaseKey(best_key, case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    ASSIGN_OR_RETURN(Value key, Lookup(items[i], parts));
    key = CaseKey(key, case_sensitive);
    ASSIGN_OR_RETURN(bool better, Compare(max ? CompareOp::kGt : CompareOp::kLt, key, best_key));
    if (better) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

absl::StatusOr<Value> FMax(const Value& v, const CallArgs& args, Budget& budget) {
  return MinOrMax(v, args, budget, true);
}
absl::StatusOr<Value> FMin(const Value& v, const CallArgs& args, Budget& budget) {
  return MinOrMax(v, args, budget, false);
}

absl::StatusOr<Value> FReplace(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_replace", args, {"old", "new", "count"}));
  if (!a.Has(1)) {
    return Error(absl::StrCat("do_replace() missing ", a.Has(0) ? "1 required positional argument: 'new'"
                                                            : "2 required positional arguments: 'old' and 'new'"));
  }
  CallArgs call;
  call.positional = {Value::String(a.Get(0)->Str()), Value::String(a.Get(1)->Str())};
  const Value count = a.Or(2, Value::None());
  if (!count.is_none()) call.positional.push_back(count);
  return CallStrMethod(v.Str(), "replace", call, budget);
}

absl::StatusOr<Value> FReverse(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_reverse", args, {}));
  (void)a;
  if (v.is_string()) {
    std::u32string u = py::Decode(v.string_value());
    std::reverse(u.begin(), u.end());
    return Value::String(py::Encode(u));
  }
  absl::StatusOr<List> items = Items(v, budget);
  if (!items.ok()) return Error("argument must be iterable");
  std::reverse(items->begin(), items->end());
  // reversed() of a generator fails, and Jinja2 then reverses list(value): a list.
  if (v.is_generator()) return Value::MakeList(*std::move(items));
  return Value::MakeGenerator(*std::move(items));
}

// Python's round(x, ndigits) for a float: correctly rounded, ties to even on the exact value.
double RoundFloat(double x, int64_t ndigits) {
  if (!std::isfinite(x) || x == 0) return x;
  if (ndigits > 323) return x;
  if (ndigits < -308) return std::copysign(0.0, x);
  if (ndigits >= 0) {
    char buf[512];
    const int n = std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    if (n <= 0 || n >= static_cast<int>(sizeof(buf))) return x;
    return std::strtod(buf, nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(-ndigits));
  const double r = std::nearbyint(x / scale) * scale;
  return std::isfinite(r) ? r : x;
}

absl::StatusOr<Value> FRound(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_round", args, {"precision", "method"}));
  ASSIGN_OR_RETURN(int64_t precision, internal::ToInt(a.Or(0, Value::Int(0)), "precision"));
  const std::string method = SoftStr(a.Or(1, Value::String("common")));
  if (method != "common" && method != "ceil" && method != "floor") {
    return Error("method must be common, ceil or floor");
  }
  RETURN_IF_ERROR(CheckDefined(v));
  if (!v.is_number() && v.kind() != Kind::kBool) {
    return Error(absl::StrCat("type ", KindName(v.kind()), " doesn't define __round__ method"));
  }
  if (method == "common") {
    if (IntLike(v)) {
      if (precision >= 0) return Value::Int(v.int_value());
      if (precision < -18) return Value::Int(0);
      int64_t scale = 1;
      for (int64_t k = 0; k < -precision; ++k) scale *= 10;
      const int64_t x = v.int_value();
      int64_t q = x / scale, r = x % scale;
      if (r < 0) {
        r += scale;
        q -= 1;
      }
      if (2 * r > scale || (2 * r == scale && (q & 1) != 0)) q += 1;
      return Value::Int(q * scale);
    }
    return Value::Float(RoundFloat(v.float_value(), precision));
  }
  // math.ceil / math.floor of value * 10**precision, divided by 10**precision.
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.float_value() * scale;
  if (std::isinf(x)) return Error("cannot convert float infinity to integer");
  if (std::isnan(x)) return Error("cannot convert float NaN to integer");
  // math.ceil / math.floor give an int: no negative zero survives them.
  double r = method == "ceil" ? std::ceil(x) : std::floor(x);
  if (r == 0) r = 0.0;
  return Value::Float(r / scale);
}

absl::StatusOr<Value> FSafe(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_mark_safe", args, {}));
  (void)a;
  return Value::String(SoftStr(v));
}

absl::StatusOr<Value> FSort(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_sort", args,
                                                {"reverse", "case_sensitive", "attribute"}));
  const bool reverse = a.Or(0, Value::Bool(false)).Truthy();
  const bool case_sensitive = a.Or(1, Value::Bool(false)).Truthy();
  const Value attribute = a.Or(2, Value::None());
  std::vector<std::vector<Value>> paths;
  if (attribute.is_string()) {
    for (absl::string_view p : absl::StrSplit(attribute.string_value(), ',')) {
      paths.push_back(AttributeParts(Value::String(std::string(p))));
    }
  } else {
    paths.push_back(AttributeParts(attribute));
  }
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  std::vector<std::pair<Value, Value>> keyed;  // (key list, item)
  for (const Value& item : items) {
    List key;
    for (const auto& path : paths) {
      ASSIGN_OR_RETURN(Value k, Lookup(item, path));
      key.push_back(CaseKey(k, case_sensitive));
    }
    keyed.emplace_back(Value::MakeList(std::move(key)), item);
  }
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    if (!error.ok()) return false;
    absl::StatusOr<bool> less = reverse ? Less(y.first, x.first) : Less(x.first, y.first);
    if (!less.ok()) error = less.status();
    return less.ok() && *less;
  });
  RETURN_IF_ERROR(error);
  List out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FString(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("soft_str", args, {}, false));
  (void)a;
  return Value::String(SoftStr(v));
}

absl::StatusOr<Value> FSum(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_sum", args, {"attribute", "start"}));
  const std::vector<Value> parts = AttributeParts(a.Or(0, Value::None()));
  Value total = a.Or(1, Value::Int(0));
  if (total.is_string()) return Error("sum() can't sum strings [use ''.join(seq) instead]");
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value x, Lookup(item, parts));
    ASSIGN_OR_RETURN(total, Arithmetic(BinaryOp::kAdd, total, x, budget));
  }
  return total;
}

// Jinja2's title: each run between the delimiters [-\s({\[<]+ gets its first character upper-
// cased and the rest lower-cased.
absl::StatusOr<Value> FTitle(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_title", args, {}));
  (void)a;
  const std::u32string u = py::Decode(SoftStr(v));
  auto delimiter = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::IsSpace(c);
  };
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    if (delimiter(u[i])) {
      py::AppendCodePoint(u[i++], &out);
      continue;
    }
    size_t j = i;
    while (j < u.size() && !delimiter(u[j])) ++j;
    out += py::Upper(py::Encode(u.substr(i, 1)));
    out += py::Lower(py::Encode(u.substr(i + 1, j - i - 1)));
    i = j;
  }
  return Value::String(std::move(out));
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
absl::StatusOr<Value> FToJson(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("tojson", args,
                                                {"ensure_ascii", "indent", "separators", "sort_keys"}));
  ASSIGN_OR_RETURN(std::string out,
                   internal::Dumps(v, a.Or(1, Value::None()), a.Or(2, Value::None()),
                                   a.Or(3, Value::Bool(false)).Truthy(), budget,
                                   a.Or(0, Value::Bool(false)).Truthy()));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FTrim(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_trim", args, {"chars"}));
  CallArgs call;
  if (a.Has(0)) call.positional.push_back(*a.Get(0));
  return CallStrMethod(SoftStr(v), "strip", call, budget);
}

absl::StatusOr<Value> FTruncate(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_truncate", args,
                                                {"length", "killwords", "end", "leeway"}));
  ASSIGN_OR_RETURN(int64_t length, internal::ToInt(a.Or(0, Value::Int(255)), "length"));
  const bool killwords = a.Or(1, Value::Bool(false)).Truthy();
  const std::string end = SoftStr(a.Or(2, Value::String("...")));
  Value leeway_value = a.Or(3, Value::None());
  if (leeway_value.is_none()) leeway_value = Value::Int(5);
  ASSIGN_OR_RETURN(int64_t leeway, internal::ToInt(leeway_value, "leeway"));
  const int64_t end_length = py::CodePointCount(end);
  if (length < end_length) {
    return Error(absl::StrCat("expected length >= ", end_length, ", got ", length));
  }
  if (leeway < 0) return Error(absl::StrCat("expected leeway >= 0, got ", leeway));
  ASSIGN_OR_RETURN(int64_t n, Length(v));
  if (n <= length + leeway) return v;
  const std::u32string u = py::Decode(v.Str());
  std::string head = py::Encode(u.substr(0, static_cast<size_t>(length - end_length)));
  if (!killwords) {
    const size_t space = head.rfind(' ');
    if (space != std::string::npos) head.resize(space);
  }
  return Value::String(head + end);
}

absl::StatusOr<Value> FUnique(const Value& v, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_unique", args, {"case_sensitive", "attribute"}));
  const bool case_sensitive = a.Or(0, Value::Bool(false)).Truthy();
  const std::vector<Value> parts = AttributeParts(a.Or(1, Value::None()));
  ASSIGN_OR_RETURN(List items, Items(v, budget));
  List seen, out;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value key, Lookup(item, parts));
    key = CaseKey(key, case_sensitive);
    if (key.kind() == Kind::kList || key.kind() == Kind::kDict) {
      return Error(absl::StrCat("unhashable type: '", KindName(key.kind()), "'"));
    }
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
      RETURN_IF_ERROR(budget.Iterate(static_cast<int64_t>(seen.size())));
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeGenerator(std::move(out));
}

absl::StatusOr<Value> FWordCount(const Value& v, const CallArgs& args, Budget&) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("do_wordcount", args, {}));
  (void)a;
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : py::Decode(SoftStr(v))) {
    const bool word = c == '_' || py::IsAlpha(c) || py::IsNumeric(c);
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::Int(words);
}

// `fmt|format(args)`: Python's printf-style `fmt % args` for the conversions s r a d i u f F e
// E g G x X o c and %%, with the flags - + space # 0, a width and a precision.
absl::StatusOr<Value> FFormat(const Value& v, const CallArgs& args, Budget& budget) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    return Error("can't handle positional and keyword arguments at the same time");
  }
  ASSIGN_OR_RETURN(std::string out, internal::PercentFormat(SoftStr(v), args, budget));
  return Value::String(std::move(out));
}

const std::unordered_map<std::string, FilterFn>& Filters() {
  static const auto* filters = new std::unordered_map<std::string, FilterFn>{
      {"abs", FAbs},         {"attr", FAttr},           {"batch", FBatch},
      {"capitalize", FCapitalize}, {"center", FCenter},  {"count", FLength},
      {"d", FDefault},       {"default", FDefault},     {"dictsort", FDictSort},
      {"e", FEscape},        {"escape", FEscape},       {"forceescape", FEscape},
      {"first", FFirst},     {"float", FFloat},         {"format", FFormat},
      {"indent", FIndent},   {"int", FInt},             {"items", FItems},
      {"join", FJoin},       {"last", FLast},           {"length", FLength},
      {"list", FList},       {"lower", FLower},         {"map", FMap},
      {"max", FMax},         {"min", FMin},             {"reject", FReject},
      {"rejectattr", FRejectAttr}, {"replace", FReplace}, {"reverse", FReverse},
      {"round", FRound},     {"safe", FSafe},           {"select", FSelect},
      {"selectattr", FSelectAttr}, {"slice", FSlice},   {"sort", FSort},
      {"string", FString},   {"sum", FSum},             {"title", FTitle},
      {"tojson", FToJson},   {"trim", FTrim},           {"truncate", FTruncate},
      {"unique", FUnique},   {"upper", FUpper},         {"wordcount", FWordCount},
  };
  return *filters;
}

}  // namespace

FilterFn FindFilter(absl::string_view name) {
  const auto it = Filters().find(std::string(name));
  return it == Filters().end() ? nullptr : it->second;
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input,
                                  const CallArgs& args, Budget& budget) {
  const FilterFn filter = FindFilter(name);
  if (filter == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("No filter named ", py::StrRepr(name), "."));
  }
  return filter(input, args, budget);
}

}  // namespace carpool::text::jinja
