#include "text/decoders.h"

#include "common/status.h"
#include "text/byte_level.h"
#include "text/pattern.h"
#include "text/unicode.h"

namespace carpool::text {
namespace {

// Maps each token's characters back to bytes; a token with a character outside the map keeps its
// own bytes. All tokens become one string, invalid UTF-8 replaced.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& t : *tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < t.size();) {
        const int b = CharToByte(NextCodePoint(t, &i));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens->assign(1, Utf8Lossy(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      std::string out;
      out.reserve(t.size());
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && strip_first_)) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      t = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;  // the first token's replacement characters vanish (prepend_scheme != never)
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      absl::StatusOr<std::string> r = pattern_.ReplaceAll(t, content_);
      if (r.ok()) t = std::move(*r);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "<0xXX>" tokens become bytes; each run of them becomes its UTF-8 text, or one U+FFFD per byte
// when the run is not valid UTF-8.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;
    size_t run_count = 0;
    auto flush = [&] {
      if (run_count == 0) return;
      if (FindInvalidUtf8(run) == std::string::npos) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_count; ++k) out.push_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_count = 0;
    };
    for (std::string& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') byte = Hex(t[3], t[4]);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        ++run_count;
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  static int Digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int Hex(char hi, char lo) {
    const int h = Digit(hi), l = Digit(lo);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const std::string& t : *tokens) all.append(t);
    tokens->assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      std::vector<size_t> bounds;  // byte offset of each character, then the size
      for (size_t i = 0; i < t.size();) {
        bounds.push_back(i);
        NextCodePoint(t, &i);
      }
      const size_t n = bounds.size();
      bounds.push_back(t.size());
      auto char_at = [&](size_t k) {
        size_t i = bounds[k];
        return NextCodePoint(t, &i);
      };
      size_t first = 0;
      while (first < std::min(start_, n) && char_at(first) == content_) ++first;
      size_t last = n;
      while (n - last < stop_ && last > first && char_at(last - 1) == content_) --last;
      t = t.substr(bounds[first], bounds[last] - bounds[first]);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts_) p->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

absl::StatusOr<char32_t> OneChar(const std::string& s, const std::string& where, const char* key) {
  size_t i = 0;
  if (s.empty() || FindInvalidUtf8(s) != std::string::npos) {
    return JsonError(where, absl::StrCat("\"", key, "\" must be one character"));
  }
  const char32_t c = NextCodePoint(s, &i);
  if (i != s.size()) return JsonError(where, absl::StrCat("\"", key, "\" must be one character"));
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j) {
  if (j.is_null()) return nullptr;
  std::string type;
  RETURN_IF_ERROR(ComponentType(j, "decoder", &type));
  const std::string where = absl::StrCat("decoder ", type);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";
    RETURN_IF_ERROR(ReadString(j, "replacement", where, &replacement));
    RETURN_IF_ERROR(OneChar(replacement, where, "replacement").status());
    bool strip_first = true;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      strip_first = j["prepend_scheme"].get<std::string>() != "never";
    } else {
      RETURN_IF_ERROR(ReadBool(j, "add_prefix_space", where, &strip_first));
    }
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), strip_first);
  }
  if (type == "Replace") {
    if (!j.contains("pattern")) return JsonError(where, "has no \"pattern\"");
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(j["pattern"], where));
    std::string content;
    RETURN_IF_ERROR(ReadString(j, "content", where, &content));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    std::string content = " ";
    int64_t start = 0, stop = 0;
    RETURN_IF_ERROR(ReadString(j, "content", where, &content));
    RETURN_IF_ERROR(ReadInt(j, "start", where, &start));
    RETURN_IF_ERROR(ReadInt(j, "stop", where, &stop));
    if (start < 0 || stop < 0) return JsonError(where, "\"start\" and \"stop\" must be >= 0");
    ASSIGN_OR_RETURN(char32_t c, OneChar(content, where, "content"));
    return std::make_unique<StripDecoder>(c, static_cast<size_t>(start), static_cast<size_t>(stop));
  }
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) return JsonError(where, "has no \"decoders\" list");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const Json& part : *it) {
      ASSIGN_OR_RETURN(std::unique_ptr<Decoder> d, ParseDecoder(part));
      if (d != nullptr) parts.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  return Unsupported("decoder", type);
}

}  // namespace carpool::text
