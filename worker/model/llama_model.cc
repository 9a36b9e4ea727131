#include "worker/model/llama_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"

namespace carpool::worker {

namespace {

// The block table of a padding sequence: one token over block 0, never stored (slot -1).
constexpr int32_t kDummyBlockTable[1] = {0};

// Bytes of a weight array on its device: numel elements of the storage type, or what a packed
// or quantized array says it takes.
int64_t ArrayBytes(const DeviceArray& a, StorageType storage) {
  if (a.format().kind == ArrayFormat::Kind::kStorage) return a.numel() * StorageTypeBytes(storage);
  return a.bytes();
}

// The norm tensors the config's family needs are there, of the right size (a loader or a test
// that builds weights by hand and misses one gets a clear error, not a read past a tensor).
absl::Status CheckFamilyTensors(const LlamaWeights& w) {
  const ModelConfig& c = w.config;
  const auto check = [](const Tensor& t, int64_t want, int layer, const char* name) {
    if (t.numel() == want) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, ": ", name, " has ", t.numel(),
                                                   " values, the config needs ", want));
  };
  for (int l = 0; l < static_cast<int>(w.layers.size()); ++l) {
    const LayerWeights& lw = w.layers[l];
    const int64_t head = c.qk_norm ? c.head_dim : 0;
    const int64_t hidden = c.sandwich_norms ? c.hidden_size : 0;
    RETURN_IF_ERROR(check(lw.q_norm, head, l, "self_attn.q_norm"));
    RETURN_IF_ERROR(check(lw.k_norm, head, l, "self_attn.k_norm"));
    RETURN_IF_ERROR(check(lw.pre_feedforward_norm, hidden, l, "pre_feedforward_layernorm"));
    RETURN_IF_ERROR(check(lw.post_feedforward_norm, hidden, l, "post_feedforward_layernorm"));
  }
  if (c.sliding_window > 0 && !c.layer_sliding.empty() &&
      static_cast<int>(c.layer_sliding.size()) != c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer_sliding has ", c.layer_sliding.size(),
                                                   " entries for ", c.num_layers, " layers"));
  }
  return absl::OkStatus();
}

}  // namespace

std::array<const DeviceArray*, 16> LlamaModel::LayerArrayList(const LayerArrays& a) {
  return {&a.input_norm,
          &a.q_proj,
          &a.k_proj,
          &a.v_proj,
          &a.q_bias,
          &a.k_bias,
          &a.v_bias,
          &a.o_proj,
          &a.post_attention_norm,
          &a.q_norm,
          &a.k_norm,
          &a.pre_feedforward_norm,
          &a.post_feedforward_norm,
          &a.gate_proj,
          &a.up_proj,
          &a.down_proj};
}

int64_t LlamaModel::KvBytesPerBlock(const ModelConfig& c, int block_size, StorageType storage) {
  return 2LL * c.num_layers * block_size * c.num_kv_heads * c.head_dim * StorageTypeBytes(storage);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape,
    cluster::Communicator* group, std::unique_ptr<ModelDevice> device,
    cluster::DeviceCommunicator* device_group) {
  if (weights == nullptr) return absl::InvalidArgumentError("no weights");
  const TensorParallelRank& tp = weights->tp;
  if (tp.size > 1 && (group == nullptr || group->size() != tp.size || group->rank() != tp.rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights are sliced for tensor-parallel rank ", tp.rank, " of ", tp.size,
        " but the group is ",
        group == nullptr ? std::string("missing")
                         : absl::StrCat("rank ", group->rank(), " of ", group->size())));
  }
  if (tp.size == 1 && group != nullptr && group->size() != 1) {
    return absl::InvalidArgumentError("a tensor-parallel group needs weights sliced for it");
  }
  if (tp.size == 1) group = nullptr;
  if (device_group != nullptr && group == nullptr) device_group = nullptr;
  if (device_group != nullptr &&
      (device_group->size() != group->size() || device_group->rank() != group->rank())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the device collectives' group is rank ", device_group->rank(), " of ",
        device_group->size(), " but the tensor-parallel group is rank ", group->rank(), " of ",
        group->size()));
  }
  if (kv_shape.num_blocks <= 0 || kv_shape.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache needs at least one block of size >= 1, got ", kv_shape.num_blocks,
                     " blocks of ", kv_shape.block_size));
  }
  RETURN_IF_ERROR(CheckFamilyTensors(*weights));
  if (device == nullptr) device = CreateCpuDevice();
  if (device_group != nullptr && device->stream() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("collectives on device buffers need a device with a stream (a GPU); ",
                     device->name(), " has none: use --tp-transport mpi"));
  }
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(weights), kv_shape, group,
                                                   std::move(device), device_group));
  RETURN_IF_ERROR(model->Init());
  return model;
}

