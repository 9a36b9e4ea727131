// The methods of str, dict, list and tuple values (BoundMethod), as Python 3.11's, on code
// points. str.format is in format.cc.
#include <algorithm>
#include <limits>

#include "absl/strings/match.h"
#include "absl/types/span.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "text/jinja/builtins.h"
#include "text/jinja/builtins_internal.h"
#include "text/jinja/format.h"
#include "text/jinja/pystr.h"

namespace carpool::text::jinja {
namespace internal {

absl::StatusOr<BoundArgs> BoundArgs::Bind(absl::string_view function, const CallArgs& args,
                                          std::initializer_list<const char*> params,
                                          bool keywords) {
  BoundArgs out;
  const absl::Span<const char* const> names(params.begin(), params.size());
  out.values_.resize(names.size());
  out.given_.assign(names.size(), false);
  if (args.positional.size() > names.size()) {
    if (!keywords) {  // a builtin method: "strip expected at most 1 argument, got 2"
      const size_t dot = function.rfind('.');
      return absl::InvalidArgumentError(absl::StrCat(
          dot == absl::string_view::npos ? function : function.substr(dot + 1),
          " expected at most ", names.size(), " argument", names.size() == 1 ? "" : "s",
          ", got ", args.positional.size()));
    }
    return absl::InvalidArgumentError(absl::StrCat(function, "() takes at most ", names.size(),
                                                   " argument", names.size() == 1 ? "" : "s",
                                                   " (", args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) {
    out.values_[i] = args.positional[i];
    out.given_[i] = true;
  }
  if (!keywords && !args.keyword.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(function, "() takes no keyword arguments"));
  }
  for (const auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && name != names[i]) ++i;
    if (i == names.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(function, "() got an unexpected keyword argument '", name, "'"));
    }
    if (out.given_[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(function, "() got multiple values for argument '", name, "'"));
    }
    out.values_[i] = value;
    out.given_[i] = true;
  }
  return out;
}

absl::StatusOr<int64_t> ToInt(const Value& v, absl::string_view what) {
  if (v.kind() == Kind::kInt || v.kind() == Kind::kBool) return v.int_value();
  (void)what;
  return absl::InvalidArgumentError(
      absl::StrCat("'", KindName(v.kind()), "' object cannot be interpreted as an integer"));
}

absl::StatusOr<std::string> ToStr(const Value& v, absl::string_view what) {
  if (v.is_string()) return v.string_value();
  return absl::InvalidArgumentError(
      absl::StrCat(what, what.empty() ? "" : " ", "must be str, not ", KindName(v.kind())));
}

Value MakeMethod(absl::string_view type_name, absl::string_view name, Function fn) {
  return Value::MakeCallable(absl::StrCat(type_name, ".", name), std::move(fn));
}

std::vector<std::string> SplitWhitespace(absl::string_view s, int64_t maxsplit) {
  const std::u32string u = py::Decode(s);
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = u.size();
  if (maxsplit < 0) maxsplit = std::numeric_limits<int64_t>::max();
  while (true) {
    while (i < n && py::IsSpace(u[i])) ++i;
    if (i == n) break;
    if (static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(py::Encode(u.substr(i)));
      break;
    }
    size_t j = i;
    while (j < n && !py::IsSpace(u[j])) ++j;
    out.push_back(py::Encode(u.substr(i, j - i)));
    i = j;
  }
  return out;
}

std::string Replace(absl::string_view s, absl::string_view old, absl::string_view replacement,
                    int64_t count) {
  if (count < 0) count = std::numeric_limits<int64_t>::max();
  std::string out;
  if (old.empty()) {
    // Python inserts `replacement` before every code point and at the end.
    const std::u32string u = py::Decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (done < count) {
        out.append(replacement.data(), replacement.size());
        ++done;
      }
      if (i < u.size()) py::AppendCodePoint(u[i], &out);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (done < count) {
    const size_t hit = s.find(old, pos);
    if (hit == absl::string_view::npos) break;
    out.append(s.data() + pos, hit - pos);
    out.append(replacement.data(), replacement.size());
    pos = hit + old.size();
    ++done;
  }
  out.append(s.data() + pos, s.size() - pos);
  return out;
}

std::string Strip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  const std::u32string u = py::Decode(s);
  const std::u32string set = chars.has_value() ? py::Decode(*chars) : std::u32string();
  auto strip = [&](char32_t c) {
    return chars.has_value() ? set.find(c) != std::u32string::npos : py::IsSpace(c);
  };
  size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip(u[e - 1])) --e;
  }
  return py::Encode(u.substr(b, e - b));
}

}  // namespace internal

