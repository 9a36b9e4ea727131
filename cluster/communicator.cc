#include "cluster/communicator.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace carpool::cluster {

void FailGroup(const absl::Status& status) {
  const std::string line = absl::StrCat("carpool[", getpid(), "]: tensor-parallel group failed: ",
                                        status.ToString(), "; exiting\n");
  (void)!write(STDERR_FILENO, line.data(), line.size());
  std::_Exit(kGroupFailedExitCode);
}

}  // namespace carpool::cluster
