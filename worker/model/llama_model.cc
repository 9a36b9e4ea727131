#include "worker/model/llama_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "kernels/cpu/cpu_kernels.h"

namespace carpool::worker {
namespace cpu = ::carpool::kernels::cpu;

namespace {

void Grow(std::vector<float>* v, int64_t n) {
  if (static_cast<int64_t>(v->size()) < n) v->resize(n);
}

const float* OrNull(const Tensor& t) { return t.empty() ? nullptr : t.data(); }

}  // namespace

int64_t LlamaModel::KvBytesPerBlock(const ModelConfig& c, int block_size) {
  return 2LL * c.num_layers * block_size * c.num_kv_heads * c.head_dim * sizeof(float);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape,
    cluster::Communicator* group) {
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
  if (kv_shape.num_blocks <= 0 || kv_shape.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache needs at least one block of size >= 1, got ",
                                                   kv_shape.num_blocks, " blocks of ",
                                                   kv_shape.block_size));
  }
  return std::unique_ptr<LlamaModel>(new LlamaModel(std::move(weights), kv_shape, group));
}

LlamaModel::LlamaModel(std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape,
                       cluster::Communicator* group)
    : weights_(std::move(weights)),
      kv_shape_(kv_shape),
      group_(group),
      num_heads_(weights_->shard.num_heads),
      num_kv_heads_(weights_->shard.num_kv_heads),
      intermediate_(weights_->shard.intermediate),
      vocab_(weights_->shard.vocab) {
  const ModelConfig& c = weights_->config;
  layout_.num_blocks = kv_shape.num_blocks;
  layout_.block_size = kv_shape.block_size;
  layout_.num_kv_heads = num_kv_heads_;
  layout_.head_dim = c.head_dim;
  inv_freq_ = RopeInvFreq(c);
  const int64_t per_layer =
      static_cast<int64_t>(kv_shape.num_blocks) * kv_shape.block_size * num_kv_heads_ * c.head_dim;
  for (int l = 0; l < c.num_layers; ++l) {
    // Left uninitialized: attention reads only slots that a step has written.
    key_cache_.emplace_back(new float[per_layer]);
    value_cache_.emplace_back(new float[per_layer]);
  }
}

int64_t LlamaModel::DecodeWeightBytes() const {
  const LlamaWeights& w = *weights_;
  int64_t elems = w.final_norm.numel() + w.lm_head.numel() + w.config.hidden_size;
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.q_bias, &l.k_bias,
                            &l.v_bias, &l.o_proj, &l.post_attention_norm, &l.gate_proj,
                            &l.up_proj, &l.down_proj}) {
      elems += t->numel();
    }
  }
  return elems * static_cast<int64_t>(sizeof(float));
}

void LlamaModel::PrepareInputs(const BatchPlan& plan, StepInputs* in) const {
  const int bs = kv_shape_.block_size;
  for (const ScheduledSeq& s : plan.seqs) {
    kernels::AttentionSeq a;
    a.query_start = static_cast<int>(in->token_ids.size());
    a.query_len = s.num_tokens;
    a.context_len = s.start_position + s.num_tokens;
    a.block_table = s.block_table.data();
    in->attention_seqs.push_back(a);
    if (s.num_tokens != 1) in->decode_only = false;
    for (int p = s.start_position; p < a.context_len; ++p) {
      in->token_ids.push_back(s.seq->TokenAt(p));
      in->positions.push_back(p);
      in->slots.push_back(static_cast<int64_t>(s.block_table[p / bs]) * bs + p % bs);
    }
    if (s.sample) in->sample_rows.push_back(static_cast<int64_t>(in->token_ids.size()) - 1);
  }
}

void LlamaModel::PrepareInputs(const StepPlan& step, StepInputs* in) const {
  const int bs = kv_shape_.block_size;
  in->token_ids = step.token_ids;
  for (const StepPlan::Seq& s : step.seqs) {
    kernels::AttentionSeq a;
    a.query_start = static_cast<int>(in->positions.size());
    a.query_len = s.num_tokens;
    a.context_len = s.start_position + s.num_tokens;
    a.block_table = s.block_table.data();
    in->attention_seqs.push_back(a);
    if (s.num_tokens != 1) in->decode_only = false;
    for (int p = s.start_position; p < a.context_len; ++p) {
      in->positions.push_back(p);
      in->slots.push_back(static_cast<int64_t>(s.block_table[p / bs]) * bs + p % bs);
    }
    if (s.sample) in->sample_rows.push_back(static_cast<int64_t>(in->positions.size()) - 1);
  }
}

