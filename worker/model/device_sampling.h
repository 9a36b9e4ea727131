// The host side of sampling on a GPU (ModelDevice::Sample): a step's sample requests as the
// CUDA sampler's rows (kernels/cuda/cuda_kernels.h, Sample) and the list of tokens their
// penalties touch. Plain host code, built and tested everywhere (the structs are CUDA-free);
// the CUDA device uploads what it produces.
//
// Thread-compatible.
#ifndef CARPOOL_WORKER_MODEL_DEVICE_SAMPLING_H_
#define CARPOOL_WORKER_MODEL_DEVICE_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cuda/cuda_kernel_params.h"
#include "worker/model/model_device.h"

namespace carpool::worker {

// A step's rows for the device sampler. Reused across steps (no allocation once warm).
class DeviceSamplingRows {
 public:
  // Fills rows() (one per request, in order) and penalties(): the seed resolved (0 without
  // has_seed, as the CPU sampler), temperature, top-k/p, min-p, the top-logprob count and the
  // penalties. A request's penalty entries are what worker::Sampler's ApplyPenalties touches:
  // when the repetition penalty is not 1 (and there are prompt or output tokens) or a frequency
  // or presence penalty is set (and there are output tokens), each distinct output token with its
  // count, then, with a repetition penalty, each distinct prompt token not in the output with
  // count 0; tokens outside [0, vocab) are skipped. A request with entries gets the next
  // penalized row (0, 1, ...). REQUIRES: vocab >= 1.
  void Pack(absl::Span<const SampleRequest> requests, int64_t vocab);

  const std::vector<kernels::cuda::SamplingRow>& rows() const { return rows_; }
  const std::vector<kernels::cuda::PenaltyToken>& penalties() const { return penalties_; }
  // Rows with penalty entries: the rows of penalized scratch the kernel needs.
  int num_penalized() const { return num_penalized_; }

 private:
  std::vector<kernels::cuda::SamplingRow> rows_;
  std::vector<kernels::cuda::PenaltyToken> penalties_;
  int num_penalized_ = 0;
  // Per token: > 0 occurrences in the output not yet listed, -1 listed; all 0 between calls.
  std::vector<int32_t> counts_;
};

// The device sampler's answer for one row as the host's SampleResult (`num_top` entries).
SampleResult ToSampleResult(const kernels::cuda::SampledToken& sampled, int num_top);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_DEVICE_SAMPLING_H_
