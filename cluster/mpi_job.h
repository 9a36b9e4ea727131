// Joining an MPI job as a carpool process: world rank and size, this node's ranks, the split into
// the router and the workers, the workers into tensor-parallel groups of consecutive ranks, and
// the two things the router and its workers tell each other over MPI (the router's backend
// endpoint at start, "stopping" at the end), so an mpirun cluster needs no address flags.
//
//   mpirun -np 1 carpool-router : -np 4 carpool-worker --tp 2
//       world ranks  0 | 1 2 | 3 4      router | TP group 0 | TP group 1
//   mpirun -np 4 carpool-worker --tp 2 --router tcp://head:5556
//       world ranks  0 1 | 2 3          (no router rank; the router runs elsewhere)
//
// Thread safety: Init and the collective calls (PublishRouterEndpoint, ReceiveRouterEndpoint)
// from the thread that called Init; RouterStopping from one thread at a time, concurrently with
// other threads' MPI calls (MPI_THREAD_MULTIPLE); accessors from any thread.
#ifndef CARPOOL_CLUSTER_MPI_JOB_H_
#define CARPOOL_CLUSTER_MPI_JOB_H_

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/job_layout.h"

namespace carpool::cluster {

struct MpiJobOptions {
  Role role = Role::kWorker;
  // Ranks per tensor-parallel group; workers only. Every worker of the job passes the same
  // value. Default: 1.
  int tensor_parallel = 1;
};

// True when this process was started by an MPI launcher (mpirun / mpiexec, or srun with PMI):
// one of OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK or PMI_SIZE is set. `getenv` is the
// environment lookup (main passes std::getenv).
bool LaunchedByMpi(const std::function<const char*(const char*)>& getenv);

class MpiJob {
 public:
  // MPI_Init_thread (MPI_THREAD_MULTIPLE required), MPI_ERRORS_RETURN on MPI_COMM_WORLD, then
  // learns every rank's role and plans the layout (PlanJobLayout; its errors are the same on
  // every rank). Collective over MPI_COMM_WORLD. Call once per process.
  static absl::StatusOr<std::unique_ptr<MpiJob>> Init(int* argc, char*** argv,
                                                      const MpiJobOptions& options);
  // Finalize(absl::Seconds(10), 0) unless Finalize ran.
  ~MpiJob();
  MpiJob(const MpiJob&) = delete;
  MpiJob& operator=(const MpiJob&) = delete;

  Role role() const { return role_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  const std::string& hostname() const { return hostname_; }
  // This rank's index among the ranks of its role on its node: a GPU worker's device.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Every rank of the job runs on this node.
  bool single_node() const { return single_node_; }

  bool has_router() const { return router_rank_ >= 0; }
  int router_rank() const { return router_rank_; }  // -1 without one

  // Workers. worker_index counts the worker ranks in world-rank order; group g holds worker
  // indices [g * tp_size, (g + 1) * tp_size).
  int num_workers() const { return num_workers_; }
  int worker_index() const { return worker_index_; }
  int tp_size() const { return tp_size_; }
  int tp_group() const { return worker_index_ / tp_size_; }
  int tp_rank() const { return worker_index_ % tp_size_; }
  // Every rank of this rank's group runs on one node.
  bool tp_group_on_one_node() const { return tp_group_on_one_node_; }
  // The group as an MPI communicator, ranks in tp_rank order. Owned by the job.
  MPI_Comm tp_comm() const { return tp_comm_; }

  // A router backend endpoint the job's workers can reach: "tcp://127.0.0.1:*" when the job
  // runs on one node, otherwise "tcp://<this host's first non-loopback IPv4 address>:*".
  // NOT_FOUND when the host has no such address.
  absl::StatusOr<std::string> ReachableBackendEndpoint() const;

  // The router's bound backend endpoint, from the router to every worker. Collective over the
  // world: the router calls Publish, every worker Receive. REQUIRES: has_router().
  absl::Status PublishRouterEndpoint(const std::string& endpoint, absl::Duration timeout);
  absl::StatusOr<std::string> ReceiveRouterEndpoint(absl::Duration timeout);

  // Router: tells every worker rank that the router is stopping; waits up to `timeout` for the
  // messages to leave. Workers: RouterStopping() turns true once that message arrived
  // (nonblocking; false without a router rank).
  absl::Status NotifyWorkersToStop(absl::Duration timeout);
  bool RouterStopping();

  // MPI_Finalize. It synchronizes with every rank of the job, so when it has not returned
  // within `timeout` (a rank died, or lingers) the process _exits with `exit_code` instead of
  // hanging. Idempotent.
  void Finalize(absl::Duration timeout, int exit_code);

  // One line for the logs: rank, role, node, group.
  std::string Describe() const;

 private:
  MpiJob() = default;
  absl::Status Setup(const MpiJobOptions& options);

  Role role_ = Role::kWorker;
  int world_rank_ = 0;
  int world_size_ = 1;
  std::string hostname_;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool single_node_ = true;
  int router_rank_ = -1;
  int num_workers_ = 0;
  int worker_index_ = -1;
  int tp_size_ = 1;
  bool tp_group_on_one_node_ = true;
  MPI_Comm control_ = MPI_COMM_NULL;  // world duplicate: endpoint and stop messages
  MPI_Comm role_comm_ = MPI_COMM_NULL;
  MPI_Comm tp_comm_ = MPI_COMM_NULL;
  MPI_Request stop_request_ = MPI_REQUEST_NULL;  // workers: the router's stop message
  int stop_message_ = 0;
  bool router_stopping_ = false;
  bool finalized_ = false;
};

}  // namespace carpool::cluster

#endif  // CARPOOL_CLUSTER_MPI_JOB_H_
