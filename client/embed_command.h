// `carpool embed --router ENDPOINT`: embeddings of text or token-id inputs through a carpool
// router, printed one line per input or as an OpenAI-style JSON document.
#ifndef CARPOOL_CLIENT_EMBED_COMMAND_H_
#define CARPOOL_CLIENT_EMBED_COMMAND_H_

#include "client/carpool_client.h"
#include "nlohmann/json.hpp"

namespace carpool::client {

// {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}, ...],
//  "usage": {"prompt_tokens": n, "total_tokens": n}}.
nlohmann::json EmbedResultToJson(const EmbedResult& result);

// Entry point: argv[first..] are the command's flags. Returns the process exit code: 0 ok;
// 1 the request failed at the router (overloaded, unavailable, timed out, ...); 2 bad flags, an
// invalid request, or the client could not start.
int RunEmbed(int argc, char** argv, int first);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_EMBED_COMMAND_H_
