// carpool-soak: a long run of a local cluster at a steady fraction of its capacity while one
// worker is killed (kill -9) and restarted every --kill-every-s. Prints requests completed,
// refused by reason, lost (ended with neither a result nor a typed error; must be 0), broken
// streams (a gap or a duplicate; must be 0), and the router's RSS and open descriptors at the
// start and the end. Writes the same as JSON with --json.
//
//   carpool-soak [--duration-s 600] [--load 0.7] [--workers 2] [--kill-every-s 60]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/carpool_client.h"
#include "common/clock.h"
#include "common/flags.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace {

using carpool::testing::Subprocess;

int64_t NowMs() { return carpool::Clock::Real()->NowMicros() / 1000; }

struct ProcStats {
  int64_t rss_kib = 0;
  int fds = 0;
};

ProcStats Measure(pid_t pid) {
  ProcStats s;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kib = std::stoll(line.substr(6));
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); ++it) {
    ++s.fds;
  }
  return s;
}

struct Tally {
  std::mutex mu;
  int64_t sent = 0, completed = 0, lost = 0, broken = 0, tokens = 0;
  std::map<std::string, int64_t> refused;
  std::vector<double> latency_ms;
};

// One request: a streaming call whose chunks must arrive in order without gaps.
void RunOne(carpool::Client* client, std::mt19937_64& rng, int prompt_len, int max_tokens,
            Tally* tally) {
  carpool::GenerateInput g;
  g.token_ids.push_back(256);
  for (int i = 1; i < prompt_len; ++i) g.token_ids.push_back(static_cast<int32_t>(rng() % 256));
  g.sampling.max_tokens = max_tokens;
  g.sampling.temperature = 0.8f;
  g.sampling.ignore_eos = true;
  int next = 0;
  bool in_order = true;
  const int64_t start = NowMs();
  auto r = client->GenerateStream(g, [&](const carpool::GenerateChunkOut& c) {
    in_order &= c.index == next;
    next += static_cast<int>(c.tokens.size());
  });
  std::lock_guard<std::mutex> lock(tally->mu);
  ++tally->sent;
  if (r.ok()) {
    ++tally->completed;
    tally->tokens += next;
    tally->latency_ms.push_back(static_cast<double>(NowMs() - start));
    if (!in_order || next != max_tokens) ++tally->broken;
    return;
  }
  const std::string reason = carpool::ErrorReason(r.status());
  // No deadline is set, so DEADLINE_EXCEEDED is the client's own timeout: nothing came back.
  if (reason.empty() || absl::IsDeadlineExceeded(r.status())) {
    ++tally->lost;
    std::cerr << "carpool-soak: lost: " << r.status() << "\n";
  } else {
    ++tally->refused[reason];
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t duration_s = 600, kill_every_s = 60, calibrate_s = 10;
  double load = 0.7;
  int workers = 2, prompt_len = 48, max_tokens = 32, threads = 64;
  std::string model = "synthetic:tiny", json_path, log_dir;
  bool help = false;
  carpool::FlagParser flags;
  flags.AddInt64("duration-s", &duration_s, "length of the loaded run");
  flags.AddInt64("kill-every-s", &kill_every_s,
                 "kill -9 and restart one worker this often; 0 never");
  flags.AddInt64("calibrate-s", &calibrate_s, "closed-loop run measuring capacity");
  flags.AddDouble("load", &load, "fraction of the measured capacity to offer");
  flags.AddInt("workers", &workers, "carpool-worker processes");
  flags.AddString("model", &model, "the workers' --model");
  flags.AddInt("prompt-len", &prompt_len, "prompt tokens per request");
  flags.AddInt("max-tokens", &max_tokens, "tokens generated per request");
  flags.AddInt("threads", &threads, "client threads (bounds concurrency)");
  flags.AddString("json", &json_path, "also write the results here");
  flags.AddString("log-dir", &log_dir, "router and worker logs; none: a temp folder");
  flags.AddBool("help", &help, "show this help");
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-soak: " << s.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << "usage: carpool-soak [flags]\n" << flags.Help();
    return 0;
  }
  const std::string bin = std::filesystem::canonical("/proc/self/exe").parent_path().string();
  if (log_dir.empty()) {
    log_dir = (std::filesystem::temp_directory_path() / ("carpool_soak_" + std::to_string(getpid())))
                  .string();
  }
  std::filesystem::create_directories(log_dir);

  Subprocess router({bin + "/carpool-router", "--frontend", "tcp://127.0.0.1:*", "--backend",
                     "tcp://127.0.0.1:*"},
                    log_dir + "/router.log");
  if (!router.WaitForLog("backend tcp://", 10000)) {
    std::cerr << "carpool-soak: the router did not start:\n" << router.Log();
    return 1;
  }
  std::smatch m;
  const std::string text = router.Log();
  std::regex_search(text, m, std::regex("frontend (tcp://[0-9.:]+), backend (tcp://[0-9.:]+)"));
  const std::string frontend = m[1], backend = m[2];
  std::vector<std::unique_ptr<Subprocess>> procs(workers);
  const auto start_worker = [&](int i) {
    procs[i] = std::make_unique<Subprocess>(
        std::vector<std::string>{bin + "/carpool-worker", "--router", backend, "--model", model,
                                 "--worker-id", absl::StrCat("soak-w", i), "--threads", "1"},
        absl::StrCat(log_dir, "/worker", i, ".log"));
  };
  for (int i = 0; i < workers; ++i) start_worker(i);

  carpool::ClientOptions co;
  co.router_endpoint = frontend;
  co.default_timeout_ms = 30000;
  co.max_retries = 3;
  auto client = carpool::Client::Connect(co);
  if (!client.ok()) return 1;
  for (int i = 0; i < 500; ++i) {
    auto s = (*client)->Stats(500);
    if (s.ok() && static_cast<int>(s->workers.size()) == workers) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // Capacity: requests per second with every client thread busy.
  double capacity = 0;
  {
    Tally t;
    std::atomic<bool> stop{false};
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&, i] {
        std::mt19937_64 rng(i);
        while (!stop.load()) RunOne(client->get(), rng, prompt_len, max_tokens, &t);
      });
    }
    std::this_thread::sleep_for(std::chrono::seconds(calibrate_s));
    stop = true;
    for (auto& th : pool) th.join();
    capacity = static_cast<double>(t.completed) / static_cast<double>(calibrate_s);
  }
  const double rate = std::max(1.0, capacity * load);
  std::cout << "carpool-soak: capacity " << capacity << " requests/s; offering " << rate
            << " requests/s for " << duration_s << " s, killing a worker every " << kill_every_s
            << " s\n";
  const ProcStats before = Measure(router.pid());

  // The loaded run: Poisson arrivals handed to the client threads.
  Tally tally;
  std::mutex arrivals_mu;
  std::mt19937_64 arrival_rng(7);
  std::exponential_distribution<double> gap(rate);
  const int64_t run_start = NowMs();
  const int64_t run_end = run_start + duration_s * 1000;
  double next_arrival_ms = static_cast<double>(run_start);
  std::atomic<int64_t> late{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      std::mt19937_64 rng(1000 + i);
      for (;;) {
        int64_t at;
        {
          std::lock_guard<std::mutex> lock(arrivals_mu);
          at = static_cast<int64_t>(next_arrival_ms);
          next_arrival_ms += gap(arrival_rng) * 1000.0;
        }
        if (at >= run_end) return;
        const int64_t wait = at - NowMs();
        if (wait > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(wait));
        } else if (wait < -100) {
          late.fetch_add(1);
        }
        RunOne(client->get(), rng, prompt_len, max_tokens, &tally);
      }
    });
  }
  int kills = 0;
  for (int64_t next_kill = run_start + kill_every_s * 1000;
       kill_every_s > 0 && next_kill < run_end; next_kill += kill_every_s * 1000) {
    while (NowMs() < next_kill) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int victim = kills % workers;
    procs[victim]->Signal(SIGKILL);
    procs[victim]->Wait(5000);
    start_worker(victim);
    ++kills;
    std::cout << "carpool-soak: killed and restarted worker " << victim << " at "
              << (NowMs() - run_start) / 1000 << " s\n";
  }
  for (auto& th : pool) th.join();
  const ProcStats after = Measure(router.pid());
  auto stats = (*client)->Stats(2000);

  std::sort(tally.latency_ms.begin(), tally.latency_ms.end());
  const auto pct = [&](double p) {
    return tally.latency_ms.empty()
               ? 0.0
               : tally.latency_ms[static_cast<size_t>(p * (tally.latency_ms.size() - 1))];
  };
  int64_t refused_total = 0;
  for (const auto& [r, n] : tally.refused) refused_total += n;
  const double growth = before.rss_kib > 0 ? 100.0 * (after.rss_kib - before.rss_kib) /
                                                 static_cast<double>(before.rss_kib)
                                           : 0;
  std::cout << "\n| metric | value |\n| --- | --- |\n"
            << "| duration | " << duration_s << " s |\n"
            << "| offered load | " << rate << " req/s (" << load * 100 << "% of " << capacity
            << ") |\n"
            << "| workers killed and restarted | " << kills << " |\n"
            << "| requests sent | " << tally.sent << " |\n"
            << "| completed | " << tally.completed << " |\n"
            << "| refused | " << refused_total << " |\n";
  for (const auto& [r, n] : tally.refused) std::cout << "| refused: " << r << " | " << n << " |\n";
  std::cout << "| lost (no result, no typed error) | " << tally.lost << " |\n"
            << "| broken streams (gap or duplicate) | " << tally.broken << " |\n"
            << "| latency p50 / p99 | " << pct(0.5) << " / " << pct(0.99) << " ms |\n"
            << "| migrations (router) | " << (stats.ok() ? stats->migrations : -1) << " |\n"
            << "| router RSS start / end | " << before.rss_kib << " / " << after.rss_kib
            << " KiB (" << growth << "%) |\n"
            << "| router open fds start / end | " << before.fds << " / " << after.fds << " |\n"
            << "| arrivals more than 100 ms late | " << late.load() << " |\n";
  if (!json_path.empty()) {
    nlohmann::json j = {{"duration_s", duration_s},
                        {"capacity_rps", capacity},
                        {"offered_rps", rate},
                        {"kills", kills},
                        {"sent", tally.sent},
                        {"completed", tally.completed},
                        {"refused", tally.refused},
                        {"lost", tally.lost},
                        {"broken", tally.broken},
                        {"latency_p50_ms", pct(0.5)},
                        {"latency_p99_ms", pct(0.99)},
                        {"migrations", stats.ok() ? stats->migrations : -1},
                        {"router_rss_kib_start", before.rss_kib},
                        {"router_rss_kib_end", after.rss_kib},
                        {"router_fds_start", before.fds},
                        {"router_fds_end", after.fds}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  client->reset();
  procs.clear();
  return tally.lost == 0 && tally.broken == 0 ? 0 : 1;
}
