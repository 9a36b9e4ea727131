#include "worker/engine.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu/linear_bf16.h"

namespace carpool::worker {
namespace {

constexpr int64_t kDefaultKvCap = int64_t{1} << 30;
// Most blocks a pool sized from GPU memory gets. Only toy models reach it (synthetic:tiny's
// bf16 blocks are 4 KiB, so an H200 would hold ~30M); real ones run out of memory far below it
// (Llama-3-8B's are 2 MiB). It keeps the host-side block table of such a pool small.
constexpr int64_t kMaxGpuKvBlocks = int64_t{1} << 22;

// Whether the loader keeps a BF16 checkpoint's tensors bf16 for the CPU device `d` asks for:
// for bf16 and int8 weights (packed or quantized from bf16 directly, no fp32 copy made), and
// for --dtype auto where that takes bf16 (CpuAutoDtypeIsBf16; a synthetic model is fp32, not a
// BF16 checkpoint). F32 and F16 checkpoints load as fp32 either way.
bool CpuKeepsBf16(const DeviceOptions& d, const std::string& model) {
  if (d.quantization == Quantization::kInt8) return true;
  if (d.dtype.has_value()) return *d.dtype == StorageType::kBF16;
  return CpuAutoDtypeIsBf16() && model.rfind("synthetic:", 0) != 0;
}

// The CPU device `d` asks for over weights loaded as CpuKeepsBf16 says: --dtype auto is bf16
// exactly when the tensors stayed bf16; the KV cache's auto follows the weights.
CpuDeviceOptions CpuOptions(const DeviceOptions& d, const LlamaWeights& weights,
                            ThreadPool* pool) {
  CpuDeviceOptions c;
  c.pool = pool;
  if (d.quantization == Quantization::kInt8) {
    c.weights = WeightFormat::kInt8;
  } else if (d.dtype.has_value()) {
    c.weights = *d.dtype == StorageType::kBF16 ? WeightFormat::kBF16 : WeightFormat::kF32;
  } else {
    c.weights = weights.embed_tokens.type() == TensorType::kBF16 ? WeightFormat::kBF16
                                                                  : WeightFormat::kF32;
  }
  c.kv_cache = d.kv_cache_dtype.value_or(c.weights == WeightFormat::kF32 ? StorageType::kF32
                                                                         : StorageType::kBF16);
  return c;
}

// Blocks for the KV pool, from the options and the model's per-block footprint.
int64_t KvBlocks(const EngineOptions& o, const ModelConfig& c, int max_model_len,
                 StorageType storage) {
  if (o.num_kv_blocks > 0) return o.num_kv_blocks;
  const int64_t per_block = LlamaModel::KvBytesPerBlock(c, o.block_size, storage);
  int64_t bytes = o.kv_cache_memory_bytes;
  if (bytes <= 0) {
    const int64_t blocks_per_seq = (max_model_len + o.block_size - 1) / o.block_size;
    bytes = std::min(kDefaultKvCap,
                     int64_t{o.scheduler.max_num_seqs} * blocks_per_seq * per_block);
  }
  return bytes / per_block;
}

// The device options.device asks for and, when the GPU's memory sizes the KV pool, what that
// memory leaves for it. Called after the weights are loaded on the host and before they go up,
// so the pool is measured against the memory the weights will take.
struct ChosenDevice {
  std::unique_ptr<ModelDevice> device;
  // The pool is sized by --gpu-memory-utilization (neither num_kv_blocks nor
  // kv_cache_memory_bytes is set): kv_pool_bytes, possibly less than one block. Else KvBlocks.
  bool sized_by_memory = false;
  int64_t kv_pool_bytes = 0;
  int64_t weight_bytes = 0;  // in the device's storage type
  int64_t margin_bytes = 0;
};

// `d` is o.device resolved (kCpu or kCuda). Under tensor parallelism each rank resolves to its
// own GPU (options.device.gpu_index, which carpool-worker sets from the local rank) and
// computes there; its collectives are staged through host memory over the group's
// communicator (LlamaModel: ToHost -> collective -> FromHost), so any device works under any
// group.
absl::StatusOr<ChosenDevice> ChooseDevice(const EngineOptions& o, const DeviceOptions& d,
                                          const LlamaWeights& weights, int max_model_len,
                                          ThreadPool* pool) {
  ChosenDevice chosen;
  if (d.kind == DeviceKind::kCpu) {
    chosen.device = CreateCpuDevice(CpuOptions(d, weights, pool));
    return chosen;
  }
  RETURN_IF_ERROR(CheckCudaSupportsModel(weights.config));
  const SchedulerOptions& sched = o.scheduler;
  ASSIGN_OR_RETURN(chosen.device,
                   CreateCudaModelDevice(d, {.max_num_batched_tokens = sched.max_num_batched_tokens,
                                             .max_num_seqs = sched.max_num_seqs,
                                             .max_model_len = max_model_len,
                                             .block_size = o.block_size}));
  if (o.num_kv_blocks == 0 && o.kv_cache_memory_bytes == 0) {
    chosen.sized_by_memory = true;
    // This rank's weights go up in the storage type: ParameterBytes counts fp32. The margin is
    // the whole model's activations, an overestimate for a tensor-parallel rank.
    chosen.weight_bytes = weights.ParameterBytes() / 4 * StorageTypeBytes(d.gpu_dtype());
    chosen.margin_bytes =
        GpuActivationMarginBytes(weights.config, sched.max_num_batched_tokens, d.gpu_dtype());
    ASSIGN_OR_RETURN(chosen.kv_pool_bytes,
                     CudaKvPoolBytes(d, chosen.weight_bytes, chosen.margin_bytes));
  }
  return chosen;
}

// The fewest of the group's ranks' `blocks` (every rank calls it): the ranks of a group index
// one pool through the leader's block tables, so they must have the same number of blocks, and
// GPUs sized by their free memory may not. Block counts are at most kMaxGpuKvBlocks (< 2^24),
// so they travel exactly as floats.
absl::StatusOr<int64_t> FewestBlocksInGroup(cluster::Communicator* group, int64_t blocks) {
  const float mine = static_cast<float>(blocks);
  std::vector<float> all(group->size());
  RETURN_IF_ERROR(group->AllGather(&mine, 1, all.data()));
  return static_cast<int64_t>(*std::min_element(all.begin(), all.end()));
}

// The KV pool's blocks when the GPU's memory sizes it: what chosen.kv_pool_bytes holds (at
// most kMaxGpuKvBlocks), the fewest of the group's ranks under tensor parallelism.
// RESOURCE_EXHAUSTED when that is not one block. Every rank of a group takes part, even one
// with no room, so that all of them see the failure.
absl::StatusOr<int64_t> GpuKvBlocks(const ChosenDevice& chosen, const ModelConfig& config,
                                    const EngineOptions& o, cluster::Communicator* group) {
  const int64_t per_block =
      LlamaModel::KvBytesPerBlock(config, o.block_size, chosen.device->kv_storage_type());
  int64_t blocks = std::min(kMaxGpuKvBlocks, chosen.kv_pool_bytes / per_block);
  if (group != nullptr && group->size() > 1) {
    ASSIGN_OR_RETURN(blocks, FewestBlocksInGroup(group, blocks));
  }
  if (blocks >= 1) return blocks;
  const double u = o.device.gpu_memory_utilization;
  if (chosen.kv_pool_bytes >= per_block) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--gpu-memory-utilization ", u, " leaves no room for a KV block on another rank of the "
        "tensor-parallel group; raise it or free GPU memory there"));
  }
  ASSIGN_OR_RETURN(const GpuMemoryInfo memory, CudaMemoryInfo(o.device));
  return GpuMemoryFitError(chosen.device->name(), u, memory, chosen.weight_bytes,
                           chosen.margin_bytes, per_block);
}

