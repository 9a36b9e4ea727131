// One step of the model as plain data: what LlamaModel computes, and what a tensor-parallel
// leader broadcasts to its followers before computing it, so they run the same forward (and
// the same collectives) on their shards. Two kinds:
//   - kGenerate: one engine step (the engine builds it from the scheduler's plan): per sequence
//     the positions it computes, whether its logits are wanted and its block table, plus the
//     token ids computed. Keys and values go to the KV pool.
//   - kEmbed: one pass of LlamaModel::Embed: whole inputs, each from position 0, no block
//     tables; keys and values go to a scratch buffer, never to the pool; nothing is sampled.
//     How each input is pooled is the leader's business (only the leader pools), so it is not
//     part of the step.
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

namespace carpool::worker {

struct StepPlan {
  enum class Kind : uint8_t { kGenerate = 1, kEmbed = 2 };
  struct Seq {
    // kGenerate: the engine's sequence id; kEmbed: the input's index in the pass. Informational
    // (logs, tests): the model computes rows in plan order whatever the ids.
    int64_t seq_id = 0;
    int32_t start_position = 0;  // computes positions [start_position, + num_tokens); kEmbed: 0
    int32_t num_tokens = 0;      // >= 1
    bool sample = false;         // kGenerate: its last row's logits are wanted
    // kGenerate: the blocks holding positions [0, start_position + num_tokens), no more.
    // kEmbed: empty.
    std::vector<int32_t> block_table;
  };
  Kind kind = Kind::kGenerate;
  std::vector<Seq> seqs;           // in plan order
  std::vector<int32_t> token_ids;  // num_tokens per sequence, concatenated in plan order

  // Tokens the step computes: the sum of the sequences' num_tokens.
  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

std::string EncodeStepPlan(const StepPlan& plan);
// INVALID_ARGUMENT for bytes that are not an encoded plan (truncated, inconsistent counts, an
// unknown kind, an embed step that does not start at position 0 or carries block tables).
absl::StatusOr<StepPlan> DecodeStepPlan(absl::string_view bytes);

enum class StepKind : uint32_t {
  kStep = 1,      // payload: EncodeStepPlan (either kind of step)
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
