// The one adapter between MPI and absl::Status, and the wait every carpool MPI operation uses.
// Internal to cluster/.
#ifndef CARPOOL_CLUSTER_MPI_UTIL_H_
#define CARPOOL_CLUSTER_MPI_UTIL_H_

#include <mpi.h>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace carpool::cluster {

// OK for MPI_SUCCESS; otherwise UNAVAILABLE with "<what>: <MPI's error string>". Requires the
// communicator's error handler to be MPI_ERRORS_RETURN (MpiJob sets it on MPI_COMM_WORLD, and
// every communicator derived from it inherits it).
absl::Status MpiStatus(int rc, absl::string_view what);

// Completes `request` by polling MPI_Test: spins briefly, then sleeps between polls (up to 1 ms)
// so that oversubscribed ranks leave the cores to the ranks doing work. DEADLINE_EXCEEDED, naming
// `what`, once `deadline` passes; the request is then abandoned (its peers may never arrive), so
// the communicator it belongs to must not be used again.
absl::Status WaitRequest(MPI_Request* request, absl::Time deadline, absl::string_view what);

}  // namespace carpool::cluster

#endif  // CARPOOL_CLUSTER_MPI_UTIL_H_