// The window behind which the KV cache may release a running sequence's blocks: the model's
// when every layer slides (Mistral). When only some do (Gemma 3), the global layers read every
// position through the same block table, so every block is kept: 0.
int ReleasableWindow(const ModelConfig& c) {
  for (int layer = 0; layer < c.num_layers; ++layer) {
    if (!LayerSlides(c, layer)) return 0;
  }
  return c.sliding_window;
}

}  // namespace

const char* DeviceSamplingName(DeviceSampling d) {
  switch (d) {
    case DeviceSampling::kOn:
      return "on";
    case DeviceSampling::kOff:
      return "off";
    case DeviceSampling::kAuto:
      break;
  }
  return "auto";
}

const char* AsyncStepName(AsyncStep a) {
  switch (a) {
    case AsyncStep::kOn:
      return "on";
    case AsyncStep::kOff:
      return "off";
    case AsyncStep::kAuto:
      break;
  }
  return "auto";
}

void SampleRequestsFromBatch(const BatchPlan& plan, std::vector<SampleRequest>* requests,
                             std::vector<int>* seq_index) {
  requests->clear();
  seq_index->clear();
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.sample) continue;
    SampleRequest r;
    r.params = &s.seq->sampling;
    r.prompt_tokens = s.seq->prompt_tokens;
    r.output_tokens = s.seq->output_tokens;
    r.position = s.seq->num_tokens();
    requests->push_back(r);
    seq_index->push_back(static_cast<int>(i));
  }
}

