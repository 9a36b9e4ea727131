// A small command-line parser for carpool's binaries: `--name value` or `--name=value`,
// booleans as `--name`, `--name=true|false` or `--no-name`. Unknown flags and malformed values
// are errors that name the flag. Parsed only in main.cc files; libraries take Options structs.
// Help() prints each flag's default, so help strings never state it themselves.
#ifndef CARPOOL_COMMON_FLAGS_H_
#define CARPOOL_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace carpool {

class FlagParser {
 public:
  // Each Add* binds a flag (name without dashes) to a destination that keeps its default. The
  // default Help() shows is the destination's value when the flag is added: strings quoted ("none"
  // when empty), bools true/false, byte counts in their largest exact unit (512MiB).
  void AddString(const std::string& name, std::string* dst, const std::string& help);
  void AddInt(const std::string& name, int* dst, const std::string& help);
  void AddInt64(const std::string& name, int64_t* dst, const std::string& help);
  void AddFloat(const std::string& name, float* dst, const std::string& help);
  void AddDouble(const std::string& name, double* dst, const std::string& help);
  void AddBool(const std::string& name, bool* dst, const std::string& help);
  // A byte count: plain integer or with a K/M/G/KiB/MiB/GiB suffix.
  void AddBytes(const std::string& name, int64_t* dst, const std::string& help);
  // Any other type: `parse` turns the text into the destination or returns an error.
  // `default_text` is what Help() shows as the default; empty shows none. An `is_bool` flag takes
  // no value (`--name` passes "true", `--no-name` "false").
  void AddCustom(const std::string& name, std::function<absl::Status(const std::string&)> parse,
                 const std::string& help, const std::string& default_text = "",
                 bool is_bool = false);

  // Parses argv[first..argc). Arguments not starting with "--" are collected as positionals.
  absl::Status Parse(int argc, char** argv, int first);
  // True when the flag appeared on the command line.
  bool WasSet(const std::string& name) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  // One line per flag: "  --name  help (default: value)", or "  --name  help" for a custom
  // flag added without a default text.
  std::string Help() const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<absl::Status(const std::string&)> parse;
    bool set = false;
  };
  Flag* Find(const std::string& name);

  std::vector<Flag> flags_;
  std::vector<std::string> positionals_;
};

// A byte count as Help() shows it: the largest of GiB, MiB, KiB that divides it exactly, else
// plain bytes ("512MiB", "1536KiB", "1000"). An AddBytes flag parses it back to `bytes`.
std::string FormatBytes(int64_t bytes);

// Parses "1,2,3" into ints. Errors name `what`.
absl::Status ParseIntList(const std::string& text, const std::string& what,
                          std::vector<int32_t>* out);

}  // namespace carpool

#endif  // CARPOOL_COMMON_FLAGS_H_
