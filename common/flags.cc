#include "common/flags.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace carpool {
namespace {

absl::Status BadValue(const std::string& name, const std::string& value, const char* kind) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, ": expected ", kind, ", got '", value, "'"));
}

absl::Status ParseBytes(const std::string& name, const std::string& text, int64_t* out) {
  static const std::pair<const char*, int64_t> kSuffixes[] = {
      {"KiB", 1LL << 10}, {"MiB", 1LL << 20}, {"GiB", 1LL << 30},
      {"K", 1LL << 10},   {"M", 1LL << 20},   {"G", 1LL << 30}, {"B", 1}};
  std::string number = text;
  int64_t unit = 1;
  for (const auto& [suffix, scale] : kSuffixes) {
    if (absl::EndsWith(text, suffix)) {
      number = text.substr(0, text.size() - std::char_traits<char>::length(suffix));
      unit = scale;
      break;
    }
  }
  double value;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value) || value < 0 ||
      value * unit > 9e18) {
    return BadValue(name, text, "a byte count such as 512MiB");
  }
  *out = static_cast<int64_t>(value * unit);
  return absl::OkStatus();
}

}  // namespace

void FlagParser::AddCustom(const std::string& name,
                           std::function<absl::Status(const std::string&)> parse,
                           const std::string& help, const std::string& default_text, bool is_bool) {
  flags_.push_back(Flag{name, help, default_text, is_bool, std::move(parse), false});
}

void FlagParser::AddString(const std::string& name, std::string* dst, const std::string& help) {
  AddCustom(name, [dst](const std::string& v) { *dst = v; return absl::OkStatus(); }, help,
            dst->empty() ? "none" : absl::StrCat("\"", *dst, "\""));
}

void FlagParser::AddInt(const std::string& name, int* dst, const std::string& help) {
  AddCustom(name, [name, dst](const std::string& v) {
    return absl::SimpleAtoi(v, dst) ? absl::OkStatus() : BadValue(name, v, "an integer");
  }, help, absl::StrCat(*dst));
}

void FlagParser::AddInt64(const std::string& name, int64_t* dst, const std::string& help) {
  AddCustom(name, [name, dst](const std::string& v) {
    return absl::SimpleAtoi(v, dst) ? absl::OkStatus() : BadValue(name, v, "an integer");
  }, help, absl::StrCat(*dst));
}

void FlagParser::AddFloat(const std::string& name, float* dst, const std::string& help) {
  AddCustom(name, [name, dst](const std::string& v) {
    return absl::SimpleAtof(v, dst) ? absl::OkStatus() : BadValue(name, v, "a number");
  }, help, absl::StrCat(*dst));
}

void FlagParser::AddDouble(const std::string& name, double* dst, const std::string& help) {
  AddCustom(name, [name, dst](const std::string& v) {
    return absl::SimpleAtod(v, dst) ? absl::OkStatus() : BadValue(name, v, "a number");
  }, help, absl::StrCat(*dst));
}

void FlagParser::AddBool(const std::string& name, bool* dst, const std::string& help) {
  AddCustom(name, [name, dst](const std::string& v) {
    return absl::SimpleAtob(v, dst) ? absl::OkStatus() : BadValue(name, v, "true or false");
  }, help, *dst ? "true" : "false", /*is_bool=*/true);
}

void FlagParser::AddBytes(const std::string& name, int64_t* dst, const std::string& help) {
  AddCustom(name, [name, dst](const std::string& v) { return ParseBytes(name, v, dst); }, help,
            FormatBytes(*dst));
}

FlagParser::Flag* FlagParser::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagParser::WasSet(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

absl::Status FlagParser::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (!absl::StartsWith(arg, "--") || arg == "--") {
      positionals_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = Find(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no-")) {
      flag = Find(name.substr(3));
      if (flag != nullptr && flag->is_bool) {
        value = "false";
        has_value = true;
      } else {
        flag = nullptr;
      }
    }
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    if (absl::Status s = flag->parse(value); !s.ok()) return s;
    flag->set = true;
  }
  return absl::OkStatus();
}

std::string FlagParser::Help() const {
  std::string out;
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, "  ", f.help);
    if (!f.default_text.empty()) {
      absl::StrAppend(&out, f.help.empty() ? "" : " ", "(default: ", f.default_text, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string FormatBytes(int64_t bytes) {
  static const std::pair<const char*, int64_t> kUnits[] = {
      {"GiB", 1LL << 30}, {"MiB", 1LL << 20}, {"KiB", 1LL << 10}};
  for (const auto& [suffix, scale] : kUnits) {
    if (bytes != 0 && bytes % scale == 0) return absl::StrCat(bytes / scale, suffix);
  }
  return absl::StrCat(bytes);
}

absl::Status ParseIntList(const std::string& text, const std::string& what,
                          std::vector<int32_t>* out) {
  out->clear();
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(piece), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", piece, "' is not an integer"));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
}

}  // namespace carpool
