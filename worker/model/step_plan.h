// One engine step as the model needs it, without the scheduler's objects: what a tensor-parallel
// leader broadcasts to its followers before every step, so they run the same forward on their
// shards. A compact serialization of BatchPlan: per sequence its id, the positions it computes,
// whether it samples and its block table, plus the token ids computed.
//
// The step channel (leader -> followers over the group's Communicator): every message is one
// broadcast of a fixed-size header that carries small payloads inline, plus a second broadcast
// of the payload when it does not fit.
#ifndef CARPOOL_WORKER_MODEL_STEP_PLAN_H_
#define CARPOOL_WORKER_MODEL_STEP_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/communicator.h"
#include "worker/scheduler/scheduler.h"

namespace carpool::worker {

struct StepPlan {
  struct Seq {
    int64_t seq_id = 0;
    int32_t start_position = 0;  // computes positions [start_position, + num_tokens)
    int32_t num_tokens = 0;
    bool sample = false;
    // The blocks holding positions [0, start_position + num_tokens), no more.
    std::vector<int32_t> block_table;
  };
  std::vector<Seq> seqs;              // in plan order
  std::vector<int32_t> token_ids;     // num_tokens per sequence, concatenated in plan order
};

// The plan's tokens and blocks. REQUIRES: every block table covers its sequence's tokens.
StepPlan StepPlanFromBatch(const BatchPlan& plan, int block_size);

std::string EncodeStepPlan(const StepPlan& plan);
// INVALID_ARGUMENT for bytes that are not an encoded plan (truncated, inconsistent counts).
absl::StatusOr<StepPlan> DecodeStepPlan(absl::string_view bytes);

enum class StepKind : uint32_t {
  kStep = 1,      // payload: EncodeStepPlan
  kShutdown = 2,  // the leader is done; followers return
};

struct StepMessage {
  StepKind kind = StepKind::kStep;
  std::string payload;
};

// Leader (group rank 0): sends `message` to every follower.
absl::Status SendStepMessage(cluster::Communicator* comm, const StepMessage& message);
// Follower: waits, without a time limit, for the leader's next message (the group's heartbeats
// end the process if the leader dies meanwhile). INVALID_ARGUMENT for a malformed header.
absl::StatusOr<StepMessage> ReceiveStepMessage(cluster::Communicator* comm);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_STEP_PLAN_H_
