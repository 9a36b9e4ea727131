// carpool-worker: one engine (or echo) serving the router's requests.
//
//   carpool-worker --router tcp://127.0.0.1:5556 --model synthetic:tiny [engine flags]
//                  [--worker-id ID] [--heartbeat-ms 200] [--embed-* flags]
//   carpool-worker --router tcp://A:5556,tcp://B:5556 [--router-lost-ms 2000] ...  (two routers)
//   mpirun -np 1 carpool-router : -np 4 carpool-worker --tp 2 --model DIR    (worker/mpi_worker.h)
//
// SIGTERM / SIGINT drain the worker: new requests are refused, running ones finish, it
// deregisters and exits 0. Under MPI they drain a group's leader; its followers wait for it.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/mpi_job.h"
#include "common/flags.h"
#include "worker/engine_flags.h"
#include "worker/gpu_list.h"
#include "worker/mpi_worker.h"
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
    "usage: carpool-worker --router ENDPOINT --model DIR|synthetic:PRESET|echo [flags]\n"
    "       mpirun ... carpool-worker [--router ENDPOINT] [--tp N] --model ... [flags]\n";

// A rank of an MPI job: see worker/mpi_worker.h.
int RunUnderMpi(int argc, char** argv, carpool::worker::MpiWorkerOptions options, int tp) {
  auto job = carpool::cluster::MpiJob::Init(
      &argc, &argv, {.role = carpool::cluster::Role::kWorker, .tensor_parallel = tp});
  if (!job.ok()) {
    std::cerr << "carpool-worker: " << job.status().message() << "\n";
    return 1;
  }
  absl::Status s =
      carpool::worker::RunMpiWorker(job->get(), std::move(options), &g_server, &g_terminate);
  if (!s.ok()) std::cerr << "carpool-worker: " << s.message() << "\n";
  const int code = s.ok() ? 0 : 1;
  (*job)->Finalize(absl::Seconds(10), code);
  return code;
}

// The process's rank on its node under mpirun or srun; -1 otherwise.
int LocalRank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                           "MV2_COMM_WORLD_LOCAL_RANK"}) {
    int rank;
    if (const char* v = std::getenv(name); v != nullptr && absl::SimpleAtoi(v, &rank)) {
      return rank;
    }
  }
  return -1;
}

