#include "text/jinja/format.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "text/jinja/builtins_internal.h"
#include "text/jinja/pystr.h"

namespace carpool::text::jinja {
namespace {

absl::Status ValueError(absl::string_view m) { return absl::InvalidArgumentError(m); }

struct Spec {
  std::string fill = " ";
  bool fill_given = false;
  char align = 0;  // '<' '>' '=' '^', or 0: the type's default
  char sign = 0;   // '+' '-' ' '
  bool alternate = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;  // ',' '_'
  int64_t precision = -1;
  char type = 0;
};

bool IsAlign(char32_t c) { return c == '<' || c == '>' || c == '=' || c == '^'; }

absl::StatusOr<Spec> ParseSpec(absl::string_view text) {
  const std::u32string s = py::Decode(text);
  Spec spec;
  size_t i = 0;
  if (s.size() >= 2 && IsAlign(s[1])) {
    spec.fill.clear();
    py::AppendCodePoint(s[0], &spec.fill);
    spec.fill_given = true;
    spec.align = static_cast<char>(s[1]);
    i = 2;
  } else if (!s.empty() && IsAlign(s[0])) {
    spec.align = static_cast<char>(s[0]);
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '#') spec.alternate = true, ++i;
  if (i < s.size() && s[i] == '0') spec.zero = true, ++i;
  auto digits = [&](int64_t* out) {
    bool any = false;
    int64_t v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (v < (int64_t{1} << 40)) v = v * 10 + (s[i] - '0');
      ++i;
      any = true;
    }
    if (any) *out = v;
    return any;
  };
  digits(&spec.width);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits(&spec.precision)) return ValueError("Format specifier missing precision");
  }
  if (i < s.size()) spec.type = static_cast<char>(s[i++]);
  if (i < s.size() || spec.type < 0) return ValueError("Invalid format specifier");
  if (spec.zero && !spec.fill_given) spec.fill.assign(1, '0');
  return spec;
}

std::string Group(const std::string& digits, char sep, size_t every) {
  if (sep == 0) return digits;
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % every == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

// Pads `sign_prefix + body` to the spec's width with its fill and alignment.
std::string Pad(const Spec& spec, const std::string& sign_prefix, const std::string& body,
                char default_align) {
  const int64_t length = py::CodePointCount(sign_prefix) + py::CodePointCount(body);
  char align = spec.align != 0 ? spec.align : (spec.zero && default_align == '>' ? '=' : default_align);
  if (spec.width <= length) return sign_prefix + body;
  const int64_t pad = spec.width - length;
  std::string fill;
  auto repeat = [&](int64_t n) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += spec.fill;
    return out;
  };
  switch (align) {
    case '<':
      return sign_prefix + body + repeat(pad);
    case '^':
      return repeat(pad / 2) + sign_prefix + body + repeat(pad - pad / 2);
    case '=':
      return sign_prefix + repeat(pad) + body;
    default:
      return repeat(pad) + sign_prefix + body;
  }
}

std::string SignPrefix(bool negative, char sign) {
  if (negative) return "-";
  if (sign == '+') return "+";
  if (sign == ' ') return " ";
  return "";
}

