// carpool-bench-router: what the router costs. Measures, in one run on loopback TCP:
//   direct: client <-> a minimal ZeroMQ ROUTER echo server (decode, answer) in another process;
//   router: client -> carpool-router -> carpool-worker --model echo -> router -> client;
// p50/p99 round trip of a minimal request (one token back) for each, and requests/s through
// the router with many requests in flight and the router pinned to one core.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec.h"
#include "common/flags.h"
#include "common/transport.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace carpool::bench {
namespace {

using Micros = std::chrono::duration<double, std::micro>;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

std::string MinimalRequest(const std::string& id) {
  GenerateInput g;
  g.request_id = id;
  g.token_ids = {7};
  g.sampling.max_tokens = 1;
  g.sampling.temperature = 0;
  return Encode(ClientMessage(g));
}

// The direct baseline's server: answers every generate with a final holding its first token.
int ServeDirect(const std::string& endpoint) {
  zmq::context_t ctx(1);
  auto s = Socket::Create(&ctx, zmq::socket_type::router, {});
  if (!s.ok() || !(*s)->Bind(endpoint).ok()) return 1;
  for (;;) {
    auto frames = (*s)->Recv(-1);
    if (!frames.ok() || !frames->has_value() || (*frames)->size() != 2) continue;
    auto m = DecodeClientMessage((**frames)[1]);
    if (!m.ok() || !std::holds_alternative<GenerateInput>(*m)) continue;
    const auto& g = std::get<GenerateInput>(*m);
    GenerateFinalOut f;
    f.request_id = g.request_id;
    f.tokens.push_back(SampleResult{g.token_ids.at(0), 0.0f, {}, ""});
    f.finish_reason = "length";
    (void)(*s)->Send({(**frames)[0], Encode(ServerMessage(f))});
  }
}

// Sequential round trips: one request in flight at a time.
std::vector<double> RoundTrips(Socket* client, int n) {
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!client->Send({MinimalRequest(absl::StrCat("r", i))}).ok()) break;
    auto reply = client->Recv(5000);
    if (!reply.ok() || !reply->has_value()) {
      std::cerr << "no reply\n";
      break;
    }
    us.push_back(Micros(std::chrono::steady_clock::now() - t0).count());
  }
  return us;
}

// Requests/s with `window` requests in flight.
double Throughput(Socket* client, int n, int window) {
  const auto t0 = std::chrono::steady_clock::now();
  int sent = 0, done = 0;
  while (done < n) {
    while (sent < n && sent - done < window) {
      if (!client->Send({MinimalRequest(absl::StrCat("t", sent))}).ok()) return 0;
      ++sent;
    }
    auto reply = client->Recv(5000);
    if (!reply.ok() || !reply->has_value()) return 0;
    ++done;
  }
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::unique_ptr<Socket> Connect(zmq::context_t* ctx, const std::string& endpoint) {
  auto s = Socket::Create(ctx, zmq::socket_type::dealer, {});
  if (!s.ok() || !(*s)->Connect(endpoint).ok()) return nullptr;
  return std::move(*s);
}

}  // namespace
}  // namespace carpool::bench

int main(int argc, char** argv) {
  using namespace carpool;
  using namespace carpool::bench;
  std::string serve_direct, bin_dir;
  int n = 5000, throughput_n = 50000, window = 64;
  bool json = false;
  FlagParser flags;
  flags.AddString("serve-direct", &serve_direct, "internal: run the direct baseline server");
  flags.AddString("bin-dir", &bin_dir,
                  "where carpool-router and carpool-worker are; none: this binary's folder");
  flags.AddInt("requests", &n, "sequential round trips per path");
  flags.AddInt("throughput-requests", &throughput_n, "requests for the throughput run");
  flags.AddInt("window", &window, "requests in flight for the throughput run");
  flags.AddBool("json", &json, "also print JSON");
  if (auto s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << s.message() << "\n" << flags.Help();
    return 2;
  }
  if (!serve_direct.empty()) return ServeDirect(serve_direct);
  if (bin_dir.empty()) {
    std::string self = argv[0];
    bin_dir = self.substr(0, self.find_last_of('/'));
  }
  const std::string tmp = absl::StrCat("/tmp/carpool_bench_router_", getpid());
  const int direct_port = testing::FreePort();
  const std::string direct_ep = absl::StrCat("tcp://127.0.0.1:", direct_port);
  testing::Subprocess direct({bin_dir + "/carpool-bench-router", "--serve-direct", direct_ep},
                             tmp + "_direct.log");
  testing::Subprocess router({bin_dir + "/carpool-router", "--frontend", "tcp://127.0.0.1:*",
                              "--backend", "tcp://127.0.0.1:*"},
                             tmp + "_router.log");
  testing::RouterEndpoints ep;
  if (!testing::WaitForRouterEndpoints(router, &ep)) {
    std::cerr << "router did not start\n" << router.Log();
    return 1;
  }
  const std::string frontend = ep.frontend, backend = ep.backend;
  testing::Subprocess worker({bin_dir + "/carpool-worker", "--router", backend, "--model", "echo",
                              "--max-num-seqs", "256"},
                             tmp + "_worker.log");
  zmq::context_t ctx(1);
  auto direct_client = Connect(&ctx, direct_ep);
  auto router_client = Connect(&ctx, frontend);
  // Warm up both paths (and wait for the worker to register).
  for (int i = 0; i < 200; ++i) {
    if (!RoundTrips(router_client.get(), 1).empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  RoundTrips(direct_client.get(), 500);
  RoundTrips(router_client.get(), 500);

  // Interleave the two paths in rounds so both see the same machine noise.
  std::vector<double> direct_us, router_us;
  for (int round = 0; round < 10; ++round) {
    auto d = RoundTrips(direct_client.get(), n / 10);
    auto r = RoundTrips(router_client.get(), n / 10);
    direct_us.insert(direct_us.end(), d.begin(), d.end());
    router_us.insert(router_us.end(), r.begin(), r.end());
  }
  // Throughput with the router process pinned to one core.
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  sched_setaffinity(router.pid(), sizeof(one), &one);
  const double rps = Throughput(router_client.get(), throughput_n, window);

  const double d50 = Percentile(direct_us, 0.5), d99 = Percentile(direct_us, 0.99);
  const double r50 = Percentile(router_us, 0.5), r99 = Percentile(router_us, 0.99);
  std::printf("%-34s %10s %10s\n", "path", "p50 us", "p99 us");
  std::printf("%-34s %10.1f %10.1f\n", "direct DEALER<->ROUTER", d50, d99);
  std::printf("%-34s %10.1f %10.1f\n", "client->router->echo worker", r50, r99);
  std::printf("router adds (p50 difference): %.1f us\n", r50 - d50);
  std::printf("throughput through the router (1 core, %d in flight): %.0f requests/s\n", window,
              rps);
  if (json) {
    nlohmann::json j = {{"direct_p50_us", d50}, {"direct_p99_us", d99},
                        {"router_p50_us", r50}, {"router_p99_us", r99},
                        {"router_added_p50_us", r50 - d50}, {"router_rps_one_core", rps}};
    std::cout << j.dump(2) << "\n";
  }
  return 0;
}
