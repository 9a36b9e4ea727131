// carpool-bench-tokenizer --tokenizer PATH --inputs-file FILE [--passes N]: single-thread encode
// and decode throughput of one tokenizer over whole documents (JSON lines {"text": ...}). The
// first pass warms the caches and is not timed; the best of the timed passes is printed.
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer_factory.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, inputs_file;
  int passes = 3;
  carpool::FlagParser parser;
  parser.AddString("tokenizer", &tokenizer_path, "a Hugging Face folder or tokenizer.json");
  parser.AddString("inputs-file", &inputs_file, "JSON lines of {\"text\": ...} documents");
  parser.AddInt("passes", &passes, "timed passes (the best is printed)");
  if (absl::Status s = parser.Parse(argc, argv, 1);
      !s.ok() || tokenizer_path.empty() || inputs_file.empty() || passes < 1) {
    std::cerr << "usage: carpool-bench-tokenizer --tokenizer PATH --inputs-file FILE\n"
              << parser.Help();
    return 2;
  }
  const auto load_start = std::chrono::steady_clock::now();
  auto tokenizer = carpool::text::LoadTokenizer(tokenizer_path);
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  const double load_s = Seconds(load_start);
  std::vector<std::string> docs;
  size_t bytes = 0;
  std::ifstream in(inputs_file);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      docs.push_back(j["text"].get<std::string>());
      bytes += docs.back().size();
    }
  }
  std::vector<std::vector<int32_t>> ids(docs.size());
  double encode_s = 1e30, decode_s = 1e30;
  size_t tokens = 0;
  for (int pass = 0; pass <= passes; ++pass) {
    auto start = std::chrono::steady_clock::now();
    tokens = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      auto r = (*tokenizer)->Encode(docs[i], false);
      if (!r.ok()) {
        std::cerr << "document " << i << ": " << r.status() << "\n";
        return 1;
      }
      ids[i] = std::move(*r);
      tokens += ids[i].size();
    }
    if (pass > 0) encode_s = std::min(encode_s, Seconds(start));
    start = std::chrono::steady_clock::now();
    size_t out = 0;
    for (const auto& d : ids) out += (*tokenizer)->Decode(d, false).size();
    if (pass > 0) decode_s = std::min(decode_s, Seconds(start));
    if (out == 0 && bytes > 0) std::cerr << "decode produced nothing\n";
  }
  std::cout << absl::StrFormat(
      "%d documents, %.2f MB, %d tokens; load %.2f s\n"
      "encode %.2f MB/s %.2f Mtok/s\ndecode %.2f MB/s %.2f Mtok/s\n",
      docs.size(), bytes / 1e6, tokens, load_s, bytes / 1e6 / encode_s, tokens / 1e6 / encode_s,
      bytes / 1e6 / decode_s, tokens / 1e6 / decode_s);
  return 0;
}