absl::StatusOr<std::string> FormatFloat(double x, const Spec& spec, absl::string_view type_name) {
  const char type = spec.type;
  if (type != 0 && std::string("eEfFgG%").find(type) == std::string::npos) {
    return ValueError(absl::StrCat("Unknown format code '", std::string(1, type),
                                   "' for object of type '", type_name, "'"));
  }
  const bool negative = std::signbit(x) && !std::isnan(x);
  const double a = std::fabs(x);
  std::string body;
  const bool upper = type == 'E' || type == 'F' || type == 'G';
  if (!std::isfinite(a)) {
    body = std::isnan(a) ? "nan" : "inf";
    if (upper) body = absl::AsciiStrToUpper(body);
    if (type == '%') body += "%";
  } else if (type == 0 && spec.precision < 0) {
    body = py::FloatRepr(a);
  } else {
    const int p = static_cast<int>(spec.precision < 0 ? 6 : spec.precision);
    char conv = type == 0 ? 'g' : type == '%' ? 'f' : type;
    const double v = type == '%' ? a * 100 : a;
    std::string fmt = "%";
    if (spec.alternate) fmt += "#";
    fmt += ".*";
    fmt.push_back(conv);
    char buf[512];
    const int n = std::snprintf(buf, sizeof(buf), fmt.c_str(), p, v);
    if (n < 0 || n >= static_cast<int>(sizeof(buf))) {
      return ValueError("the formatted number is too long");
    }
    body.assign(buf, static_cast<size_t>(n));
    if (type == 0 && body.find_first_of(".e") == std::string::npos) body += ".0";
    if (type == '%') body += "%";
  }
  if (spec.grouping != 0 && std::isfinite(a)) {
    const size_t end = body.find_first_of(".e%");
    const std::string int_part = body.substr(0, end);
    body = Group(int_part, spec.grouping, 3) + (end == std::string::npos ? "" : body.substr(end));
  }
  return Pad(spec, SignPrefix(negative, spec.sign), body, '>');
}

absl::StatusOr<std::string> FormatInt(int64_t x, const Spec& spec, absl::string_view type_name) {
  const char type = spec.type;
  if (type != 0 && std::string("eEfFgG%").find(type) != std::string::npos) {
    return FormatFloat(static_cast<double>(x), spec, type_name);
  }
  if (type != 0 && std::string("dnbBoxXc").find(type) == std::string::npos) {
    return ValueError(absl::StrCat("Unknown format code '", std::string(1, type),
                                   "' for object of type '", type_name, "'"));
  }
  if (spec.precision >= 0) return ValueError("Precision not allowed in integer format specifier");
  if (type == 'c') {
    if (x < 0 || x > 0x10FFFF) return absl::InvalidArgumentError("%c arg not in range(0x110000)");
    std::string body;
    py::AppendCodePoint(static_cast<char32_t>(x), &body);
    return Pad(spec, "", body, '>');
  }
  const bool negative = x < 0;
  const uint64_t a = negative ? static_cast<uint64_t>(0) - static_cast<uint64_t>(x)
                              : static_cast<uint64_t>(x);
  std::string digits;
  std::string prefix;
  size_t every = 3;
  if (type == 'x' || type == 'X') {
    digits = absl::StrFormat(type == 'x' ? "%x" : "%X", a);
    if (spec.alternate) prefix = type == 'x' ? "0x" : "0X";
    every = 4;
  } else if (type == 'o') {
    digits = absl::StrFormat("%o", a);
    if (spec.alternate) prefix = "0o";
    every = 4;
  } else if (type == 'b') {
    do {
      digits.insert(digits.begin(), static_cast<char>('0' + ((a >> digits.size()) & 1)));
    } while (digits.size() < 64 && (a >> digits.size()) != 0);
    if (spec.alternate) prefix = "0b";
    every = 4;
  } else {
    digits = absl::StrCat(a);
  }
  return Pad(spec, SignPrefix(negative, spec.sign) + prefix, Group(digits, spec.grouping, every),
             '>');
}

std::string AsciiRepr(const Value& v) {
  const std::string r = v.Repr();
  std::string out;
  for (char32_t c : py::Decode(r)) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c <= 0xFF) {
      out += absl::StrFormat("\\x%02x", static_cast<uint32_t>(c));
    } else if (c <= 0xFFFF) {
      out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
    } else {
      out += absl::StrFormat("\\U%08x", static_cast<uint32_t>(c));
    }
  }
  return out;
}

struct FieldState {
  int64_t next_auto = 0;
  bool automatic = false;
  bool manual = false;
};

absl::StatusOr<std::string> FormatImpl(absl::string_view fmt, const CallArgs& args,
                                       Budget& budget, FieldState& state, int depth);