LlamaModel::LlamaModel(std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape,
                       cluster::Communicator* group, std::unique_ptr<ModelDevice> device,
                       cluster::DeviceCommunicator* device_group)
    : weights_(std::move(weights)),
      kv_shape_(kv_shape),
      group_(group),
      device_(std::move(device)),
      device_group_(device_group),
      num_heads_(weights_->shard.num_heads),
      num_kv_heads_(weights_->shard.num_kv_heads),
      intermediate_(weights_->shard.intermediate),
      vocab_(weights_->shard.vocab) {
  const ModelConfig& c = weights_->config;
  layout_.num_blocks = kv_shape.num_blocks;
  layout_.block_size = kv_shape.block_size;
  layout_.num_kv_heads = num_kv_heads_;
  layout_.head_dim = c.head_dim;
  switch (device_->storage_type()) {
    case StorageType::kBF16:
      element_type_ = cluster::DeviceElementType::kBF16;
      break;
    case StorageType::kF16:
      element_type_ = cluster::DeviceElementType::kF16;
      break;
    case StorageType::kF32:
      element_type_ = cluster::DeviceElementType::kF32;
      break;
  }
}

absl::Status LlamaModel::Init() {
  const LlamaWeights& w = *weights_;
  ModelDevice& d = *device_;
  ASSIGN_OR_RETURN(embed_, d.Weight(w.embed_tokens));
  ASSIGN_OR_RETURN(final_norm_, d.NormWeight(w.final_norm));
  lm_head_ = &embed_;
  if (w.lm_head.raw_data() != w.embed_tokens.raw_data()) {
    ASSIGN_OR_RETURN(own_lm_head_, d.Weight(w.lm_head));
    lm_head_ = &own_lm_head_;
  }
  layers_.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    LayerArrays& a = layers_[l];
    ASSIGN_OR_RETURN(a.input_norm, d.NormWeight(lw.input_norm));
    ASSIGN_OR_RETURN(a.q_proj, d.Weight(lw.q_proj));
    ASSIGN_OR_RETURN(a.k_proj, d.Weight(lw.k_proj));
    ASSIGN_OR_RETURN(a.v_proj, d.Weight(lw.v_proj));
    ASSIGN_OR_RETURN(a.q_bias, d.Weight(lw.q_bias));
    ASSIGN_OR_RETURN(a.k_bias, d.Weight(lw.k_bias));
    ASSIGN_OR_RETURN(a.v_bias, d.Weight(lw.v_bias));
    ASSIGN_OR_RETURN(a.o_proj, d.Weight(lw.o_proj));
    ASSIGN_OR_RETURN(a.post_attention_norm, d.NormWeight(lw.post_attention_norm));
    ASSIGN_OR_RETURN(a.q_norm, d.NormWeight(lw.q_norm));
    ASSIGN_OR_RETURN(a.k_norm, d.NormWeight(lw.k_norm));
    ASSIGN_OR_RETURN(a.pre_feedforward_norm, d.NormWeight(lw.pre_feedforward_norm));
    ASSIGN_OR_RETURN(a.post_feedforward_norm, d.NormWeight(lw.post_feedforward_norm));
    ASSIGN_OR_RETURN(a.gate_proj, d.Weight(lw.gate_proj));
    ASSIGN_OR_RETURN(a.up_proj, d.Weight(lw.up_proj));
    ASSIGN_OR_RETURN(a.down_proj, d.Weight(lw.down_proj));
  }
  d.SetRope(RopeInvFreq(w.config), LocalRopeInvFreq(w.config));
  const int64_t per_layer = static_cast<int64_t>(kv_shape_.num_blocks) * kv_shape_.block_size *
                            num_kv_heads_ * w.config.head_dim;
  for (int l = 0; l < w.config.num_layers; ++l) {
    // Left uninitialized: attention reads only slots that a step has written.
    ASSIGN_OR_RETURN(DeviceArray keys, d.AllocateKv(per_layer));
    ASSIGN_OR_RETURN(DeviceArray values, d.AllocateKv(per_layer));
    key_cache_.push_back(std::move(keys));
    value_cache_.push_back(std::move(values));
  }
  host_memory_ = !key_cache_.empty() && d.HostData(key_cache_[0]) != nullptr;
  // Every layer's weights, the final norm and the head, but one embedding row.
  const StorageType storage = d.storage_type();
  decode_weight_bytes_ = ArrayBytes(final_norm_, storage) + ArrayBytes(*lm_head_, storage);
  if (!embed_.empty()) {
    decode_weight_bytes_ += ArrayBytes(embed_, storage) * w.config.hidden_size / embed_.numel();
  }
  for (const LayerArrays& a : layers_) {
    for (const DeviceArray* x : LayerArrayList(a)) decode_weight_bytes_ += ArrayBytes(*x, storage);
  }
  // A device whose arrays all hold their own memory (a GPU's copies; the CPU's packed or
  // quantized weights, and bf16 tensors it borrows by reference) no longer needs the host's
  // tensors: 4 bytes a parameter in fp32 (32 GB for an 8B model), or the mapped checkpoint
  // beside the CPU's int8 copy. Nothing reads them after Init (DecodeWeightBytes is computed
  // above). Devices that borrow fp32 tensors (the CPU in fp32, and test devices built on it)
  // keep them.
  if (WeightsCopied()) weights_->ReleaseTensors();
  return absl::OkStatus();
}