namespace {

using internal::BoundArgs;

absl::Status TypeError(absl::string_view m) { return absl::InvalidArgumentError(m); }

// Python's start/end arguments of find/count/startswith, normalised on `length` code points
// (ADJUST_INDICES: end clamped to the length, negatives counted from the end).
absl::Status Range(const BoundArgs& a, size_t first, int64_t length, int64_t* start,
                   int64_t* end) {
  *start = 0;
  *end = length;
  for (size_t k = 0; k < 2; ++k) {
    const Value* v = a.Get(first + k);
    if (v == nullptr || v->is_none()) continue;
    if (v->kind() != Kind::kInt && v->kind() != Kind::kBool) {
      return TypeError("slice indices must be integers or None or have an __index__ method");
    }
    int64_t x = v->int_value();
    if (x < 0) {
      x += length;
      if (x < 0) x = 0;
    } else if (k == 1 && x > length) {
      x = length;
    }
    (k == 0 ? *start : *end) = x;
  }
  return absl::OkStatus();
}

// Whether the start and end arguments at `first` and `first + 1` are absent or None: the
// method looks at the whole string.
bool WholeString(const BoundArgs& a, size_t first) {
  for (size_t k = first; k < first + 2; ++k) {
    const Value* v = a.Get(k);
    if (v != nullptr && !v->is_none()) return false;
  }
  return true;
}

// Code point indexes of `s` -> byte offsets (one past the end included).
std::vector<size_t> Offsets(absl::string_view s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  }
  out.push_back(s.size());
  return out;
}

int64_t CodePointIndex(const std::vector<size_t>& offsets, size_t byte) {
  return std::lower_bound(offsets.begin(), offsets.end(), byte) - offsets.begin();
}

// find / rfind / index / rindex / count.
absl::StatusOr<Value> Search(absl::string_view method, const std::string& s, const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(absl::StrCat("str.", method), args, {"sub", "start", "end"}, false));
  if (!a.Has(0)) {
    return TypeError(absl::StrCat(method, " expected at least 1 argument, got 0"));
  }
  ASSIGN_OR_RETURN(std::string sub, internal::ToStr(*a.Get(0), ""));
  const bool rev = method == "rfind" || method == "rindex";
  if (WholeString(a, 1)) {  // no code point offsets to compute
    if (method == "count") {
      if (sub.empty()) return Value::Int(py::CodePointCount(s) + 1);
      int64_t n = 0;
      for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) {
        ++n;
      }
      return Value::Int(n);
    }
    const size_t pos = rev ? s.rfind(sub) : s.find(sub);
    if (pos != std::string::npos) {
      return Value::Int(py::CodePointCount(absl::string_view(s).substr(0, pos)));
    }
    if (method == "index" || method == "rindex") {
      return absl::InvalidArgumentError("substring not found");
    }
    return Value::Int(-1);
  }
  const std::vector<size_t> offsets = Offsets(s);
  const int64_t length = static_cast<int64_t>(offsets.size()) - 1;
  int64_t start, end;
  RETURN_IF_ERROR(Range(a, 1, length, &start, &end));
  const int64_t sub_length = py::CodePointCount(sub);
  if (method == "count") {
    if (end - start < sub_length) return Value::Int(0);
    if (sub.empty()) return Value::Int(end - start + 1);
    const absl::string_view window = absl::string_view(s).substr(
        offsets[static_cast<size_t>(start)], offsets[static_cast<size_t>(end)] - offsets[static_cast<size_t>(start)]);
    int64_t n = 0;
    for (size_t pos = window.find(sub); pos != absl::string_view::npos;
         pos = window.find(sub, pos + sub.size())) {
      ++n;
    }
    return Value::Int(n);
  }
  int64_t found = -1;
  if (end - start >= sub_length) {
    const size_t b = offsets[static_cast<size_t>(start)];
    const absl::string_view window =
        absl::string_view(s).substr(b, offsets[static_cast<size_t>(end)] - b);
    const size_t pos = rev ? window.rfind(sub) : window.find(sub);
    if (pos != absl::string_view::npos) found = CodePointIndex(offsets, b + pos);
  }
  if (found < 0 && (method == "index" || method == "rindex")) {
    return absl::InvalidArgumentError("substring not found");
  }
  return Value::Int(found);
}

