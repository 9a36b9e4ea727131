// carpool-bench-embed: embeddings through the served path (C++ SDK -> carpool-router ->
// carpool-worker), unbatched (--embed-max-batch-size 1) against batched, at several
// concurrencies, plus a sweep of the batcher's max wait. Each cell runs `--seconds` of closed-loop
// load: `c` threads, each sending one embed request (one input) as soon as its last one ended.
// Prints a table (throughput in inputs/s, p50/p95 latency in ms) and, with --json, the cells.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/carpool_client.h"
#include "common/flags.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace carpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string bin_dir;
  std::string model = "synthetic:small";
  int input_tokens = 16;
  double seconds = 3;
  std::string concurrencies = "1,8,32";
  std::string waits_ms = "0,1,5,20";
  int batched_max_batch_size = 32;
  int batched_wait_ms = 5;  // the batched cells of the concurrency table
  int sweep_concurrency = 8;
  bool json = false;
};

struct Cell {
  std::string config;  // "unbatched", "batched"
  int max_batch_size = 1;
  int max_wait_ms = 0;
  int concurrency = 1;
  int64_t requests = 0;
  int64_t errors = 0;
  double inputs_per_s = 0;
  double p50_ms = 0;
  double p95_ms = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

std::vector<int> IntList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    out.push_back(std::stoi(std::string(part)));
  }
  return out;
}

// A router for the whole run; one worker at a time, restarted per batcher configuration.
class Cluster {
 public:
  Cluster(const Options& o, const std::string& tmp) : o_(o), tmp_(tmp) {}

  bool StartRouter() {
    router_ = std::make_unique<testing::Subprocess>(
        std::vector<std::string>{o_.bin_dir + "/carpool-router", "--frontend",
                                 "tcp://127.0.0.1:*", "--backend", "tcp://127.0.0.1:*"},
        tmp_ + "_router.log");
    testing::RouterEndpoints ep;
    if (!testing::WaitForRouterEndpoints(*router_, &ep)) return false;
    frontend_ = ep.frontend;
    backend_ = ep.backend;
    ClientOptions c;
    c.router_endpoint = frontend_;
    c.default_timeout_ms = 60000;
    auto client = Client::Connect(c);
    if (!client.ok()) return false;
    client_ = std::move(*client);
    return true;
  }

