// carpool-bench-fleet: what one router costs as the fleet behind it grows (issue 19). For each
// fleet size N and placement policy it starts carpool-router (a subprocess on 127.0.0.1
// ephemeral ports) and N simulated workers in this process (router/testing/sim_fleet.h), waits
// until every worker registered and its cached blocks reached the router's prefix index, then
// measures:
//   idle     router CPU (utime + stime, /proc/<pid>/stat) while N workers only heartbeat, as a
//            share of one core (10 ms ticks: use several seconds); for the first policy
//            again at --alt-heartbeat-ms (a fresh router, its heartbeat timeout 5 times
//            that), which splits it into a cost per heartbeat and a fixed part (the router's
//            periodic passes over its workers);
//   load     requests/s through the router from several clients keeping many minimal requests
//            in flight (a short prompt, max_tokens 1), and router CPU per request (all its
//            threads, and of it the ZeroMQ I/O threads', /proc/<pid>/task/*/stat), and this
//            process's CPU per request in the same run (the fleet and the clients, getrusage);
//   latency  p50 / p99 round trip of one request at a time (the fleet answers at once with
//            --step-ms 0, so this is client -> router -> worker -> router -> client);
// and, in process, without sockets, the router's per-request placement work at N workers, the
// router's way (its model's placement index, router/placement_index.h: GenerateKind::PlaceAmong,
// with the prefix match against an index of N x --cached-blocks hashes) and, for reference, the
// linear way it replaced (the worker list, the placement view with every worker's prefix match,
// the policy's Place over the snapshots); the index's update when a worker's load changes; one
// admission cycle (Admit, Next, MarkDispatched, Release), in ns per call; embed placement the
// same two ways (EmbedKind::PlaceAmong by the index's embed lane, and the linear default:
// EmbedKind::Place's snapshot of every worker, then Place) over N workers with
// embed_queue_size 64 and random embed inputs held, for requests of 1 to 32 inputs, and the
// index's update when such a worker's load changes; the loop's periodic housekeeping pass over
// the workers; and the prefix index's memory.
// Everything runs on one machine: the fleet and the clients share its cores with the router.
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/block_hash.h"
#include "common/codec.h"
#include "common/flags.h"
#include "common/transport.h"
#include "nlohmann/json.hpp"
#include "router/admission.h"
#include "router/embed_kind.h"
#include "router/generate_kind.h"
#include "router/placement.h"
#include "router/prefix_index.h"
#include "router/router_stats.h"
#include "router/testing/sim_fleet.h"
#include "router/testing/sim_worker.h"
#include "router/worker_registry.h"
#include "tests/testing/subprocess.h"

