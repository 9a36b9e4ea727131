#include "client/tokenize_command.h"

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "nlohmann/json.hpp"
#include "text/stream_decoder.h"
#include "text/tokenizer_factory.h"

namespace carpool::client {
namespace {

using nlohmann::json;

// Keys in the order written ({"line": N, "error": ...}).
std::string Dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

// One input: text to encode or ids to decode.
struct Input {
  std::string text;
  std::vector<int32_t> ids;
};

absl::StatusOr<Input> ParseLine(const std::string& line, bool decode) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("not a JSON object");
  }
  Input in;
  if (!decode) {
    auto it = j.find("text");
    if (it == j.end() || !it->is_string()) {
      return absl::InvalidArgumentError("expected {\"text\": \"...\"}");
    }
    in.text = it->get<std::string>();
    return in;
  }
  auto it = j.find("ids");
  if (it == j.end() || !it->is_array()) {
    return absl::InvalidArgumentError("expected {\"ids\": [...]}");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& id = (*it)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "] is not a token id (an integer in [0, 2^31))"));
    }
    in.ids.push_back(id.get<int32_t>());
  }
  return in;
}

// Writes the output line for one input, or its error.
void RunOne(const Tokenizer& tokenizer, const TokenizeLinesOptions& o,
            const absl::StatusOr<Input>& in, int64_t line, std::ostream& out, std::ostream& err) {
  auto fail = [&](const absl::Status& s) {
    if (o.json) {
      out << Dump({{"line", line}, {"error", std::string(s.message())}}) << "\n";
    } else {
      err << "line " << line << ": " << s.message() << "\n";
    }
  };
  if (!in.ok()) return fail(in.status());
  if (o.decode && o.stream) {
    text::StreamDecoder stream(&tokenizer, o.skip_special_tokens);
    std::vector<std::string> chunks;
    for (int32_t id : in->ids) chunks.push_back(absl::BytesToHexString(stream.Add(id)));
    chunks.push_back(absl::BytesToHexString(stream.Finish()));
    if (o.json) {
      out << Dump({{"text", stream.text()}, {"chunks_hex", chunks}}) << "\n";
    } else {
      out << stream.text() << "\n";
    }
    return;
  }
  if (o.decode) {
    const std::string text = tokenizer.Decode(in->ids, o.skip_special_tokens);
    if (o.json) {
      out << Dump({{"text", text}}) << "\n";
    } else {
      out << text << "\n";
    }
    return;
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(in->text, o.add_special_tokens);
  if (!ids.ok()) return fail(ids.status());
  if (o.json) {
    out << Dump({{"ids", *ids}}) << "\n";
    return;
  }
  std::string text;
  for (size_t i = 0; i < ids->size(); ++i) absl::StrAppend(&text, i == 0 ? "" : " ", (*ids)[i]);
  out << text << "\n";
}

struct Flags {
  std::string tokenizer;
  std::string inputs_file;
  bool add_special_tokens = true;
  bool skip_special_tokens = false;
  bool json = false;
  bool stream = false;
  bool help = false;
};

int Run(int argc, char** argv, int first, bool decode) {
  const char* name = decode ? "carpool detokenize" : "carpool tokenize";
  Flags f;
  FlagParser parser;
  parser.AddString("tokenizer", &f.tokenizer,
                   "a Hugging Face folder or tokenizer.json, or synthetic:<preset>; required");
  parser.AddString("inputs-file", &f.inputs_file,
                   decode ? "JSON lines of {\"ids\": [...]}" : "JSON lines of {\"text\": \"...\"}");
  if (decode) {
    parser.AddBool("skip-special-tokens", &f.skip_special_tokens, "leave special tokens out");
    parser.AddBool("stream", &f.stream,
                   "decode one id at a time as a stream does; --json adds each chunk's bytes "
                   "(chunks_hex)");
  } else {
    parser.AddBool("add-special-tokens", &f.add_special_tokens,
                   "add the tokenizer's special tokens (BOS...); --no-add-special-tokens: none");
  }
  parser.AddBool("json", &f.json,
                 decode ? "print {\"text\": ...} per input" : "print {\"ids\": [...]} per input");
  parser.AddBool("help", &f.help, "show this help");
  if (absl::Status s = parser.Parse(argc, argv, first); !s.ok()) {
    std::cerr << name << ": " << s.message() << "\n";
    return 2;
  }
  if (f.help) {
    std::cout << "usage: " << name << " --tokenizer PATH [--inputs-file FILE] [flags] "
              << (decode ? "[IDS...]\n  IDS: the token ids of one input (\"1 2 3\" or \"1,2,3\")\n"
                         : "[TEXT...]\n  each TEXT is one input\n")
              << parser.Help();
    return 0;
  }
  if (f.tokenizer.empty()) {
    std::cerr << name << ": --tokenizer is required\n";
    return 2;
  }
  const std::vector<std::string>& args = parser.positionals();
  if (args.empty() == f.inputs_file.empty()) {
    std::cerr << name
              << ": give inputs on the command line or --inputs-file, not both and not "
                 "neither\n";
    return 2;
  }
  std::ifstream file;
  if (!f.inputs_file.empty()) {
    file.open(f.inputs_file);
    if (!file) {
      std::cerr << name << ": cannot open " << f.inputs_file << "\n";
      return 2;
    }
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = text::LoadTokenizer(f.tokenizer);
  if (!tokenizer.ok()) {
    std::cerr << name << ": " << tokenizer.status().message() << "\n";
    return 1;
  }
  TokenizeLinesOptions o;
  o.decode = decode;
  o.add_special_tokens = f.add_special_tokens;
  o.skip_special_tokens = f.skip_special_tokens;
  o.json = f.json;
  o.stream = f.stream;
  std::ios::sync_with_stdio(false);
  if (file.is_open()) {
    TokenizeJsonLines(**tokenizer, o, file, std::cout, std::cerr);
  } else if (decode) {
    Input in;
    absl::Status status;
    for (const std::string& arg : args) {
      for (absl::string_view part : absl::StrSplit(arg, absl::ByAnyChar(", "), absl::SkipEmpty())) {
        int32_t id;
        if (!absl::SimpleAtoi(part, &id) || id < 0) {
          status = absl::InvalidArgumentError(
              absl::StrCat("'", std::string(part), "' is not a token id"));
          break;
        }
        in.ids.push_back(id);
      }
    }
    absl::StatusOr<Input> input = status.ok() ? absl::StatusOr<Input>(in) : status;
    RunOne(**tokenizer, o, input, 1, std::cout, std::cerr);
  } else {
    for (size_t i = 0; i < args.size(); ++i) {
      RunOne(**tokenizer, o, Input{args[i], {}}, static_cast<int64_t>(i + 1), std::cout, std::cerr);
    }
  }
  std::cout.flush();
  return 0;
}

}  // namespace

void TokenizeJsonLines(const Tokenizer& tokenizer, const TokenizeLinesOptions& options,
                       std::istream& in, std::ostream& out, std::ostream& err) {
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    RunOne(tokenizer, options, ParseLine(line, options.decode), number, out, err);
  }
}

int RunTokenize(int argc, char** argv, int first) { return Run(argc, argv, first, false); }
int RunDetokenize(int argc, char** argv, int first) { return Run(argc, argv, first, true); }

}  // namespace carpool::client
