#include "text/pre_tokenizers.h"

#include <algorithm>

#include "absl/functional/function_ref.h"
#include "common/status.h"
#include "text/byte_level.h"
#include "text/pattern.h"
#include "text/unicode.h"

namespace carpool::text {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Cut {
  size_t begin;
  size_t end;
  bool remove;
};

// The library's NormalizedString::split: spans -> the pieces `behavior` keeps.
void ApplyBehavior(const std::vector<PatternSpan>& spans, Behavior behavior,
                   std::vector<Cut>* cuts) {
  cuts->clear();
  switch (behavior) {
    case Behavior::kIsolated:
      for (const PatternSpan& s : spans) cuts->push_back({s.begin, s.end, false});
      return;
    case Behavior::kRemoved:
      for (const PatternSpan& s : spans) cuts->push_back({s.begin, s.end, s.is_match});
      return;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const PatternSpan& s : spans) {
        if (s.is_match == previous && !cuts->empty()) {
          cuts->back().end = s.end;
        } else {
          cuts->push_back({s.begin, s.end, false});
        }
        previous = s.is_match;
      }
      return;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const PatternSpan& s : spans) {
        if (s.is_match && !previous && !cuts->empty()) {
          cuts->back().end = s.end;
        } else {
          cuts->push_back({s.begin, s.end, false});
        }
        previous = s.is_match;
      }
      return;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous && !cuts->empty()) {
          cuts->back().begin = it->begin;
        } else {
          cuts->push_back({it->begin, it->end, false});
        }
        previous = it->is_match;
      }
      std::reverse(cuts->begin(), cuts->end());
      return;
    }
  }
}

using SpanFinder = absl::FunctionRef<absl::Status(std::string_view, std::vector<PatternSpan>*)>;

// Splits every piece of *p in place (the text stays).
absl::Status SplitPieces(PreTokenized* p, SpanFinder find, Behavior behavior) {
  std::vector<Piece> out;
  out.reserve(p->pieces.size() * 2);
  std::vector<PatternSpan> spans;
  std::vector<Cut> cuts;
  for (const Piece& piece : p->pieces) {
    RETURN_IF_ERROR(find(p->view(piece), &spans));
    ApplyBehavior(spans, behavior, &cuts);
    for (const Cut& c : cuts) {
      if (c.remove || c.end == c.begin) continue;
      // A slice keeps the alignment of its bytes.
      const size_t origin =
          piece.origin > c.begin ? std::min(piece.origin - c.begin, c.end - c.begin) : 0;
      out.push_back({static_cast<uint32_t>(piece.begin + c.begin),
                     static_cast<uint32_t>(piece.begin + c.end), static_cast<uint32_t>(origin)});
    }
  }
  p->pieces = std::move(out);
  return absl::OkStatus();
}

