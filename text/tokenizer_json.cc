#include "text/tokenizer_json.h"

#include "common/status.h"

namespace carpool::text {

absl::StatusOr<TokenizerJson> ParseTokenizerJson(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("tokenizer.json is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  for (const char* unsupported : {"truncation", "padding"}) {
    if (j.contains(unsupported) && !j[unsupported].is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", unsupported,
                       " is set; carpool does not truncate or pad, so it "
                       "supports only \"",
                       unsupported, "\": null"));
    }
  }
  TokenizerJson out;
  if (j.contains("added_tokens")) {
    ASSIGN_OR_RETURN(out.added_tokens, ParseAddedTokens(j["added_tokens"]));
  }
  static const Json kNull;
  auto field = [&j](const char* key) -> const Json& {
    auto it = j.find(key);
    return it == j.end() ? kNull : *it;
  };
  ASSIGN_OR_RETURN(out.normalizer, ParseNormalizer(field("normalizer")));
  ASSIGN_OR_RETURN(out.pre_tokenizer, ParsePreTokenizer(field("pre_tokenizer")));
  ASSIGN_OR_RETURN(out.post_processor, ParsePostProcessor(field("post_processor")));
  ASSIGN_OR_RETURN(out.decoder, ParseDecoder(field("decoder")));
  const Json& model = field("model");
  if (!model.is_object()) return absl::InvalidArgumentError("tokenizer.json has no \"model\"");
  std::string type;
  if (model.contains("type")) {
    RETURN_IF_ERROR(ComponentType(model, "model", &type));
  } else if (model.contains("merges")) {
    type = "BPE";
  }
  if (type != "BPE") return Unsupported("model", type.empty() ? "(none)" : type);
  ASSIGN_OR_RETURN(out.model, BpeModel::FromJson(model));
  return out;
}

namespace {

absl::Status ReadTokenName(const Json& j, const char* key, std::optional<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return absl::OkStatus();
  }
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    *out = (*it)["content"].get<std::string>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: \"", key,
                                                 "\" must be a string or an AddedToken object"));
}

absl::Status ReadOptionalBool(const Json& j, const char* key, std::optional<bool>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer_config.json: \"", key, "\" must be a boolean"));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(std::string_view text) {
  TokenizerConfig c;
  if (text.empty()) return c;
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
  }
  RETURN_IF_ERROR(ReadTokenName(j, "bos_token", &c.bos_token));
  RETURN_IF_ERROR(ReadTokenName(j, "eos_token", &c.eos_token));
  RETURN_IF_ERROR(ReadOptionalBool(j, "add_bos_token", &c.add_bos_token));
  RETURN_IF_ERROR(ReadOptionalBool(j, "add_eos_token", &c.add_eos_token));
  if (auto it = j.find("model_max_length"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: \"model_max_length\" must be a number");
    }
    // transformers writes int(1e30) for "no limit".
    const double v = it->get<double>();
    if (v >= 1 && v < 1e15) c.model_max_length = static_cast<int64_t>(v);
  }
  if (auto it = j.find("tokenizer_class"); it != j.end() && it->is_string()) {
    c.tokenizer_class = it->get<std::string>();
  }
  return c;
}

absl::StatusOr<std::vector<int32_t>> ParseGenerationEosIds(std::string_view text) {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("generation_config.json is not a JSON object");
  }
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return ids;
  const Json list = it->is_array() ? *it : Json::array({*it});
  for (const Json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 30)) {
      return absl::InvalidArgumentError(
          "generation_config.json: \"eos_token_id\" must be a token id or a list of them");
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace carpool::text