bool LlamaModel::WeightsCopied() const {
  const auto copied = [](const DeviceArray& a) { return a.empty() || a.owns_memory(); };
  if (!copied(embed_) || !copied(final_norm_) || !copied(own_lm_head_)) return false;
  for (const LayerArrays& a : layers_) {
    for (const DeviceArray* x : LayerArrayList(a)) {
      if (!copied(*x)) return false;
    }
  }
  return true;
}

int64_t LlamaModel::DecodeWeightBytes() const { return decode_weight_bytes_; }

void LlamaModel::PrepareInputs(const StepPlan& step, StepInputs* in) {
  in->token_ids = step.token_ids;
  in->scratch_kv = step.kind == StepPlan::Kind::kEmbed;
  in->decode_only = !in->scratch_kv;
  if (in->scratch_kv) {
    // Token r's keys and values sit in scratch slot r: each sequence's block table (block_size
    // 1) is the run of slot numbers from its first token.
    const int64_t t = step.num_tokens();
    const int64_t kv_dim = static_cast<int64_t>(num_kv_heads_) * weights_->config.head_dim;
    if (static_cast<int64_t>(embed_table_.size()) < t) {
      embed_table_.resize(t);
      for (int64_t r = 0; r < t; ++r) embed_table_[r] = static_cast<int32_t>(r);
    }
    device_->Reserve(&embed_keys_, t * kv_dim);
    device_->Reserve(&embed_values_, t * kv_dim);
    embed_layout_ = layout_;
    embed_layout_.num_blocks = static_cast<int>(t);
    embed_layout_.block_size = 1;
  }
  const int bs = in->scratch_kv ? 1 : kv_shape_.block_size;
  for (const StepPlan::Seq& s : step.seqs) {
    kernels::AttentionSeq a;
    a.query_start = static_cast<int>(in->positions.size());
    a.query_len = s.num_tokens;
    a.context_len = s.start_position + s.num_tokens;
    a.block_table = in->scratch_kv ? embed_table_.data() + a.query_start : s.block_table.data();
    in->attention_seqs.push_back(a);
    if (s.num_tokens != 1) in->decode_only = false;
    for (int p = s.start_position; p < a.context_len; ++p) {
      in->positions.push_back(p);
      in->slots.push_back(static_cast<int64_t>(a.block_table[p / bs]) * bs + p % bs);
    }
    if (s.sample) in->sample_rows.push_back(static_cast<int64_t>(in->positions.size()) - 1);
  }
}

void LlamaModel::Publish(const StepPlan& step) {
  if (group_ == nullptr || group_->rank() != 0) return;
  const int64_t start = Clock::Real()->NowMicros();
  if (absl::Status s = SendStepMessage(group_, {StepKind::kStep, EncodeStepPlan(step)}); !s.ok()) {
    cluster::FailGroup(s);
  }
  times_.broadcast_micros += Clock::Real()->NowMicros() - start;
}

void LlamaModel::Forward(const StepPlan& step, std::vector<float>* logits) {
  CARPOOL_CHECK(step.kind == StepPlan::Kind::kGenerate);
  Publish(step);
  StepInputs in;
  PrepareInputs(step, &in);
  Compute(&in, logits);
}

bool LlamaModel::CanSampleOnDevice() const {
  // Under tensor parallelism the leader's device holds the gathered logits only where the
  // collectives run on the device (device_group_); host staging gathers them on the host.
  return (group_ == nullptr || device_group_ != nullptr) && device_->SamplesOnDevice();
}

void LlamaModel::ForwardAndSample(const StepPlan& step, absl::Span<const SampleRequest> requests,
                                  std::vector<SampleResult>* samples) {
  CARPOOL_CHECK(step.kind == StepPlan::Kind::kGenerate);
  CARPOOL_CHECK(CanSampleOnDevice());
  CARPOOL_CHECK(group_ == nullptr || group_->rank() == 0);
  Publish(step);
  StepInputs in;
  PrepareInputs(step, &in);
  CARPOOL_CHECK(requests.size() == in.sample_rows.size());
  Compute(&in, &sample_scratch_, requests, samples);
}

