#include "text/post_processors.h"

#include <string>

#include "common/status.h"

namespace carpool::text {
namespace {

class AffixProcessor : public PostProcessor {
 public:
  AffixProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void Process(std::vector<int32_t>* ids) const override {
    ids->insert(ids->begin(), prefix_.begin(), prefix_.end());
    ids->insert(ids->end(), suffix_.begin(), suffix_.end());
  }

 private:
  std::vector<int32_t> prefix_, suffix_;
};

// TemplateProcessing's "single" template: special tokens and the sequence, in any order.
class TemplateProcessor : public PostProcessor {
 public:
  // One item: the sequence (ids empty, is_sequence) or a special token's ids.
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  explicit TemplateProcessor(std::vector<Item> items) : items_(std::move(items)) {}
  void Process(std::vector<int32_t>* ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids->size() + 4);
    for (const Item& item : items_) {
      if (item.is_sequence) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else {
        out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
    }
    *ids = std::move(out);
  }

 private:
  std::vector<Item> items_;
};

class NoOpProcessor : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*) const override {}
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void Process(std::vector<int32_t>* ids) const override {
    for (const auto& p : parts_) p->Process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const Json& j,
                                                             const std::string& where) {
  auto single = j.find("single");
  if (single == j.end() || !single->is_array()) return JsonError(where, "has no \"single\" list");
  auto specials = j.find("special_tokens");
  std::vector<TemplateProcessor::Item> items;
  for (const Json& piece : *single) {
    if (piece.contains("Sequence")) {
      const Json& seq = piece["Sequence"];
      if (!seq.is_object() || seq.value("id", "") != "A") {
        return JsonError(where, "a single-sequence template may only name sequence A");
      }
      items.push_back({true, {}});
      continue;
    }
    if (!piece.contains("SpecialToken") || !piece["SpecialToken"].is_object() ||
        !piece["SpecialToken"].contains("id") || !piece["SpecialToken"]["id"].is_string()) {
      return JsonError(where, "template pieces must be {\"Sequence\"} or {\"SpecialToken\"}");
    }
    const std::string name = piece["SpecialToken"]["id"].get<std::string>();
    if (specials == j.end() || !specials->is_object() || !specials->contains(name)) {
      return JsonError(where,
                       absl::StrCat("special token \"", name, "\" is not in \"special_tokens\""));
    }
    const Json& st = (*specials)[name];
    if (!st.contains("ids") || !st["ids"].is_array()) {
      return JsonError(where, absl::StrCat("special token \"", name, "\" has no \"ids\""));
    }
    TemplateProcessor::Item item{false, {}};
    for (const Json& id : st["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        return JsonError(where, absl::StrCat("special token \"", name, "\" has a bad id"));
      }
      item.ids.push_back(id.get<int32_t>());
    }
    items.push_back(std::move(item));
  }
  return std::make_unique<TemplateProcessor>(std::move(items));
}

// BertProcessing / RobertaProcessing: [cls] $A [sep], each given as [token, id].
absl::StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const Json& j,
                                                           const std::string& where) {
  auto id_of = [&](const char* key) -> absl::StatusOr<int32_t> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
      return JsonError(where, absl::StrCat("\"", key, "\" must be [token, id]"));
    }
    return (*it)[1].get<int32_t>();
  };
  ASSIGN_OR_RETURN(int32_t cls, id_of("cls"));
  ASSIGN_OR_RETURN(int32_t sep, id_of("sep"));
  return std::make_unique<AffixProcessor>(std::vector<int32_t>{cls}, std::vector<int32_t>{sep});
}

}  // namespace

std::unique_ptr<PostProcessor> MakeAffixProcessor(std::vector<int32_t> prefix,
                                                  std::vector<int32_t> suffix) {
  return std::make_unique<AffixProcessor>(std::move(prefix), std::move(suffix));
}

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const Json& j) {
  if (j.is_null()) return nullptr;
  std::string type;
  RETURN_IF_ERROR(ComponentType(j, "post_processor", &type));
  const std::string where = absl::StrCat("post_processor ", type);
  if (type == "TemplateProcessing") return ParseTemplate(j, where);
  if (type == "BertProcessing" || type == "RobertaProcessing") return ParseClsSep(j, where);
  if (type == "ByteLevel") return std::make_unique<NoOpProcessor>();
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) return JsonError(where, "has no \"processors\" list");
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const Json& part : *it) {
      ASSIGN_OR_RETURN(std::unique_ptr<PostProcessor> p, ParsePostProcessor(part));
      if (p != nullptr) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  return Unsupported("post_processor", type);
}

}  // namespace carpool::text
