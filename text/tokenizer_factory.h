// The tokenizer for a path or model spec, for tools that take one (the CLI, tests, benchmarks):
// "synthetic:*" is ByteTokenizer; anything else is a Hugging Face folder or tokenizer.json file.
#ifndef CARPOOL_TEXT_TOKENIZER_FACTORY_H_
#define CARPOOL_TEXT_TOKENIZER_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer.h"

namespace carpool::text {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path_or_spec);

}  // namespace carpool::text

#endif  // CARPOOL_TEXT_TOKENIZER_FACTORY_H_
