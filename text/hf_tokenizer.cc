#include "text/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "text/unicode.h"

namespace carpool::text {
namespace {

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return out.str();
}

// transformers rebuilds the post-processor from add_bos_token / add_eos_token for these classes.
bool RebuildsPostProcessor(const std::string& tokenizer_class) {
  return absl::StrContains(tokenizer_class, "Llama") || absl::StrContains(tokenizer_class, "Gemma");
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (!fs::exists(dir / "tokenizer.json", ec)) {
      if (fs::exists(dir / "tokenizer.model", ec)) {
        return absl::NotFoundError(absl::StrCat(
            path,
            " has tokenizer.model but no tokenizer.json: carpool reads tokenizer.json "
            "only (sentencepiece-only folders are not supported); convert it with transformers "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(...)) to get one"));
      }
      return absl::NotFoundError(absl::StrCat(path, " has no tokenizer.json"));
    }
    ASSIGN_OR_RETURN(std::string json, ReadFile(dir / "tokenizer.json"));
    std::string config, generation;
    if (fs::exists(dir / "tokenizer_config.json", ec)) {
      ASSIGN_OR_RETURN(config, ReadFile(dir / "tokenizer_config.json"));
    }
    if (fs::exists(dir / "generation_config.json", ec)) {
      ASSIGN_OR_RETURN(generation, ReadFile(dir / "generation_config.json"));
    }
    return FromJson(json, config, generation);
  }
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  ASSIGN_OR_RETURN(std::string json, ReadFile(path));
  return FromJson(json, "");
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json,
    std::string_view generation_config_json) {
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  ASSIGN_OR_RETURN(t->parts_, ParseTokenizerJson(tokenizer_json));
  ASSIGN_OR_RETURN(TokenizerConfig config, ParseTokenizerConfig(tokenizer_config_json));
  t->AssignAddedTokenIds();
  t->track_origin_ = t->parts_.pre_tokenizer != nullptr && t->parts_.pre_tokenizer->NeedsOrigin();

  // The library's trie order: special tokens first, then the others.
  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  t->vocab_size_ = t->parts_.model->vocab_size();
  for (bool special : {true, false}) {
    for (const AddedToken& a : t->parts_.added_tokens) {
      if (a.special != special) continue;
      if (a.normalized) {
        std::string content = a.content;
        if (t->parts_.normalizer != nullptr) {
          RETURN_IF_ERROR(t->parts_.normalizer->Normalize(&content));
        }
        normalized.push_back(a);
        normalized_patterns.push_back(std::move(content));
      } else {
        raw.push_back(a);
        raw_patterns.push_back(a.content);
      }
    }
  }
  for (const AddedToken& a : t->parts_.added_tokens) {
    t->vocab_size_ = std::max(t->vocab_size_, a.id + 1);
  }
  t->raw_matcher_ = std::make_unique<AddedTokenMatcher>(raw, raw_patterns);
  t->normalized_matcher_ = std::make_unique<AddedTokenMatcher>(normalized, normalized_patterns);

  if (config.bos_token) t->bos_id_ = t->TokenToId(*config.bos_token);
  if (config.eos_token) t->eos_id_ = t->TokenToId(*config.eos_token);
  t->model_max_length_ = config.model_max_length;
  ASSIGN_OR_RETURN(t->stop_ids_, ParseGenerationEosIds(generation_config_json));
  if (t->stop_ids_.empty() && t->eos_id_) t->stop_ids_.push_back(*t->eos_id_);
  if ((config.add_bos_token || config.add_eos_token) &&
      RebuildsPostProcessor(config.tokenizer_class)) {
    std::vector<int32_t> prefix, suffix;
    if (config.add_bos_token.value_or(true) && t->bos_id_) prefix.push_back(*t->bos_id_);
    if (config.add_eos_token.value_or(false) && t->eos_id_) suffix.push_back(*t->eos_id_);
    t->config_post_processor_ = MakeAffixProcessor(std::move(prefix), std::move(suffix));
  }

  // Run every regex once so a pattern that cannot finish fails here, not on the first request.
  for (const char* probe :
       {"Hello world, it's 2024!\n\n  \t x", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!",
        "                              x", "1111111111111111111111111111111a"}) {
    absl::StatusOr<std::vector<int32_t>> ids = t->Encode(probe, true);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: a probe text does not encode: ", ids.status().message()));
    }
  }
  return t;
}