// startswith / endswith.
absl::StatusOr<Value> Affix(absl::string_view method, const std::string& s, const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(absl::StrCat("str.", method), args, {"prefix", "start", "end"}, false));
  if (!a.Has(0)) return TypeError(absl::StrCat(method, " expected at least 1 argument, got 0"));
  std::vector<std::string> candidates;
  const Value& p = *a.Get(0);
  if (p.is_string()) {
    candidates.push_back(p.string_value());
  } else if (p.kind() == Kind::kTuple) {
    for (const Value& v : p.list_value()) {
      if (!v.is_string()) {
        return TypeError(absl::StrCat("tuple for ", method, " must only contain str, not ",
                                      KindName(v.kind())));
      }
      candidates.push_back(v.string_value());
    }
  } else {
    return TypeError(absl::StrCat(method, " first arg must be str or a tuple of str, not ",
                                  KindName(p.kind())));
  }
  const bool starts = method == "startswith";
  if (WholeString(a, 1)) {  // no code point offsets to compute
    for (const std::string& c : candidates) {
      if (starts ? absl::StartsWith(s, c) : absl::EndsWith(s, c)) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  const std::vector<size_t> offsets = Offsets(s);
  const int64_t length = static_cast<int64_t>(offsets.size()) - 1;
  int64_t start, end;
  RETURN_IF_ERROR(Range(a, 1, length, &start, &end));
  for (const std::string& c : candidates) {
    if (start > length) continue;
    if (end - start < py::CodePointCount(c)) continue;
    const size_t b = offsets[static_cast<size_t>(start)];
    const absl::string_view window =
        absl::string_view(s).substr(b, offsets[static_cast<size_t>(end)] - b);
    if (starts ? absl::string_view(window).substr(0, c.size()) == c
                               : window.size() >= c.size() &&
                                     window.substr(window.size() - c.size()) == c) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> SplitMethod(absl::string_view method, const std::string& s,
                                  const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(method, args, {"sep", "maxsplit"}));
  int64_t maxsplit = -1;
  if (a.Has(1)) {
    ASSIGN_OR_RETURN(maxsplit, internal::ToInt(*a.Get(1), "maxsplit"));
  }
  const Value sep = a.Or(0, Value::None());
  const bool right = method == "rsplit";
  std::vector<std::string> parts;
  if (sep.is_none()) {
    if (!right) {
      parts = internal::SplitWhitespace(s, maxsplit);
    } else {
      // rsplit(None, n): split from the right; the rest keeps its leading whitespace.
      std::u32string u = py::Decode(s);
      std::reverse(u.begin(), u.end());
      for (std::string& part : internal::SplitWhitespace(py::Encode(u), maxsplit)) {
        std::u32string p = py::Decode(part);
        std::reverse(p.begin(), p.end());
        parts.insert(parts.begin(), py::Encode(p));
      }
    }
  } else {
    if (!sep.is_string()) return TypeError(absl::StrCat("must be str or None, not ", KindName(sep.kind())));
    const std::string& d = sep.string_value();
    if (d.empty()) return absl::InvalidArgumentError("empty separator");
    if (maxsplit < 0) maxsplit = std::numeric_limits<int64_t>::max();
    if (!right) {
      size_t pos = 0;
      int64_t n = 0;
      while (n < maxsplit) {
        const size_t hit = s.find(d, pos);
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(pos, hit - pos));
        pos = hit + d.size();
        ++n;
      }
      parts.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      int64_t n = 0;
      while (n < maxsplit && end >= d.size()) {
        const size_t hit = s.rfind(d, end - d.size());
        if (hit == std::string::npos) break;
        parts.insert(parts.begin(), s.substr(hit + d.size(), end - hit - d.size()));
        end = hit;
        ++n;
      }
      parts.insert(parts.begin(), s.substr(0, end));
    }
  }
  List out;
  for (std::string& p : parts) out.push_back(Value::String(std::move(p)));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> SplitLines(const std::string& s, const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("splitlines", args, {"keepends"}));
  ASSIGN_OR_RETURN(const int64_t keep, internal::ToInt(a.Or(0, Value::Bool(false)), "keepends"));
  const std::u32string u = py::Decode(s);
  List out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    while (j < u.size() && !py::IsLineBreak(u[j])) ++j;
    size_t eol = j;
    if (j < u.size()) {
      eol = j + (u[j] == '\r' && j + 1 < u.size() && u[j + 1] == '\n' ? 2 : 1);
    }
    out.push_back(Value::String(py::Encode(u.substr(i, (keep ? eol : j) - i))));
    i = eol;
  }
  return Value::MakeList(std::move(out));
}

