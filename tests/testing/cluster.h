// Helpers for the tests that run carpool-router and carpool-worker processes on loopback ports
// and drive them through the C++ SDK (tests/integration: cluster_test, failover_test,
// two_routers_test): starting the processes, connecting, waiting on the router's stats, random
// prompts, and the no-fault tokens from an in-process engine.
#ifndef CARPOOL_TESTS_TESTING_CLUSTER_H_
#define CARPOOL_TESTS_TESTING_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/carpool_client.h"
#include "tests/testing/subprocess.h"
#include "worker/engine.h"

namespace carpool::testing {

// Milliseconds on the real clock.
int64_t NowMs();

// "tcp://127.0.0.1:<port>"; port 0 gives "tcp://127.0.0.1:*" (the process picks one).
std::string LoopbackEndpoint(int port);

// Starts <bin_dir>/carpool-router --frontend <frontend> --backend <backend> <extra...> with its
// output in log_path into *router, and waits for it to log its endpoints into *ep. A failed
// wait is a fatal failure (with the router's log); callers that must stop then wrap the call in
// ASSERT_NO_FATAL_FAILURE.
void StartRouterProcess(const std::string& bin_dir, const std::string& frontend,
                        const std::string& backend, const std::vector<std::string>& extra,
                        const std::string& log_path, std::unique_ptr<Subprocess>* router,
                        RouterEndpoints* ep);

// The command line of a synthetic:tiny worker: <bin_dir>/carpool-worker --router <routers>
// --model synthetic:tiny --worker-id <name> --max-model-len <max_model_len> <extra...>. Flags in
// `extra` come last, so they override the ones before (e.g. another --model).
std::vector<std::string> WorkerArgv(const std::string& bin_dir, const std::string& routers,
                                    const std::string& name, int max_model_len,
                                    const std::vector<std::string>& extra);

// Client::Connect(options); a failure is a test failure (with its status) and gives nullptr.
std::unique_ptr<Client> ConnectClient(const ClientOptions& options);

// Polls c->Stats(stats_timeout_ms) every poll_ms until `done` holds for an answer. The ms it
// took, or -1 when timeout_ms passes first.
int64_t WaitForStats(Client* c, const std::function<bool(const StatsOut&)>& done,
                     int64_t timeout_ms, int poll_ms, int64_t stats_timeout_ms);

// A prompt as the cluster tests send it: token 256 (BOS of the synthetic models), then a length
// drawn uniformly from [min_len, max_len], then that many tokens drawn uniformly from [0, 255].
// Draws from `rng` in that order, so callers that draw more after it keep their sequences.
std::vector<int32_t> RandomPromptIds(std::mt19937& rng, int min_len, int max_len);

// An in-process synthetic:tiny engine with max_model_len and no prefix caching: what the
// workers the helpers above start run.
absl::StatusOr<std::unique_ptr<worker::Engine>> SyntheticTinyEngine(int max_model_len);

// The no-fault run: every request through one SyntheticTinyEngine(max_model_len), batched. The
// tokens of each, in order; a request that fails is a test failure and gives no tokens.
std::vector<std::vector<int32_t>> InProcessTokens(std::vector<worker::EngineRequest> requests,
                                                  int max_model_len);

}  // namespace carpool::testing

#endif  // CARPOOL_TESTS_TESTING_CLUSTER_H_
