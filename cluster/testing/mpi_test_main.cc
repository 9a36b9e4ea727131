#include "cluster/testing/mpi_test_main.h"

#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"

namespace carpool::cluster::testing {
namespace {

MpiJob* g_job = nullptr;

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

}  // namespace

MpiJob& Job() { return *g_job; }

}  // namespace carpool::cluster::testing

int main(int argc, char** argv) {
  using carpool::cluster::MpiJob;
  namespace t = carpool::cluster::testing;
  const int rank = t::EnvInt("OMPI_COMM_WORLD_RANK", t::EnvInt("PMI_RANK", 0));
  const int size = t::EnvInt("OMPI_COMM_WORLD_SIZE", t::EnvInt("PMI_SIZE", 1));
  auto job = MpiJob::Init(&argc, &argv, t::TestJobOptions(rank, size));
  if (!job.ok()) {
    std::fprintf(stderr, "rank %d: MpiJob::Init: %s\n", rank, job.status().ToString().c_str());
    return 1;
  }
  t::g_job = job->get();
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  (*job)->Finalize(absl::Seconds(20), failed != 0 ? 1 : 0);
  t::g_job = nullptr;
  return failed != 0 ? 1 : 0;
}