// center / ljust / rjust.
absl::StatusOr<Value> Pad(absl::string_view method, const std::string& s, const CallArgs& args,
                          Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(absl::StrCat("str.", method), args, {"width", "fillchar"}, false));
  if (!a.Has(0)) return TypeError(absl::StrCat(method, " expected at least 1 argument, got 0"));
  ASSIGN_OR_RETURN(int64_t width, internal::ToInt(*a.Get(0), "width"));
  std::string fill = " ";
  if (a.Has(1)) {
    const Value& f = *a.Get(1);
    if (!f.is_string()) {
      return TypeError(absl::StrCat(method, "() argument 2 must be str, not ", KindName(f.kind())));
    }
    if (py::CodePointCount(f.string_value()) != 1) {
      return TypeError("The fill character must be exactly one character long");
    }
    fill = f.string_value();
  }
  const int64_t length = py::CodePointCount(s);
  if (width <= length) return Value::String(s);
  const int64_t marg = width - length;
  RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(s.size()) + marg * static_cast<int64_t>(fill.size())));
  int64_t left = 0;
  if (method == "center") {
    left = marg / 2 + (marg & width & 1);
  } else if (method == "rjust") {
    left = marg;
  }
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = left; i < marg; ++i) out += fill;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> ZFill(const std::string& s, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("str.zfill", args, {"width"}, false));
  if (!a.Has(0)) return TypeError("zfill() takes exactly one argument (0 given)");
  ASSIGN_OR_RETURN(int64_t width, internal::ToInt(*a.Get(0), "width"));
  const int64_t length = py::CodePointCount(s);
  if (width <= length) return Value::String(s);
  RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(s.size()) + width - length));
  std::string out;
  size_t body = 0;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    out.push_back(s[0]);
    body = 1;
  }
  out.append(static_cast<size_t>(width - length), '0');
  out.append(s, body, std::string::npos);
  return Value::String(std::move(out));
}

