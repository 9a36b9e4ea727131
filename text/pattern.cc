#include "text/pattern.h"

namespace carpool::text {

absl::StatusOr<Pattern> Pattern::FromJson(const Json& j, const std::string& where) {
  if (j.is_object() && j.size() == 1) {
    if (auto it = j.find("String"); it != j.end() && it->is_string()) {
      return FromLiteral(it->get<std::string>());
    }
    if (auto it = j.find("Regex"); it != j.end() && it->is_string()) {
      absl::StatusOr<Pattern> p = FromRegex(it->get<std::string>());
      if (!p.ok()) return JsonError(where, std::string(p.status().message()));
      return p;
    }
  }
  return JsonError(where, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

absl::StatusOr<Pattern> Pattern::FromRegex(std::string_view regex) {
  absl::StatusOr<std::unique_ptr<Regex>> compiled = Regex::Compile(regex);
  if (!compiled.ok()) return compiled.status();
  Pattern p;
  p.regex_ = std::move(*compiled);
  return p;
}

Pattern Pattern::FromLiteral(std::string literal) {
  Pattern p;
  p.literal_ = std::move(literal);
  return p;
}

absl::Status Pattern::Spans(std::string_view text, std::vector<PatternSpan>* out) const {
  out->clear();
  if (text.empty()) {
    out->push_back({0, 0, false});
    return absl::OkStatus();
  }
  size_t prev = 0;
  auto add = [&](size_t begin, size_t end) {
    if (prev != begin) out->push_back({prev, begin, false});
    out->push_back({begin, end, true});
    prev = end;
  };
  if (regex_ != nullptr) {
    if (absl::Status s = regex_->ForEachMatch(text, add); !s.ok()) return s;
  } else if (!literal_.empty()) {
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size())) {
      add(pos, pos + literal_.size());
    }
  }
  if (prev != text.size()) out->push_back({prev, text.size(), false});
  return absl::OkStatus();
}

absl::StatusOr<std::string> Pattern::ReplaceAll(std::string_view text,
                                                std::string_view content) const {
  std::vector<PatternSpan> spans;
  if (absl::Status s = Spans(text, &spans); !s.ok()) return s;
  std::string out;
  out.reserve(text.size());
  for (const PatternSpan& span : spans) {
    if (span.is_match) {
      out.append(content);
    } else {
      out.append(text.substr(span.begin, span.end - span.begin));
    }
  }
  return out;
}

}  // namespace carpool::text
