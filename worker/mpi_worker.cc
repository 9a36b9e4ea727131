#include "worker/mpi_worker.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/group_heartbeat.h"
#include "cluster/mpi_communicator.h"
#ifdef CARPOOL_HAVE_NCCL
#include "cluster/nccl_communicator.h"
#endif
#include "common/status.h"
#include "worker/engine.h"

namespace carpool::worker {
namespace {

template <typename... Args>
void Log(const cluster::MpiJob& job, const Args&... args) {
  const std::string line =
      absl::StrCat("carpool-worker[rank ", job.world_rank(), "]: ", args..., "\n");
  std::fputs(line.c_str(), stderr);
}

// Polls the group's heartbeats and the router's stop message beside the engine.
class Watcher {
 public:
  Watcher(cluster::MpiJob* job, cluster::GroupHeartbeat* beats, absl::Duration period,
          bool leader, std::atomic<WorkerServer*>* server_slot,
          const std::atomic<bool>* terminate, absl::Duration terminating_timeout)
      : job_(job),
        beats_(beats),
        period_(period),
        leader_(leader),
        server_slot_(server_slot),
        terminate_(terminate),
        terminating_timeout_(terminating_timeout) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Watcher() { Stop(/*leave=*/false); }

  // Joins the thread. With `leave`, tells the group this rank leaves on purpose; without, its
  // peers see it go silent, as they should when it failed. Idempotent.
  void Stop(bool leave) {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
    if (beats_ != nullptr && leave) beats_->Leave();
  }

  bool router_stopping() const { return router_stopping_.load(); }

 private:
  void Run() {
    bool terminating = false;
    while (!stop_.load()) {
      if (beats_ != nullptr && !terminating && terminate_->load()) {
        terminating = true;
        beats_->SetTimeout(terminating_timeout_);
      }
      if (beats_ != nullptr) {
        if (absl::Status s = beats_->Poll(); !s.ok()) cluster::FailGroup(s);
      }
      if (!router_stopping_.load() && job_->RouterStopping()) {
        router_stopping_.store(true);
        Log(*job_, "the router is stopping", leader_ ? "; draining" : "");
        if (leader_) {
          if (WorkerServer* server = server_slot_->load()) server->RequestDrain();
        }
      }
      absl::SleepFor(period_);
    }
  }

  cluster::MpiJob* const job_;
  cluster::GroupHeartbeat* const beats_;
  const absl::Duration period_;
  const bool leader_;
  std::atomic<WorkerServer*>* const server_slot_;
  const std::atomic<bool>* const terminate_;
  const absl::Duration terminating_timeout_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> router_stopping_{false};
  std::thread thread_;
};

// What every rank of a group must agree on for the leader's block tables and logits to mean the
// same thing on the followers.
struct GroupShape {
  int64_t num_kv_blocks = 0;
  int64_t block_size = 0;
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;
};

absl::Status AgreeOnShape(cluster::Communicator* group, const GroupShape& mine) {
  GroupShape leader = mine;
  RETURN_IF_ERROR(group->Broadcast(&leader, sizeof(leader), 0, group->timeout()));
  if (std::memcmp(&leader, &mine, sizeof(mine)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor-parallel rank ", group->rank(), " has ", mine.num_kv_blocks, " KV blocks of ",
        mine.block_size, ", max_model_len ", mine.max_model_len, ", vocab ", mine.vocab_size,
        " but its leader has ", leader.num_kv_blocks, " of ", leader.block_size, ", ",
        leader.max_model_len, ", ", leader.vocab_size, ": start every rank with the same flags"));
  }
  return absl::OkStatus();
}

// The group's transport for its collectives (--tp-transport, ResolveTpTransport): the ranks
// first count how many of them run on a GPU, so that every rank decides the same. With NCCL,
// `nccl` holds the group's NCCL communicator on this rank's GPU (its unique id broadcast over
// MPI); with MPI it stays null.
absl::Status ChooseTransport(cluster::MpiJob* job, const MpiWorkerOptions& options,
                             cluster::Communicator* group,
                             std::unique_ptr<cluster::DeviceCommunicator>* nccl) {
  const DeviceOptions& device = options.server.engine.device;
  float on_gpu = device.kind == DeviceKind::kCuda ? 1.0f : 0.0f;
  RETURN_IF_ERROR(group->AllReduceSum(&on_gpu, 1));
  ASSIGN_OR_RETURN(const TpTransport transport,
                   ResolveTpTransport(device.tp_transport, static_cast<int>(on_gpu),
                                      group->size(), BuiltWithNccl()));
  Log(*job, "tensor-parallel transport: ", TpTransportName(transport), " (--tp-transport ",
      TpTransportName(device.tp_transport), ")");
  if (transport != TpTransport::kNccl) return absl::OkStatus();
#ifdef CARPOOL_HAVE_NCCL
  ASSIGN_OR_RETURN(*nccl, cluster::NcclCommunicator::CreateOverMpi(
                              job->tp_comm(), {.device = device.gpu_index,
                                               .timeout = options.collective_timeout}));
  return absl::OkStatus();
#else
  (void)nccl;
  return absl::InternalError("NCCL transport chosen in a build without NCCL");
#endif
}

absl::Status RunLeader(cluster::MpiJob* job, const MpiWorkerOptions& options,
                       cluster::Communicator* group, Watcher* watcher,
                       std::atomic<WorkerServer*>* server_slot,
                       const std::atomic<bool>* terminate) {
  ASSIGN_OR_RETURN(std::unique_ptr<WorkerServer> server, WorkerServer::Create(options.server));
  if (group != nullptr) {
    const RegisterInfo& r = server->register_info();
    RETURN_IF_ERROR(AgreeOnShape(group, {r.num_kv_blocks, r.block_size, r.max_model_len,
                                         r.vocab_size}));
  }
  server_slot->store(server.get());
  // A signal or a router stop that came during the load.
  if (terminate->load() || watcher->router_stopping()) server->RequestDrain();
  const absl::Status status = server->Run();
  server_slot->store(nullptr);
  if (group != nullptr) {
    if (absl::Status s = StopFollowers(group); !s.ok()) cluster::FailGroup(s);
    Log(*job, "followers released");
  }
  return status;
}

absl::Status RunGroupFollower(cluster::MpiJob* job, const MpiWorkerOptions& options,
                              cluster::Communicator* group) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options.server.engine));
  RETURN_IF_ERROR(AgreeOnShape(
      group, {engine->kv_cache().num_blocks(), engine->options().block_size,
              engine->options().scheduler.max_model_len, engine->model_config().vocab_size}));
  Log(*job, "following tensor-parallel leader (model ", options.server.engine.model, ", rank ",
      group->rank(), " of ", group->size(), ")");
  RETURN_IF_ERROR(RunFollower(&engine->model(), group));
  Log(*job, "leader is done; exiting");
  return absl::OkStatus();
}

}  // namespace