void LlamaModel::Forward(const BatchPlan& plan, std::vector<float>* logits) {
  StepInputs in;
  if (group_ == nullptr) {
    PrepareInputs(plan, &in);
    Compute(in, logits);
    return;
  }
  const StepPlan step = StepPlanFromBatch(plan, kv_shape_.block_size);
  const int64_t start = Clock::Real()->NowMicros();
  if (absl::Status s = SendStepMessage(group_, {StepKind::kStep, EncodeStepPlan(step)}); !s.ok()) {
    cluster::FailGroup(s);
  }
  times_.broadcast_micros += Clock::Real()->NowMicros() - start;
  PrepareInputs(step, &in);
  Compute(in, logits);
}

void LlamaModel::ForwardStep(const StepPlan& step, std::vector<float>* logits) {
  StepInputs in;
  PrepareInputs(step, &in);
  Compute(in, logits);
}

void LlamaModel::Compute(const StepInputs& in, std::vector<float>* logits) {
  const ModelConfig& c = weights_->config;
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t h = c.hidden_size;
  Grow(&residual_, t * h);
  Grow(&hidden_, t * h);
  Grow(&out_, t * h);
  const float eps = static_cast<float>(c.rms_norm_eps);

  Embed(in, t);  // -> residual_
  cpu::RmsNorm(residual_.data(), weights_->layers[0].input_norm.data(), eps, hidden_.data(), t, h);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = weights_->layers[l];
    Attention(l, in, t);  // hidden_ -> out_
    cpu::AddRmsNorm(out_.data(), residual_.data(), lw.post_attention_norm.data(), eps,
                    hidden_.data(), t, h);
    Mlp(l, t);            // hidden_ -> out_
    const Tensor& next_norm =
        l + 1 < c.num_layers ? weights_->layers[l + 1].input_norm : weights_->final_norm;
    cpu::AddRmsNorm(out_.data(), residual_.data(), next_norm.data(), eps, hidden_.data(), t, h);
  }
  Head(in, logits);
}

void LlamaModel::Embed(const StepInputs& in, int64_t t) {
  const int64_t h = weights_->config.hidden_size;
  if (group_ == nullptr) {
    cpu::EmbeddingGather(weights_->embed_tokens.data(), in.token_ids.data(), residual_.data(), t,
                         h);
    return;
  }
  // Vocabulary-parallel: this rank's rows, zeros for tokens another rank holds, then the sum.
  const int64_t first = weights_->shard.vocab_begin;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t row = in.token_ids[i] - first;
    float* out = residual_.data() + i * h;
    if (row >= 0 && row < vocab_) {
      std::copy_n(weights_->embed_tokens.data() + row * h, h, out);
    } else {
      std::fill_n(out, h, 0.0f);
    }
  }
  AllReduce(residual_.data(), t * h);
}

void LlamaModel::Head(const StepInputs& in, std::vector<float>* logits) {
  const ModelConfig& c = weights_->config;
  const int64_t h = c.hidden_size;
  // Logits only for the rows that sample.
  const int64_t s = static_cast<int64_t>(in.sample_rows.size());
  Grow(&out_, s * h);
  for (int64_t i = 0; i < s; ++i) {
    std::copy_n(hidden_.data() + in.sample_rows[i] * h, h, out_.data() + i * h);
  }
  if (group_ == nullptr) {
    logits->resize(s * c.vocab_size);
    cpu::Linear(out_.data(), weights_->lm_head.data(), nullptr, logits->data(), s, c.vocab_size,
                h);
    return;
  }
  // Vocabulary-parallel head: each rank's [s, vocab_] slice, gathered on the leader as
  // [rank][s][vocab_] and interleaved into [s][vocab_size].
  logits->clear();
  if (s == 0) return;
  Grow(&local_logits_, s * vocab_);
  cpu::Linear(out_.data(), weights_->lm_head.data(), nullptr, local_logits_.data(), s, vocab_, h);
  const bool leader = group_->rank() == 0;
  const int size = group_->size();
  if (leader) Grow(&gathered_, size * s * vocab_);
  const int64_t start = Clock::Real()->NowMicros();
  if (absl::Status st = group_->Gather(local_logits_.data(), s * vocab_,
                                       leader ? gathered_.data() : nullptr, 0);
      !st.ok()) {
    cluster::FailGroup(st);
  }
  times_.gather_micros += Clock::Real()->NowMicros() - start;
  if (!leader) return;
  logits->resize(s * c.vocab_size);
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < s; ++i) {
      std::copy_n(gathered_.data() + (r * s + i) * vocab_, vocab_,
                  logits->data() + i * c.vocab_size + r * vocab_);
    }
  }
}