// The library's find_matches for a character predicate: each matching character is one match,
// the runs between them one non-match each.
void CharSpans(std::string_view text, absl::FunctionRef<bool(char32_t)> pred,
               std::vector<PatternSpan>* out) {
  out->clear();
  if (text.empty()) {
    out->push_back({0, 0, false});
    return;
  }
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const char32_t c = NextCodePoint(text, &i);
    if (pred(c)) {
      if (last < start) out->push_back({last, start, false});
      out->push_back({start, i, true});
      last = i;
    }
  }
  if (last < text.size()) out->push_back({last, text.size(), false});
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  absl::Status PreTokenize(PreTokenized* p) const override {
    return SplitPieces(
        p,
        [this](std::string_view text, std::vector<PatternSpan>* spans) {
          RETURN_IF_ERROR(pattern_.Spans(text, spans));
          if (invert_) {
            for (PatternSpan& s : *spans) s.is_match = !s.is_match;
          }
          return absl::OkStatus();
        },
        behavior_);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  absl::Status PreTokenize(PreTokenized* p) const override {
    PreTokenized out;
    out.text.reserve(p->text.size() * 2);
    std::string prefixed;
    std::vector<PatternSpan> spans;
    for (const Piece& piece : p->pieces) {
      std::string_view s = p->view(piece);
      size_t origin = piece.origin;  // in s
      if (add_prefix_space_ && (s.empty() || s[0] != ' ')) {
        // The space takes the alignment of the first character.
        if (origin > 0) ++origin;
        // Inserted through iterators: assign + append trips GCC 12's -Wrestrict.
        prefixed.resize(1);
        prefixed[0] = ' ';
        prefixed.insert(prefixed.end(), s.begin(), s.end());
        s = prefixed;
      }
      if (regex_ != nullptr) {
        RETURN_IF_ERROR(regex_->Spans(s, &spans));
      } else {
        spans.assign(1, {0, s.size(), false});
      }
      for (const PatternSpan& span : spans) {
        if (span.end == span.begin) continue;
        const uint32_t begin = static_cast<uint32_t>(out.text.size());
        uint32_t piece_origin = 0;  // each byte's characters keep the byte's alignment
        for (size_t i = span.begin; i < span.end; ++i) {
          out.text.append(ByteToChars(static_cast<uint8_t>(s[i])));
          if (i < origin) piece_origin = static_cast<uint32_t>(out.text.size()) - begin;
        }
        out.pieces.push_back({begin, static_cast<uint32_t>(out.text.size()), piece_origin});
      }
    }
    *p = std::move(out);
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;  // null: use_regex false
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    AppendUtf8(replacement, &replacement_utf8_);
  }
  absl::Status PreTokenize(PreTokenized* p) const override {
    PreTokenized out;
    out.text.reserve(p->text.size() * 2);
    for (const Piece& piece : p->pieces) {
      std::string_view s = p->view(piece);
      const uint32_t begin = static_cast<uint32_t>(out.text.size());
      const bool starts_with_replacement =
          (!s.empty() && s[0] == ' ') ||
          (s.size() >= replacement_utf8_.size() &&
           s.substr(0, replacement_utf8_.size()) == replacement_utf8_);
      // The library's test is the piece's offset in the original input being 0 (its
      // NormalizedString's offsets_original), not its place in the normalized text.
      const bool prepend = scheme_ == PrependScheme::kAlways ||
                           (scheme_ == PrependScheme::kFirst && piece.at_origin());
      // The prepended replacement takes the first character's alignment, each space's
      // replacement the space's.
      uint32_t origin = 0;
      if (prepend && !starts_with_replacement) {
        out.text.append(replacement_utf8_);
        if (piece.at_origin()) origin = static_cast<uint32_t>(out.text.size()) - begin;
      }
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == ' ') {
          out.text.append(replacement_utf8_);
        } else {
          out.text.push_back(s[i]);
        }
        if (i < piece.origin) origin = static_cast<uint32_t>(out.text.size()) - begin;
      }
      out.pieces.push_back({begin, static_cast<uint32_t>(out.text.size()), origin});
    }
    if (split_) {
      const char32_t r = replacement_;
      RETURN_IF_ERROR(SplitPieces(
          &out,
          [r](std::string_view text, std::vector<PatternSpan>* spans) {
            CharSpans(
                text, [r](char32_t c) { return c == r; }, spans);
            return absl::OkStatus();
          },
          Behavior::kMergedWithNext));
    }
    *p = std::move(out);
    return absl::OkStatus();
  }
  bool NeedsOrigin() const override { return scheme_ == PrependScheme::kFirst; }

 private:
  char32_t replacement_;
  std::string replacement_utf8_;
  PrependScheme scheme_;
  bool split_;
};

// Splits on single characters matching a predicate (Digits, WhitespaceSplit).
class CharSplitPreTokenizer : public PreTokenizer {
 public:
  CharSplitPreTokenizer(bool (*pred)(char32_t), Behavior behavior)
      : pred_(pred), behavior_(behavior) {}
  absl::Status PreTokenize(PreTokenized* p) const override {
    return SplitPieces(
        p,
        [this](std::string_view text, std::vector<PatternSpan>* spans) {
          CharSpans(text, pred_, spans);
          return absl::OkStatus();
        },
        behavior_);
  }