bool LlamaModel::CanStepAsync() const {
  // Where the device's memory is the host's, the head writes into a host vector the next step
  // reuses, so such a device samples synchronously. Under tensor parallelism the followers
  // would need the tokens the leader's device sampled (a step's pending ids), which only the
  // leader has, so tensor-parallel steps are synchronous.
  return group_ == nullptr && CanSampleOnDevice() && device_->SupportsAsyncStep() &&
         !host_memory_;
}

void LlamaModel::StepInputs::Clear() {
  token_ids.clear();
  positions.clear();
  slots.clear();
  attention_seqs.clear();
  sample_rows.clear();
  decode_only = true;
  scratch_kv = false;
  async = false;
}

void LlamaModel::LaunchStep(const StepPlan& step, absl::Span<const SampleRequest> requests) {
  CARPOOL_CHECK(step.kind == StepPlan::Kind::kGenerate);
  CARPOOL_CHECK(CanStepAsync());
  // Two steps at most: the buffer this one takes is the one step launched_ - 2 read.
  CARPOOL_CHECK(launched_ - finished_ < 2);
  StepInputs& in = async_inputs_[launched_ % 2];
  in.Clear();
  // The block tables are copied: the caller's plan may be rewritten before the device reads
  // them. The outer vector keeps its inner vectors' memory across steps.
  if (in.block_tables.size() < step.seqs.size()) in.block_tables.resize(step.seqs.size());
  for (size_t i = 0; i < step.seqs.size(); ++i) {
    in.block_tables[i].assign(step.seqs[i].block_table.begin(), step.seqs[i].block_table.end());
  }
  PrepareInputs(step, &in);
  for (size_t i = 0; i < step.seqs.size(); ++i) {
    in.attention_seqs[i].block_table = in.block_tables[i].data();
  }
  in.async = true;
  CARPOOL_CHECK(requests.size() == in.sample_rows.size());
  ++launched_;
  Compute(&in, &sample_scratch_, requests, nullptr, /*launch_only=*/true);
}

void LlamaModel::FinishStep(std::vector<SampleResult>* samples) {
  CARPOOL_CHECK(finished_ < launched_);
  device_->FinishSample(samples);
  ++finished_;
}

void LlamaModel::Follow(const StepPlan& step) {
  CARPOOL_CHECK(group_ != nullptr && group_->rank() != 0);
  if (step.kind == StepPlan::Kind::kGenerate) {
    Forward(step, &follower_logits_);
    return;
  }
  StepInputs in;
  RunEmbedStep(step, &in);
}

bool LlamaModel::PadDecode(StepInputs* in) const {
  const int n = static_cast<int>(in->attention_seqs.size());
  if (!in->decode_only || n == 0) return false;
  const int size = device_->GraphBatchSize(n);
  if (size < n) return false;
  for (int i = n; i < size; ++i) {
    kernels::AttentionSeq a;
    a.query_start = static_cast<int>(in->token_ids.size());
    a.query_len = 1;
    a.context_len = 1;
    a.block_table = kDummyBlockTable;
    in->attention_seqs.push_back(a);
    in->sample_rows.push_back(static_cast<int64_t>(in->token_ids.size()));
    in->token_ids.push_back(0);
    in->positions.push_back(0);
    in->slots.push_back(-1);
  }
  return true;
}

void LlamaModel::Compute(StepInputs* in, std::vector<float>* logits,
                         absl::Span<const SampleRequest> requests,
                         std::vector<SampleResult>* samples, bool launch_only) {
  const int64_t wanted = static_cast<int64_t>(in->sample_rows.size());
  // A step whose sums go through host memory (MPI) cannot be recorded; one whose collectives
  // are enqueued on the device's stream (device_group_) can, so it is padded and run through
  // RunStep like a whole model's.
  const bool whole_step = (group_ == nullptr || device_group_ != nullptr) && PadDecode(in);
  const int64_t s = static_cast<int64_t>(in->sample_rows.size());
  Stage(*in, s);
  if (group_ != nullptr) {
    CARPOOL_CHECK(!launch_only);
    ParallelStep(*in, s, whole_step, logits, requests, samples);
    // The padding's rows come last; they are dropped (and not sampled).
    if (!logits->empty()) logits->resize(wanted * weights_->config.vocab_size);
    return;
  }
  const int64_t h = weights_->config.hidden_size;
  // Where the device's memory is the host's, the head writes straight into `logits`.
  DeviceArray host_logits;
  DeviceArray* head_out = &logits_;
  if (host_memory_) {
    logits->resize(s * vocab_);
    host_logits = DeviceArray(nullptr, logits->data(), s * vocab_);
    head_out = &host_logits;
  }
  const auto body = [&] {
    RunLayers(*in);
    if (s == 0) return;
    device_->GatherRows(hidden_, h, &sampled_);
    device_->Linear(sampled_, *lm_head_, no_bias_, s, vocab_, h, head_out);
    CapLogits(s, head_out);
  };
  if (whole_step) {
    device_->RunStep(body);
  } else {
    body();
  }
  // The padding's rows come last; their logits are dropped (and they are not sampled).
  if (launch_only) {
    device_->SampleAsync(*head_out, vocab_, requests);
    return;
  }
  if (samples != nullptr) {
    device_->Sample(*head_out, vocab_, requests, samples);
    return;
  }
  logits->resize(wanted * vocab_);
  if (!host_memory_ && wanted > 0) device_->ToHost(logits_, 0, wanted * vocab_, logits->data());
}

