// carpool-worker as a rank of an mpirun (or srun) job: the MPI half of worker_main.
//
// Each tensor-parallel group's rank 0 (the leader) runs the WorkerServer: scheduler, KV cache,
// the router connection, and before every step a broadcast of the step to its followers. The
// other ranks (followers) load their slices of the same model and run every step they receive
// (RunFollower) until the leader says it is done. Every rank builds its engine from the same
// options, device included: carpool-worker resolved the device per process, so on GPUs each rank
// computes on its local rank's GPU. The group's collectives go as --tp-transport says
// (ResolveTpTransport in worker/device_options.h): NCCL on the GPUs' buffers, its unique id
// broadcast over MPI, when every rank has a GPU (auto, nccl); through host memory over MPI
// otherwise (mpi, or a rank on the CPU). Step plans and heartbeats always go over MPI.
//
// Liveness, so that no rank ever hangs:
//   - a watcher thread per rank exchanges heartbeats with its group (cluster/group_heartbeat.h)
//     and ends the process (cluster::FailGroup, exit code 75) when a peer goes silent (for
//     heartbeat_timeout, or heartbeat_timeout_terminating once a SIGTERM/SIGINT arrived);
//   - every collective inside a step has a timeout, and a failed one ends the process too;
//   - the leader's router then sees one dead worker (its heartbeats stop).
// When the router is a rank of the same job, its endpoint comes over MPI (no --router needed),
// and its "stopping" message drains the leaders, which then release their followers.
#ifndef CARPOOL_WORKER_MPI_WORKER_H_
#define CARPOOL_WORKER_MPI_WORKER_H_

#include <atomic>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/communicator.h"
#include "cluster/mpi_job.h"
#include "worker/model/llama_model.h"
#include "worker/worker_server.h"

namespace carpool::worker {

struct MpiWorkerOptions {
  // What the leader serves with. server.router_endpoint may be empty when the job has a router
  // rank; when both exist, the flag wins.
  WorkerServerOptions server;
  // Between heartbeats inside a group, and how long a silent peer may stay silent.
  // Default: 100 ms, 1 s.
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration heartbeat_timeout = absl::Seconds(1);
  // The timeout once this rank got SIGTERM/SIGINT. mpirun sends SIGTERM to every surviving rank
  // when one dies, so a peer silent this long then is dead, and the group must exit before
  // mpirun's SIGKILL (1 s later) for its router to notice within its heartbeat timeout.
  // Default: 300 ms.
  absl::Duration heartbeat_timeout_terminating = absl::Milliseconds(300);
  // Longest wait of one collective inside a step. Default: 60 s.
  absl::Duration collective_timeout = absl::Seconds(60);
};

// Runs this rank until its group is done: the leader until drained (SIGTERM, the router's
// `drain`, or the router rank stopping), a follower until its leader is done. `server_slot`
// holds the leader's server while it runs, for signal handlers (nullptr otherwise);
// `terminate` is set by them. Errors: no router endpoint, a model the group cannot load, or
// ranks that disagree on the engine's shape.
absl::Status RunMpiWorker(cluster::MpiJob* job, MpiWorkerOptions options,
                          std::atomic<WorkerServer*>* server_slot,
                          const std::atomic<bool>* terminate);

// A follower's loop: runs every step its leader broadcasts on `group` (generation steps and
// embedding passes, LlamaModel::Follow) until the leader's shutdown. Errors: a malformed
// message (a failed collective ends the process instead).
absl::Status RunFollower(LlamaModel* model, cluster::Communicator* group);
// The leader's shutdown message to its followers.
absl::Status StopFollowers(cluster::Communicator* group);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MPI_WORKER_H_
