#include "cluster/router_launch.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace carpool::cluster {
namespace {

void Log(const std::string& text) {
  const std::string line = absl::StrCat("carpool-router: ", text, "\n");
  std::fputs(line.c_str(), stderr);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RouterMpiSession>> RouterMpiSession::JoinIfLaunched(
    int* argc, char*** argv, const std::function<const char*(const char*)>& getenv) {
  if (!LaunchedByMpi(getenv)) return nullptr;
  std::unique_ptr<RouterMpiSession> session(new RouterMpiSession());
  ASSIGN_OR_RETURN(session->job_, MpiJob::Init(argc, argv, {.role = Role::kRouter}));
  Log(session->job_->Describe());
  absl::StatusOr<std::string> backend = session->job_->ReachableBackendEndpoint();
  if (!backend.ok()) Log(absl::StrCat(backend.status().message(), "; binding 127.0.0.1"));
  session->backend_ = backend.ok() ? *backend : "tcp://127.0.0.1:*";
  return session;
}

absl::Status RouterMpiSession::Publish(const std::string& bound_backend) {
  Log(absl::StrCat("telling the job's ", job_->num_workers(), " worker ranks: backend ",
                   bound_backend));
  return job_->PublishRouterEndpoint(bound_backend, absl::Minutes(2));
}

void RouterMpiSession::Stop(absl::Duration timeout) {
  if (absl::Status s = job_->NotifyWorkersToStop(absl::Seconds(5)); !s.ok()) {
    Log(absl::StrCat("could not tell every worker to stop: ", s.message()));
  }
  Log("waiting for the job's workers to finish");
  job_->Finalize(timeout, 0);
}

}  // namespace carpool::cluster