absl::StatusOr<Value> LookupField(absl::string_view name, const CallArgs& args,
                                  FieldState& state) {
  size_t i = 0;
  while (i < name.size() && name[i] != '.' && name[i] != '[') ++i;
  const absl::string_view first = name.substr(0, i);
  Value obj;
  const bool numeric =
      !first.empty() && std::all_of(first.begin(), first.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (first.empty() || numeric) {
    int64_t index;
    if (first.empty()) {
      if (state.manual) {
        return ValueError("cannot switch from manual field specification to automatic field numbering");
      }
      state.automatic = true;
      index = state.next_auto++;
    } else {
      if (state.automatic) {
        return ValueError("cannot switch from automatic field numbering to manual field specification");
      }
      state.manual = true;
      if (first.size() > 9) return ValueError("Too many decimal digits in format string");
      index = std::stoll(std::string(first));
    }
    if (index >= static_cast<int64_t>(args.positional.size())) {
      // Jinja2's sandboxed formatter looks the index up itself: IndexError's message.
      return absl::InvalidArgumentError("tuple index out of range");
    }
    obj = args.positional[static_cast<size_t>(index)];
  } else {
    bool found = false;
    for (const auto& [k, v] : args.keyword) {
      if (k == first) {
        obj = v;
        found = true;
      }
    }
    if (!found) return absl::InvalidArgumentError(py::StrRepr(first));
  }
  while (i < name.size()) {
    // Looking into an Undefined (an unsafe attribute's included) raises its error, as Jinja2's
    // sandboxed formatter does.
    RETURN_IF_ERROR(CheckDefined(obj));
    if (name[i] == '.') {
      size_t j = i + 1;
      while (j < name.size() && name[j] != '.' && name[j] != '[') ++j;
      if (j == i + 1) return ValueError("Empty attribute in format string");
      obj = GetAttr(obj, name.substr(i + 1, j - i - 1));
      i = j;
    } else if (name[i] == '[') {
      const size_t close = name.find(']', i);
      if (close == absl::string_view::npos) return ValueError("Missing ']' in format string");
      const absl::string_view key = name.substr(i + 1, close - i - 1);
      if (key.empty()) return ValueError("Empty attribute in format string");
      const bool digits = std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      obj = GetItem(obj, digits && key.size() < 18 ? Value::Int(std::stoll(std::string(key)))
                                                  : Value::String(std::string(key)));
      i = close + 1;
      if (i < name.size() && name[i] != '.' && name[i] != '[') {
        return ValueError("Only '.' or '[' may follow ']' in format field specifier");
      }
    } else {
      return ValueError("Only '.' or '[' may follow ']' in format field specifier");
    }
  }
  return obj;
}

absl::StatusOr<std::string> FormatField(absl::string_view field, const CallArgs& args,
                                        Budget& budget, FieldState& state, int depth) {
  size_t i = 0;
  while (i < field.size() && field[i] != '!' && field[i] != ':') {
    if (field[i] == '[') {
      while (i < field.size() && field[i] != ']') ++i;
      if (i == field.size()) break;
    }
    ++i;
  }
  const absl::string_view name = field.substr(0, i);
  char conversion = 0;
  if (i < field.size() && field[i] == '!') {
    if (i + 1 >= field.size()) return ValueError("end of string while looking for conversion specifier");
    conversion = field[i + 1];
    i += 2;
    if (i < field.size() && field[i] != ':') return ValueError("expected ':' after conversion specifier");
  }
  std::string spec_text;
  if (i < field.size() && field[i] == ':') {
    if (depth >= 2) return ValueError("Max string recursion exceeded");
    ASSIGN_OR_RETURN(spec_text, FormatImpl(field.substr(i + 1), args, budget, state, depth + 1));
  }
  ASSIGN_OR_RETURN(Value value, LookupField(name, args, state));
  if (conversion == 'r') {
    value = Value::String(value.Repr());
  } else if (conversion == 's') {
    value = Value::String(value.Str());
  } else if (conversion == 'a') {
    value = Value::String(AsciiRepr(value));
  } else if (conversion != 0) {
    return ValueError(absl::StrCat("Unknown conversion specifier ", std::string(1, conversion)));
  }
  return FormatValue(value, spec_text, budget);
}

absl::StatusOr<std::string> FormatImpl(absl::string_view fmt, const CallArgs& args,
                                       Budget& budget, FieldState& state, int depth) {
  std::string out;
  size_t i = 0;
  while (i < fmt.size()) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      return ValueError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    if (i + 1 == fmt.size()) return ValueError("Single '{' encountered in format string");
    size_t j = i + 1;
    int open = 1;
    while (j < fmt.size()) {
      if (fmt[j] == '[') {
        // An index may hold braces; Python reads to the ']'.
        while (j < fmt.size() && fmt[j] != ']') ++j;
        if (j == fmt.size()) break;
      } else if (fmt[j] == '{') {
        ++open;
      } else if (fmt[j] == '}' && --open == 0) {
        break;
      }
      ++j;
    }
    if (j >= fmt.size()) {
      return ValueError(depth == 0 ? "expected '}' before end of string"
                                   : "unmatched '{' in format spec");
    }
    ASSIGN_OR_RETURN(std::string field, FormatField(fmt.substr(i + 1, j - i - 1), args, budget, state, depth));
    out += field;
    RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(out.size())));
    i = j + 1;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> FormatValue(const Value& value, absl::string_view spec_text,
                                        Budget& budget) {
  if (!spec_text.empty()) {
    ASSIGN_OR_RETURN(Spec spec, ParseSpec(spec_text));
    RETURN_IF_ERROR(budget.CheckSize(spec.width * static_cast<int64_t>(spec.fill.size())));
  }
  switch (value.kind()) {
    case Kind::kString: {
      ASSIGN_OR_RETURN(Spec spec, ParseSpec(spec_text));
      if (spec.type != 0 && spec.type != 's') {
        return ValueError(absl::StrCat("Unknown format code '", std::string(1, spec.type),
                                       "' for object of type 'str'"));
      }
      if (spec.sign != 0) return ValueError("Sign not allowed in string format specifier");
      if (spec.alternate) return ValueError("Alternate form (#) not allowed in string format specifier");
      if (spec.align == '=') return ValueError("'=' alignment not allowed in string format specifier");
      std::string body = value.string_value();
      if (spec.precision >= 0 && py::CodePointCount(body) > spec.precision) {
        body = py::Encode(py::Decode(body).substr(0, static_cast<size_t>(spec.precision)));
      }
      return Pad(spec, "", body, '<');
    }
    case Kind::kBool:
      if (spec_text.empty()) return value.Str();
      [[fallthrough]];
    case Kind::kInt: {
      ASSIGN_OR_RETURN(Spec spec, ParseSpec(spec_text));
      return FormatInt(value.int_value(), spec, KindName(value.kind()));
    }
    case Kind::kFloat: {
      ASSIGN_OR_RETURN(Spec spec, ParseSpec(spec_text));
      if (spec.type == 'n') spec.type = 'g';
      return FormatFloat(value.float_value(), spec, "float");
    }
    default:
      if (spec_text.empty()) return value.Str();
      return absl::InvalidArgumentError(absl::StrCat("unsupported format string passed to ",
                                                     KindName(value.kind()), ".__format__"));
  }
}

