#include "worker/scheduler/scheduler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/scheduler/admission_policy.h"
#include "worker/scheduler/scheduler_impl.h"

namespace carpool::worker {

absl::Status SchedulerOptions::Validate() const {
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_batched_tokens must be >= 1, got ", max_num_batched_tokens));
  }
  if (max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs must be >= 1, got ", max_num_seqs));
  }
  if (max_model_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_model_len must be >= 1, got ", max_model_len));
  }
  if (!enable_chunked_prefill && max_num_batched_tokens < max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_num_batched_tokens (", max_num_batched_tokens, ") must be >= max_model_len (",
        max_model_len, ") when chunked prefill is disabled"));
  }
  if (static_batch_timeout_micros < 0) {
    return absl::InvalidArgumentError(absl::StrCat("static_batch_timeout_micros must be >= 0, got ",
                                                   static_batch_timeout_micros));
  }
  if (policy != SchedulerPolicy::kContinuous && policy != SchedulerPolicy::kStatic) {
    return absl::InvalidArgumentError("policy must be continuous or static");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Scheduler>> CreateScheduler(const SchedulerOptions& options,
                                                           KvCacheManager* kv_cache) {
  RETURN_IF_ERROR(options.Validate());
  if (kv_cache == nullptr) return absl::InvalidArgumentError("kv_cache is null");
  std::unique_ptr<internal::AdmissionPolicy> policy = options.policy == SchedulerPolicy::kStatic
                                                          ? internal::MakeStaticPolicy(options)
                                                          : internal::MakeContinuousPolicy();
  return std::unique_ptr<Scheduler>(
      new internal::SchedulerImpl(options, kv_cache, std::move(policy)));
}

}  // namespace carpool::worker