bool CpuAutoDtypeIsBf16() {
  return std::string(kernels::cpu::LinearBf16Path()) != "portable";
}

void StepPlanFromBatch(const BatchPlan& plan, int block_size, StepPlan* step) {
  step->kind = StepPlan::Kind::kGenerate;
  step->seqs.resize(plan.seqs.size());
  step->token_ids.clear();
  step->token_ids.reserve(plan.num_batched_tokens);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    StepPlan::Seq& q = step->seqs[i];
    q.seq_id = s.seq->seq_id;
    q.start_position = s.start_position;
    q.num_tokens = s.num_tokens;
    q.sample = s.sample;
    const int context = s.start_position + s.num_tokens;
    const size_t blocks = static_cast<size_t>((context + block_size - 1) / block_size);
    q.block_table.assign(s.block_table.begin(), s.block_table.begin() + blocks);
    for (int p = s.start_position; p < context; ++p) step->token_ids.push_back(s.seq->TokenAt(p));
  }
}

absl::Status EngineOptions::Validate() const {
  if (model.empty()) return absl::InvalidArgumentError("--model is required");
  if (block_size < 1 || block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size must be in [1, 1024], got ", block_size));
  }
  if (num_kv_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-kv-blocks must be >= 0, got ", num_kv_blocks));
  }
  if (kv_cache_memory_bytes < 0) {
    return absl::InvalidArgumentError("--kv-cache-memory must be >= 0");
  }
  RETURN_IF_ERROR(device.Validate());
  if (num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 0, got ", num_threads));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                       Clock* clock,
                                                       std::unique_ptr<ModelDevice> device) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Engine> engine(new Engine());
  engine->options_ = options;
  engine->pool_ = std::make_unique<ThreadPool>(options.num_threads > 0 ? options.num_threads
                                                                       : ThreadPool::CoreCount());
  engine->clock_ = clock != nullptr ? clock : Clock::Real();
  cluster::Communicator* group = options.tensor_parallel_group;
  TensorParallelRank tp;
  if (group != nullptr) tp = {group->rank(), group->size()};
  // The device's kind first: it decides how the weights load (a GPU converts fp32 tensors; the
  // CPU may keep a BF16 checkpoint bf16).
  DeviceOptions resolved = options.device;
  LoadOptions load;
  if (device == nullptr) {
    if (resolved.kind != DeviceKind::kCpu) {
      ASSIGN_OR_RETURN(resolved, ResolveDevice(resolved, /*local_rank=*/-1));
    }
    RETURN_IF_ERROR(CheckDeviceStorage(resolved));
    load.keep_bf16 = resolved.kind == DeviceKind::kCpu && CpuKeepsBf16(resolved, options.model);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaWeights> weights,
                   LoadWeights(options.model, tp, engine->pool_.get(), load));
  const ModelConfig config = weights->config;

  SchedulerOptions& sched = engine->options_.scheduler;
  if (sched.max_model_len <= 0) sched.max_model_len = config.max_position_embeddings;
  if (sched.max_model_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len ", sched.max_model_len, " exceeds the model's max_position_embeddings ",
        config.max_position_embeddings));
  }
  sched.clock = engine->clock_;

  int64_t blocks = 0;
  if (device == nullptr) {
    ASSIGN_OR_RETURN(ChosenDevice chosen, ChooseDevice(options, resolved, *weights,
                                                       sched.max_model_len, engine->pool_.get()));
    if (chosen.sized_by_memory) {
      ASSIGN_OR_RETURN(blocks, GpuKvBlocks(chosen, config, options, group));
    }
    device = std::move(chosen.device);
  }
  if (blocks == 0) {
    blocks = KvBlocks(engine->options_, config, sched.max_model_len, device->kv_storage_type());
  }
  if (blocks < 1 || blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache of ", blocks, " blocks is out of range; check --num-kv-blocks / "
                     "--kv-cache-memory"));
  }
  KvCacheOptions kv_options;
  kv_options.num_blocks = static_cast<int>(blocks);
  kv_options.block_size = options.block_size;
  kv_options.enable_prefix_caching = options.enable_prefix_caching;
  kv_options.sliding_window = ReleasableWindow(config);
  ASSIGN_OR_RETURN(engine->kv_cache_, KvCacheManager::Create(kv_options));
  ASSIGN_OR_RETURN(engine->model_,
                   LlamaModel::Create(std::move(weights),
                                      KvCacheShape{static_cast<int>(blocks), options.block_size},
                                      group, std::move(device),
                                      options.tensor_parallel_device_group));
  ASSIGN_OR_RETURN(engine->scheduler_, CreateScheduler(sched, engine->kv_cache_.get()));
  const bool can_sample_on_device = engine->model_->CanSampleOnDevice();
  if (options.device_sampling == DeviceSampling::kOn && !can_sample_on_device) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device-sampling on: ", engine->model_->device().name(),
        engine->model_->group() != nullptr ? " under tensor parallelism" : "",
        " cannot sample on the device (a GPU can, alone or under --tp-transport nccl); use auto "
        "or off"));
  }
  engine->samples_on_device_ =
      options.device_sampling != DeviceSampling::kOff && can_sample_on_device;
  const bool can_step_async = engine->samples_on_device_ && engine->model_->CanStepAsync();
  if (options.async_step == AsyncStep::kOn && !can_step_async) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--async-step on: ", engine->model_->device().name(),
        !engine->samples_on_device_ ? " does not sample on the device here"
                                    : " cannot run steps asynchronously",
        " (a GPU that samples on the device, without tensor parallelism, can); use auto or "
        "off"));
  }
  engine->async_ = options.async_step != AsyncStep::kOff && can_step_async;
  engine->sampler_ = std::make_unique<Sampler>(config.vocab_size);
  engine->next_seed_ = std::random_device{}();
  return engine;
}

