// The tokenizer.json BPE model: vocabulary, ranked merges and the word-level options
// (byte_fallback, ignore_merges, unk_token, fuse_unk, continuing_subword_prefix,
// end_of_word_suffix). Tokenize applies merges lowest rank first (ties: leftmost), as the Hugging
// Face `tokenizers` BPE does, and caches each piece's result.
//
// Thread safety: Tokenize may run on many threads at once (the cache has its own lock).
#ifndef CARPOOL_TEXT_BPE_H_
#define CARPOOL_TEXT_BPE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "text/json_util.h"

namespace carpool::text {

struct BpeOptions {
  // Pieces of at most this many bytes have their ids cached. Default: 256.
  size_t max_cached_piece_bytes = 256;
  // The cache stops growing at this many pieces. Default: 200,000.
  size_t max_cache_entries = 200'000;
};

class BpeModel {
 public:
  // From a tokenizer.json "model" object of type BPE (merges as "a b" strings or [a, b] pairs).
  // Errors name the bad field: a merge of unknown tokens, a missing unk_token, dropout.
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& model,
                                                            const BpeOptions& options = {});

  // Appends the ids of one pre-token. REQUIRES: valid UTF-8. A character with no token (no
  // byte fallback, no unk_token) is dropped, as the library does.
  void Tokenize(std::string_view piece, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token of `id`, or nullptr outside the vocabulary.
  const std::string* IdToToken(int32_t id) const;
  // One more than the largest id.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  // The number of vocabulary entries (the library's get_vocab_size).
  size_t vocab_entries() const { return vocab_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  BpeModel() = default;
  void TokenizeWord(std::string_view word, std::vector<int32_t>* ids) const;
  void MergeWord(std::string_view word, std::vector<int32_t>* ids) const;
  void FindWordSeparator();

  BpeOptions options_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  int32_t byte_ids_[256];  // "<0xXX>" ids for byte_fallback; -1 when absent
  // When no vocabulary token has this character right after another character (as "▁" in
  // sentencepiece vocabularies), no merge can join across the point before it, so a long piece
  // (a whole Metaspace-normalized text) is cut there into words that BPE runs on, and caches, one
  // by one, with the same result. Empty: never cut.
  std::string word_separator_;

  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_BPE_H_
