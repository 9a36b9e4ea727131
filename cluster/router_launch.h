// carpool-router as a rank of an mpirun job (`mpirun -np 1 carpool-router : -np N
// carpool-worker ...`): joins the job, picks a backend endpoint the job's workers can reach,
// hands the bound endpoint to every worker over MPI, and at exit tells them to stop and waits
// for them, so one Ctrl-C or SIGTERM to the router ends the whole job cleanly.
//
//   ASSIGN_OR_RETURN(auto mpi, RouterMpiSession::JoinIfLaunched(&argc, &argv, std::getenv));
//   if (mpi && !backend_flag_set) options.backend = mpi->backend();
//   ... Router::Create(options) ...;  if (mpi) mpi->Publish(router->backend_endpoint());
//   ... router->Run() ...;            if (mpi) mpi->Stop();
#ifndef CARPOOL_CLUSTER_ROUTER_LAUNCH_H_
#define CARPOOL_CLUSTER_ROUTER_LAUNCH_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cluster/mpi_job.h"

namespace carpool::cluster {

class RouterMpiSession {
 public:
  // Null (and OK) when the process was not started by an MPI launcher (LaunchedByMpi).
  static absl::StatusOr<std::unique_ptr<RouterMpiSession>> JoinIfLaunched(
      int* argc, char*** argv, const std::function<const char*(const char*)>& getenv);

  // The backend to bind when --backend was not given: MpiJob::ReachableBackendEndpoint, or the
  // default "tcp://127.0.0.1:*" if the host has no other address.
  const std::string& backend() const { return backend_; }

  // Sends the bound endpoint to every worker rank (they wait for it at start).
  absl::Status Publish(const std::string& bound_backend);

  // Tells every worker rank the router is stopping (leaders drain, then release their
  // followers), then MPI_Finalize, which returns once every rank of the job has finished. A job
  // that takes longer than `timeout` is left to mpirun: the router exits anyway.
  void Stop(absl::Duration timeout = absl::Seconds(60));

 private:
  RouterMpiSession() = default;
  std::unique_ptr<MpiJob> job_;
  std::string backend_;
};

}  // namespace carpool::cluster

#endif  // CARPOOL_CLUSTER_ROUTER_LAUNCH_H_
