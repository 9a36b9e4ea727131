// The `carpool` command line: subcommands over an in-process engine or a carpool cluster.
#include <cstring>
#include <iostream>

#include "client/batch_command.h"
#include "client/bench_serve_command.h"
#include "client/chat_template_command.h"
#include "client/embed_command.h"
#include "client/generate_command.h"
#include "client/status_command.h"
#include "client/tokenize_command.h"

namespace {

constexpr char kUsage[] =
    "usage: carpool <command> [flags]\n"
    "commands:\n"
    "  generate   run prompts through an in-process engine (--model) or a carpool router\n"
    "             (--router tcp://host:port)            (carpool generate --help)\n"
    "  embed      embeddings of texts or token ids through a carpool router\n"
    "             (--router tcp://host:port)            (carpool embed --help)\n"
    "  tokenize   text to token ids with a model's tokenizer (--tokenizer PATH)\n"
    "             (carpool tokenize --help)\n"
    "  detokenize token ids to text with a model's tokenizer (carpool detokenize --help)\n"
    "  chat-template  the prompt a model's chat template makes of a conversation\n"
    "             (--model DIR --messages-file F.json)  (carpool chat-template --help)\n"
    "  status     show a router's workers, queue and totals (carpool status --help)\n"
    "  batch      batch jobs on a router: submit FILE.jsonl [--wait], status ID, results ID,\n"
    "             cancel ID, list                       (carpool batch --help)\n"
    "  bench      serving benchmark against a router: carpool bench serve (--help)\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "generate") == 0) return carpool::client::RunGenerate(argc, argv, 2);
  if (std::strcmp(argv[1], "embed") == 0) return carpool::client::RunEmbed(argc, argv, 2);
  if (std::strcmp(argv[1], "tokenize") == 0) return carpool::client::RunTokenize(argc, argv, 2);
  if (std::strcmp(argv[1], "detokenize") == 0) {
    return carpool::client::RunDetokenize(argc, argv, 2);
  }
  if (std::strcmp(argv[1], "chat-template") == 0) {
    return carpool::client::RunChatTemplate(argc, argv, 2);
  }
  if (std::strcmp(argv[1], "status") == 0) return carpool::client::RunStatus(argc, argv, 2);
  if (std::strcmp(argv[1], "batch") == 0) return carpool::client::RunBatch(argc, argv, 2);
  if (std::strcmp(argv[1], "bench") == 0) return carpool::client::RunBench(argc, argv, 2);
  std::cerr << "carpool: unknown command '" << argv[1] << "'\n" << kUsage;
  return 2;
}
