// carpool-router: the cluster's front door. Flags only; the work is in router.cc.
#include <csignal>
#include <iostream>

#include "common/flags.h"
#include "router/router.h"

namespace {

carpool::router::Router* g_router = nullptr;

void OnSignal(int) {
  if (g_router != nullptr) g_router->Stop();
}

}  // namespace

int main(int argc, char** argv) {
  carpool::router::RouterOptions options;
  bool help = false;
  carpool::FlagParser flags;
  flags.AddString("frontend", &options.frontend, "client endpoint (default tcp://127.0.0.1:5555)");
  flags.AddString("backend", &options.backend, "worker endpoint (default tcp://127.0.0.1:5556)");
  flags.AddInt64("heartbeat-timeout-ms", &options.heartbeat_timeout_ms,
                 "a worker silent this long is dead (default 1000)");
  flags.AddInt("max-queued-requests", &options.max_queued_requests,
               "requests waiting for a worker before refusals (default 10000)");
  flags.AddBytes("max-request-bytes", &options.max_request_bytes,
                 "largest client message (default 1MiB)");
  flags.AddInt("max-migrations", &options.max_migrations,
               "times a request may move after its worker died (default 3)");
  flags.AddBool("help", &help, "show this help");
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-router: " << s.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << "usage: carpool-router [flags]\n" << flags.Help();
    return 0;
  }
  auto router = carpool::router::Router::Create(options);
  if (!router.ok()) {
    std::cerr << "carpool-router: " << router.status().message() << "\n";
    return 1;
  }
  g_router = router->get();
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::cerr << "carpool-router: frontend " << (*router)->frontend_endpoint() << ", backend "
            << (*router)->backend_endpoint() << std::endl;
  absl::Status s = (*router)->Run();
  g_router = nullptr;
  if (!s.ok()) {
    std::cerr << "carpool-router: " << s.message() << "\n";
    return 1;
  }
  std::cerr << "carpool-router: stopped\n";
  return 0;
}