absl::Status Engine::ValidateRequest(const EngineRequest& r) const {
  const ModelConfig& c = model_->config();
  const int max_len = options_.scheduler.max_model_len;
  if (r.prompt_tokens.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (size_t i = 0; i < r.prompt_tokens.size(); ++i) {
    const int32_t id = r.prompt_tokens[i];
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " has id ", id,
                                                     ", outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  for (size_t i = 0; i < r.output_tokens.size(); ++i) {
    const int32_t id = r.output_tokens[i];
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("output token ", i, " has id ", id,
                                                     ", outside the vocabulary [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  RETURN_IF_ERROR(r.sampling.Validate(c.vocab_size));
  if (static_cast<int64_t>(r.output_tokens.size()) >= r.sampling.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request already has ", r.output_tokens.size(), " output tokens; max_tokens (",
        r.sampling.max_tokens, ") leaves none to generate"));
  }
  const int64_t prompt_len = static_cast<int64_t>(r.prompt_tokens.size());
  if (prompt_len >= max_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt is ", prompt_len,
                                                   " tokens; max_model_len is ", max_len,
                                                   " and at least one token must be generated"));
  }
  if (prompt_len + r.sampling.max_tokens > max_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", prompt_len, " tokens) + max_tokens (", r.sampling.max_tokens,
        ") exceeds max_model_len ", max_len));
  }
  // A sliding sequence holds only its window's blocks (and a chunk's); a recompute without
  // chunked prefill computes it in one step.
  const SchedulerOptions& sched = options_.scheduler;
  const int max_chunk = sched.enable_chunked_prefill ? sched.max_num_batched_tokens : max_len;
  const int64_t blocks_needed = kv_cache_->PeakBlocks(
      static_cast<int>(prompt_len + r.sampling.max_tokens), max_chunk);
  if (blocks_needed > model_->kv_shape().num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request needs ", blocks_needed, " KV blocks at once but the whole cache has ",
        model_->kv_shape().num_blocks));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Engine::Add(EngineRequest request) {
  RETURN_IF_ERROR(ValidateRequest(request));
  auto seq = std::make_unique<Sequence>();
  seq->seq_id = next_id_++;
  seq->prompt_tokens = std::move(request.prompt_tokens);
  seq->output_tokens = std::move(request.output_tokens);
  seq->sampling = std::move(request.sampling);
  if (!seq->sampling.has_seed) {
    seq->sampling.has_seed = true;
    seq->sampling.seed = next_seed_ = next_seed_ * 6364136223846793005ULL + 1442695040888963407ULL;
  }
  seq->eos_token_ids = model_->config().eos_token_ids;
  seq->priority = request.priority;
  seq->cache_salt = request.cache_salt;
  seq->arrival_micros = clock_->NowMicros();
  auto completion = std::make_shared<Completion>();
  completion->prompt_tokens = static_cast<int>(seq->prompt_tokens.size());
  completion->timings.arrival = seq->arrival_micros;
  const int64_t id = seq->seq_id;
  Inflight& f = inflight_[id];
  f.completion = std::move(completion);
  f.stop_token_ids = seq->sampling.stop_token_ids;
  f.ignore_eos = seq->sampling.ignore_eos;
  scheduler_->Add(std::move(seq));
  return id;
}

