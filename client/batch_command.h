// `carpool batch`: batch jobs on a carpool router (docs/batch.md, docs/cli.md):
//   carpool batch submit FILE.jsonl [--endpoint URL] [--wait] [--output OUT.jsonl]
//   carpool batch status ID [--wait] | results ID [--errors] | cancel ID | list
// With --wait a progress bar (requests answered of the total) on a terminal, a line per change
// otherwise.
#ifndef CARPOOL_CLIENT_BATCH_COMMAND_H_
#define CARPOOL_CLIENT_BATCH_COMMAND_H_

#include <string>

#include "client/carpool_client.h"
#include "nlohmann/json.hpp"

namespace carpool::client {

// A batch as OpenAI's JSON object (the fields BatchInfo holds; null for what is not set).
nlohmann::json BatchInfoToJson(const BatchInfo& batch);

// "batch_1  in_progress  12/30 done (1 failed)  /v1/chat/completions": one line per batch.
std::string BatchLine(const BatchInfo& batch);

// The progress bar of `batch` (answered = completed + failed of total), `width` cells wide:
// "[#######.............]  12/30  in_progress".
std::string ProgressBar(const BatchInfo& batch, int width = 30);

// Entry point: argv[first] is the batch subcommand, argv[first + 1..] its arguments. Returns the
// process exit code: 0 ok; 1 the router refused or failed the call, or the batch waited for ended
// failed, expired or cancelled (the status is named); 2 bad flags or an unreadable file.
int RunBatch(int argc, char** argv, int first);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_BATCH_COMMAND_H_
