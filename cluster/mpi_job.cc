#include "cluster/mpi_job.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/mpi_util.h"
#include "common/status.h"

namespace carpool::cluster {
namespace {

constexpr int kStopTag = 7001;
constexpr int kStopMessage = 1;
// The endpoint travels in a fixed buffer: one broadcast, no length exchange.
constexpr int kEndpointBufferBytes = 1024;

int RoleCode(Role role) { return role == Role::kRouter ? 0 : 1; }

std::string Hostname() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "unknown-host";
  return host;
}

}  // namespace

bool LaunchedByMpi(const std::function<const char*(const char*)>& getenv) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (getenv(name) != nullptr) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<MpiJob>> MpiJob::Init(int* argc, char*** argv,
                                                     const MpiJobOptions& options) {
  if (options.tensor_parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp must be >= 1, got ", options.tensor_parallel));
  }
  int initialized = 0;
  RETURN_IF_ERROR(MpiStatus(MPI_Initialized(&initialized), "MPI_Initialized"));
  if (initialized) return absl::FailedPreconditionError("MPI is already initialized");
  int provided = 0;
  RETURN_IF_ERROR(
      MpiStatus(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread"));
  std::unique_ptr<MpiJob> job(new MpiJob());
  if (provided < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(
        "the MPI library does not provide MPI_THREAD_MULTIPLE (carpool's heartbeats run beside "
        "the engine thread)");
  }
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                            "MPI_Comm_set_errhandler"));
  RETURN_IF_ERROR(job->Setup(options));
  return job;
}

absl::Status MpiJob::Setup(const MpiJobOptions& options) {
  role_ = options.role;
  hostname_ = Hostname();
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank"));
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size"));

  // Which node each rank runs on: the world rank of its node's first rank.
  MPI_Comm node = MPI_COMM_NULL;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED,
                                                world_rank_, MPI_INFO_NULL, &node),
                            "MPI_Comm_split_type"));
  int node_size = 0, node_id = world_rank_;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(node, &node_size), "MPI_Comm_size"));
  RETURN_IF_ERROR(MpiStatus(MPI_Bcast(&node_id, 1, MPI_INT, 0, node), "MPI_Bcast(node)"));
  single_node_ = node_size == world_size_;

  // Every rank's (role, tensor_parallel, node).
  const int mine[3] = {RoleCode(role_), options.tensor_parallel, node_id};
  std::vector<int> all(3 * world_size_);
  RETURN_IF_ERROR(MpiStatus(
      MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather"));
  std::vector<RankInfo> ranks(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    ranks[r].role = all[3 * r] == RoleCode(Role::kRouter) ? Role::kRouter : Role::kWorker;
    ranks[r].tensor_parallel = all[3 * r + 1];
    ranks[r].node = all[3 * r + 2];
  }
  ASSIGN_OR_RETURN(const JobLayout layout, PlanJobLayout(ranks));
  router_rank_ = layout.router_rank;
  num_workers_ = static_cast<int>(layout.worker_ranks.size());
  tp_size_ = layout.tp_size;

  // This rank's index among its role's ranks on its node.
  MPI_Comm local = MPI_COMM_NULL;
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_split(node, RoleCode(role_), world_rank_, &local),
                            "MPI_Comm_split(local)"));
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank"));
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_size(local, &local_size_), "MPI_Comm_size"));
  MPI_Comm_free(&local);
  MPI_Comm_free(&node);

  RETURN_IF_ERROR(MpiStatus(MPI_Comm_split(MPI_COMM_WORLD, RoleCode(role_), world_rank_,
                                           &role_comm_),
                            "MPI_Comm_split(role)"));
  RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup"));
  if (role_ == Role::kWorker) {
    RETURN_IF_ERROR(MpiStatus(MPI_Comm_rank(role_comm_, &worker_index_), "MPI_Comm_rank"));
    RETURN_IF_ERROR(MpiStatus(
        MPI_Comm_split(role_comm_, worker_index_ / tp_size_, worker_index_, &tp_comm_),
        "MPI_Comm_split(tp)"));
    for (int r : layout.Group(tp_group())) {
      if (ranks[r].node != node_id) tp_group_on_one_node_ = false;
    }
    if (has_router()) {
      RETURN_IF_ERROR(MpiStatus(MPI_Irecv(&stop_message_, 1, MPI_INT, router_rank_, kStopTag,
                                          control_, &stop_request_),
                                "MPI_Irecv(stop)"));
    }
  }
  return absl::OkStatus();
}

MpiJob::~MpiJob() { Finalize(absl::Seconds(10), 0); }

