// carpool-worker: one engine (or echo) serving the router's requests.
//
//   carpool-worker --router tcp://127.0.0.1:5556 --model synthetic:tiny [engine flags]
//                  [--worker-id ID] [--heartbeat-ms 200]
//
// SIGTERM / SIGINT drain the worker: new requests are refused, running ones finish, it
// deregisters and exits 0.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>

#include "common/flags.h"
#include "worker/engine_flags.h"
#include "worker/worker_server.h"

namespace {

using carpool::worker::WorkerServer;
using carpool::worker::WorkerServerOptions;

std::atomic<bool> g_terminate{false};
std::atomic<WorkerServer*> g_server{nullptr};
static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<WorkerServer*>::is_always_lock_free);

// Async-signal-safe: lock-free atomic operations only.
void OnTerminate(int) {
  g_terminate.store(true);
  if (WorkerServer* s = g_server.load()) s->RequestDrain();
}

void InstallSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnTerminate;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

constexpr char kUsage[] =
    "usage: carpool-worker --router ENDPOINT --model DIR|synthetic:PRESET|echo [flags]\n";

}  // namespace

int main(int argc, char** argv) {
  WorkerServerOptions options;
  bool help = false;
  carpool::FlagParser parser;
  parser.AddString("router", &options.router_endpoint,
                   "the router's worker endpoint, e.g. tcp://127.0.0.1:5556");
  carpool::worker::RegisterEngineFlags(&parser, &options.engine);
  parser.AddString("worker-id", &options.worker_id, "routing id (default: hostname:pid)");
  parser.AddInt("heartbeat-ms", &options.heartbeat_ms, "heartbeat interval (default 200)");
  parser.AddBool("help", &help, "show this help");
  if (absl::Status s = parser.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-worker: " << s.message() << "\n" << kUsage;
    return 2;
  }
  if (help) {
    std::cout << kUsage << "flags (--model echo: no model, prompts come back as output):\n"
              << parser.Help();
    return 0;
  }
  if (!parser.positionals().empty()) {
    std::cerr << "carpool-worker: unexpected argument '" << parser.positionals()[0] << "'\n"
              << kUsage;
    return 2;
  }
  // Before the model loads, so a SIGTERM during a long load is not lost.
  InstallSignalHandlers();
  absl::StatusOr<std::unique_ptr<WorkerServer>> server = WorkerServer::Create(options);
  if (!server.ok()) {
    std::cerr << "carpool-worker: " << server.status().message() << "\n";
    return 1;
  }
  g_server.store(server->get());
  if (g_terminate.load()) (*server)->RequestDrain();  // a signal that came during the load
  absl::Status s = (*server)->Run();
  g_server.store(nullptr);
  if (!s.ok()) {
    std::cerr << "carpool-worker: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
