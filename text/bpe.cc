#include "text/bpe.h"

#include <queue>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "text/unicode.h"

namespace carpool::text {
namespace {

constexpr char kWhere[] = "model BPE";

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes of the piece it covers; 0 once merged into its left neighbour
};

struct QueuedMerge {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // Lowest rank first, then leftmost.
  bool operator<(const QueuedMerge& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

absl::Status ReadMergePair(const Json& m, size_t index, std::string* a, std::string* b) {
  if (m.is_string()) {
    const std::string& line = m.get_ref<const std::string&>();
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return JsonError(kWhere, absl::StrCat("merge ", index, " (\"", line,
                                            "\") is not two tokens separated by a space"));
    }
    *a = line.substr(0, space);
    *b = line.substr(space + 1);
    return absl::OkStatus();
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    *a = m[0].get<std::string>();
    *b = m[1].get<std::string>();
    return absl::OkStatus();
  }
  return JsonError(kWhere, absl::StrCat("merge ", index, " is neither \"a b\" nor [a, b]"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& j,
                                                             const BpeOptions& options) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->options_ = options;
  if (j.contains("dropout") && !j["dropout"].is_null()) {
    if (!j["dropout"].is_number() || j["dropout"].get<double>() != 0.0) {
      return JsonError(kWhere, "dropout is not supported (encoding must be deterministic)");
    }
  }
  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_object()) return JsonError(kWhere, "has no \"vocab\" object");
  m->vocab_.reserve(vocab->size());
  int32_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > (1 << 30)) {
      return JsonError(kWhere,
                       absl::StrCat("vocab entry \"", it.key(), "\" has no id in [0, 2^30]"));
    }
    const int32_t id = it.value().get<int32_t>();
    m->vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.resize(max_id + 1);
  for (const auto& [token, id] : m->vocab_) m->id_to_token_[id] = token;

  RETURN_IF_ERROR(ReadBool(j, "fuse_unk", kWhere, &m->fuse_unk_));
  RETURN_IF_ERROR(ReadBool(j, "byte_fallback", kWhere, &m->byte_fallback_));
  RETURN_IF_ERROR(ReadBool(j, "ignore_merges", kWhere, &m->ignore_merges_));
  RETURN_IF_ERROR(
      ReadString(j, "continuing_subword_prefix", kWhere, &m->continuing_subword_prefix_));
  RETURN_IF_ERROR(ReadString(j, "end_of_word_suffix", kWhere, &m->end_of_word_suffix_));
  std::string unk;
  RETURN_IF_ERROR(ReadString(j, "unk_token", kWhere, &unk));
  if (j.contains("unk_token") && !j["unk_token"].is_null()) {
    std::optional<int32_t> id = m->TokenToId(unk);
    if (!id) return JsonError(kWhere, absl::StrCat("unk_token \"", unk, "\" is not in the vocab"));
    m->unk_id_ = *id;
  }
  for (int b = 0; b < 256; ++b) {
    m->byte_ids_[b] = m->TokenToId(absl::StrFormat("<0x%02X>", b)).value_or(-1);
  }

