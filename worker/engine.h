// One worker's inference engine: scheduler + KV cache + model + sampler, stepped by its owner.
//
//   auto engine = Engine::Create(options);
//   engine->Add(request);            // validated; errors name the field
//   while (engine->has_unfinished()) for (auto& event : engine->Step()) ...
//
// Generate() wraps that loop for offline batch mode. Thread-compatible: one thread (the engine
// loop) owns an Engine.
#ifndef CARPOOL_WORKER_ENGINE_H_
#define CARPOOL_WORKER_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/thread_pool.h"
#include "worker/device_options.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/model/llama_model.h"
#include "worker/model/step_plan.h"
#include "worker/sampler/sampler.h"
#include "worker/scheduler/scheduler.h"

namespace carpool::worker {

// Where the engine samples (--device-sampling). kOn and kAuto where the device can
// (LlamaModel::CanSampleOnDevice: a GPU, without tensor parallelism): on the device, which
// returns only the sampled ids and logprobs (ModelDevice::Sample); kOff, and kAuto elsewhere:
// the logits are copied to the host and sampled there (Sampler). Both follow the CPU sampler's
// contract, so the same logits give the same tokens either way.
enum class DeviceSampling { kAuto, kOn, kOff };
const char* DeviceSamplingName(DeviceSampling d);  // "auto", "on", "off"

// Whether the engine prepares step N + 1 while the device runs step N (--async-step). kOn and
// kAuto where the model can (LlamaModel::CanStepAsync: a device that runs steps asynchronously
// and samples on the device, without tensor parallelism): asynchronous; kOff, and kAuto
// elsewhere (the CPU): each step finishes before the next is scheduled. Both give the same
// tokens for the same requests.
enum class AsyncStep { kAuto, kOn, kOff };
const char* AsyncStepName(AsyncStep a);  // "auto", "on", "off"

struct EngineOptions {
  // "synthetic:<preset>" or a Hugging Face folder. Required.
  std::string model;
  // scheduler.max_model_len <= 0 means the model's max_position_embeddings.
  SchedulerOptions scheduler;
  // Tokens per KV block. Default: 16.
  int block_size = 16;
  // KV pool size in blocks; 0 derives it from kv_cache_memory_bytes. Default: 0.
  int num_kv_blocks = 0;
  // KV pool size in bytes when num_kv_blocks is 0; 0 means, on the CPU, enough for max_num_seqs
  // sequences of max_model_len tokens, capped at 1 GiB, and on a GPU what
  // device.gpu_memory_utilization leaves. Default: 0.
  int64_t kv_cache_memory_bytes = 0;
  // Share identical full prompt blocks between requests. Default: true.
  bool enable_prefix_caching = true;
  // Threads of the pool the engine owns: its CPU device's kernels and the weights' loading run
  // on them (a device given to Engine::Create brings its own). 0 = one per core. Default: 0.
  int num_threads = 0;
  // Tensor parallelism: this process's group (not owned; outlives the engine). The engine loads
  // its rank's slices; on the group's leader, the model broadcasts every step it computes
  // (generation steps and embedding passes) to the followers, which run them
  // (LlamaModel::Follow, RunFollower in worker/mpi_worker.h). Null or a group of one: the whole
  // model here. Default: null.
  cluster::Communicator* tensor_parallel_group = nullptr;
  // The same group's collectives on device buffers (cluster::DeviceCommunicator, not owned;
  // outlives the engine): with a GPU device, the model's sums and logits' gather run on the
  // device's stream through it instead of through host memory over tensor_parallel_group
  // (carpool-worker: an NcclCommunicator under --tp-transport nccl or auto). Null: host
  // staging. Default: null.
  cluster::DeviceCommunicator* tensor_parallel_device_group = nullptr;
  // The device the model runs on when Engine::Create is given none. kCpu: a CpuDevice whose
  // weights are device.dtype's (auto: CpuAutoDtypeIsBf16 and a BF16 checkpoint), int8 with
  // device.quantization, and whose KV cache is device.kv_cache_dtype's (auto: bf16 with bf16 or
  // int8 weights); the weights load with LoadOptions::keep_bf16 where they end up bf16 or int8,
  // so a BF16 checkpoint is never converted to fp32, and the model releases the host's copy once
  // packed. kCuda (or kAuto resolving to it): a CudaDevice on device.gpu_index in
  // device.dtype, and, when neither num_kv_blocks nor kv_cache_memory_bytes is set, a KV pool
  // sized by device.gpu_memory_utilization (CudaKvPoolBytes). Under tensor parallelism the
  // same, per rank: the caller resolves each rank's gpu_index (carpool-worker: the local rank),
  // the collectives are staged through host memory over the group's communicator unless
  // tensor_parallel_device_group is set, and a pool sized by memory takes the fewest blocks of
  // the group's ranks (every rank of the group then takes part in that collective).
  // Default: the CPU in fp32 (the binaries' --device and --dtype flags default to auto;
  // RegisterEngineFlags), so an engine built in code computes what it did before bf16 weights
  // existed unless it asks for them.
  DeviceOptions device = {.kind = DeviceKind::kCpu, .dtype = StorageType::kF32};
  // Sampling on the device (see DeviceSampling); kOn makes Create fail with
  // FAILED_PRECONDITION where the device cannot sample. Default: auto.
  DeviceSampling device_sampling = DeviceSampling::kAuto;
  // The asynchronous step (see AsyncStep and Engine::Step); kOn makes Create fail with
  // FAILED_PRECONDITION where the model cannot step asynchronously (or device_sampling is
  // kOff). Default: auto.
  AsyncStep async_step = AsyncStep::kAuto;