void LlamaModel::Stage(const StepInputs& in, int64_t s) {
  const ModelConfig& c = weights_->config;
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  StepView view;
  view.token_ids = in.token_ids;
  if (group_ != nullptr) {
    // Vocabulary-parallel embedding: this rank's rows (row 0 stands in for tokens another rank
    // holds; EmbedTokens zeroes those rows).
    local_ids_.resize(t);
    const int64_t first = weights_->shard.vocab_begin;
    for (int64_t i = 0; i < t; ++i) {
      const int64_t row = in.token_ids[i] - first;
      local_ids_[i] = row >= 0 && row < vocab_ ? static_cast<int32_t>(row) : 0;
    }
    view.token_ids = local_ids_;
  }
  view.positions = in.positions;
  view.slots = in.slots;
  view.seqs = in.attention_seqs;
  view.block_size = in.scratch_kv ? embed_layout_.block_size : kv_shape_.block_size;
  view.sample_rows = in.sample_rows;
  view.decode_only = in.decode_only;
  view.async = in.async;
  device_->SetStep(view);

  const int64_t h = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(num_heads_) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(num_kv_heads_) * c.head_dim;
  ModelDevice& d = *device_;
  d.Reserve(&residual_, t * h);
  d.Reserve(&hidden_, t * h);
  d.Reserve(&out_, t * h);
  d.Reserve(&q_, t * q_dim);
  d.Reserve(&k_, t * kv_dim);
  d.Reserve(&v_, t * kv_dim);
  d.Reserve(&attn_, t * q_dim);
  d.Reserve(&gate_, t * intermediate_);
  d.Reserve(&up_, t * intermediate_);
  d.Reserve(&sampled_, s * h);
  if (group_ != nullptr || !host_memory_) d.Reserve(&logits_, s * vocab_);
  if (group_ == nullptr) return;
  // Every step makes the embedding's sum and two per layer. Counted here, not as each is
  // enqueued: a replayed graph makes its recorded sums without the model's calls.
  times_.all_reduces += 1 + 2 * c.num_layers;
  const int size = group_->size();
  if (device_group_ != nullptr) {
    d.Reserve(&gathered_logits_, size * s * vocab_);
    if (group_->rank() == 0) d.Reserve(&full_logits_, s * c.vocab_size);
  }
  if (group_->rank() == 0 && static_cast<int64_t>(gathered_.size()) < size * s * vocab_) {
    gathered_.resize(size * s * vocab_);
  }
}

void LlamaModel::RunLayers(const StepInputs& in) {
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  EmbedTokens(in, t, /*sum=*/true);  // -> residual_
  RunLayersFromResidual(in);
}

void LlamaModel::RunLayersFromResidual(const StepInputs& in) {
  const ModelConfig& c = weights_->config;
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t h = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  ModelDevice& d = *device_;
  d.RmsNorm(residual_, layers_[0].input_norm, eps, t, h, &hidden_);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerArrays& lw = layers_[l];
    Attention(l, in, t);  // hidden_ -> out_
    if (c.sandwich_norms) {
      // Gemma 3: the attention output is normalized before its residual add, and the MLP's
      // input has a norm of its own.
      d.RmsNorm(out_, lw.post_attention_norm, eps, t, h, &out_);
      d.AddRmsNorm(out_, &residual_, lw.pre_feedforward_norm, eps, t, h, &hidden_);
    } else {
      d.AddRmsNorm(out_, &residual_, lw.post_attention_norm, eps, t, h, &hidden_);
    }
    Mlp(l, t);  // hidden_ -> out_
    if (c.sandwich_norms) d.RmsNorm(out_, lw.post_feedforward_norm, eps, t, h, &out_);
    const DeviceArray& next_norm = l + 1 < c.num_layers ? layers_[l + 1].input_norm : final_norm_;
    d.AddRmsNorm(out_, &residual_, next_norm, eps, t, h, &hidden_);
  }
}