// isdigit, isalpha, ... and isupper / islower / istitle.
Value Predicate(absl::string_view method, const std::string& s) {
  const std::u32string u = py::Decode(s);
  if (method == "isupper" || method == "islower") {
    const bool upper = method == "isupper";
    bool cased = false;
    for (char32_t c : u) {
      if ((upper ? py::IsLower(c) : py::IsUpper(c)) || py::IsTitle(c)) return Value::Bool(false);
      if (upper ? py::IsUpper(c) : py::IsLower(c)) cased = true;
    }
    return Value::Bool(cased);
  }
  if (method == "istitle") {
    bool cased = false, previous_cased = false;
    for (char32_t c : u) {
      if (py::IsUpper(c) || py::IsTitle(c)) {
        if (previous_cased) return Value::Bool(false);
        previous_cased = cased = true;
      } else if (py::IsLower(c)) {
        if (!previous_cased) return Value::Bool(false);
        previous_cased = cased = true;
      } else {
        previous_cased = false;
      }
    }
    return Value::Bool(cased);
  }
  if (u.empty()) return Value::Bool(false);
  for (char32_t c : u) {
    bool ok = false;
    if (method == "isdigit") ok = py::IsDigit(c);
    else if (method == "isdecimal") ok = py::IsDecimal(c);
    else if (method == "isnumeric") ok = py::IsNumeric(c);
    else if (method == "isalpha") ok = py::IsAlpha(c);
    else if (method == "isalnum") ok = py::IsAlpha(c) || py::IsNumeric(c);
    else if (method == "isspace") ok = py::IsSpace(c);
    if (!ok) return Value::Bool(false);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> Join(const std::string& sep, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("str.join", args, {"iterable"}, false));
  if (!a.Has(0)) return TypeError("str.join() takes exactly one argument (0 given)");
  if (a.Get(0)->is_undefined()) RETURN_IF_ERROR(CheckDefined(*a.Get(0)));
  absl::StatusOr<List> items = Iterate(*a.Get(0));
  if (!items.ok()) return TypeError("can only join an iterable");
  RETURN_IF_ERROR(budget.Iterate(static_cast<int64_t>(items->size())));
  std::string out;
  for (size_t i = 0; i < items->size(); ++i) {
    const Value& v = (*items)[i];
    if (!v.is_string()) {
      return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ",
                                    KindName(v.kind()), " found"));
    }
    if (i > 0) out += sep;
    out += v.string_value();
    RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(out.size())));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Partition(absl::string_view method, const std::string& s,
                                const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(absl::StrCat("str.", method), args, {"sep"}, false));
  if (!a.Has(0)) return TypeError(absl::StrCat(method, "() takes exactly one argument (0 given)"));
  ASSIGN_OR_RETURN(std::string sep, internal::ToStr(*a.Get(0), ""));
  if (sep.empty()) return absl::InvalidArgumentError("empty separator");
  const size_t hit = method == "partition" ? s.find(sep) : s.rfind(sep);
  if (hit == std::string::npos) {
    return method == "partition"
               ? Value::MakeTuple({Value::String(s), Value::String(""), Value::String("")})
               : Value::MakeTuple({Value::String(""), Value::String(""), Value::String(s)});
  }
  return Value::MakeTuple({Value::String(s.substr(0, hit)), Value::String(sep),
                           Value::String(s.substr(hit + sep.size()))});
}

// The str methods; nullopt for a name str has no method of (in carpool).
// strip / lstrip / rstrip.
absl::StatusOr<Value> StripMethod(absl::string_view method, const std::string& s,
                                  const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a,
                   BoundArgs::Bind(absl::StrCat("str.", method), args, {"chars"}, false));
  std::optional<std::string> chars;
  if (a.Has(0) && !a.Get(0)->is_none()) {
    if (!a.Get(0)->is_string()) return TypeError(absl::StrCat(method, " arg must be None or str"));
    chars = a.Get(0)->string_value();
  }
  return Value::String(internal::Strip(s, chars, method != "rstrip", method != "lstrip"));
}

absl::StatusOr<Value> ReplaceMethod(const std::string& s, const CallArgs& args, Budget& budget) {
  ASSIGN_OR_RETURN(BoundArgs a,
                   BoundArgs::Bind("str.replace", args, {"old", "new", "count"}, false));
  if (!a.Has(1)) {
    return TypeError(
        absl::StrCat("replace expected at least 2 arguments, got ", args.positional.size()));
  }
  ASSIGN_OR_RETURN(std::string old, internal::ToStr(*a.Get(0), "replace() argument 1"));
  ASSIGN_OR_RETURN(std::string repl, internal::ToStr(*a.Get(1), "replace() argument 2"));
  int64_t count = -1;
  if (a.Has(2)) {
    ASSIGN_OR_RETURN(count, internal::ToInt(*a.Get(2), "count"));
  }
  // The result is at most len(s) + (len(s) + 1) * len(new): check that bound first.
  const int64_t bound = static_cast<int64_t>(s.size()) +
                        (py::CodePointCount(s) + 1) * static_cast<int64_t>(repl.size());
  if (repl.size() > old.size()) RETURN_IF_ERROR(budget.CheckSize(bound));
  return Value::String(internal::Replace(s, old, repl, count));
}