  absl::Status Validate() const;
};

struct EngineRequest {
  std::vector<int32_t> prompt_tokens;
  // Tokens already generated for this request elsewhere (a resumed stream). The engine
  // recomputes prompt + these as prefill and continues after them; the penalties count them as
  // output. sampling.max_tokens counts them too (the total output is max_tokens tokens), so
  // there must be fewer of them than max_tokens. Completion and events carry only the new tokens.
  std::vector<int32_t> output_tokens;
  SamplingParams sampling;
  Priority priority = Priority::kDefault;
  uint64_t cache_salt = 0;
};

// Times in microseconds on the engine's clock.
struct RequestTimings {
  int64_t arrival = 0;
  int64_t first_scheduled = 0;
  int64_t first_token = 0;
  int64_t finished = 0;
};

// A finished request, as Generate() returns it.
struct Completion {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> logprobs;   // one per token
  FinishReason finish_reason = FinishReason::kNone;
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;
  RequestTimings timings;
};

// What one Step() produced for one request.
struct EngineEvent {
  int64_t seq_id = 0;  // the engine's id of the request (Engine::Add)
  bool has_token = false;
  SampleResult sample;
  bool finished = false;
  // Set when finished: the whole result.
  std::shared_ptr<Completion> completion;
};

// --dtype auto on the CPU: whether a BF16 checkpoint's weights stay bf16 (else they are
// converted to fp32 at load). True wherever LinearBf16 has a vector path (avx512_bf16, and
// avx2, which computes on the exact bf16 weights): a decode step reads half the bytes, and
// carpool-bench-engine measured bf16 faster than fp32 on an AVX2-only EPYC too; false for the
// portable build.
bool CpuAutoDtypeIsBf16();

// The model's step for the scheduler's `plan`: per scheduled sequence its positions, whether it
// samples, the blocks of its block table that cover them (block_size tokens each), and the
// token ids computed. Reuses `step`'s memory. REQUIRES: every block table covers its sequence's
// tokens.
void StepPlanFromBatch(const BatchPlan& plan, int block_size, StepPlan* step);

// The sampled rows of `plan` as ModelDevice::Sample takes them: one request per sequence with
// `sample` set, in plan order (the order of the model's sampled rows), with its parameters,
// prompt and output tokens and the position of the token it samples (num_tokens(), as the host
// path's SampleInput). (*seq_index)[i] is request i's index in plan.seqs. Reuses the vectors'
// memory; the requests point into the plan's sequences.
void SampleRequestsFromBatch(const BatchPlan& plan, std::vector<SampleRequest>* requests,
                             std::vector<int>* seq_index);

class Engine {
 public:
  // `device` runs the model (its kv_storage_type sizes the KV pool; the weights load as fp32
  // for it); nullptr: the one options.device asks for (on the CPU, one that computes on the
  // engine's thread pool).
  // FAILED_PRECONDITION when options.device asks for CUDA and this build has none or no GPU is
  // visible, or options.device_sampling is kOn and the device cannot sample; INVALID_ARGUMENT
  // when the device it resolves to refuses the storage flags (CheckDeviceStorage);
  // RESOURCE_EXHAUSTED when --gpu-memory-utilization leaves no room for a KV block (on any rank
  // of a tensor-parallel group).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options, Clock* clock = nullptr,
      std::unique_ptr<ModelDevice> device = nullptr);