absl::Status LlamaModel::Embed(absl::Span<const EmbeddingInput* const> inputs,
                               std::vector<std::vector<float>>* out, int64_t max_tokens_per_pass) {
  if (group_ != nullptr && group_->rank() != 0) {
    return absl::FailedPreconditionError(
        "a tensor-parallel follower computes embeddings only as its leader's embed steps");
  }
  const ModelConfig& c = weights_->config;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t>& tokens = inputs[i]->tokens;
    if (tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("embedding input ", i, " is empty"));
    }
    if (static_cast<int64_t>(tokens.size()) > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding input ", i, " has ", tokens.size(),
          " tokens; the model's max_position_embeddings is ", c.max_position_embeddings));
    }
    for (size_t j = 0; j < tokens.size(); ++j) {
      if (tokens[j] < 0 || tokens[j] >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("embedding input ", i, ": token ", j, " has id ", tokens[j],
                         ", outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
  }
  out->assign(inputs.size(), std::vector<float>());
  const int64_t budget = max_tokens_per_pass > 0 ? max_tokens_per_pass : INT64_MAX;
  for (size_t begin = 0; begin < inputs.size();) {
    size_t end = begin;
    int64_t tokens = 0;
    while (end < inputs.size() &&
           (end == begin || tokens + static_cast<int64_t>(inputs[end]->tokens.size()) <= budget)) {
      tokens += static_cast<int64_t>(inputs[end++]->tokens.size());
    }
    EmbedPass(inputs.subspan(begin, end - begin), out->data() + begin);
    begin = end;
  }
  return absl::OkStatus();
}

void LlamaModel::RunEmbedStep(const StepPlan& step, StepInputs* in) {
  CARPOOL_CHECK(step.kind == StepPlan::Kind::kEmbed);
  PrepareInputs(step, in);
  Stage(*in, 0);
  RunLayers(*in);  // final-norm hidden states -> hidden_
  if (device_group_ != nullptr) WaitForDevice();
}

void LlamaModel::EmbedPass(absl::Span<const EmbeddingInput* const> inputs,
                           std::vector<float>* out) {
  const ModelConfig& c = weights_->config;
  StepPlan step;
  step.kind = StepPlan::Kind::kEmbed;
  step.seqs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t>& tokens = inputs[i]->tokens;
    step.seqs[i].seq_id = static_cast<int64_t>(i);
    step.seqs[i].num_tokens = static_cast<int32_t>(tokens.size());
    step.token_ids.insert(step.token_ids.end(), tokens.begin(), tokens.end());
  }
  Publish(step);
  StepInputs in;
  RunEmbedStep(step, &in);

  const int64_t t = step.num_tokens();
  const int64_t h = c.hidden_size;
  const float* hidden = HostView(hidden_, t * h);
  std::vector<double> pooled(h);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const kernels::AttentionSeq& a = in.attention_seqs[i];
    const float* rows = hidden + static_cast<int64_t>(a.query_start) * h;
    if (inputs[i]->pooling == Pooling::kLast) {
      const float* last = rows + static_cast<int64_t>(a.query_len - 1) * h;
      for (int64_t j = 0; j < h; ++j) pooled[j] = last[j];
    } else {
      std::fill(pooled.begin(), pooled.end(), 0.0);
      for (int r = 0; r < a.query_len; ++r) {
        for (int64_t j = 0; j < h; ++j) pooled[j] += rows[r * h + j];
      }
      for (double& v : pooled) v /= a.query_len;
    }
    double scale = 1.0;
    if (inputs[i]->normalize) {
      double ss = 0.0;
      for (double v : pooled) ss += v * v;
      scale = ss > 0.0 ? 1.0 / std::sqrt(ss) : 0.0;
    }
    out[i].resize(h);
    for (int64_t j = 0; j < h; ++j) out[i][j] = static_cast<float>(pooled[j] * scale);
  }
}

void LlamaModel::EmbedTokens(const StepInputs& in, int64_t t, bool sum) {
  const ModelConfig& c = weights_->config;
  const int64_t h = c.hidden_size;
  device_->EmbeddingGather(embed_, h, &residual_);
  // Gemma's sqrt(hidden_size). Under tensor parallelism every row comes whole from one rank
  // (the others add zeros), so scaling the rank's rows before the sum is scaling the sum.
  if (c.embedding_multiplier != 1.0f) device_->Scale(c.embedding_multiplier, t * h, &residual_);
  if (group_ == nullptr) return;
  // Vocabulary-parallel: this rank's rows, zeros for tokens another rank holds, then the sum.
  float* rows = HostView(residual_, t * h);
  const int64_t first = weights_->shard.vocab_begin;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t row = in.token_ids[i] - first;
    if (row < 0 || row >= vocab_) std::fill_n(rows + i * h, h, 0.0f);
  }
  if (device_group_ != nullptr) {
    Release(rows, t * h, &residual_);
    if (sum) AllReduce(&residual_, t * h);
    return;
  }
  SumOverGroup(rows, t * h);
  Release(rows, t * h, &residual_);
}

void LlamaModel::CapLogits(int64_t s, DeviceArray* logits) {
  const double cap = weights_->config.final_logit_softcapping;
  if (cap > 0.0) device_->SoftCap(static_cast<float>(cap), s * vocab_, logits);
}

