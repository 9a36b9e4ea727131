// A sandboxed Jinja2 interpreter for chat templates: a template is parsed once (Parse, which
// refuses what carpool does not support, naming the construct and its line) and rendered many
// times, from several threads at once, over a context of plain values (Render).
//
// It renders as Jinja2 3.1 does when configured as Hugging Face transformers configures it for
// chat templates: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
// loopcontrols extension, the globals raise_exception and strftime_now, and a tojson filter that
// is json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=False).
// Undefined values behave as Jinja2's default Undefined. docs/chat_templates.md lists what is
// supported.
//
// The sandbox: a template sees only the values of its context and the globals above. There is no
// file, environment, network or attribute access beyond those values (no Python internals exist
// to reach), no method that mutates a list or dict, and every render is bounded by Limits: each
// limit exceeded is an INVALID_ARGUMENT naming it, never a crash or a hang.
//
// Thread safety: a Template is immutable after Parse; Render is const and thread-safe.
#ifndef CARPOOL_TEXT_JINJA_TEMPLATE_H_
#define CARPOOL_TEXT_JINJA_TEMPLATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace carpool::text::jinja {

struct Limits {
  // Bytes the render may write (its output, and any one string it builds).
  // Default: 8 MiB.
  int64_t max_output_bytes = int64_t{8} << 20;
  // Loop iterations of one render, all loops together (for bodies, range(), filters over lists).
  // Default: 1,000,000.
  int64_t max_loop_iterations = 1'000'000;
  // Nested macro calls (and recursive loop(items) calls). Nesting of the source is bounded when
  // parsing (256 levels) and of the evaluation as a whole (1000 levels, a call counting 8).
  // Default: 64.
  int max_recursion_depth = 64;
  // Wall-clock time of one render, in microseconds (checked as it runs).
  // Default: 2 s.
  int64_t max_run_time_us = 2'000'000;
};

struct RenderOptions {
  Limits limits;
  // What strftime_now formats: the current time in microseconds since the Unix epoch, formatted
  // in the local time zone as Python's datetime.now().strftime does. Default: the system clock.
  std::function<int64_t()> now_unix_micros;
};

class Template {
 public:
  // Parses `source`. INVALID_ARGUMENT for a syntax error or a construct carpool does not
  // support (a tag, filter or test it lacks), with the construct and its 1-based line:
  //   "line 3: unsupported tag 'include'".
  static absl::StatusOr<std::unique_ptr<Template>> Parse(absl::string_view source);

  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // Renders over `context` (a dict: its keys are the template's variables). INVALID_ARGUMENT
  // with the template's own message for raise_exception("..."), with the line and the error for a
  // failed evaluation (an undefined value used as one, a type error, an unsafe attribute), and
  // naming the limit for one exceeded: "the template ran more than 1000000 loop iterations".
  absl::StatusOr<std::string> Render(const Value& context,
                                     const RenderOptions& options = {}) const;

 private:
  struct Impl;
  explicit Template(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace carpool::text::jinja

#endif  // CARPOOL_TEXT_JINJA_TEMPLATE_H_