  // Checks a request against the model and limits (INVALID_ARGUMENT naming the problem).
  absl::Status ValidateRequest(const EngineRequest& request) const;
  // Validates and queues; returns the request id.
  absl::StatusOr<int64_t> Add(EngineRequest request);
  bool Abort(int64_t request_id);

  // One iteration: schedule, forward, sample, update. Synchronous (steps_async() false): the
  // step scheduled in this call runs and its events come back. Asynchronous: the step launched
  // by the previous call (or, when none is in flight, one scheduled now) is finished here, and
  // before waiting for it the engine schedules and launches the next one, assuming every
  // sequence it sampled gets one more token (whose id the device fills in). A sequence that
  // turns out to have stopped (a stop token, EOS) got a wasted row in that next step, whose
  // result is dropped; it leaves the scheduler before the step after, and its events end with
  // the step that stopped it, as in the synchronous engine. Either way, the events of a request
  // are the same, token for token.
  std::vector<EngineEvent> Step();
  // Requests not finished, or a step still in flight.
  bool has_unfinished() const { return scheduler_->has_unfinished() || pending_.active; }

  // Embeddings of one-shot inputs (LlamaModel::Embed), one vector of hidden_size floats per
  // input, in order. Runs now, between steps; takes no KV blocks. Passes are bounded by
  // scheduler.max_num_batched_tokens, so they need no more activation memory than a step.
  // INVALID_ARGUMENT naming the input: empty, a token outside the vocabulary, or longer than
  // max_model_len. Under tensor parallelism the leader's engine embeds (its followers run each
  // pass with it); a follower's engine answers FAILED_PRECONDITION.
  absl::StatusOr<std::vector<std::vector<float>>> Embed(
      absl::Span<const EmbeddingInput* const> inputs);

  // Offline batch mode: runs every valid request through the engine together; results in input
  // order, invalid requests get their error and do not disturb the others.
  std::vector<absl::StatusOr<Completion>> Generate(std::vector<EngineRequest> requests);

  const ModelConfig& model_config() const { return model_->config(); }
  const EngineOptions& options() const { return options_; }
  LlamaModel& model() { return *model_; }
  const KvCacheManager& kv_cache() const { return *kv_cache_; }
  // The prefix-cache hash changes since the last call (KvCacheManager::TakeEvents).
  KvCacheEvents TakeKvCacheEvents() { return kv_cache_->TakeEvents(); }
  const Scheduler& scheduler() const { return *scheduler_; }
  // The engine's pool (options.num_threads threads), for callers that want to run work of
  // their own on the same threads between steps (benchmarks).
  ThreadPool& thread_pool() const { return *pool_; }
  // Wall time spent inside the model's forward, cumulative (for overhead measurements); with
  // device sampling it includes the sampling, which the forward's read-back then waits for.
  // Asynchronous steps: the time launching steps and waiting for them.
  // Embed's passes are not included.
  int64_t forward_micros() const { return forward_micros_; }
  // Whether steps sample on the device (options.device_sampling resolved).
  bool samples_on_device() const { return samples_on_device_; }
  // Whether steps run asynchronously (options.async_step resolved).
  bool steps_async() const { return async_; }
  // Asynchronous steps: rows computed for sequences that had already stopped (their results
  // dropped), cumulative.
  int64_t wasted_rows() const { return wasted_rows_; }
  // Asynchronous steps launched only after the step before finished, because the device could
  // not gather a penalized request's pending token (ModelDevice::SamplesPendingPenalties).
  int64_t drained_steps() const { return drained_steps_; }

