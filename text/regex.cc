#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

#include <cctype>
#include <optional>

#include "absl/strings/str_cat.h"
#include "text/unicode.h"

namespace carpool::text {
namespace {

// One JIT stack and one match block per thread, shared by every Regex.
struct ThreadMatchState {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_data* data = nullptr;
  ThreadMatchState() {
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    data = pcre2_match_data_create(1, nullptr);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_jit_stack_free(stack);
  }
};

ThreadMatchState& State() {
  thread_local ThreadMatchState state;
  return state;
}

pcre2_jit_stack* JitStack(void*) { return State().stack; }

// Oniguruma's (the library's engine, Ruby syntax) \w and \s in Unicode mode, which PCRE2's UCP
// classes do not quite equal: \w also takes marks and the join controls, \s is exactly
// White_Space. Ruby syntax also has \h (a hex digit) and \uHHHH, which PCRE2 spells otherwise.
constexpr char kWordClass[] = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}";
constexpr char kSpaceClass[] = "\\p{White_Space}";
constexpr char kHexClass[] = "0-9a-fA-F";  // Ruby syntax: \h is a hex digit, not a blank

bool IsHex4(std::string_view s) {
  if (s.size() != 4) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// `pattern` with \w \W \s \S \h \H spelled as Oniguruma means them (the negated ones inside a
// character class stay as they are) and \uHHHH as \x{HHHH}. \Q...\E stays literal.
std::string OnigurumaClasses(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size());
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 'Q') {
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop - 1;
        continue;
      }
      if (e == 'u' && IsHex4(pattern.substr(i + 2, 4))) {
        out.append("\\x{").append(pattern.substr(i + 2, 4)).append("}");  // \uHHHH
        i += 5;
        continue;
      }
      const char* cls = e == 'w' || e == 'W'   ? kWordClass
                        : e == 's' || e == 'S' ? kSpaceClass
                        : e == 'h' || e == 'H' ? kHexClass
                                               : nullptr;
      const bool negated = e == 'W' || e == 'S' || e == 'H';
      if (cls != nullptr && !(in_class && negated)) {
        if (in_class) {
          out.append(cls);
        } else {
          out.append(negated ? "[^" : "[").append(cls).append("]");
        }
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class inside a class
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_context* context = nullptr;
  bool jit = false;
  ~Impl() {
    pcre2_match_context_free(context);
    pcre2_code_free(code);
  }
};

Regex::Regex(std::unique_ptr<Impl> impl, std::string pattern)
    : impl_(std::move(impl)), pattern_(std::move(pattern)) {}
Regex::~Regex() = default;

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern,
                                                      const RegexOptions& options) {
  auto impl = std::make_unique<Impl>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::string translated = OnigurumaClasses(pattern);
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (impl->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex \"", std::string(pattern),
                                                   "\" does not compile at ", offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  impl->jit = pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  impl->context = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(impl->context, options.match_limit);
  pcre2_set_depth_limit(impl->context, 100'000);
  pcre2_set_heap_limit(impl->context, 64 * 1024);  // KiB
  if (impl->jit) pcre2_jit_stack_assign(impl->context, JitStack, nullptr);
  return std::unique_ptr<Regex>(new Regex(std::move(impl), std::string(pattern)));
}

std::string Regex::Escape(std::string_view literal) {
  std::string out = "\\Q";
  size_t start = 0;
  // \Q...\E quotes everything but "\E" itself.
  for (size_t pos; (pos = literal.find("\\E", start)) != std::string_view::npos; start = pos + 2) {
    out.append(literal.substr(start, pos - start)).append("\\E\\\\E\\Q");
  }
  out.append(literal.substr(start)).append("\\E");
  return out;
}

absl::Status Regex::ForEachMatch(std::string_view text,
                                 absl::FunctionRef<void(size_t, size_t)> on_match) const {
  ThreadMatchState& state = State();
  const PCRE2_SPTR subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // As the library's (Oniguruma) iterator: an empty match right where the previous match ended
  // is not reported; the search moves on one character instead.
  size_t pos = 0;
  std::optional<size_t> last_match_end;
  while (pos <= text.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), pos, 0,
                                                state.data, impl_->context)
                              : pcre2_match(impl_->code, subject, text.size(), pos,
                                            PCRE2_NO_UTF_CHECK, state.data, impl_->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return absl::ResourceExhaustedError(absl::StrCat("tokenizer regex \"", pattern_,
                                                       "\" failed at byte ", pos, ": ",
                                                       reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0], end = ovector[1];
    if (begin == end && last_match_end == end) {
      if (pos >= text.size()) break;
      pos += Utf8Length(static_cast<unsigned char>(text[pos]));
      continue;
    }
    on_match(begin, end);
    last_match_end = end;
    pos = end;
  }
  return absl::OkStatus();
}

}  // namespace carpool::text