void LlamaModel::AllReduce(float* data, int64_t count) {
  if (group_ == nullptr) return;
  const int64_t start = Clock::Real()->NowMicros();
  if (absl::Status s = group_->AllReduceSum(data, count); !s.ok()) cluster::FailGroup(s);
  times_.all_reduce_micros += Clock::Real()->NowMicros() - start;
  ++times_.all_reduces;
}

void LlamaModel::Attention(int layer, const StepInputs& in, int64_t t) {
  const ModelConfig& c = weights_->config;
  const LayerWeights& lw = weights_->layers[layer];
  const int64_t h = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(num_heads_) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(num_kv_heads_) * c.head_dim;
  Grow(&q_, t * q_dim);
  Grow(&k_, t * kv_dim);
  Grow(&v_, t * kv_dim);
  Grow(&attn_, t * q_dim);
  cpu::Linear(hidden_.data(), lw.q_proj.data(), OrNull(lw.q_bias), q_.data(), t, q_dim, h);
  cpu::Linear(hidden_.data(), lw.k_proj.data(), OrNull(lw.k_bias), k_.data(), t, kv_dim, h);
  cpu::Linear(hidden_.data(), lw.v_proj.data(), OrNull(lw.v_bias), v_.data(), t, kv_dim, h);
  cpu::RotaryEmbedding(q_.data(), in.positions.data(), inv_freq_.data(), t, num_heads_,
                       c.head_dim, c.head_dim);
  cpu::RotaryEmbedding(k_.data(), in.positions.data(), inv_freq_.data(), t, num_kv_heads_,
                       c.head_dim, c.head_dim);
  cpu::WriteKvCache(k_.data(), v_.data(), in.slots.data(), t, layout_, key_cache_[layer].get(),
                    value_cache_[layer].get());

  kernels::AttentionParams params;
  params.cache = layout_;
  params.num_heads = num_heads_;
  params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  params.num_seqs = static_cast<int>(in.attention_seqs.size());
  params.seqs = in.attention_seqs.data();
  if (in.decode_only) {
    cpu::PagedAttentionDecode(q_.data(), key_cache_[layer].get(), value_cache_[layer].get(),
                              params, attn_.data());
  } else {
    cpu::PagedAttention(q_.data(), key_cache_[layer].get(), value_cache_[layer].get(), params,
                        attn_.data());
  }
  cpu::Linear(attn_.data(), lw.o_proj.data(), nullptr, out_.data(), t, h, q_dim);
  AllReduce(out_.data(), t * h);  // partial sums over this rank's heads
}

void LlamaModel::Mlp(int layer, int64_t t) {
  const ModelConfig& c = weights_->config;
  const LayerWeights& lw = weights_->layers[layer];
  const int64_t h = c.hidden_size;
  const int64_t inter = intermediate_;
  Grow(&gate_, t * inter);
  Grow(&up_, t * inter);
  cpu::Linear(hidden_.data(), lw.gate_proj.data(), nullptr, gate_.data(), t, inter, h);
  cpu::Linear(hidden_.data(), lw.up_proj.data(), nullptr, up_.data(), t, inter, h);
  cpu::SiluMul(gate_.data(), up_.data(), gate_.data(), t, inter);
  cpu::Linear(gate_.data(), lw.down_proj.data(), nullptr, out_.data(), t, h, inter);
  AllReduce(out_.data(), t * h);  // partial sums over this rank's features
}

}  // namespace carpool::worker
