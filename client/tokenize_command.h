// `carpool tokenize` and `carpool detokenize --tokenizer PATH`: text to token ids and back with a
// model's own tokenizer (a Hugging Face folder or tokenizer.json, or "synthetic:*" for the byte
// tokenizer), in-process. Inputs come from the command line or a JSON-lines file
// ({"text": ...} / {"ids": [...]} per line); --json prints one JSON line per input
// ({"ids": [...]} / {"text": ...}), and a bad input line prints {"line": N, "error": ...} while
// the rest go on. `detokenize --stream` decodes the way a stream does (TokenizeLinesOptions).
#ifndef CARPOOL_CLIENT_TOKENIZE_COMMAND_H_
#define CARPOOL_CLIENT_TOKENIZE_COMMAND_H_

#include <istream>
#include <ostream>

#include "common/tokenizer.h"

namespace carpool::client {

struct TokenizeLinesOptions {
  bool decode = false;               // detokenize instead of tokenize
  bool add_special_tokens = true;    // tokenize; Default: true (Hugging Face encode's default)
  bool skip_special_tokens = false;  // detokenize; Default: false
  bool json = false;                 // Default: false (plain: ids space-separated / the text)
  // detokenize: feed the ids one at a time through text::StreamDecoder, as the router streams
  // text; --json adds "chunks_hex", each chunk's bytes in hex (a chunk that ended inside a
  // UTF-8 sequence would show there). "text" is the chunks joined. Default: false.
  bool stream = false;
};

// Runs every JSON line of `in` through `tokenizer`, writing one output line per input line
// (blank lines are skipped; line numbers count them). Bad lines are reported, never fatal.
void TokenizeJsonLines(const Tokenizer& tokenizer, const TokenizeLinesOptions& options,
                       std::istream& in, std::ostream& out, std::ostream& err);

// Entry points: argv[first..] are the command's flags. Exit code 0 (also when some inputs were
// bad), 1 when the tokenizer does not load, 2 for bad flags.
int RunTokenize(int argc, char** argv, int first);
int RunDetokenize(int argc, char** argv, int first);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_TOKENIZE_COMMAND_H_