absl::StatusOr<std::string> MpiJob::ReachableBackendEndpoint() const {
  if (single_node_) return std::string("tcp://127.0.0.1:*");
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::NotFoundError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::string address;
  for (ifaddrs* i = list; i != nullptr && address.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) address = text;
  }
  freeifaddrs(list);
  if (address.empty()) {
    return absl::NotFoundError(absl::StrCat(
        hostname_, " has no non-loopback IPv4 address for workers on other nodes; pass --backend"));
  }
  return absl::StrCat("tcp://", address, ":*");
}

absl::Status MpiJob::PublishRouterEndpoint(const std::string& endpoint, absl::Duration timeout) {
  if (role_ != Role::kRouter) {
    return absl::FailedPreconditionError("only the router publishes its endpoint");
  }
  if (static_cast<int>(endpoint.size()) >= kEndpointBufferBytes) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint longer than ",
                                                   kEndpointBufferBytes - 1, " bytes"));
  }
  std::vector<char> buffer(kEndpointBufferBytes, '\0');
  std::memcpy(buffer.data(), endpoint.data(), endpoint.size());
  MPI_Request request;
  RETURN_IF_ERROR(MpiStatus(
      MPI_Ibcast(buffer.data(), kEndpointBufferBytes, MPI_CHAR, router_rank_, control_, &request),
      "MPI_Ibcast(endpoint)"));
  return WaitRequest(&request, absl::Now() + timeout, "publishing the router endpoint");
}

absl::StatusOr<std::string> MpiJob::ReceiveRouterEndpoint(absl::Duration timeout) {
  if (!has_router() || role_ != Role::kWorker) {
    return absl::FailedPreconditionError("no router rank in this MPI job");
  }
  std::vector<char> buffer(kEndpointBufferBytes, '\0');
  MPI_Request request;
  RETURN_IF_ERROR(MpiStatus(
      MPI_Ibcast(buffer.data(), kEndpointBufferBytes, MPI_CHAR, router_rank_, control_, &request),
      "MPI_Ibcast(endpoint)"));
  RETURN_IF_ERROR(WaitRequest(&request, absl::Now() + timeout,
                              "waiting for the router's endpoint"));
  buffer.back() = '\0';
  return std::string(buffer.data());
}

absl::Status MpiJob::NotifyWorkersToStop(absl::Duration timeout) {
  if (role_ != Role::kRouter) return absl::FailedPreconditionError("only the router stops workers");
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<MPI_Request> requests;
  for (int r = 0; r < world_size_; ++r) {
    if (r == world_rank_) continue;
    MPI_Request request;
    RETURN_IF_ERROR(MpiStatus(
        MPI_Isend(&kStopMessage, 1, MPI_INT, r, kStopTag, control_, &request), "MPI_Isend(stop)"));
    requests.push_back(request);
  }
  for (MPI_Request& request : requests) {
    RETURN_IF_ERROR(WaitRequest(&request, deadline, "telling the workers to stop"));
  }
  return absl::OkStatus();
}

bool MpiJob::RouterStopping() {
  if (router_stopping_ || stop_request_ == MPI_REQUEST_NULL) return router_stopping_;
  int done = 0;
  if (MPI_Test(&stop_request_, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
    router_stopping_ = true;
  }
  return router_stopping_;
}

void MpiJob::Finalize(absl::Duration timeout, int exit_code) {
  if (finalized_) return;
  finalized_ = true;
  if (stop_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&stop_request_);
    MPI_Request_free(&stop_request_);
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return done; })) return;
    const std::string line =
        absl::StrCat("carpool[", getpid(), "]: MPI_Finalize did not return within ",
                     absl::FormatDuration(timeout), " (a rank of the job is gone); exiting\n");
    (void)!write(STDERR_FILENO, line.data(), line.size());
    std::_Exit(exit_code);
  });
  MPI_Finalize();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_one();
  watchdog.join();
}

std::string MpiJob::Describe() const {
  std::string s = absl::StrCat("MPI world rank ", world_rank_, "/", world_size_, " on ", hostname_,
                               " (pid ", getpid(), "), ",
                               role_ == Role::kRouter ? "router" : "worker", ", local rank ",
                               local_rank_, "/", local_size_);
  if (role_ == Role::kWorker) {
    absl::StrAppend(&s, ", tensor-parallel group ", tp_group(), " rank ", tp_rank(), "/",
                    tp_size_);
    if (!tp_group_on_one_node_) absl::StrAppend(&s, " (WARNING: the group spans nodes)");
  }
  absl::StrAppend(&s, has_router() ? absl::StrCat(", router at world rank ", router_rank_)
                                   : std::string(", no router rank"));
  return s;
}

}  // namespace carpool::cluster