 private:
  bool (*pred_)(char32_t);
  Behavior behavior_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status PreTokenize(PreTokenized* p) const override {
    for (const auto& part : parts_) RETURN_IF_ERROR(part->PreTokenize(p));
    return absl::OkStatus();
  }
  bool NeedsOrigin() const override {
    for (const auto& part : parts_) {
      if (part->NeedsOrigin()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

absl::StatusOr<Behavior> ParseBehavior(const Json& j, const std::string& where) {
  std::string name = "Isolated";
  RETURN_IF_ERROR(ReadString(j, "behavior", where, &name));
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return JsonError(where, absl::StrCat("behavior \"", name, "\" is not supported"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParseMetaspace(const Json& j,
                                                             const std::string& where) {
  std::string replacement = "\xE2\x96\x81";  // U+2581
  RETURN_IF_ERROR(ReadString(j, "replacement", where, &replacement));
  size_t i = 0;
  if (replacement.empty() || FindInvalidUtf8(replacement) != std::string::npos) {
    return JsonError(where, "\"replacement\" must be one character");
  }
  const char32_t r = NextCodePoint(replacement, &i);
  if (i != replacement.size()) return JsonError(where, "\"replacement\" must be one character");
  PrependScheme scheme = PrependScheme::kAlways;
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    std::string name;
    RETURN_IF_ERROR(ReadString(j, "prepend_scheme", where, &name));
    if (name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (name == "never") {
      scheme = PrependScheme::kNever;
    } else {
      return JsonError(where, absl::StrCat("prepend_scheme \"", name, "\" is not supported"));
    }
  } else {
    bool add_prefix_space = true;  // files from before prepend_scheme
    RETURN_IF_ERROR(ReadBool(j, "add_prefix_space", where, &add_prefix_space));
    scheme = add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  bool split = true;
  RETURN_IF_ERROR(ReadBool(j, "split", where, &split));
  return std::make_unique<MetaspacePreTokenizer>(r, scheme, split);
}

bool IsDigit(char32_t c) { return IsNumeric(c); }

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& j) {
  if (j.is_null()) return nullptr;
  std::string type;
  RETURN_IF_ERROR(ComponentType(j, "pre_tokenizer", &type));
  const std::string where = absl::StrCat("pre_tokenizer ", type);
  if (type == "Split") {
    if (!j.contains("pattern")) return JsonError(where, "has no \"pattern\"");
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(j["pattern"], where));
    ASSIGN_OR_RETURN(Behavior behavior, ParseBehavior(j, where));
    bool invert = false;
    RETURN_IF_ERROR(ReadBool(j, "invert", where, &invert));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior, invert);
  }
  if (type == "ByteLevel") {
    bool add_prefix_space = true, use_regex = true;
    RETURN_IF_ERROR(ReadBool(j, "add_prefix_space", where, &add_prefix_space));
    RETURN_IF_ERROR(ReadBool(j, "use_regex", where, &use_regex));
    std::unique_ptr<Pattern> regex;
    if (use_regex) {
      ASSIGN_OR_RETURN(Pattern p, Pattern::FromRegex(kGpt2Regex));
      regex = std::make_unique<Pattern>(std::move(p));
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
  }
  if (type == "Metaspace") return ParseMetaspace(j, where);
  if (type == "Digits") {
    bool individual = false;
    RETURN_IF_ERROR(ReadBool(j, "individual_digits", where, &individual));
    return std::make_unique<CharSplitPreTokenizer>(
        IsDigit, individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "Whitespace") {
    ASSIGN_OR_RETURN(Pattern p, Pattern::FromRegex(R"(\w+|[^\w\s]+)"));
    return std::make_unique<SplitPreTokenizer>(std::move(p), Behavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharSplitPreTokenizer>(IsWhitespace, Behavior::kRemoved);
  }
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) return JsonError(where, "has no \"pretokenizers\" list");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const Json& part : *it) {
      ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> p, ParsePreTokenizer(part));
      if (p != nullptr) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  return Unsupported("pre_tokenizer", type);
}

}  // namespace carpool::text
