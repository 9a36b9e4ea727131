#include "text/normalizers.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <vector>

#include "common/status.h"
#include "text/pattern.h"
#include "text/unicode.h"

namespace carpool::text {
namespace {

bool IsAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

// The library normalizes with Unicode 9.0 data: a character assigned later has no decomposition
// and combining class 0 there, so it stays as it is and nothing reorders or composes across it.
// Normalizing the runs between such characters apart gives that result exactly (normalization
// data of assigned characters never changes).
constexpr uint8_t kLibraryNormalizationUnicodeMajor = 9;

bool NewerThanLibraryData(char32_t c) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  return age[0] > kLibraryNormalizationUnicodeMajor;
}

// text[0, n) extended to the end of the character byte n - 1 belongs to.
std::string_view WholeCharacters(std::string_view text, size_t n) {
  n = std::min(n, text.size());
  while (n < text.size() && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) ++n;
  return text.substr(0, n);
}

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* n) : n_(n) {}
  absl::Status Normalize(std::string* text, OriginPrefix* origin) const override {
    if (IsAscii(*text)) return absl::OkStatus();
    if (origin != nullptr && origin->bytes > 0) {
      // The library aligns the i-th character its normalizer yields with the input position the
      // changes so far reach, which for a prefix that normalizes on its own is the prefix's
      // normalized length; where the prefix's last character composes with the next one, the
      // composed character starts inside that length and so counts as aligned, as there.
      std::string prefix;
      RETURN_IF_ERROR(NormalizeTo(WholeCharacters(*text, origin->bytes), &prefix));
      origin->bytes = prefix.size();
    }
    std::string out;
    bool changed = false;
    RETURN_IF_ERROR(NormalizeTo(*text, &out, &changed));
    if (changed) *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  // out = normalized `text`; *changed (when given) false means out was left empty because
  // `text` is already normalized.
  absl::Status NormalizeTo(std::string_view text, std::string* out,
                           bool* changed = nullptr) const {
    out->clear();
    out->reserve(text.size());
    size_t run = 0;
    for (size_t i = 0; i < text.size();) {
      const size_t start = i;
      const char32_t c = NextCodePoint(text, &i);
      if (c < 0x300 || !NewerThanLibraryData(c)) continue;
      RETURN_IF_ERROR(Append(text.substr(run, start - run), out));
      out->append(text.substr(start, i - start));
      run = i;
    }
    if (run == 0 && changed != nullptr) {
      UErrorCode err = U_ZERO_ERROR;
      if (n_->isNormalizedUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())),
                               err) &&
          U_SUCCESS(err)) {
        *changed = false;
        return absl::OkStatus();
      }
    }
    RETURN_IF_ERROR(Append(text.substr(run), out));
    if (changed != nullptr) *changed = true;
    return absl::OkStatus();
  }

  absl::Status Append(std::string_view run, std::string* out) const {
    if (run.empty()) return absl::OkStatus();
    UErrorCode err = U_ZERO_ERROR;
    icu::StringByteSink<std::string> sink(out, static_cast<int32_t>(run.size()));
    n_->normalizeUTF8(0, icu::StringPiece(run.data(), static_cast<int32_t>(run.size())), sink,
                      nullptr, err);
    if (U_FAILURE(err)) {
      return absl::InternalError(absl::StrCat("unicode normalization failed: ", u_errorName(err)));
    }
    return absl::OkStatus();
  }

  const icu::Normalizer2* n_;  // owned by ICU
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  absl::Status Normalize(std::string* text, OriginPrefix* origin) const override {
    if (text->empty()) return absl::OkStatus();
    text->insert(0, prepend_);
    // The prepended characters take the alignment of the first character.
    if (origin != nullptr && origin->bytes > 0) origin->bytes += prepend_.size();
    return absl::OkStatus();
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text, OriginPrefix* origin) const override {
    if (origin == nullptr) {
      ASSIGN_OR_RETURN(*text, pattern_.ReplaceAll(*text, content_));
      return absl::OkStatus();
    }
    std::vector<PatternSpan> spans;
    RETURN_IF_ERROR(pattern_.Spans(*text, &spans));
    std::string out;
    out.reserve(text->size());
    // Text between matches keeps its alignment; a match's content is inserted, so it takes the
    // alignment of the match's last byte (of the text's start for an empty match at 0). Once a
    // byte is not aligned with offset 0, none after it is.
    const size_t prefix = WholeCharacters(*text, origin->bytes).size();
    bool aligned = true;
    size_t bytes = 0;
    for (const PatternSpan& span : spans) {
      if (aligned && span.is_match) {
        aligned = span.end == 0 ? origin->segment_at_origin : span.end <= prefix;
        if (aligned) bytes = out.size() + content_.size();
      } else if (aligned && span.end <= prefix) {
        bytes = out.size() + span.end - span.begin;
      } else if (aligned) {
        bytes = out.size() + (prefix > span.begin ? prefix - span.begin : 0);
        aligned = false;
      }
      if (span.is_match) {
        out.append(content_);
      } else {
        out.append(*text, span.begin, span.end - span.begin);
      }
    }
    origin->bytes = bytes;
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text, OriginPrefix* origin) const override {
    // Each character's lowercase keeps its alignment.
    if (origin != nullptr && origin->bytes > 0) {
      origin->bytes = Lowercase(WholeCharacters(*text, origin->bytes)).size();
    }
    *text = Lowercase(*text);
    return absl::OkStatus();
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text, OriginPrefix* origin) const override {
    std::string_view s = *text;
    if (left_) s = TrimStartWhitespace(s);
    if (right_) s = TrimEndWhitespace(s);
    if (origin != nullptr) {
      // What is left keeps its alignment.
      const size_t removed = static_cast<size_t>(s.data() - text->data());
      origin->bytes = origin->bytes > removed ? std::min(origin->bytes - removed, s.size()) : 0;
    }
    if (s.size() != text->size()) *text = std::string(s);
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status Normalize(std::string* text, OriginPrefix* origin) const override {
    for (const auto& part : parts_) RETURN_IF_ERROR(part->Normalize(text, origin));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j) {
  if (j.is_null()) return nullptr;
  std::string type;
  RETURN_IF_ERROR(ComponentType(j, "normalizer", &type));
  const std::string where = absl::StrCat("normalizer ", type);
  if (type == "NFC" || type == "NFKC") {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* n = type == "NFC" ? icu::Normalizer2::getNFCInstance(err)
                                              : icu::Normalizer2::getNFKCInstance(err);
    if (U_FAILURE(err) || n == nullptr) {
      return absl::InternalError(absl::StrCat("ICU has no ", type, " data: ", u_errorName(err)));
    }
    return std::make_unique<UnicodeNormalizer>(n);
  }
  if (type == "Prepend") {
    std::string prepend;
    RETURN_IF_ERROR(ReadString(j, "prepend", where, &prepend));
    return std::make_unique<PrependNormalizer>(std::move(prepend));
  }
  if (type == "Replace") {
    if (!j.contains("pattern")) return JsonError(where, "has no \"pattern\"");
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(j["pattern"], where));
    std::string content;
    RETURN_IF_ERROR(ReadString(j, "content", where, &content));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    bool left = true, right = true;
    RETURN_IF_ERROR(ReadBool(j, "strip_left", where, &left));
    RETURN_IF_ERROR(ReadBool(j, "strip_right", where, &right));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return JsonError(where, "has no \"normalizers\" list");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const Json& part : *it) {
      ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> n, ParseNormalizer(part));
      if (n != nullptr) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  return Unsupported("normalizer", type);
}

}  // namespace carpool::text
