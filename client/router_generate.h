// `carpool generate --router ENDPOINT`: the prompts go to a carpool router through the SDK and
// come back as the same output the in-process mode prints.
#ifndef CARPOOL_CLIENT_ROUTER_GENERATE_H_
#define CARPOOL_CLIENT_ROUTER_GENERATE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "client/carpool_client.h"

namespace carpool::client {

struct RouterGenerateOptions {
  ClientOptions client;
  CallOptions call;
  // One per prompt, in input order; a prompt that failed to parse keeps its error.
  std::vector<absl::StatusOr<GenerateInput>> requests;
  // --prompts-file: one JSON line per prompt in input order, errors in place, exit status 1 if
  // any failed. Otherwise one prompt, whose failure prints to stderr. Default: false.
  bool batch_mode = false;
  // Print JSON (always on in batch mode). Default: false.
  bool json = false;
  // Stream on the wire; without json (single prompt), print text as it arrives. Default: false.
  bool stream = false;
  // Batch mode: requests in flight at once. Default: 8.
  int concurrency = 8;
  // Top alternatives per token to print ("top_logprobs" when > 0). Default: 0.
  int top_logprobs = 0;
};

// Runs the requests and prints their results. Returns the process exit code: 0 ok; 1 a request
// failed at the router (overloaded, unavailable, timed out, ...) or a batch line failed; 2 a
// request was invalid or the client could not start.
int RunRouterGenerate(RouterGenerateOptions options);

}  // namespace carpool::client

#endif  // CARPOOL_CLIENT_ROUTER_GENERATE_H_
