// A request's state inside one worker's scheduler.
#ifndef CARPOOL_WORKER_SCHEDULER_SEQUENCE_H_
#define CARPOOL_WORKER_SCHEDULER_SEQUENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/finish_reason.h"
#include "common/priority.h"
#include "common/sample_result.h"
#include "common/sampling_params.h"

namespace carpool::worker {

// kSuspended: a batch-class sequence that gave its slot to a more urgent one; it keeps its KV
// blocks and resumes where it stopped (scheduler_impl.h).
enum class SeqStatus { kWaiting, kRunning, kSuspended, kFinished };

struct Sequence {
  int64_t seq_id = 0;                 // unique within the scheduler
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> output_tokens;
  SamplingParams sampling;
  std::vector<int32_t> eos_token_ids; // the model's; ignored when sampling.ignore_eos
  Priority priority = Priority::kDefault;
  uint64_t cache_salt = 0;            // prefix-cache hashes are salted per tenant
  int64_t arrival_micros = 0;

  // Tokens (prompt, then output) whose keys and values are in the KV cache.
  int num_computed_tokens = 0;
  // Prompt tokens served from the prefix cache at the latest (re)admission.
  int num_cached_tokens = 0;
  int num_preemptions = 0;
  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  // Logprob results of the output tokens, one per output token.
  std::vector<SampleResult> output_logprobs;

  int num_tokens() const {
    return static_cast<int>(prompt_tokens.size() + output_tokens.size());
  }
  // Token at sequence position `pos` (prompt first, then output).
  int32_t TokenAt(int pos) const {
    const int p = static_cast<int>(prompt_tokens.size());
    return pos < p ? prompt_tokens[pos] : output_tokens[pos - p];
  }
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_SCHEDULER_SEQUENCE_H_