void LlamaModel::ParallelStep(const StepInputs& in, int64_t s, bool whole_step,
                              std::vector<float>* logits,
                              absl::Span<const SampleRequest> requests,
                              std::vector<SampleResult>* samples) {
  logits->clear();
  if (device_group_ == nullptr) {
    // Host staging (MPI): every sum and the gather wait for their ranks on the host.
    RunLayers(in);
    ParallelHead(s, logits);
    return;
  }
  // Device collectives. The vocabulary-parallel embedding's rows of other ranks' tokens are
  // zeroed on the host first (a copy each way, before anything is recorded). Everything after
  // it, the embedding's sum, the layers with their sums, the head and the logits' all-gather,
  // is enqueued on the device's stream with no host wait, so a padded decode step runs as one
  // RunStep that a GPU records as a CUDA graph, NCCL kernels included (every rank pads to the
  // same size, so every rank records and replays the same collectives). The host waits for
  // the stream only after it.
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t h = weights_->config.hidden_size;
  EmbedTokens(in, t, /*sum=*/false);
  const auto body = [&] {
    AllReduce(&residual_, t * h);
    RunLayersFromResidual(in);
    if (s > 0) DeviceParallelHead(s);
  };
  if (whole_step) {
    device_->RunStep(body);
  } else {
    body();
  }
  WaitForDevice();
  if (group_->rank() != 0) return;
  const int64_t full_vocab = weights_->config.vocab_size;
  if (samples != nullptr) {
    // The leader's device holds the interleaved rows: only ids and logprobs come back.
    if (s == 0) {
      samples->clear();
      return;
    }
    device_->Sample(full_logits_, full_vocab, requests, samples);
    return;
  }
  if (s == 0) return;
  logits->resize(s * full_vocab);
  device_->ToHost(full_logits_, 0, s * full_vocab, logits->data());
}

void LlamaModel::DeviceParallelHead(int64_t s) {
  const int64_t h = weights_->config.hidden_size;
  device_->GatherRows(hidden_, h, &sampled_);
  device_->Linear(sampled_, *lm_head_, no_bias_, s, vocab_, h, &logits_);
  CapLogits(s, &logits_);  // elementwise, so each rank caps its own slice
  // NCCL has no gather: every rank receives every slice, and the followers drop theirs.
  // gathered_logits_ was sized in Stage (a recorded step must not reallocate).
  const int64_t start = Clock::Real()->NowMicros();
  if (absl::Status st =
          device_group_->AllGatherOnStream(logits_.data(), s * vocab_, element_type_,
                                           gathered_logits_.data(), device_->stream());
      !st.ok()) {
    cluster::FailGroup(st);
  }
  times_.gather_micros += Clock::Real()->NowMicros() - start;
  if (group_->rank() != 0) return;
  // The leader interleaves [rank][s][vocab_] into [s][vocab_size] on the device (one strided
  // copy per rank, in stream order, so a recorded step holds them too).
  const int64_t full_vocab = weights_->config.vocab_size;
  for (int r = 0; r < group_->size(); ++r) {
    device_->CopyRows(gathered_logits_, r * s * vocab_, vocab_, s, vocab_, r * vocab_, full_vocab,
                      &full_logits_);
  }
}

void LlamaModel::InterleaveGathered(int64_t s, std::vector<float>* logits) const {
  const ModelConfig& c = weights_->config;
  const int size = group_->size();
  logits->resize(s * c.vocab_size);
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < s; ++i) {
      std::copy_n(gathered_.data() + (r * s + i) * vocab_, vocab_,
                  logits->data() + i * c.vocab_size + r * vocab_);
    }
  }
}

void LlamaModel::ParallelHead(int64_t s, std::vector<float>* logits) {
  // Vocabulary-parallel head over the host communicator: each rank's [s, vocab_] slice,
  // gathered on the leader as [rank][s][vocab_] and interleaved into [s][vocab_size].
  const ModelConfig& c = weights_->config;
  const int64_t h = c.hidden_size;
  logits->clear();
  const bool leader = group_->rank() == 0;
  if (s == 0) return;
  device_->GatherRows(hidden_, h, &sampled_);
  device_->Linear(sampled_, *lm_head_, no_bias_, s, vocab_, h, &logits_);
  CapLogits(s, &logits_);  // elementwise, so each rank caps its own slice
  const float* local = HostView(logits_, s * vocab_);
  const int64_t start = Clock::Real()->NowMicros();
  if (absl::Status st = group_->Gather(local, s * vocab_, leader ? gathered_.data() : nullptr, 0);
      !st.ok()) {
    cluster::FailGroup(st);
  }
  times_.gather_micros += Clock::Real()->NowMicros() - start;
  if (!leader) return;
  InterleaveGathered(s, logits);
}