absl::Status RunFollower(LlamaModel* model, cluster::Communicator* group) {
  for (;;) {
    absl::StatusOr<StepMessage> message = ReceiveStepMessage(group);
    if (!message.ok()) {
      if (message.status().code() != absl::StatusCode::kInvalidArgument) {
        cluster::FailGroup(message.status());
      }
      return message.status();
    }
    if (message->kind == StepKind::kShutdown) return absl::OkStatus();
    ASSIGN_OR_RETURN(const StepPlan step, DecodeStepPlan(message->payload));
    model->Follow(step);
  }
}

absl::Status StopFollowers(cluster::Communicator* group) {
  return SendStepMessage(group, {StepKind::kShutdown, ""});
}

absl::Status RunMpiWorker(cluster::MpiJob* job, MpiWorkerOptions options,
                          std::atomic<WorkerServer*>* server_slot,
                          const std::atomic<bool>* terminate) {
  Log(*job, job->Describe());
  if (job->has_router()) {
    // Collective: every worker rank takes part, whatever --router says.
    ASSIGN_OR_RETURN(std::string endpoint, job->ReceiveRouterEndpoint(absl::Minutes(2)));
    if (options.server.router_endpoint.empty()) {
      options.server.router_endpoint = endpoint;
    } else {
      Log(*job, "--router ", options.server.router_endpoint, " overrides the job's router ",
          endpoint);
    }
  }
  if (options.server.router_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "no router: pass --router, or start carpool-router in the same mpirun job "
        "(mpirun -np 1 carpool-router : -np N carpool-worker ...)");
  }
  const bool leader = job->tp_rank() == 0;
  std::unique_ptr<cluster::MpiCommunicator> group;
  std::unique_ptr<cluster::GroupHeartbeat> beats;
  std::unique_ptr<cluster::DeviceCommunicator> nccl;
  if (job->tp_size() > 1) {
    ASSIGN_OR_RETURN(group, cluster::MpiCommunicator::Create(
                                job->tp_comm(), {.timeout = options.collective_timeout}));
    ASSIGN_OR_RETURN(beats, cluster::GroupHeartbeat::Create(
                                job->tp_comm(), {.interval = options.heartbeat_interval,
                                                 .timeout = options.heartbeat_timeout}));
    options.server.engine.tensor_parallel_group = group.get();
    RETURN_IF_ERROR(ChooseTransport(job, options, group.get(), &nccl));
    options.server.engine.tensor_parallel_device_group = nccl.get();
  }
  Watcher watcher(job, beats.get(),
                  std::min(options.heartbeat_interval / 2, absl::Milliseconds(50)), leader,
                  server_slot, terminate, options.heartbeat_timeout_terminating);
  absl::Status status = leader ? RunLeader(job, options, group.get(), &watcher, server_slot,
                                           terminate)
                               : RunGroupFollower(job, options, group.get());
  watcher.Stop(/*leave=*/status.ok());
  return status;
}

}  // namespace carpool::worker
