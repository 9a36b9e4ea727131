#include "text/tokenizer_factory.h"

#include "absl/strings/match.h"
#include "text/hf_tokenizer.h"

namespace carpool::text {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path_or_spec) {
  if (absl::StartsWith(path_or_spec, "synthetic:")) return std::make_unique<ByteTokenizer>();
  absl::StatusOr<std::unique_ptr<HfTokenizer>> hf = HfTokenizer::Load(path_or_spec);
  if (!hf.ok()) return hf.status();
  return std::unique_ptr<Tokenizer>(std::move(*hf));
}

}  // namespace carpool::text