  // Replaces the worker with one whose batcher takes `max_batch_size` inputs, waiting at most
  // `max_wait_ms` to fill a batch; returns once it answers an embed.
  bool StartWorker(int max_batch_size, int max_wait_ms) {
    worker_.reset();  // SIGTERM: it drains and deregisters
    worker_ = std::make_unique<testing::Subprocess>(
        std::vector<std::string>{
            o_.bin_dir + "/carpool-worker", "--router", backend_, "--model", o_.model,
            "--worker-id", absl::StrCat("embed-b", max_batch_size, "-w", max_wait_ms),
            "--embed-max-batch-size", absl::StrCat(max_batch_size), "--embed-max-wait-ms",
            absl::StrCat(max_wait_ms), "--embed-queue-size", "256"},
        absl::StrCat(tmp_, "_worker_", ++workers_started_, ".log"));
    for (int i = 0; i < 400; ++i) {
      EmbedInput in;
      in.inputs.push_back({false, "", Input(0)});
      CallOptions call;
      call.timeout_ms = 2000;
      if (client_->Embed(in, call).ok()) return true;
      if (!worker_->running()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::cerr << "the worker did not serve embeddings:\n" << worker_->Log();
    return false;
  }

  // One input of o_.input_tokens token ids (byte range, so any synthetic vocabulary holds them).
  std::vector<int32_t> Input(uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> ids(o_.input_tokens);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 256);
    return ids;
  }

  Cell Run(int concurrency) {
    Cell cell;
    cell.concurrency = concurrency;
    std::atomic<bool> stop{false};
    std::atomic<int64_t> inputs{0}, errors{0};
    std::vector<std::vector<double>> latencies(concurrency);
    std::vector<std::thread> threads;
    const Clock::time_point start = Clock::now();
    for (int t = 0; t < concurrency; ++t) {
      threads.emplace_back([&, t] {
        uint64_t seed = 1000 * (t + 1);
        while (!stop.load(std::memory_order_relaxed)) {
          EmbedInput in;
          in.inputs.push_back({false, "", Input(seed++)});
          const Clock::time_point sent = Clock::now();
          absl::StatusOr<EmbedResult> r = client_->Embed(std::move(in));
          const double ms =
              std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
          if (!r.ok()) {
            errors.fetch_add(1);
            continue;
          }
          latencies[t].push_back(ms);
          inputs.fetch_add(1);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.seconds));
    stop = true;
    for (std::thread& th : threads) th.join();
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    std::vector<double> all;
    for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
    cell.requests = static_cast<int64_t>(all.size());
    cell.errors = errors.load();
    cell.inputs_per_s = static_cast<double>(inputs.load()) / elapsed;
    cell.p50_ms = Percentile(all, 0.5);
    cell.p95_ms = Percentile(all, 0.95);
    return cell;
  }

 private:
  const Options& o_;
  const std::string tmp_;
  std::unique_ptr<testing::Subprocess> router_;
  std::unique_ptr<testing::Subprocess> worker_;
  int workers_started_ = 0;
  std::string frontend_, backend_;
  std::unique_ptr<Client> client_;
};

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

void PrintCell(const Cell& c) {
  std::printf("%-10s %6d %8d %6d %10.1f %9.2f %9.2f %7lld\n", c.config.c_str(), c.max_batch_size,
              c.max_wait_ms, c.concurrency, c.inputs_per_s, c.p50_ms, c.p95_ms,
              static_cast<long long>(c.errors));
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  Options o;
  FlagParser flags;
  flags.AddString("bin-dir", &o.bin_dir,
                  "where carpool-router and carpool-worker are; none: this binary's folder");
  flags.AddString("model", &o.model, "the workers' --model");
  flags.AddInt("input-tokens", &o.input_tokens, "tokens per input");
  flags.AddDouble("seconds", &o.seconds, "load per cell");
  flags.AddString("concurrency", &o.concurrencies, "closed-loop clients per cell");
  flags.AddString("max-wait-ms", &o.waits_ms, "the sweep's --embed-max-wait-ms values");
  flags.AddInt("batch-size", &o.batched_max_batch_size, "batched --embed-max-batch-size");
  flags.AddInt("batched-wait-ms", &o.batched_wait_ms,
               "batched --embed-max-wait-ms in the concurrency table");
  flags.AddInt("sweep-concurrency", &o.sweep_concurrency, "concurrency of the sweep");
  flags.AddBool("json", &o.json, "also print JSON");
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-bench-embed: " << s.message() << "\n" << flags.Help();
    return 2;
  }
  if (o.bin_dir.empty()) {
    const std::string self = argv[0];
    o.bin_dir = self.substr(0, self.find_last_of('/'));
  }
  if (o.input_tokens < 1 || o.seconds <= 0) {
    std::cerr << "carpool-bench-embed: --input-tokens and --seconds must be > 0\n";
    return 2;
  }
  const std::string load_before = LoadAverage();
  Cluster cluster(o, absl::StrCat("/tmp/carpool_bench_embed_", getpid()));
  if (!cluster.StartRouter()) {
    std::cerr << "carpool-bench-embed: the router did not start\n";
    return 1;
  }
  std::printf("model %s, %d tokens per input, %.1f s per cell, load average %s\n",
              o.model.c_str(), o.input_tokens, o.seconds, load_before.c_str());
  std::printf("%-10s %6s %8s %6s %10s %9s %9s %7s\n", "config", "batch", "wait_ms", "conc",
              "inputs/s", "p50 ms", "p95 ms", "errors");
  std::vector<Cell> cells;
  const std::vector<int> concurrencies = IntList(o.concurrencies);
  struct Config {
    const char* name;
    int batch;
    int wait_ms;
  };
  for (const Config& config : {Config{"unbatched", 1, 0},
                               Config{"batched", o.batched_max_batch_size, o.batched_wait_ms}}) {
    if (!cluster.StartWorker(config.batch, config.wait_ms)) return 1;
    for (int c : concurrencies) {
      Cell cell = cluster.Run(c);
      cell.config = config.name;
      cell.max_batch_size = config.batch;
      cell.max_wait_ms = config.wait_ms;
      PrintCell(cell);
      cells.push_back(cell);
    }
  }
  for (int wait : IntList(o.waits_ms)) {
    if (!cluster.StartWorker(o.batched_max_batch_size, wait)) return 1;
    Cell cell = cluster.Run(o.sweep_concurrency);
    cell.config = "sweep";
    cell.max_batch_size = o.batched_max_batch_size;
    cell.max_wait_ms = wait;
    PrintCell(cell);
    cells.push_back(cell);
  }
  // The target: batched at concurrency 8 against unbatched at 8.
  const Cell* unbatched = nullptr;
  const Cell* batched = nullptr;
  for (const Cell& c : cells) {
    if (c.concurrency != 8) continue;
    if (c.config == std::string("unbatched")) unbatched = &c;
    if (c.config == std::string("batched")) batched = &c;
  }
  if (unbatched != nullptr && batched != nullptr && unbatched->inputs_per_s > 0 &&
      unbatched->p95_ms > 0) {
    std::printf(
        "concurrency 8: batched/unbatched throughput %.2fx (target >= 2.5x), p95 %.2fx of "
        "unbatched (target <= 1.5x)\n",
        batched->inputs_per_s / unbatched->inputs_per_s, batched->p95_ms / unbatched->p95_ms);
  }
  std::printf("load average after: %s\n", LoadAverage().c_str());
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Cell& c : cells) {
      j.push_back({{"config", c.config}, {"max_batch_size", c.max_batch_size},
                   {"max_wait_ms", c.max_wait_ms}, {"concurrency", c.concurrency},
                   {"inputs_per_s", c.inputs_per_s}, {"p50_ms", c.p50_ms},
                   {"p95_ms", c.p95_ms}, {"requests", c.requests}, {"errors", c.errors}});
    }
    std::cout << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace carpool::bench

int main(int argc, char** argv) { return carpool::bench::Main(argc, argv); }