bool Engine::Abort(int64_t request_id) {
  if (!pending_.active) {
    const bool known = inflight_.erase(request_id) > 0;
    const bool held = scheduler_->Abort(request_id);
    // Asynchronous: a sequence that stopped by a token may still be the scheduler's until the
    // next call (it is finished for the caller).
    return async_ ? known : held;
  }
  // A step is between the scheduler's Schedule and Update: the scheduler takes the abort
  // before it schedules again; no event of the request comes back from now on.
  const bool known = inflight_.erase(request_id) > 0;
  if (known) deferred_aborts_.push_back(request_id);
  return known;
}

StepOutput Engine::RunModel(const BatchPlan& plan) {
  const int64_t start = clock_->NowMicros();
  StepPlanFromBatch(plan, options_.block_size, &step_);
  StepOutput out;
  out.samples.resize(plan.seqs.size());
  if (samples_on_device_) {
    SampleRequestsFromBatch(plan, &sample_requests_, &sample_seq_index_);
    model_->ForwardAndSample(step_, sample_requests_, &device_samples_);
    forward_micros_ += clock_->NowMicros() - start;
    for (size_t i = 0; i < sample_seq_index_.size(); ++i) {
      out.samples[sample_seq_index_[i]] = std::move(device_samples_[i]);
    }
    return out;
  }
  model_->Forward(step_, &logits_);
  forward_micros_ += clock_->NowMicros() - start;
  const int vocab = model_->config().vocab_size;
  int row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (!s.sample) continue;
    SampleInput in;
    in.logits = logits_.data() + static_cast<int64_t>(row++) * vocab;
    in.params = &s.seq->sampling;
    in.prompt_tokens = s.seq->prompt_tokens;
    in.output_tokens = s.seq->output_tokens;
    in.position = s.seq->num_tokens();
    out.samples[i] = sampler_->Sample(in);
  }
  return out;
}

std::vector<EngineEvent> Engine::Step() { return async_ ? AsyncStepOnce() : SyncStep(); }

void Engine::MarkScheduled(const BatchPlan& plan) {
  const int64_t now = clock_->NowMicros();
  for (const ScheduledSeq& s : plan.seqs) {
    auto it = inflight_.find(s.seq->seq_id);
    if (it != inflight_.end() && it->second.completion->timings.first_scheduled == 0) {
      it->second.completion->timings.first_scheduled = now;
    }
  }
}

std::vector<EngineEvent> Engine::SyncStep() {
  std::vector<EngineEvent> events;
  BatchPlan plan = scheduler_->Schedule();
  if (plan.empty()) return events;
  MarkScheduled(plan);
  const StepOutput output = RunModel(plan);
  const int64_t done = clock_->NowMicros();
  for (SeqUpdate& u : scheduler_->Update(plan, output)) {
    auto it = inflight_.find(u.seq_id);
    if (it == inflight_.end()) continue;
    Completion& c = *it->second.completion;
    EngineEvent event;
    event.seq_id = u.seq_id;
    if (u.has_token) {
      if (c.tokens.empty()) c.timings.first_token = done;
      c.tokens.push_back(u.sample.token);
      c.logprobs.push_back(u.sample);
      event.has_token = true;
      event.sample = std::move(u.sample);
    }
    if (u.finished) {
      c.finish_reason = u.finish_reason;
      c.cached_prompt_tokens = u.cached_prompt_tokens;
      c.timings.finished = done;
      event.finished = true;
      event.completion = std::move(it->second.completion);
      inflight_.erase(it);
    }
    events.push_back(std::move(event));
  }
  return events;
}