namespace carpool::bench {
namespace {

using Clock = std::chrono::steady_clock;
using router::PlacementPolicy;

struct Config {
  std::vector<int> workers;
  std::vector<PlacementPolicy> policies;
  int cached_blocks = 10000;
  int num_kv_blocks = 16384;
  int max_num_seqs = 64;
  int heartbeat_ms = 200;
  int alt_heartbeat_ms = 2000;  // 0: none
  int step_ms = 0;
  int threads = 2;
  int router_lost_ms = 2000;  // the fleet's ZMTP heartbeats, as the worker's; 0: none
  double idle_seconds = 5;
  int requests = 20000;
  int clients = 4;
  int window = 64;
  int latency_requests = 500;
  int prompt_tokens = 33;
  int micro_iterations = 20000;
  int hot_holders = 8;
  bool micro_only = false;
  std::string bin_dir;
  int io_threads = 1;  // the router's --io-threads
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// utime + stime in a /proc .../stat file, in seconds; -1 when unreadable. `comm`, when given,
// gets the command (a thread's name).
double StatCpuSeconds(const std::string& path, std::string* comm = nullptr) {
  std::ifstream f(path);
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t open = stat.find('(');
  const size_t close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return -1;
  if (comm != nullptr) *comm = stat.substr(open + 1, close - open - 1);
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  // Fields after the command: state is field 3; utime and stime are fields 14 and 15.
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// utime + stime of `pid`, every thread, in seconds; -1 when unreadable.
double CpuSeconds(pid_t pid) { return StatCpuSeconds(absl::StrCat("/proc/", pid, "/stat")); }

// This process's user + system CPU in seconds (every thread: the fleet's and the clients').
double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// utime + stime of `pid`'s ZeroMQ I/O threads (named "ZMQbg/IO/<k>"), in seconds: the sockets'
// own work (TCP reads and writes, ZMTP framing) besides the router's loop.
double ZmqIoCpuSeconds(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  double total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string comm;
    const double cpu = StatCpuSeconds(entry.path().string() + "/stat", &comm);
    if (cpu >= 0 && comm.rfind("ZMQbg/IO", 0) == 0) total += cpu;
  }
  return total;
}

// Bytes this process has allocated from malloc now.
int64_t HeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// VmRSS of `pid` ("self" for this process), in bytes.
int64_t RssBytes(const std::string& pid) {
  std::ifstream f("/proc/" + pid + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

std::vector<int32_t> PromptFor(uint64_t n, int length) {
  std::vector<int32_t> p;
  uint64_t x = n * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < length; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p.push_back(1 + static_cast<int32_t>(x % 255));
  }
  return p;
}

std::string MinimalRequest(const std::string& id, uint64_t n, int prompt_tokens) {
  GenerateInput g;
  g.request_id = id;
  g.token_ids = PromptFor(n, prompt_tokens);
  g.sampling.max_tokens = 1;
  g.sampling.temperature = 0;
  return Encode(ClientMessage(g));
}

// ---- end to end

struct EndToEnd {
  bool ok = false;
  std::string error;
  double register_s = 0;           // until every worker's cached blocks were in the index
  int64_t router_rss_delta = 0;    // router RSS after registration less before, bytes
  double idle_core_share = 0;      // router CPU / wall while the fleet heartbeats
  double idle_core_share_alt = 0;  // the same at Config::alt_heartbeat_ms; 0: not measured
  double rps = 0;
  double router_us_per_request = 0;
  double router_io_us_per_request = 0;  // of it, the ZeroMQ I/O threads'
  // This process's CPU in the same run (the fleet's workers and the clients), per request.
  double fleet_clients_us_per_request = 0;
  int64_t refused = 0;             // requests answered with an error under load
  double p50_us = 0, p99_us = 0;
};

// One client keeping `window` requests in flight until `n` are answered; false on a timeout.
bool ClosedLoop(const std::string& frontend, int client, int n, int window, int prompt_tokens,
                std::atomic<int64_t>* refused) {
  zmq::context_t ctx(1);
  auto s = Socket::Create(&ctx, zmq::socket_type::dealer, SocketOptions());
  if (!s.ok() || !(*s)->Connect(frontend).ok()) return false;
  int sent = 0, done = 0;
  while (done < n) {
    while (sent < n && sent - done < window) {
      const uint64_t tag = (static_cast<uint64_t>(client) << 32) | static_cast<uint64_t>(sent);
      if (!(*s)->Send({MinimalRequest(absl::StrCat("c", client, "-", sent), tag,
                                      prompt_tokens)}).ok()) {
        return false;
      }
      ++sent;
    }
    auto reply = (*s)->Recv(10000);
    if (!reply.ok() || !reply->has_value()) return false;
    auto m = DecodeServerMessage((*reply)->back());
    if (m.ok() && std::holds_alternative<ErrorInfo>(*m)) ++*refused;
    ++done;
  }
  return true;
}

// Starts n simulated workers heartbeating every heartbeat_ms and waits until all registered and
// their cached blocks are in the router's index; null with `error` set when they are not.
std::unique_ptr<router::testing::SimFleet> StartFleet(const Config& c, int n, int heartbeat_ms,
                                                      const testing::RouterEndpoints& ep,
                                                      std::string* error) {
  router::testing::SimFleetOptions fo;
  fo.router = ep.backend;
  fo.workers = n;
  fo.max_num_seqs = c.max_num_seqs;
  fo.num_kv_blocks = c.num_kv_blocks;
  fo.cached_blocks = c.cached_blocks;
  fo.step_ms = c.step_ms;
  fo.heartbeat_ms = heartbeat_ms;
  fo.threads = c.threads;
  fo.router_lost_ms = c.router_lost_ms;
  const auto t0 = Clock::now();
  auto fleet = router::testing::SimFleet::Start(fo);
  if (!fleet.ok()) {
    *error = std::string(fleet.status().message());
    return nullptr;
  }
  if (!(*fleet)->WaitRegistered(120'000)) {
    *error = "the fleet did not register";
    return nullptr;
  }
  const int64_t want = int64_t{n} * c.cached_blocks;
  for (;;) {
    const StatsOut s = router::testing::QueryStats(ep.frontend);
    int64_t blocks = 0;
    for (const WorkerStatsOut& w : s.workers) blocks += w.cached_prefix_blocks;
    if (static_cast<int>(s.workers.size()) == n && blocks == want) break;
    if (Seconds(Clock::now() - t0) > 180) {
      *error = absl::StrCat("the index holds ", blocks, " of ", want, " blocks");
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::move(*fleet);
}

// The router's CPU over `seconds` of wall time, as a share of one core (after a short settle).
double IdleShare(pid_t pid, double seconds) {
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double cpu0 = CpuSeconds(pid);
  const auto w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return (CpuSeconds(pid) - cpu0) / Seconds(Clock::now() - w0);
}

// `alt_heartbeat`: afterwards, the idle share again with a fleet heartbeating every
// c.alt_heartbeat_ms, so the cost splits into per-heartbeat and fixed parts.
EndToEnd RunEndToEnd(const Config& c, int n, PlacementPolicy policy, bool alt_heartbeat) {
  EndToEnd r;
  const std::string tmp = absl::StrCat("/tmp/carpool_bench_fleet_", getpid(), "_", n, "_",
                                       router::PlacementPolicyName(policy));
  testing::Subprocess router({c.bin_dir + "/carpool-router", "--frontend", "tcp://127.0.0.1:*",
                              "--backend", "tcp://127.0.0.1:*", "--placement",
                              router::PlacementPolicyName(policy), "--io-threads",
                              absl::StrCat(c.io_threads)},
                             tmp + "_router.log");
  testing::RouterEndpoints ep;
  if (!testing::WaitForRouterEndpoints(router, &ep)) {
    r.error = "router did not start: " + router.Log();
    return r;
  }
  const std::string router_pid = absl::StrCat(router.pid());
  const int64_t rss_before = RssBytes(router_pid);
  const auto t0 = Clock::now();
  std::unique_ptr<router::testing::SimFleet> fleet =
      StartFleet(c, n, c.heartbeat_ms, ep, &r.error);
  if (fleet == nullptr) return r;
  r.register_s = Seconds(Clock::now() - t0);
  r.router_rss_delta = RssBytes(router_pid) - rss_before;
  r.idle_core_share = IdleShare(router.pid(), c.idle_seconds);

  std::atomic<int64_t> refused{0};
  std::atomic<bool> failed{false};
  double cpu0 = CpuSeconds(router.pid());
  const double io0 = ZmqIoCpuSeconds(router.pid());
  const double self0 = SelfCpuSeconds();
  const auto w0 = Clock::now();
  std::vector<std::thread> clients;
  const int per_client = c.requests / c.clients;
  for (int k = 0; k < c.clients; ++k) {
    clients.emplace_back([&, k] {
      if (!ClosedLoop(ep.frontend, k, per_client, c.window, c.prompt_tokens, &refused)) {
        failed.store(true);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const double wall = Seconds(Clock::now() - w0);
  const double cpu = CpuSeconds(router.pid()) - cpu0;
  const double io = ZmqIoCpuSeconds(router.pid()) - io0;
  const double self = SelfCpuSeconds() - self0;
  if (failed.load()) {
    r.error = "a client got no answer for 10 s";
    return r;
  }
  const int total = per_client * c.clients;
  r.rps = total / wall;
  r.router_us_per_request = cpu * 1e6 / total;
  r.router_io_us_per_request = io * 1e6 / total;
  r.fleet_clients_us_per_request = self * 1e6 / total;
  r.refused = refused.load();

  zmq::context_t ctx(1);
  auto s = Socket::Create(&ctx, zmq::socket_type::dealer, SocketOptions());
  if (!s.ok() || !(*s)->Connect(ep.frontend).ok()) {
    r.error = "no latency client";
    return r;
  }
  std::vector<double> us;
  for (int i = 0; i < c.latency_requests + 50; ++i) {
    const auto t = Clock::now();
    if (!(*s)->Send({MinimalRequest(absl::StrCat("l", i), 1'000'000'000ull + i,
                                    c.prompt_tokens)}).ok()) {
      break;
    }
    auto reply = (*s)->Recv(5000);
    if (!reply.ok() || !reply->has_value()) break;
    if (i >= 50) us.push_back(Seconds(Clock::now() - t) * 1e6);  // the first 50 warm up
  }
  r.p50_us = Percentile(us, 0.5);
  r.p99_us = Percentile(us, 0.99);
  fleet->Stop(/*deregister=*/true);
  router.Terminate();
  if (alt_heartbeat) {
    // A fresh router: one that served the first fleet still keeps its workers' metrics.
    testing::Subprocess alt({c.bin_dir + "/carpool-router", "--frontend", "tcp://127.0.0.1:*",
                             "--backend", "tcp://127.0.0.1:*", "--placement",
                             router::PlacementPolicyName(policy), "--io-threads",
                             absl::StrCat(c.io_threads), "--heartbeat-timeout-ms",
                             absl::StrCat(std::max(1000, 5 * c.alt_heartbeat_ms))},
                            tmp + "_alt_router.log");
    testing::RouterEndpoints alt_ep;
    if (!testing::WaitForRouterEndpoints(alt, &alt_ep)) {
      r.error = "router did not start: " + alt.Log();
      return r;
    }
    fleet = StartFleet(c, n, c.alt_heartbeat_ms, alt_ep, &r.error);
    if (fleet == nullptr) return r;
    r.idle_core_share_alt = IdleShare(alt.pid(), c.idle_seconds);
    fleet->Stop(/*deregister=*/true);
  }
  r.ok = true;
  return r;
}

// ---- in process

struct Micro {
  double indexed_ns = 0;    // the router's placement: Model() + GenerateKind::PlaceAmong
  double update_ns = 0;     // a worker's load changes: WorkerRegistry::Changed
  // The linear placement, for reference:
  double list_ns = 0;       // the worker list of the request's model (registry Mutable, filter)
  double view_ns = 0;       // GenerateKind::Place: snapshots, and the prefix match
  double place_ns = 0;      // the policy's Place over the snapshots
  double admission_ns = 0;  // Admit + Next + MarkDispatched + Release
  // Embed placement over a fleet that embeds: the router's way (EmbedKind::PlaceAmong), the
  // linear way it replaced (RequestKind::PlaceAmong: EmbedKind::Place, then Place), and the
  // index's update when an embedding worker's load changes.
  double embed_indexed_ns = 0;
  double embed_linear_ns = 0;
  double embed_update_ns = 0;
  // prefix_affinity only: prompts whose blocks Config::hot_holders workers cache, and prompts
  // whose first block every worker caches (a system prompt), the router's way.
  double hot_ns = 0;
  double shared_ns = 0;
};

struct Fixture {
  router::WorkerRegistry registry;
  router::PrefixIndex index;
};

// Registers simulated worker `i` (its id "sim-<i>", model "sim", the configured capacity) with
// `registry`; `embed_queue_size` 0: it does not embed.
router::WorkerState* RegisterSim(const Config& c, size_t i, int embed_queue_size,
                                 router::WorkerRegistry* registry) {
  RegisterInfo info;
  info.worker_id = absl::StrCat("sim-", i);
  info.model = "sim";
  info.max_num_seqs = c.max_num_seqs;
  info.num_kv_blocks = c.num_kv_blocks;
  info.block_size = 16;
  info.embed_queue_size = embed_queue_size;
  std::vector<uint64_t> orphaned;
  registry->Register(info.worker_id, info, 0, &orphaned);
  return registry->Find(info.worker_id);
}

// A registry of n workers with random load and an index holding `cached` random hashes each.
void Populate(const Config& c, int n, Fixture* f) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < n; ++i) {
    router::WorkerState* w = RegisterSim(c, static_cast<size_t>(i), 0, &f->registry);
    w->outstanding_tokens = static_cast<int64_t>(rng() % 4096);
    f->registry.Changed(w);
    KvEventsInfo k;
    k.reset = true;
    for (int b = 0; b < c.cached_blocks; ++b) k.stored.push_back(rng() | 1);
    f->index.Apply(w->identity, k, c.num_kv_blocks);
  }
}

template <typename Body>
double NsPerCall(int iterations, Body body) {
  for (int i = 0; i < iterations / 10; ++i) body(i);  // warm the caches first
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) body(i);
  return Seconds(Clock::now() - t0) * 1e9 / iterations;
}

// Where the timed loops' results go, so the compiler keeps the loops.
volatile size_t g_sink = 0;

Micro RunMicro(const Config& c, Fixture& f, PlacementPolicy policy) {
  router::RouterOptions options;
  options.placement = policy;
  // Place never calls back into the host.
  router::GenerateKind kind(nullptr, options);
  std::vector<router::GenerateRequest> requests(64);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].prompt = PromptFor(i, c.prompt_tokens);
    requests[i].sampling.max_tokens = 1;
  }
  const int iters = std::max(1, c.micro_iterations);
  Micro m;
  size_t sink = 0;
  m.list_ns = NsPerCall(iters, [&](int) {
    std::vector<router::WorkerState*> workers = f.registry.Mutable();
    std::erase_if(workers, [](const router::WorkerState* w) { return w->info.model != "sim"; });
    sink += workers.size();
  });
  std::vector<router::WorkerState*> workers = f.registry.Mutable();
  m.view_ns = NsPerCall(iters, [&](int i) {
    router::PlacementView view = kind.Place(requests[i % requests.size()], workers, f.index);
    sink += view.snapshots.size();
  });
  const router::PlacementView view = kind.Place(requests[0], workers, f.index);
  std::mt19937_64 rng(7);
  m.place_ns = NsPerCall(iters, [&](int i) {
    router::PlacementInput in;
    in.request_tokens = view.request_tokens;
    in.cursor = static_cast<uint64_t>(i);
    in.random = rng();
    sink += router::Place(policy, view.snapshots, in).value_or(0);
  });
  const router::PlacementIndex* model = f.registry.Model("sim");
  m.indexed_ns = NsPerCall(iters, [&](int i) {
    router::PlacementInput in;
    in.cursor = static_cast<uint64_t>(i);
    in.random = rng();
    in.affinity_load_weight = options.affinity_load_weight;
    const router::Placement p = kind.PlaceAmong(requests[i % requests.size()],
                                                *f.registry.Model("sim"), f.index, policy, in);
    sink += p.worker != nullptr ? 1 : 0;
  });
  // Loads drawn as Populate draws them: the fixture stays alike for the next policy.
  m.update_ns = NsPerCall(iters, [&](int i) {
    router::WorkerState* w = model->workers()[static_cast<size_t>(i) % workers.size()];
    w->outstanding_tokens = static_cast<int64_t>(rng() % 4096);
    f.registry.Changed(w);
  });
  router::AdmissionController admission{router::AdmissionOptions(), router::TenantTable()};
  admission.SetCapacityTokens(int64_t{c.num_kv_blocks} * 16);
  admission.SetLargestWorkerTokens(int64_t{c.num_kv_blocks} * 16);
  admission.SetWorkersAvailable(true);
  uint64_t next_id = 1;
  m.admission_ns = NsPerCall(iters, [&](int) {
    router::AdmissionRequest a;
    a.id = next_id++;
    a.prompt_tokens = c.prompt_tokens;
    a.max_tokens = 1;
    if (admission.Admit(a)) return;
    if (std::optional<uint64_t> next = admission.Next()) {
      admission.MarkDispatched(*next);
      admission.Release(*next, 1, /*completed=*/true);
    }
  });
  {
    // A registry of as many workers that embed (queues of 64, random inputs held and loads),
    // and embed requests of 1 to 32 inputs.
    router::WorkerRegistry embedders;
    std::mt19937_64 erng(43);
    for (size_t i = 0; i < workers.size(); ++i) {
      router::WorkerState* w = RegisterSim(c, i, 64, &embedders);
      w->outstanding_tokens = static_cast<int64_t>(erng() % 4096);
      w->embed_inputs = static_cast<int>(erng() % 65);
      embedders.Changed(w);
    }
    router::EmbedKind embed(nullptr);
    std::vector<router::EmbedRequest> embeds(64);
    for (size_t i = 0; i < embeds.size(); ++i) {
      embeds[i].tokens.assign(size_t{1} << (i % 6), PromptFor(i, 8));
      embeds[i].total_tokens = static_cast<int64_t>(embeds[i].tokens.size()) * 8;
      embeds[i].validated = true;
    }
    const router::PlacementIndex* embed_model = embedders.Model("sim");
    const auto embed_in = [&](int i) {
      router::PlacementInput in;
      in.cursor = static_cast<uint64_t>(i);
      in.random = rng();
      in.affinity_load_weight = options.affinity_load_weight;
      return in;
    };
    m.embed_indexed_ns = NsPerCall(iters, [&](int i) {
      const router::Placement p = embed.PlaceAmong(embeds[i % embeds.size()],
                                                   *embedders.Model("sim"), f.index, policy,
                                                   embed_in(i));
      sink += p.worker != nullptr ? 1 : 0;
    });
    m.embed_linear_ns = NsPerCall(iters, [&](int i) {
      const router::Placement p = embed.RequestKind::PlaceAmong(
          embeds[i % embeds.size()], *embedders.Model("sim"), f.index, policy, embed_in(i));
      sink += p.worker != nullptr ? 1 : 0;
    });
    m.embed_update_ns = NsPerCall(iters, [&](int i) {
      router::WorkerState* w = embed_model->workers()[static_cast<size_t>(i) % workers.size()];
      w->outstanding_tokens = static_cast<int64_t>(erng() % 4096);
      embedders.Changed(w);
    });
  }
  if (policy == PlacementPolicy::kPrefixAffinity) {
    const int n = static_cast<int>(workers.size());
    std::vector<router::GenerateRequest> hot(requests.size());
    std::vector<router::GenerateRequest> shared(requests.size());
    const std::vector<int32_t> system = PromptFor(7, 16);
    for (size_t i = 0; i < hot.size(); ++i) {
      hot[i].prompt = PromptFor(1000 + i, c.prompt_tokens);
      hot[i].sampling.max_tokens = 1;
      shared[i].prompt = system;
      const std::vector<int32_t> rest = PromptFor(2000 + i, c.prompt_tokens);
      shared[i].prompt.insert(shared[i].prompt.end(), rest.begin(), rest.end());
      shared[i].sampling.max_tokens = 1;
      KvEventsInfo k;
      k.stored = PromptBlockHashes(hot[i].prompt, 16, 0);
      for (int j = 0; j < std::min(c.hot_holders, n); ++j) {
        f.index.Apply(workers[(i * 131 + j) % n]->identity, k, c.num_kv_blocks);
      }
    }
    KvEventsInfo first;
    first.stored = {PromptBlockHashes(shared[0].prompt, 16, 0)[0]};
    for (const router::WorkerState* w : workers) f.index.Apply(w->identity, first, c.num_kv_blocks);
    const auto timed = [&](std::vector<router::GenerateRequest>& rs) {
      return NsPerCall(iters, [&](int i) {
        router::PlacementInput in;
        in.affinity_load_weight = options.affinity_load_weight;
        const router::Placement p =
            kind.PlaceAmong(rs[i % rs.size()], *f.registry.Model("sim"), f.index, policy, in);
        sink += static_cast<size_t>(p.cached_prefix_tokens);
      });
    };
    m.hot_ns = timed(hot);
    m.shared_ns = timed(shared);
  }
  g_sink = sink;
  return m;
}

// What the router's loop does every 50 ms whatever the load (CheckWorkers: the silent workers,
// the stall check's and the capacity's passes over the worker list, the metrics' gauges), in
// microseconds per pass over `f`'s workers; `gauges_us`: of which the metrics' gauges.
double HousekeepingMicros(Fixture& f, int iterations, double* gauges_us) {
  router::RouterStats stats{router::RouterOptions()};
  router::AdmissionController admission{router::AdmissionOptions(), router::TenantTable()};
  const router::StatsSources sources{f.registry, admission, f.index, false, 0};
  size_t sink = 0;
  const double ns = NsPerCall(std::max(10, iterations), [&](int) {
    sink += f.registry.Silent(0, 1'000'000).size();
    for (router::WorkerState* w : f.registry.Mutable()) sink += w->stalled ? 1 : 0;
    for (const router::WorkerState* w : f.registry.All()) sink += w->info.num_kv_blocks;
    stats.UpdateGauges(sources);
  });
  *gauges_us = NsPerCall(std::max(10, iterations), [&](int) { stats.UpdateGauges(sources); }) /
               1000;
  g_sink = sink;
  return ns / 1000;
}

// The bytes an absl::flat_hash_set<uint64_t> holding `n` hashes takes when filled one insert at
// a time, as PrefixIndex's per-worker sets are: a slot of 8 bytes and a control byte per
// capacity entry.
int64_t HashSetBytes(int n) {
  absl::flat_hash_set<uint64_t> s;
  for (int i = 0; i < n; ++i) s.insert(static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 1);
  return static_cast<int64_t>(s.capacity()) * (sizeof(uint64_t) + 1) + 16;
}

absl::Status ParseConfig(int argc, char** argv, Config* c, std::string* json_path) {
  std::string workers = "1,16,256,1024";
  std::string policies = "round_robin,least_loaded,power_of_two,prefix_affinity";
  FlagParser flags;
  flags.AddString("workers", &workers, "fleet sizes, comma-separated");
  flags.AddString("policies", &policies, "placement policies, comma-separated");
  flags.AddInt("cached-blocks", &c->cached_blocks, "prefix-cache blocks each worker reports");
  flags.AddInt("num-kv-blocks", &c->num_kv_blocks, "KV blocks per worker");
  flags.AddInt("max-num-seqs", &c->max_num_seqs, "sequences per worker");
  flags.AddInt("heartbeat-ms", &c->heartbeat_ms, "the fleet's heartbeat interval");
  flags.AddInt("alt-heartbeat-ms", &c->alt_heartbeat_ms,
               "idle CPU again at this heartbeat interval (first policy of each N), to split "
               "it into a cost per heartbeat and a fixed part; 0: not measured");
  flags.AddInt("step-ms", &c->step_ms, "the fleet's step time; 0: answers at once");
  flags.AddInt("threads", &c->threads, "threads serving the fleet's sockets");
  flags.AddInt("router-lost-ms", &c->router_lost_ms,
               "the fleet's ZMTP heartbeats every router-lost-ms / 3 per connection, as "
               "carpool-worker's default; 0: none");
  flags.AddDouble("idle-seconds", &c->idle_seconds, "how long router CPU is sampled idle");
  flags.AddInt("requests", &c->requests, "requests of the throughput run");
  flags.AddInt("clients", &c->clients, "client sockets of the throughput run");
  flags.AddInt("window", &c->window, "requests in flight per client");
  flags.AddInt("latency-requests", &c->latency_requests, "sequential round trips");
  flags.AddInt("prompt-tokens", &c->prompt_tokens, "prompt length of every request");
  flags.AddInt("micro-iterations", &c->micro_iterations, "calls timed per in-process figure");
  flags.AddBool("micro-only", &c->micro_only, "only the in-process measurements");
  flags.AddInt("hot-holders", &c->hot_holders,
               "prefix_affinity: also time prompts whose blocks this many workers cache");
  flags.AddInt("io-threads", &c->io_threads, "the router's --io-threads");
  flags.AddString("bin-dir", &c->bin_dir, "where carpool-router is; none: this binary's folder");
  flags.AddString("json", json_path, "also write the results to this file");
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(s.message(), "\n", flags.Help()));
  }
  for (absl::string_view w : absl::StrSplit(workers, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(w, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--workers: bad size '", w, "'"));
    }
    c->workers.push_back(n);
  }
  const std::vector<std::string> names = absl::StrSplit(policies, ',', absl::SkipEmpty());
  for (const std::string& p : names) {
    absl::StatusOr<PlacementPolicy> policy = router::ParsePlacementPolicy(p);
    if (!policy.ok()) return absl::InvalidArgumentError(absl::StrCat("--policies: ", p));
    c->policies.push_back(*policy);
  }
  if (c->workers.empty() || c->policies.empty()) {
    return absl::InvalidArgumentError("--workers and --policies need at least one entry");
  }
  if (c->clients < 1 || c->window < 1 || c->requests < c->clients || c->prompt_tokens < 1 ||
      c->idle_seconds <= 0 || c->cached_blocks < 0 || c->cached_blocks > c->num_kv_blocks) {
    return absl::InvalidArgumentError(
        "need --clients >= 1, --window >= 1, --requests >= --clients, --prompt-tokens >= 1, "
        "--idle-seconds > 0 and 0 <= --cached-blocks <= --num-kv-blocks");
  }
  if (c->heartbeat_ms < 1 || c->alt_heartbeat_ms < 0 || c->alt_heartbeat_ms == c->heartbeat_ms) {
    return absl::InvalidArgumentError(
        "need --heartbeat-ms >= 1 and --alt-heartbeat-ms 0 (none) or another interval");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace carpool::bench

int main(int argc, char** argv) {
  using namespace carpool::bench;
  Config c;
  std::string json_path;
  if (absl::Status s = ParseConfig(argc, argv, &c, &json_path); !s.ok()) {
    std::cerr << "carpool-bench-fleet: " << s.message() << "\n";
    return 2;
  }
  if (c.bin_dir.empty()) {
    const std::string self = argv[0];
    c.bin_dir = self.find('/') == std::string::npos ? "." : self.substr(0, self.rfind('/'));
  }
  nlohmann::json results = nlohmann::json::array();
  std::printf("%6s %-16s %9s %9s %9s %9s %9s %9s %9s | %9s %9s %9s | %9s %9s %9s\n", "N",
              "policy", "idle %cpu", "req/s", "cpu us/r", "zmq io", "rest us/r", "p50 us",
              "p99 us", "index ns", "update ns", "admit ns", "list ns", "view ns", "place ns");
  for (int n : c.workers) {
    const int64_t heap0 = HeapBytes();
    Fixture fixture;
    Populate(c, n, &fixture);
    const int64_t index_heap = HeapBytes() - heap0;
    const int64_t index_estimate = int64_t{n} * HashSetBytes(c.cached_blocks);
    const int64_t index_bytes = fixture.index.MemoryBytes();
    double gauges_us = 0;
    const double housekeeping_us =
        HousekeepingMicros(fixture, c.micro_iterations / 100, &gauges_us);
    std::printf("N=%d: prefix index of %d x %d blocks: %.1f MB allocated (heap growth, the "
                "registry's few KB included), %.1f MB in its tables (%.1f MB of them the "
                "workers' sets); the loop's 50 ms housekeeping pass: %.0f us (%.2f%% of a "
                "core), %.0f us of it the metrics' gauges\n",
                n, n, c.cached_blocks, index_heap / 1e6, index_bytes / 1e6, index_estimate / 1e6,
                housekeeping_us, housekeeping_us / 50'000 * 100, gauges_us);
    for (PlacementPolicy policy : c.policies) {
      const Micro m = RunMicro(c, fixture, policy);
      EndToEnd e;
      const bool alt = policy == c.policies.front() && c.alt_heartbeat_ms > 0;
      if (!c.micro_only) e = RunEndToEnd(c, n, policy, alt);
      if (!c.micro_only && !e.ok) {
        std::fprintf(stderr, "N=%d %s: %s\n", n, carpool::router::PlacementPolicyName(policy),
                     e.error.c_str());
      }
      std::printf("%6d %-16s %9.2f %9.0f %9.1f %9.1f %9.1f %9.0f %9.0f | %9.0f %9.0f %9.0f | "
                  "%9.0f %9.0f %9.0f\n",
                  n, carpool::router::PlacementPolicyName(policy), 100 * e.idle_core_share, e.rps,
                  e.router_us_per_request, e.router_io_us_per_request,
                  e.fleet_clients_us_per_request, e.p50_us, e.p99_us, m.indexed_ns, m.update_ns,
                  m.admission_ns, m.list_ns, m.view_ns, m.place_ns);
      std::printf("%6s embed placement: %.0f ns the router's way (embed lane), %.0f ns the "
                  "linear way (x%.1f); the index's update of an embedding worker's load %.0f ns\n",
                  "", m.embed_indexed_ns, m.embed_linear_ns,
                  m.embed_indexed_ns > 0 ? m.embed_linear_ns / m.embed_indexed_ns : 0.0,
                  m.embed_update_ns);
      if (policy == PlacementPolicy::kPrefixAffinity) {
        std::printf("%6s prefix_affinity, the router's way: %.0f ns with the prompt's blocks "
                    "cached on %d workers, %.0f ns with its first block cached on every worker\n",
                    "", m.hot_ns, std::min(c.hot_holders, n), m.shared_ns);
      }
      // idle = fixed + rate x per_heartbeat, at two heartbeat rates.
      double per_heartbeat_us = 0, fixed_share = 0;
      if (e.ok && alt) {
        const double rate = n * 1000.0 / c.heartbeat_ms;
        const double alt_rate = n * 1000.0 / c.alt_heartbeat_ms;
        per_heartbeat_us = (e.idle_core_share - e.idle_core_share_alt) / (rate - alt_rate) * 1e6;
        fixed_share = e.idle_core_share - rate * per_heartbeat_us / 1e6;
        std::printf("%6s idle router CPU %.2f%% at %d ms heartbeats (%.0f/s), %.2f%% at %d ms: "
                    "%.1f us per heartbeat, %.2f%% of a core besides\n",
                    "", 100 * e.idle_core_share, c.heartbeat_ms, rate,
                    100 * e.idle_core_share_alt, c.alt_heartbeat_ms, per_heartbeat_us,
                    100 * fixed_share);
      }
      std::fflush(stdout);
      results.push_back({{"workers", n},
                         {"policy", carpool::router::PlacementPolicyName(policy)},
                         {"cached_blocks_per_worker", c.cached_blocks},
                         {"end_to_end_ok", e.ok},
                         {"error", e.error},
                         {"register_s", e.register_s},
                         {"router_rss_growth_bytes", e.router_rss_delta},
                         {"idle_router_core_share", e.idle_core_share},
                         {"idle_router_core_share_alt_heartbeat", e.idle_core_share_alt},
                         {"heartbeat_ms", c.heartbeat_ms},
                         {"router_lost_ms", c.router_lost_ms},
                         {"alt_heartbeat_ms", alt ? c.alt_heartbeat_ms : 0},
                         {"router_us_per_heartbeat", per_heartbeat_us},
                         {"idle_fixed_core_share", fixed_share},
                         {"requests_per_s", e.rps},
                         {"router_cpu_us_per_request", e.router_us_per_request},
                         {"router_zmq_io_cpu_us_per_request", e.router_io_us_per_request},
                         {"fleet_clients_cpu_us_per_request", e.fleet_clients_us_per_request},
                         {"cores", static_cast<int>(std::thread::hardware_concurrency())},
                         {"refused_under_load", e.refused},
                         {"latency_p50_us", e.p50_us},
                         {"latency_p99_us", e.p99_us},
                         {"indexed_place_ns", m.indexed_ns},
                         {"index_update_ns", m.update_ns},
                         {"prefix_hot_holders", std::min(c.hot_holders, n)},
                         {"prefix_hot_place_ns", m.hot_ns},
                         {"prefix_shared_first_block_place_ns", m.shared_ns},
                         {"worker_list_ns", m.list_ns},
                         {"placement_view_ns", m.view_ns},
                         {"place_ns", m.place_ns},
                         {"admission_cycle_ns", m.admission_ns},
                         {"embed_indexed_place_ns", m.embed_indexed_ns},
                         {"embed_linear_place_ns", m.embed_linear_ns},
                         {"embed_index_update_ns", m.embed_update_ns},
                         {"index_heap_bytes", index_heap},
                         {"index_table_bytes", index_bytes},
                         {"housekeeping_pass_us", housekeeping_us},
                         {"housekeeping_gauges_us", gauges_us},
                         {"index_estimate_bytes", index_estimate}});
    }
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << results.dump(2) << "\n";
    if (!out) {
      std::cerr << "carpool-bench-fleet: cannot write " << json_path << "\n";
      return 1;
    }
  }
  return 0;
}
