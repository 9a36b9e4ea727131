// The load generator of `carpool bench serve`: releases a workload's requests on an arrival
// schedule (all at once, Poisson or gamma), keeps at most max_concurrency in flight, and times
// what each request sees. The transport is a RequestSender: the C++ SDK (NewZmqSender) in the
// CLI, a fake in tests.
#ifndef CARPOOL_CLIENT_BENCH_SERVE_RUNNER_H_
#define CARPOOL_CLIENT_BENCH_SERVE_RUNNER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/bench_serve.h"
#include "client/carpool_client.h"

namespace carpool::client::bench {

// What the server reported for one finished request.
struct SendResult {
  int prompt_tokens = 0;      // 0: unknown (the client's count is used)
  int completion_tokens = 0;  // 0: unknown (the tokens counted in chunks are used)
};

// Sends one request and waits for its end. Thread-safe: the runner calls Send from as many
// threads as there are requests in flight.
class RequestSender {
 public:
  virtual ~RequestSender() = default;
  // Runs `request` to its end, calling on_chunk(n) on the calling thread as each chunk of n
  // tokens arrives. An error is the request's failure (it is counted, not retried).
  virtual absl::StatusOr<SendResult> Send(const BenchRequest& request,
                                          const std::function<void(int num_tokens)>& on_chunk) = 0;
};

struct RunnerOptions {
  // Requests per second; +inf sends them all at once. Default: +inf.
  double request_rate = std::numeric_limits<double>::infinity();
  // Shape of the gamma-distributed gaps; 1 is Poisson (ArrivalOffsets). Default: 1.
  double burstiness = 1;
  // Most requests in flight; a released request waits for a slot, and its times count from
  // when it is sent. 0: unlimited. Default: 0.
  int max_concurrency = 0;
  // Seeds the arrival schedule. Default: 0.
  uint64_t seed = 0;
  // Requests sent one at a time before the run (the workload's first ones), not measured.
  // Default: 0.
  int num_warmups = 0;
  // Where to draw a progress bar (redrawn in place a few times a second); null: none.
  // Default: null.
  std::ostream* progress = nullptr;

  absl::Status Validate() const;
};

struct RunResult {
  std::vector<RequestOutcome> outcomes;  // in workload order
  double duration_s = 0;                 // from the first release to the last final
};

// Runs the workload to the end (every request succeeds or fails). Uses one thread per request
// in flight. REQUIRES: options.Validate() is OK.
RunResult RunWorkload(const std::vector<BenchRequest>& requests, RequestSender* sender,
                      const RunnerOptions& options);

struct ZmqSenderOptions {
  // Per request, from send to final. Default: 600000 (10 minutes).
  int64_t timeout_ms = 600'000;
  // Sampling of every request. Default: greedy, ignore_eos (so output lengths are the
  // workload's).
  float temperature = 0;
  bool ignore_eos = true;
};

// A RequestSender over carpool::Client: streaming generate, max_tokens = output_len. `client`
// is not owned and must outlive the sender.
std::unique_ptr<RequestSender> NewZmqSender(Client* client, const ZmqSenderOptions& options);

struct HttpSenderOptions {
  // The gateway's base URL (carpool-router --http). Default: http://127.0.0.1:8000.
  std::string url = "http://127.0.0.1:8000";
  // Sent as "model" when not empty; the gateway takes the served model otherwise. Default: "".
  std::string model;
  // Sent as "Authorization: Bearer KEY" when not empty. Default: "".
  std::string api_key;
  // Per request, read and write timeouts (whole seconds). Default: 600000.
  int64_t timeout_ms = 600'000;
  float temperature = 0;
  bool ignore_eos = true;
};

// A RequestSender over the OpenAI-compatible HTTP gateway: POST /v1/completions with
// stream: true, one keep-alive connection per request in flight; chunks are the SSE events.
std::unique_ptr<RequestSender> NewHttpSender(const HttpSenderOptions& options);

}  // namespace carpool::client::bench

#endif  // CARPOOL_CLIENT_BENCH_SERVE_RUNNER_H_