// The asynchronous step. Per call, with step N in flight (launched by the previous call, or
// now when none is):
//   1. the scheduler's Update over N with a placeholder per sampled row (PendingTokenId), so
//      that it schedules every running sequence one token further; stops by length apply now,
//      as they depend on no token's value;
//   2. the aborts the scheduler could not take while N was between Schedule and Update;
//   3. Schedule() and launch N + 1, whose rows that decode a placeholder read the token from
//      N's results on the device;
//   4. wait for N, write its real tokens over the placeholders, find the stops by token (stop
//      ids, EOS), and make N's events.
// A sequence stopped by a token in 4 is still the scheduler's and may be in N + 1 (a wasted
// row): it is aborted in 2 of the next call, and its later rows are dropped in 4 (it is no
// longer inflight_). Until 4 of N, no host code reads a placeholder as a token: the step plans
// and sample requests carry them to the device, and the scheduler compares them only with stop
// ids and EOS, which are never negative.
std::vector<EngineEvent> Engine::AsyncStepOnce() {
  if (!pending_.active) {
    ApplyDeferredAborts();
    BatchPlan plan = scheduler_->Schedule();
    if (plan.empty()) return {};
    MarkScheduled(plan);
    Launch(std::move(plan));
  }
  ProvisionalUpdate();
  ApplyDeferredAborts();
  std::swap(pending_, finishing_);
  pending_.active = false;
  BatchPlan next = scheduler_->Schedule();
  std::vector<EngineEvent> events;
  if (!next.empty() && NeedsKnownTokens(next)) {
    // The device cannot gather a penalized request's pending token: finish N first, so the
    // next step's inputs are all known (the device idles for this step's host work).
    ++drained_steps_;
    events = FinishPending(&finishing_);
    finishing_.active = false;
    MarkScheduled(next);
    Launch(std::move(next));
    return events;
  }
  if (!next.empty()) {
    MarkScheduled(next);
    Launch(std::move(next));
  }
  events = FinishPending(&finishing_);
  finishing_.active = false;
  return events;
}

bool Engine::NeedsKnownTokens(const BatchPlan& plan) const {
  if (model_->device().SamplesPendingPenalties()) return false;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.sample || s.seq->output_tokens.empty() || s.seq->output_tokens.back() >= 0) continue;
    const SamplingParams& p = s.seq->sampling;
    if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
        p.presence_penalty != 0.0f) {
      return true;
    }
  }
  return false;
}

void Engine::Launch(BatchPlan plan) {
  const int64_t start = clock_->NowMicros();
  StepPlanFromBatch(plan, options_.block_size, &step_);
  SampleRequestsFromBatch(plan, &sample_requests_, &sample_seq_index_);
  pending_.rows.resize(sample_seq_index_.size());
  for (size_t r = 0; r < sample_seq_index_.size(); ++r) {
    const Sequence& seq = *plan.seqs[sample_seq_index_[r]].seq;
    PendingStep::Row& row = pending_.rows[r];
    row = PendingStep::Row();
    row.seq_id = seq.seq_id;
    row.seq_index = sample_seq_index_[r];
    row.output_index = static_cast<int>(seq.output_tokens.size());
    row.logprob_index = static_cast<int>(seq.output_logprobs.size());
  }
  model_->LaunchStep(step_, sample_requests_);
  pending_.plan = std::move(plan);
  pending_.active = true;
  forward_micros_ += clock_->NowMicros() - start;
}

void Engine::ProvisionalUpdate() {
  const BatchPlan& plan = pending_.plan;
  provisional_.samples.assign(plan.seqs.size(), SampleResult());
  for (size_t r = 0; r < pending_.rows.size(); ++r) {
    provisional_.samples[pending_.rows[r].seq_index].token =
        PendingTokenId(static_cast<int>(r));
  }
  // One update per sampled sequence, in plan order: the rows' order.
  const std::vector<SeqUpdate> updates = scheduler_->Update(plan, provisional_);
  CARPOOL_CHECK(updates.size() == pending_.rows.size());
  for (size_t r = 0; r < updates.size(); ++r) {
    PendingStep::Row& row = pending_.rows[r];
    CARPOOL_CHECK(updates[r].seq_id == row.seq_id);
    row.updated = true;
    row.length_finished = updates[r].finished;
    row.length_reason = updates[r].finish_reason;
    row.cached_prompt_tokens = updates[r].cached_prompt_tokens;
  }
}

