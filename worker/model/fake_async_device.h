// A device for testing and measuring the engine's asynchronous step without a GPU
// (ModelDevice::SupportsAsyncStep): every step takes a fixed device time, and the device checks
// the host's side of the contract, that no input of a step in flight is overwritten before the
// step finishes.
//
//   FakeDeviceLog log;
//   auto device = std::make_unique<FakeAsyncDevice>(CreateCpuDevice(), options, &log);
//
// With an inner device (the CPU's), the kernels run on it when the model calls them, on the
// caller's thread, so the logits are real; without one they do nothing and Sample draws a token
// from (seed, position) alone, so a step costs the host nothing but the engine's own work (the
// benchmark). Either way the device models its time by a clock, not a thread: step k starts
// when it is launched or when step k - 1 ends, whichever is later, and ends step_micros after;
// FinishSample (and Sample, for a synchronous step) sleeps until then. Sampling happens on "the
// device" (SamplesOnDevice): the CPU sampler over the inner device's logits, after the
// placeholders of an asynchronous step (PendingTokenId, in the token ids and the penalties'
// output tokens) are replaced by the previous step's samples, as a GPU gathers them.
//
// The check: at an asynchronous SetStep the device checksums every input the view points to
// (token ids, positions, slots, sequences, their block tables, sample rows) and verifies the
// sum when the step finishes; it also counts a launch while two steps are in flight and a view
// whose memory overlaps a step in flight. Any of these is a violation in the log.
//
// Thread-compatible, like every device: the engine thread drives it.
#ifndef CARPOOL_WORKER_MODEL_FAKE_ASYNC_DEVICE_H_
#define CARPOOL_WORKER_MODEL_FAKE_ASYNC_DEVICE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "worker/model/model_device.h"
#include "worker/sampler/sampler.h"

namespace carpool::worker {

struct FakeAsyncDeviceOptions {
  // Device time of one step (synchronous or not), in microseconds. Default: 10 ms.
  int64_t step_micros = 10'000;
  // SupportsAsyncStep(). Default: true.
  bool async = true;
  // The vocabulary the samples are drawn from. Required (>= 1).
  int vocab = 0;
  // SamplesPendingPenalties(): false makes the device act as a GPU does, and a placeholder in
  // an asynchronous request's output tokens a violation. Default: true.
  bool samples_pending_penalties = true;
};

// What a FakeAsyncDevice saw; outlives the device (the engine owns the device).
struct FakeDeviceLog {
  enum class Kind { kLaunch, kFinish };
  struct Event {
    Kind kind;
    int64_t step;  // asynchronous steps, 0, 1, ...
  };
  std::vector<Event> events;
  // Inputs of a step in flight changed before it finished, or overlapping views, or a third
  // step launched; each with a line saying what.
  int64_t violations = 0;
  std::vector<std::string> violation_notes;
  int64_t async_steps = 0;
  int64_t sync_steps = 0;
  // Time the host slept in FinishSample and Sample, waiting for the device.
  int64_t wait_micros = 0;
  // Placeholder ids the device replaced by the previous step's samples.
  int64_t gathered_tokens = 0;
};

class FakeAsyncDevice : public ModelDevice {
 public:
  // `inner` (may be null: no computation) computes; `log` (not owned) must outlive the device.
  FakeAsyncDevice(std::unique_ptr<ModelDevice> inner, const FakeAsyncDeviceOptions& options,
                  FakeDeviceLog* log);
  ~FakeAsyncDevice() override;

  std::string name() const override { return "fake-async"; }
  StorageType storage_type() const override;
  StorageType kv_storage_type() const override;
  absl::StatusOr<DeviceArray> Weight(const Tensor& host) override;
  absl::StatusOr<DeviceArray> NormWeight(const Tensor& host) override;
  absl::StatusOr<DeviceArray> Allocate(int64_t numel) override;
  absl::StatusOr<DeviceArray> AllocateKv(int64_t numel) override;
  void Reserve(DeviceArray* a, int64_t numel) override;
  int64_t FreeBytes() const override { return -1; }
  void SetRope(absl::Span<const float> inv_freq, absl::Span<const float> local) override;
  void SetStep(const StepView& step) override;

  void EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) override;
  void RmsNorm(const DeviceArray& x, const DeviceArray& w, float eps, int64_t rows, int64_t h,
               DeviceArray* out) override;
  void AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& w, float eps,
                  int64_t rows, int64_t h, DeviceArray* out) override;
  void Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias, int64_t m,
              int64_t n, int64_t k, DeviceArray* y) override;
  void Rope(int num_heads, int head_dim, bool local, DeviceArray* x) override;
  void HeadRmsNorm(const DeviceArray& w, float eps, int64_t rows, int num_heads, int head_dim,
                   DeviceArray* x) override;
  void SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
               DeviceArray* out) override;
  void GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows, int64_t inter,
                   DeviceArray* out) override;
  void SoftCap(float cap, int64_t n, DeviceArray* x) override;
  void Scale(float factor, int64_t n, DeviceArray* x) override;
  void WriteKv(const DeviceArray& k, const DeviceArray& v, const kernels::KvCacheLayout& layout,
               DeviceArray* key_cache, DeviceArray* value_cache) override;
  void Attention(const DeviceArray& q, const DeviceArray& key_cache, const DeviceArray& value_cache,
                 const kernels::KvCacheLayout& layout, int num_heads,
                 const AttentionOptions& options, DeviceArray* out) override;
  void GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) override;
  int GraphBatchSize(int num_seqs) const override;
  void RunStep(const std::function<void()>& body) override;

  bool SamplesOnDevice() const override { return true; }
  void Sample(const DeviceArray& logits, int64_t vocab, absl::Span<const SampleRequest> requests,
              std::vector<SampleResult>* out) override;
  bool SupportsAsyncStep() const override { return options_.async; }
  bool SamplesPendingPenalties() const override { return options_.samples_pending_penalties; }
  void SampleAsync(const DeviceArray& logits, int64_t vocab,
                   absl::Span<const SampleRequest> requests) override;
  void FinishSample(std::vector<SampleResult>* out) override;

  float* HostData(const DeviceArray&) override { return nullptr; }
  void ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) override;
  void FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) override;

 private:
  // One asynchronous step launched and not finished.
  struct InFlight {
    int64_t step = 0;
    StepView view;  // the host's memory, which must not change until the step finishes
    uint64_t checksum = 0;
    bool clobbered = false;  // a later view overlapped it (a violation already)
    int64_t done_at = 0;     // steady-clock micros
    std::vector<SampleResult> samples;
  };
  static uint64_t Checksum(const StepView& view);
  void Violation(std::string note);
  // The samples of `requests` over rows of `logits`, with placeholders resolved.
  void Draw(const DeviceArray& logits, int64_t vocab, absl::Span<const SampleRequest> requests,
            bool resolve, std::vector<SampleResult>* out);
  // When a step launched now ends; advances the device's clock.
  int64_t ScheduleDeviceTime();
  void SleepUntil(int64_t micros);

  std::unique_ptr<ModelDevice> inner_;
  const FakeAsyncDeviceOptions options_;
  FakeDeviceLog* const log_;
  Sampler sampler_;
  std::deque<InFlight> in_flight_;
  int64_t next_step_ = 0;
  int64_t device_free_at_ = 0;
  // The last asynchronous step's samples, which the next step's placeholders stand for.
  std::vector<SampleResult> previous_;
  std::vector<int32_t> resolved_ids_;
  std::vector<std::vector<int32_t>> resolved_outputs_;
  std::vector<float> host_logits_;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_MODEL_FAKE_ASYNC_DEVICE_H_