std::optional<Function> StrMethod(const Value& v, absl::string_view name) {
  const std::string n(name);
  auto no_args = [n](const CallArgs& args) -> absl::Status {
    if (!args.positional.empty() || !args.keyword.empty()) {
      return TypeError(absl::StrCat("str.", n, "() takes no arguments (",
                                    args.positional.size() + args.keyword.size(), " given)"));
    }
    return absl::OkStatus();
  };
  if (n == "strip" || n == "lstrip" || n == "rstrip") {
    return [v, n](const CallArgs& args, Budget&) { return StripMethod(n, v.string_value(), args); };
  }
  if (n == "upper" || n == "lower" || n == "title" || n == "capitalize") {
    return [v, n, no_args](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
      RETURN_IF_ERROR(no_args(args));
      if (n == "upper") return Value::String(py::Upper(v.string_value()));
      if (n == "lower") return Value::String(py::Lower(v.string_value()));
      if (n == "title") return Value::String(py::Title(v.string_value()));
      return Value::String(py::Capitalize(v.string_value()));
    };
  }
  if (n == "split" || n == "rsplit") {
    return [v, n](const CallArgs& args, Budget&) { return SplitMethod(n, v.string_value(), args); };
  }
  if (n == "splitlines") {
    return [v](const CallArgs& args, Budget&) { return SplitLines(v.string_value(), args); };
  }
  if (n == "startswith" || n == "endswith") {
    return [v, n](const CallArgs& args, Budget&) { return Affix(n, v.string_value(), args); };
  }
  if (n == "find" || n == "rfind" || n == "index" || n == "rindex" || n == "count") {
    return [v, n](const CallArgs& args, Budget&) { return Search(n, v.string_value(), args); };
  }
  if (n == "replace") {
    return [v](const CallArgs& args, Budget& budget) {
      return ReplaceMethod(v.string_value(), args, budget);
    };
  }
  if (n == "format") {
    return [v](const CallArgs& args, Budget& budget) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(std::string out, StrFormat(v.string_value(), args, budget));
      return Value::String(std::move(out));
    };
  }
  if (n == "join") {
    return [v](const CallArgs& args, Budget& budget) { return Join(v.string_value(), args, budget); };
  }
  if (n == "center" || n == "ljust" || n == "rjust") {
    return [v, n](const CallArgs& args, Budget& budget) { return Pad(n, v.string_value(), args, budget); };
  }
  if (n == "zfill") {
    return [v](const CallArgs& args, Budget& budget) { return ZFill(v.string_value(), args, budget); };
  }
  if (n == "isdigit" || n == "isdecimal" || n == "isnumeric" || n == "isalpha" ||
      n == "isalnum" || n == "isspace" || n == "isupper" || n == "islower" || n == "istitle") {
    return [v, n, no_args](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
      RETURN_IF_ERROR(no_args(args));
      return Predicate(n, v.string_value());
    };
  }
  if (n == "partition" || n == "rpartition") {
    return [v, n](const CallArgs& args, Budget&) { return Partition(n, v.string_value(), args); };
  }
  if (n == "removeprefix" || n == "removesuffix") {
    return [v, n](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(absl::StrCat("str.", n), args, {"affix"}, false));
      if (!a.Has(0)) return TypeError(absl::StrCat("str.", n, "() takes exactly one argument (0 given)"));
      ASSIGN_OR_RETURN(std::string affix,
                       internal::ToStr(*a.Get(0), absl::StrCat(n, "() argument")));
      if (n == "removeprefix" && v.string_value().compare(0, affix.size(), affix) == 0) {
        return Value::String(v.string_value().substr(affix.size()));
      }
      if (n == "removesuffix" && !affix.empty() && v.string_value().size() >= affix.size() &&
          v.string_value().compare(v.string_value().size() - affix.size(), affix.size(), affix) == 0) {
        return Value::String(v.string_value().substr(0, v.string_value().size() - affix.size()));
      }
      return Value::String(v.string_value());
    };
  }
  return std::nullopt;
}