  m->FindWordSeparator();
  auto merges = j.find("merges");
  if (merges != j.end() && !merges->is_null()) {
    if (!merges->is_array()) return JsonError(kWhere, "\"merges\" must be a list");
    m->merges_.reserve(merges->size());
    const size_t prefix_len = m->continuing_subword_prefix_.size();
    std::string a, b;
    for (size_t i = 0; i < merges->size(); ++i) {
      RETURN_IF_ERROR(ReadMergePair((*merges)[i], i, &a, &b));
      std::optional<int32_t> a_id = m->TokenToId(a), b_id = m->TokenToId(b);
      if (!a_id || !b_id) {
        return JsonError(kWhere, absl::StrCat("merge ", i, " (\"", a, "\", \"", b,
                                              "\") names a token that is not in the vocab"));
      }
      std::string merged = a;
      if (prefix_len > 0 && b.compare(0, prefix_len, m->continuing_subword_prefix_) == 0) {
        merged.append(b, prefix_len);
      } else {
        merged.append(b);
      }
      std::optional<int32_t> new_id = m->TokenToId(merged);
      if (!new_id) {
        return JsonError(kWhere, absl::StrCat("merge ", i, " makes \"", merged,
                                              "\", which is not in the vocab"));
      }
      m->merges_[PairKey(*a_id, *b_id)] = {static_cast<int32_t>(i), *new_id};
    }
  }
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return nullptr;
  const std::string& t = id_to_token_[id];
  // A hole in the ids has an empty token; the empty string is never a vocab entry id.
  if (t.empty() && vocab_.find(absl::string_view()) == vocab_.end()) return nullptr;
  return &t;
}

void BpeModel::FindWordSeparator() {
  const std::string candidate = "\xE2\x96\x81";  // U+2581, sentencepiece's space
  if (ignore_merges_ || !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty() ||
      !TokenToId(candidate)) {
    return;
  }
  const size_t len = candidate.size();
  for (const auto& [token, id] : vocab_) {
    for (size_t pos = token.find(candidate, 1); pos != std::string::npos;
         pos = token.find(candidate, pos + len)) {
      if (pos < len || token.compare(pos - len, len, candidate) != 0) return;
    }
  }
  word_separator_ = candidate;
}

void BpeModel::Tokenize(std::string_view piece, std::vector<int32_t>* ids) const {
  if (word_separator_.empty()) return TokenizeWord(piece, ids);
  const std::string_view sep = word_separator_;
  size_t start = 0;
  for (size_t pos = piece.find(sep, 1); pos != std::string_view::npos;
       pos = piece.find(sep, pos + sep.size())) {
    if (pos >= sep.size() && piece.compare(pos - sep.size(), sep.size(), sep) == 0) continue;
    TokenizeWord(piece.substr(start, pos - start), ids);
    start = pos;
  }
  TokenizeWord(piece.substr(start), ids);
}

void BpeModel::TokenizeWord(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (std::optional<int32_t> id = TokenToId(piece)) {
      ids->push_back(*id);
      return;
    }
  }
  const bool cacheable = piece.size() <= options_.max_cached_piece_bytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&mu_);
    auto it = cache_.find(absl::string_view(piece.data(), piece.size()));
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  MergeWord(piece, ids);
  if (cacheable) {
    absl::MutexLock lock(&mu_);
    if (cache_.size() < options_.max_cache_entries) {
      cache_.try_emplace(std::string(piece), ids->begin() + first, ids->end());
    }
  }
}

void BpeModel::MergeWord(std::string_view w, std::vector<int32_t>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&symbols](int32_t id, uint32_t len) {
    const int32_t pos = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, pos - 1, pos + 1, len});
  };
  // A pending unknown run: its id and bytes (unk_len 0: none). Plain fields, not an optional
  // pair, which GCC 12 at -O3 flags -Wmaybe-uninitialized.
  int32_t unk_tok = 0;
  uint32_t unk_len = 0;
  std::string scratch;
  for (size_t i = 0; i < w.size();) {
    const size_t start = i;
    NextCodePoint(w, &i);
    const uint32_t byte_len = static_cast<uint32_t>(i - start);
    std::string_view s = w.substr(start, byte_len);
    if ((start > 0 && !continuing_subword_prefix_.empty()) ||
        (i == w.size() && !end_of_word_suffix_.empty())) {
      scratch.clear();
      if (start > 0) scratch.append(continuing_subword_prefix_);
      scratch.append(s);
      if (i == w.size()) scratch.append(end_of_word_suffix_);
      s = scratch;
    }
    if (std::optional<int32_t> id = TokenToId(s)) {
      if (unk_len > 0) {
        add(unk_tok, unk_len);
        unk_len = 0;
      }
      add(*id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_ids_[c] >= 0;
      if (all) {
        // As the library does: a pending unknown run stays pending across byte tokens.
        for (unsigned char c : s) add(byte_ids_[c], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_len > 0 && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_len > 0) add(unk_tok, unk_len);
        unk_tok = *unk_id_;
        unk_len = byte_len;
      }
    }
  }
  if (unk_len > 0) add(unk_tok, unk_len);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::priority_queue<QueuedMerge> queue;
  auto find = [this](int32_t a, int32_t b) -> const Merge* {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t p = 0; p + 1 < symbols.size(); ++p) {
    if (const Merge* m = find(symbols[p].id, symbols[p + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(p), m->new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    const Merge* still = find(cur.id, right.id);
    if (still == nullptr || still->new_id != top.new_id) continue;  // a stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* m = find(symbols[cur.prev].id, cur.id)) {
        queue.push({m->rank, cur.prev, m->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const Merge* m = find(cur.id, symbols[cur.next].id)) {
        queue.push({m->rank, top.pos, m->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids->push_back(s.id);
  }
}

}  // namespace carpool::text
