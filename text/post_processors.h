// tokenizer.json post-processors for a single sequence: TemplateProcessing, BertProcessing,
// RobertaProcessing, ByteLevel (offsets only: ids unchanged), Sequence. They run only when the
// caller asks for special tokens.
//
// Thread safety: immutable after parsing.
#ifndef CARPOOL_TEXT_POST_PROCESSORS_H_
#define CARPOOL_TEXT_POST_PROCESSORS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "text/json_util.h"

namespace carpool::text {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the ids of one encoded sequence (adds its special tokens).
  virtual void Process(std::vector<int32_t>* ids) const = 0;
};

// The post-processor a tokenizer.json "post_processor" value describes; nullptr for null. A
// type this build does not run is INVALID_ARGUMENT naming it.
absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const Json& j);

// A template "[prefix ids] $A [suffix ids]", what tokenizer_config.json's add_bos_token /
// add_eos_token build for Llama tokenizers.
std::unique_ptr<PostProcessor> MakeAffixProcessor(std::vector<int32_t> prefix,
                                                  std::vector<int32_t> suffix);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_POST_PROCESSORS_H_