std::optional<Function> DictMethod(const Value& d, absl::string_view name) {
  const std::string n(name);
  if (n == "items" || n == "keys" || n == "values") {
    return [d, n](const CallArgs& args, Budget& budget) -> absl::StatusOr<Value> {
      if (!args.positional.empty() || !args.keyword.empty()) {
        return TypeError(absl::StrCat("dict.", n, "() takes no arguments (",
                                      args.positional.size() + args.keyword.size(), " given)"));
      }
      RETURN_IF_ERROR(budget.Iterate(static_cast<int64_t>(d.dict_value().entries.size())));
      List out;
      for (const auto& [k, v] : d.dict_value().entries) {
        if (n == "items") out.push_back(Value::MakeTuple({k, v}));
        else out.push_back(n == "keys" ? k : v);
      }
      return Value::MakeList(std::move(out));
    };
  }
  if (n == "get") {
    return [d](const CallArgs& args, Budget&) -> absl::StatusOr<Value> {
      if (!args.keyword.empty()) return TypeError("dict.get() takes no keyword arguments");
      if (args.positional.empty() || args.positional.size() > 2) {
        return TypeError(absl::StrCat("get expected at ", args.positional.empty() ? "least 1" : "most 2",
                                      " argument", args.positional.empty() ? "" : "s", ", got ",
                                      args.positional.size()));
      }
      const Value* v = d.dict_value().Find(args.positional[0]);
      if (v != nullptr) return *v;
      return args.positional.size() > 1 ? args.positional[1] : Value::None();
    };
  }
  if (n == "copy") {
    return [d](const CallArgs&, Budget&) -> absl::StatusOr<Value> { return d; };
  }
  return std::nullopt;
}

std::optional<Function> SequenceMethod(const Value& seq, absl::string_view name) {
  const std::string n(name);
  const std::string type = KindName(seq.kind());
  if (n == "index" || n == "count") {
    return [seq, n, type](const CallArgs& args, Budget& budget) -> absl::StatusOr<Value> {
      ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(absl::StrCat(type, ".", n), args, {"value", "start", "stop"}, false));
      if (!a.Has(0)) {
        return TypeError(absl::StrCat(n, " expected at least 1 argument, got 0"));
      }
      const List& items = seq.list_value();
      RETURN_IF_ERROR(budget.Iterate(static_cast<int64_t>(items.size())));
      if (n == "count") {
        int64_t c = 0;
        for (const Value& v : items) c += Equals(v, *a.Get(0));
        return Value::Int(c);
      }
      int64_t start, end;
      RETURN_IF_ERROR(Range(a, 1, static_cast<int64_t>(items.size()), &start, &end));
      for (int64_t i = start; i < end; ++i) {
        if (Equals(items[static_cast<size_t>(i)], *a.Get(0))) return Value::Int(i);
      }
      if (type == "tuple") return absl::InvalidArgumentError("tuple.index(x): x not in tuple");
      return absl::InvalidArgumentError(absl::StrCat(a.Get(0)->Repr(), " is not in list"));
    };
  }
  if (n == "copy" && seq.kind() == Kind::kList) {
    return [seq](const CallArgs&, Budget&) -> absl::StatusOr<Value> { return seq; };
  }
  return std::nullopt;
}

}  // namespace

StrMethodFn FindStrMethod(absl::string_view name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return [](absl::string_view n, const std::string& s, const CallArgs& args, Budget&) {
      return StripMethod(n, s, args);
    };
  }
  if (name == "split" || name == "rsplit") {
    return [](absl::string_view n, const std::string& s, const CallArgs& args, Budget&) {
      return SplitMethod(n, s, args);
    };
  }
  if (name == "startswith" || name == "endswith") {
    return [](absl::string_view n, const std::string& s, const CallArgs& args, Budget&) {
      return Affix(n, s, args);
    };
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" ||
      name == "count") {
    return [](absl::string_view n, const std::string& s, const CallArgs& args, Budget&) {
      return Search(n, s, args);
    };
  }
  if (name == "replace") {
    return [](absl::string_view, const std::string& s, const CallArgs& args, Budget& budget) {
      return ReplaceMethod(s, args, budget);
    };
  }
  return nullptr;
}

std::optional<Value> BoundMethod(const Value& obj, absl::string_view name) {
  std::optional<Function> fn;
  switch (obj.kind()) {
    case Kind::kString:
      fn = StrMethod(obj, name);
      if (!fn.has_value()) fn = internal::MoreStrMethod(obj, name);
      break;
    case Kind::kInt:
    case Kind::kBool:
    case Kind::kFloat:
      return internal::NumberAttribute(obj, name);
    case Kind::kDict:
      fn = DictMethod(obj, name);
      break;
    case Kind::kList:
    case Kind::kTuple:
      fn = SequenceMethod(obj, name);
      break;
    default:
      break;
  }
  if (!fn.has_value()) return std::nullopt;
  return internal::MakeMethod(KindName(obj.kind()), name, *std::move(fn));
}

}  // namespace carpool::text::jinja