// Resolves --device and its GPU into the engine's options; 0 when the worker can go on, else the
// exit code (2). Every process resolves its own: under mpirun / srun each rank, a tensor-parallel
// group's leader and followers alike, gets the GPU of its local rank modulo the GPU count, unless
// --gpu names one or --gpus lists the group's (the rank then takes its local rank's entry). Both
// are ordinals into the GPUs the process sees (CUDA_VISIBLE_DEVICES as the launcher left it).
int ResolveDeviceOrExit(carpool::worker::DeviceOptions* device, const std::vector<int>& gpus,
                        int tp) {
  std::string chosen_by;  // how --gpus chose, for the error and the log
  if (!gpus.empty()) {
    if (device->gpu_index != -1) {
      std::cerr << "carpool-worker: give --gpu or --gpus, not both\n";
      return 2;
    }
    const int local_rank = LocalRank();
    absl::StatusOr<int> gpu = carpool::worker::GpuForLocalRank(gpus, tp, local_rank);
    if (!gpu.ok()) {
      std::cerr << "carpool-worker: " << gpu.status().message() << "\n";
      return 2;
    }
    device->gpu_index = *gpu;
    chosen_by =
        absl::StrCat("--gpus ", absl::StrJoin(gpus, ","), ", local rank ", std::max(local_rank, 0));
  }
  absl::StatusOr<carpool::worker::DeviceOptions> resolved =
      carpool::worker::ResolveDevice(*device, LocalRank());
  if (!resolved.ok()) {
    std::cerr << "carpool-worker: " << (chosen_by.empty() ? "" : chosen_by + ": ")
              << resolved.status().message() << "\n";
    return 2;
  }
  *device = *resolved;
  if (device->kind == carpool::worker::DeviceKind::kCuda) {
    // Which physical GPU this is, in the node's terms: on a shared node the ordinal and the
    // node's index differ.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::cerr << "carpool-worker: GPU ordinal " << device->gpu_index
              << (chosen_by.empty() ? "" : " (" + chosen_by + ")") << ": the node's device "
              << carpool::worker::VisibleDeviceName(device->gpu_index, visible).value_or("?")
              << (visible == nullptr ? " (CUDA_VISIBLE_DEVICES unset)"
                                     : absl::StrCat(" of CUDA_VISIBLE_DEVICES=", visible))
              << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  carpool::worker::MpiWorkerOptions mpi;
  WorkerServerOptions& options = mpi.server;
  bool help = false;
  int tp = 1;
  int tp_heartbeat_ms = 100, tp_timeout_ms = 1000, tp_collective_timeout_ms = 60000;
  carpool::FlagParser parser;
  parser.AddString("router", &options.router_endpoint,
                   "the router's worker endpoint, e.g. tcp://127.0.0.1:5556, or a pair "
                   "tcp://A:5556,tcp://B:5556 (registers with the first that answers, the next "
                   "once it is lost); none: under mpirun, the job's carpool-router rank");
  parser.AddInt("router-lost-ms", &options.router_lost_ms,
                "a router silent this long (no ZMTP heartbeat answer, no registration) is lost: "
                "the worker registers again, with the next --router endpoint if there are several");
  // With the device flags (--device, --gpu, --dtype, ...) into options.engine.device.
  carpool::worker::RegisterEngineFlags(&parser, &options.engine);
  std::vector<int> gpus;
  parser.AddCustom(
      "gpus",
      [&gpus](const std::string& v) -> absl::Status {
        absl::StatusOr<std::vector<int>> parsed = carpool::worker::ParseGpuList(v);
        if (!parsed.ok()) return parsed.status();
        gpus = *std::move(parsed);
        return absl::OkStatus();
      },
      "a tensor-parallel group's GPUs, one per rank, e.g. 2,3: the rank of local rank r takes "
      "the r-th, an ordinal into the GPUs it sees (as --gpu); for a group that is its own "
      "mpirun job on one host (cluster/launch/plan.py writes it); none: --gpu's choice",
      "");
  parser.AddString("worker-id", &options.worker_id, "routing id; none: hostname:pid");
  parser.AddInt("heartbeat-ms", &options.heartbeat_ms, "heartbeat interval");
  parser.AddInt("embed-max-batch-size", &options.embed.max_batch_size,
                "most embedding inputs in one batch");
  parser.AddCustom(
      "embed-max-wait-ms",
      [&options](const std::string& v) {
        double ms;
        if (!absl::SimpleAtod(v, &ms) || !(ms >= 0) || ms > 3.6e6) {
          return absl::InvalidArgumentError(
              absl::StrCat("--embed-max-wait-ms must be a number in [0, 3600000], got '", v, "'"));
        }
        options.embed.max_wait_micros = static_cast<int64_t>(ms * 1000);
        return absl::OkStatus();
      },
      "a batch that is not full runs this long after its first input arrived",
      absl::StrCat(options.embed.max_wait_micros / 1000.0));
  parser.AddInt("embed-max-concurrent-batches", &options.embed.max_concurrent_batches,
                "embedding batches running at once; must be 1: batches run on the engine thread, "
                "one at a time, at most one between two generation steps");
  parser.AddInt("embed-queue-size", &options.embed.max_queue_size,
                "most embedding inputs waiting for a batch, >= --embed-max-batch-size; more are "
                "refused with queue_full");
  parser.AddInt("tp", &tp, "tensor-parallel ranks per worker, consecutive ranks of the mpirun job");
  parser.AddInt("tp-heartbeat-ms", &tp_heartbeat_ms,
                "heartbeat interval inside a tensor-parallel group");
  parser.AddInt("tp-timeout-ms", &tp_timeout_ms,
                "a group peer silent this long is dead and the group exits");
  parser.AddInt("tp-collective-timeout-ms", &tp_collective_timeout_ms,
                "longest wait of one collective in a step");
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
  if (absl::Status s = options.ValidateEmbed(); !s.ok()) {
    std::cerr << "carpool-worker: " << s.message() << "\n";
    return 2;
  }
  if (int code = ResolveDeviceOrExit(&options.engine.device, gpus, tp); code != 0) return code;
  // Before the model loads, so a SIGTERM during a long load is not lost.
  InstallSignalHandlers();
  if (carpool::cluster::LaunchedByMpi(std::getenv) || tp > 1) {
    if (!carpool::cluster::LaunchedByMpi(std::getenv)) {
      std::cerr << "carpool-worker: --tp " << tp << " needs " << tp
                << " ranks per worker: start it with mpirun (docs/cluster.md)\n";
      return 2;
    }
    if (tp < 1 || tp_heartbeat_ms < 1 || tp_timeout_ms <= tp_heartbeat_ms ||
        tp_collective_timeout_ms < 1) {
      std::cerr << "carpool-worker: need --tp >= 1, 0 < --tp-heartbeat-ms < --tp-timeout-ms and "
                   "--tp-collective-timeout-ms >= 1\n";
      return 2;
    }
    mpi.heartbeat_interval = absl::Milliseconds(tp_heartbeat_ms);
    mpi.heartbeat_timeout = absl::Milliseconds(tp_timeout_ms);
    mpi.collective_timeout = absl::Milliseconds(tp_collective_timeout_ms);
    mpi.heartbeat_timeout_terminating = std::min(
        mpi.heartbeat_timeout, std::max(absl::Milliseconds(300), 3 * mpi.heartbeat_interval));
    return RunUnderMpi(argc, argv, std::move(mpi), tp);
  }
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