absl::StatusOr<std::string> StrFormat(absl::string_view fmt, const CallArgs& args,
                                      Budget& budget) {
  FieldState state;
  return FormatImpl(fmt, args, budget, state, 0);
}

namespace internal {
namespace {

absl::Status Error(absl::string_view m) { return absl::InvalidArgumentError(m); }
bool IntLike(const Value& v) { return v.kind() == Kind::kInt || v.kind() == Kind::kBool; }

}  // namespace

absl::StatusOr<std::string> PercentFormat(const std::string& fmt, const CallArgs& args,
                                          Budget& budget) {
  std::string out;
  size_t next = 0;
  bool used_mapping = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    ++i;
    if (i >= fmt.size()) return Error("incomplete format");
    Value arg;
    bool have_arg = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) return Error("incomplete format key");
      const std::string key = fmt.substr(i + 1, close - i - 1);
      if (args.keyword.empty()) return Error("format requires a mapping");
      bool found = false;
      for (const auto& [k, val] : args.keyword) {
        if (k == key) arg = val, found = true;
      }
      if (!found) return Error(py::StrRepr(key));
      have_arg = used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) flags.push_back(fmt[i++]);
    std::string width, precision;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) width.push_back(fmt[i++]);
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision.clear();
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) precision.push_back(fmt[i++]);
      if (precision.empty()) precision.assign(1, '0');
    }
    if (i >= fmt.size()) return Error("incomplete format");
    char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) {
      if (next >= args.positional.size()) return Error("not enough arguments for format string");
      arg = args.positional[next++];
    }
    const bool left = flags.find('-') != std::string::npos;
    std::string spec;
    spec.push_back(left ? '<' : '>');
    if (flags.find('+') != std::string::npos) spec.push_back('+');
    else if (flags.find(' ') != std::string::npos) spec.push_back(' ');
    if (flags.find('#') != std::string::npos) spec.push_back('#');
    const bool zero = !left && flags.find('0') != std::string::npos;
    Value value;
    switch (conv) {
      case 's': case 'r': case 'a':
        value = Value::String(conv == 's' ? arg.Str() : arg.Repr());
        spec.assign(1, left ? '<' : '>');
        break;
      case 'd': case 'i': case 'u':
        if (arg.kind() == Kind::kFloat) {
          ASSIGN_OR_RETURN(value, FloatToInt(arg.float_value()));
        } else if (IntLike(arg)) {
          value = Value::Int(arg.int_value());
        } else {
          return Error(absl::StrCat("%", std::string(1, conv), " format: a real number is required, not ",
                                    KindName(arg.kind())));
        }
        precision.clear();
        break;
      case 'c':
        if (arg.is_string()) {
          if (py::CodePointCount(arg.string_value()) != 1) {
            return Error("%c requires int or char");
          }
          value = arg;
          spec.assign(1, left ? '<' : '>');
          conv = 's';
          break;
        }
        [[fallthrough]];
      case 'x': case 'X': case 'o':
        if (!IntLike(arg)) {
          return Error(absl::StrCat("%", std::string(1, conv), " format: an integer is required, not ",
                                    KindName(arg.kind())));
        }
        value = Value::Int(arg.int_value());
        precision.clear();
        break;
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
        if (!arg.is_number() && arg.kind() != Kind::kBool) {
          return Error(absl::StrCat("must be real number, not ", KindName(arg.kind())));
        }
        value = Value::Float(arg.float_value());
        if (precision.empty()) precision.assign(1, '6');
        break;
      default:
        return Error(absl::StrFormat("unsupported format character '%c' (0x%x) at index %d", conv,
                                     static_cast<unsigned char>(conv), i));
    }
    if (zero && conv != 's' && conv != 'r' && conv != 'a') spec += "0";
    spec += width;
    if (!precision.empty()) spec += "." + precision;
    if (conv != 's' && conv != 'r' && conv != 'a' && conv != 'i' && conv != 'u') spec.push_back(conv);
    if (conv == 'i' || conv == 'u') spec.push_back('d');
    ASSIGN_OR_RETURN(std::string piece, FormatValue(value, spec, budget));
    out += piece;
    RETURN_IF_ERROR(budget.CheckSize(static_cast<int64_t>(out.size())));
  }
  if (!used_mapping && args.keyword.empty() && next < args.positional.size()) {
    return Error("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace internal

}  // namespace carpool::text::jinja