void HfTokenizer::AssignAddedTokenIds() {
  // As the library does when it loads a file: a token already in the vocabulary (or added
  // before) keeps that id; a new one gets the next id past the vocabulary and the tokens so far.
  // The "id" written in the file is not used.
  const int64_t vocab_len = static_cast<int64_t>(parts_.model->vocab_entries());
  std::optional<int64_t> max_added;
  for (size_t i = 0; i < parts_.added_tokens.size(); ++i) {
    AddedToken& a = parts_.added_tokens[i];
    std::optional<int32_t> id = TokenToId(a.content);
    if (!id) {
      const int64_t next = !max_added                                    ? vocab_len
                           : (*max_added >= vocab_len || vocab_len == 0) ? *max_added + 1
                                                                         : vocab_len;
      id = static_cast<int32_t>(next);
    }
    a.id = *id;
    max_added = std::max<int64_t>(max_added.value_or(*id), *id);
    added_by_id_[a.id] = i;
    added_by_content_[a.content] = a.id;
  }
}

const AddedToken* HfTokenizer::FindAdded(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it == added_by_id_.end() ? nullptr : &parts_.added_tokens[it->second];
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  const AddedToken* a = FindAdded(id);
  return a != nullptr && a->special;
}

std::optional<std::string> HfTokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* a = FindAdded(id)) return a->content;
  if (const std::string* t = parts_.model->IdToToken(id)) return *t;
  return std::nullopt;
}

std::optional<int32_t> HfTokenizer::TokenToId(std::string_view token) const {
  auto it = added_by_content_.find(absl::string_view(token.data(), token.size()));
  if (it != added_by_content_.end()) return it->second;
  return parts_.model->TokenToId(token);
}

absl::Status HfTokenizer::EncodeSegment(std::string_view raw, bool at_origin,
                                        std::vector<int32_t>* ids) const {
  std::string normalized(raw);
  // Before normalizing, the first character is what sits at the input's offset 0.
  OriginPrefix origin;
  if (track_origin_ && at_origin && !raw.empty()) {
    origin.segment_at_origin = true;
    origin.bytes = Utf8Length(static_cast<unsigned char>(raw[0]));
  }
  if (parts_.normalizer != nullptr) {
    RETURN_IF_ERROR(
        parts_.normalizer->Normalize(&normalized, track_origin_ ? &origin : nullptr));
  }
  std::vector<Segment> segments;
  normalized_matcher_->Split(normalized, &segments);
  PreTokenized pre;
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids->push_back(s.id);
      continue;
    }
    pre.text.assign(normalized, s.begin, s.end - s.begin);
    const size_t piece_origin =
        origin.bytes > s.begin ? std::min(origin.bytes - s.begin, s.end - s.begin) : 0;
    pre.pieces.assign(1, {0, static_cast<uint32_t>(pre.text.size()),
                          static_cast<uint32_t>(piece_origin)});
    if (parts_.pre_tokenizer != nullptr) {
      RETURN_IF_ERROR(parts_.pre_tokenizer->PreTokenize(&pre));
    }
    for (const Piece& p : pre.pieces) parts_.model->Tokenize(pre.view(p), ids);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(const std::string& text,
                                                         bool add_special_tokens) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (byte offset ", bad, ")"));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Segment> segments;
  raw_matcher_->Split(text, &segments);
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    RETURN_IF_ERROR(
        EncodeSegment(std::string_view(text).substr(s.begin, s.end - s.begin), s.begin == 0, &ids));
  }
  if (add_special_tokens) {
    if (config_post_processor_ != nullptr) {
      config_post_processor_->Process(&ids);
    } else if (parts_.post_processor != nullptr) {
      parts_.post_processor->Process(&ids);
    }
  }
  return ids;
}

std::string HfTokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* a = FindAdded(id)) {
      if (!(skip_special_tokens && a->special)) tokens.push_back(a->content);
    } else if (const std::string* t = parts_.model->IdToToken(id)) {
      tokens.push_back(*t);
    }
  }
  if (parts_.decoder == nullptr) return absl::StrJoin(tokens, " ");
  parts_.decoder->DecodeChain(&tokens);
  return absl::StrJoin(tokens, "");
}

}  // namespace carpool::text