 private:
  Engine() = default;
  StepOutput RunModel(const BatchPlan& plan);

  // An asynchronous step launched and not finished.
  struct PendingStep {
    bool active = false;
    BatchPlan plan;
    // Per sampled row (plan order): the sequence's id, its index in plan.seqs, and what the
    // provisional Update said (finished by length, with its counts).
    struct Row {
      int64_t seq_id = 0;
      int seq_index = 0;
      int output_index = 0;  // the row's token's index in the sequence's output_tokens
      int logprob_index = 0;  // and in its output_logprobs (a resumed stream has fewer)
      bool updated = false;  // the provisional Update ran over this step
      bool length_finished = false;
      FinishReason length_reason = FinishReason::kNone;
      int cached_prompt_tokens = 0;
    };
    std::vector<Row> rows;
  };
  // Per request beside its Completion: what deciding a stop needs once the scheduler may have
  // dropped the sequence.
  struct Inflight {
    std::shared_ptr<Completion> completion;
    std::vector<int32_t> stop_token_ids;
    bool ignore_eos = false;
  };
  std::vector<EngineEvent> SyncStep();
  std::vector<EngineEvent> AsyncStepOnce();
  // Stamps first_scheduled on the plan's requests.
  void MarkScheduled(const BatchPlan& plan);
  // Builds the step and its sample requests from `plan` and launches it as pending_.
  void Launch(BatchPlan plan);
  // The scheduler's Update over the pending step before its tokens are known: every sampled
  // sequence gets a placeholder (PendingTokenId of its row), stops by length are applied.
  void ProvisionalUpdate();
  // Waits for `step`, writes its real tokens into the live sequences and makes its events.
  std::vector<EngineEvent> FinishPending(PendingStep* step);
  // Aborts the scheduler could not take while a step was between Schedule and Update.
  void ApplyDeferredAborts();
  // Whether `plan` samples a penalized sequence whose last token is still pending, which a
  // device that does not gather pending penalty tokens cannot take.
  bool NeedsKnownTokens(const BatchPlan& plan) const;

  EngineOptions options_;
  Clock* clock_ = nullptr;
  // Declared before the model: its CPU device computes on it, so it goes last.
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCacheManager> kv_cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Sampler> sampler_;
  int64_t next_id_ = 1;
  uint64_t next_seed_ = 0x5eed;
  // Requests between Add and their final event.
  absl::flat_hash_map<int64_t, Inflight> inflight_;
  StepPlan step_;  // the current step, reused across steps
  bool async_ = false;
  PendingStep pending_;
  // The step being finished by the current call (pending_'s memory, swapped).
  PendingStep finishing_;
  // The provisional Update's placeholder samples.
  StepOutput provisional_;
  // Sequences to drop from the scheduler at the next point it allows (aborted, or stopped by a
  // token while the next step was already scheduled).
  std::vector<int64_t> deferred_aborts_;
  int64_t wasted_rows_ = 0;
  int64_t drained_steps_ = 0;
  std::vector<float> logits_;
  bool samples_on_device_ = false;
  // Device sampling: the step's requests, their sequences' indices in the plan, the results.
  std::vector<SampleRequest> sample_requests_;
  std::vector<int> sample_seq_index_;
  std::vector<SampleResult> device_samples_;
  int64_t forward_micros_ = 0;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_ENGINE_H_