float* LlamaModel::HostView(const DeviceArray& x, int64_t count) {
  if (host_memory_) return device_->HostData(x);
  if (static_cast<int64_t>(host_scratch_.size()) < count) host_scratch_.resize(count);
  if (count > 0) device_->ToHost(x, 0, count, host_scratch_.data());
  return host_scratch_.data();
}

void LlamaModel::Release(float* host, int64_t count, DeviceArray* x) {
  if (!host_memory_ && count > 0) device_->FromHost(host, 0, count, x);
}

void LlamaModel::AllReduce(DeviceArray* x, int64_t count) {
  if (group_ == nullptr) return;
  if (device_group_ != nullptr) {
    const int64_t start = Clock::Real()->NowMicros();
    if (absl::Status s =
            device_group_->AllReduceSumOnStream(x->data(), count, element_type_, device_->stream());
        !s.ok()) {
      cluster::FailGroup(s);
    }
    times_.all_reduce_micros += Clock::Real()->NowMicros() - start;
    return;
  }
  float* host = HostView(*x, count);
  SumOverGroup(host, count);
  Release(host, count, x);
}

void LlamaModel::WaitForDevice() {
  const int64_t start = Clock::Real()->NowMicros();
  if (absl::Status s = device_group_->WaitStream(device_->stream()); !s.ok()) {
    cluster::FailGroup(s);
  }
  times_.device_wait_micros += Clock::Real()->NowMicros() - start;
}

void LlamaModel::SumOverGroup(float* host, int64_t count) {
  const int64_t start = Clock::Real()->NowMicros();
  if (absl::Status s = group_->AllReduceSum(host, count); !s.ok()) cluster::FailGroup(s);
  times_.all_reduce_micros += Clock::Real()->NowMicros() - start;
}

void LlamaModel::Attention(int layer, const StepInputs& in, int64_t t) {
  const ModelConfig& c = weights_->config;
  const LayerArrays& lw = layers_[layer];
  const int64_t h = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(num_heads_) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(num_kv_heads_) * c.head_dim;
  ModelDevice& d = *device_;
  d.Linear(hidden_, lw.q_proj, lw.q_bias, t, q_dim, h, &q_);
  d.Linear(hidden_, lw.k_proj, lw.k_bias, t, kv_dim, h, &k_);
  d.Linear(hidden_, lw.v_proj, lw.v_bias, t, kv_dim, h, &v_);
  if (c.qk_norm) {
    // Per head, so a rank's heads are normalized exactly as in the whole model.
    const float eps = static_cast<float>(c.rms_norm_eps);
    d.HeadRmsNorm(lw.q_norm, eps, t, num_heads_, c.head_dim, &q_);
    d.HeadRmsNorm(lw.k_norm, eps, t, num_kv_heads_, c.head_dim, &k_);
  }
  const bool slides = LayerSlides(c, layer);
  d.Rope(num_heads_, c.head_dim, slides, &q_);
  d.Rope(num_kv_heads_, c.head_dim, slides, &k_);
  DeviceArray* const keys = in.scratch_kv ? &embed_keys_ : &key_cache_[layer];
  DeviceArray* const values = in.scratch_kv ? &embed_values_ : &value_cache_[layer];
  const kernels::KvCacheLayout& layout = in.scratch_kv ? embed_layout_ : layout_;
  d.WriteKv(k_, v_, layout, keys, values);
  AttentionOptions options;
  const double scaled_by = c.query_pre_attn_scalar > 0.0 ? c.query_pre_attn_scalar : c.head_dim;
  options.scale = static_cast<float>(1.0 / std::sqrt(scaled_by));
  options.sliding_window = slides ? c.sliding_window : 0;
  options.logit_softcap = static_cast<float>(c.attn_logit_softcapping);
  d.Attention(q_, *keys, *values, layout, num_heads_, options, &attn_);
  d.Linear(attn_, lw.o_proj, no_bias_, t, h, q_dim, &out_);
  AllReduce(&out_, t * h);  // partial sums over this rank's heads
}

void LlamaModel::Mlp(int layer, int64_t t) {
  const ModelConfig& c = weights_->config;
  const LayerArrays& lw = layers_[layer];
  const int64_t h = c.hidden_size;
  const int64_t inter = intermediate_;
  ModelDevice& d = *device_;
  d.Linear(hidden_, lw.gate_proj, no_bias_, t, inter, h, &gate_);
  d.Linear(hidden_, lw.up_proj, no_bias_, t, inter, h, &up_);
  if (c.hidden_activation == Activation::kGeluTanh) {
    d.GeluTanhMul(gate_, up_, t, inter, &gate_);
  } else {
    d.SiluMul(gate_, up_, t, inter, &gate_);
  }
  d.Linear(gate_, lw.down_proj, no_bias_, t, h, inter, &out_);
  AllReduce(&out_, t * h);  // partial sums over this rank's features
}

}  // namespace carpool::worker
