// main() for GoogleTest binaries that run as every rank of an mpirun job (ctest label `mpi`,
// registered with carpool_mpi_test in cluster/CMakeLists.txt). main joins the job through
// MpiJob::Init with the options the binary's TestJobOptions returns, runs every test on every
// rank (tests branch on the rank), and exits non-zero on a rank whose tests failed, which makes
// mpirun fail.
#ifndef CARPOOL_CLUSTER_TESTING_MPI_TEST_MAIN_H_
#define CARPOOL_CLUSTER_TESTING_MPI_TEST_MAIN_H_

#include "cluster/mpi_job.h"

namespace carpool::cluster::testing {

// Defined by each test binary: how the rank with this world rank joins the job (before MPI is
// up the rank comes from the launcher's environment).
MpiJobOptions TestJobOptions(int world_rank, int world_size);

// The job main joined; valid while the tests run.
MpiJob& Job();

}  // namespace carpool::cluster::testing

#endif  // CARPOOL_CLUSTER_TESTING_MPI_TEST_MAIN_H_