void Engine::ApplyDeferredAborts() {
  for (int64_t id : deferred_aborts_) scheduler_->Abort(id);
  deferred_aborts_.clear();
}

std::vector<EngineEvent> Engine::FinishPending(PendingStep* step) {
  const int64_t start = clock_->NowMicros();
  model_->FinishStep(&device_samples_);
  const int64_t done = clock_->NowMicros();
  forward_micros_ += done - start;
  CARPOOL_CHECK(device_samples_.size() == step->rows.size());
  const std::vector<int32_t>& eos = model_->config().eos_token_ids;
  const auto contains = [](const std::vector<int32_t>& ids, int32_t token) {
    return std::find(ids.begin(), ids.end(), token) != ids.end();
  };
  std::vector<EngineEvent> events;
  events.reserve(step->rows.size());
  for (size_t r = 0; r < step->rows.size(); ++r) {
    const PendingStep::Row& row = step->rows[r];
    CARPOOL_CHECK(row.updated);
    auto it = inflight_.find(row.seq_id);
    if (it == inflight_.end()) {
      ++wasted_rows_;  // aborted, or stopped by a token in the step before
      continue;
    }
    SampleResult& sample = device_samples_[r];
    if (!row.length_finished) {
      // Still the scheduler's (aborted and stopped sequences left inflight_ above).
      Sequence& seq = *step->plan.seqs[row.seq_index].seq;
      seq.output_tokens[row.output_index] = sample.token;
      seq.output_logprobs[row.logprob_index] = sample;
    }
    // The scheduler's StopReason, in its order, for the real token.
    FinishReason reason = FinishReason::kNone;
    if (contains(it->second.stop_token_ids, sample.token) ||
        (!it->second.ignore_eos && contains(eos, sample.token))) {
      reason = FinishReason::kStop;
    } else if (row.length_finished) {
      reason = row.length_reason;
    }
    if (reason != FinishReason::kNone && !row.length_finished) {
      deferred_aborts_.push_back(row.seq_id);
    }
    Completion& c = *it->second.completion;
    EngineEvent event;
    event.seq_id = row.seq_id;
    if (c.tokens.empty()) c.timings.first_token = done;
    c.tokens.push_back(sample.token);
    c.logprobs.push_back(sample);
    event.has_token = true;
    event.sample = std::move(sample);
    if (reason != FinishReason::kNone) {
      c.finish_reason = reason;
      c.cached_prompt_tokens = row.cached_prompt_tokens;
      c.timings.finished = done;
      event.finished = true;
      event.completion = std::move(it->second.completion);
      inflight_.erase(it);
    }
    events.push_back(std::move(event));
  }
  return events;
}

absl::StatusOr<std::vector<std::vector<float>>> Engine::Embed(
    absl::Span<const EmbeddingInput* const> inputs) {
  const int max_len = options_.scheduler.max_model_len;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (static_cast<int64_t>(inputs[i]->tokens.size()) > max_len) {
      return absl::InvalidArgumentError(absl::StrCat("embedding input ", i, " has ",
                                                     inputs[i]->tokens.size(),
                                                     " tokens; max_model_len is ", max_len));
    }
  }
  std::vector<std::vector<float>> out;
  RETURN_IF_ERROR(model_->Embed(inputs, &out, options_.scheduler.max_num_batched_tokens));
  return out;
}

std::vector<absl::StatusOr<Completion>> Engine::Generate(std::vector<EngineRequest> requests) {
  std::vector<absl::StatusOr<Completion>> results(requests.size(),
                                                  absl::InternalError("not run"));
  absl::flat_hash_map<int64_t, size_t> index_of;
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<int64_t> id = Add(std::move(requests[i]));
    if (!id.ok()) {
      results[i] = id.status();
    } else {
      index_of[*id] = i;
    }
  }
  while (has_unfinished()) {
    for (EngineEvent& e : Step()) {
      if (e.finished) results[index_of[e.seq_id]] = std::move(*e.completion);
    }
  }
  return results;
}

}  // namespace carpool::worker
