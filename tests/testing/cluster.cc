#include "tests/testing/cluster.h"

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace carpool::testing {

int64_t NowMs() { return Clock::Real()->NowMicros() / 1000; }

std::string LoopbackEndpoint(int port) {
  return port == 0 ? std::string("tcp://127.0.0.1:*") : absl::StrCat("tcp://127.0.0.1:", port);
}

void StartRouterProcess(const std::string& bin_dir, const std::string& frontend,
                        const std::string& backend, const std::vector<std::string>& extra,
                        const std::string& log_path, std::unique_ptr<Subprocess>* router,
                        RouterEndpoints* ep) {
  std::vector<std::string> argv = {bin_dir + "/carpool-router", "--frontend", frontend, "--backend",
                                   backend};
  argv.insert(argv.end(), extra.begin(), extra.end());
  *router = std::make_unique<Subprocess>(argv, log_path);
  ASSERT_TRUE(WaitForRouterEndpoints(**router, ep)) << (*router)->Log();
}

std::vector<std::string> WorkerArgv(const std::string& bin_dir, const std::string& routers,
                                    const std::string& name, int max_model_len,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {bin_dir + "/carpool-worker",
                                   "--router",
                                   routers,
                                   "--model",
                                   "synthetic:tiny",
                                   "--worker-id",
                                   name,
                                   "--max-model-len",
                                   absl::StrCat(max_model_len)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::unique_ptr<Client> ConnectClient(const ClientOptions& options) {
  auto c = Client::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

int64_t WaitForStats(Client* c, const std::function<bool(const StatsOut&)>& done,
                     int64_t timeout_ms, int poll_ms, int64_t stats_timeout_ms) {
  const int64_t start = NowMs();
  while (NowMs() - start < timeout_ms) {
    absl::StatusOr<StatsOut> s = c->Stats(stats_timeout_ms);
    if (s.ok() && done(*s)) return NowMs() - start;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return -1;
}

std::vector<int32_t> RandomPromptIds(std::mt19937& rng, int min_len, int max_len) {
  std::uniform_int_distribution<int> len(min_len, max_len), tok(0, 255);
  std::vector<int32_t> ids = {256};
  for (int j = len(rng); j > 0; --j) ids.push_back(tok(rng));
  return ids;
}

absl::StatusOr<std::unique_ptr<worker::Engine>> SyntheticTinyEngine(int max_model_len) {
  worker::EngineOptions o;
  o.model = "synthetic:tiny";
  o.scheduler.max_model_len = max_model_len;
  o.enable_prefix_caching = false;
  return worker::Engine::Create(o);
}

std::vector<std::vector<int32_t>> InProcessTokens(std::vector<worker::EngineRequest> requests,
                                                  int max_model_len) {
  auto engine = SyntheticTinyEngine(max_model_len);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::vector<std::vector<int32_t>> out;
  for (auto& c : (*engine)->Generate(std::move(requests))) {
    EXPECT_TRUE(c.ok()) << c.status();
    out.push_back(c.ok() ? c->tokens : std::vector<int32_t>());
  }
  return out;
}

}  // namespace carpool::testing
