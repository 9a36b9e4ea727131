#include "worker/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

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
  RunLayers(in);
  Head(in, logits);
}

void LlamaModel::RunLayers(const StepInputs& in) {
  const ModelConfig& c = weights_->config;
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t h = c.hidden_size;
  Grow(&residual_, t * h);
  Grow(&hidden_, t * h);
  Grow(&out_, t * h);
  const float eps = static_cast<float>(c.rms_norm_eps);

  EmbedTokens(in, t);  // -> residual_
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
}

absl::Status LlamaModel::Embed(absl::Span<const EmbeddingInput* const> inputs,
                               std::vector<std::vector<float>>* out, int64_t max_tokens_per_pass) {
  if (group_ != nullptr) {
    return absl::UnimplementedError(
        "embeddings are not supported under tensor parallelism (--tp > 1): the step plan that "
        "leaders broadcast carries only generation steps");
  }
  const ModelConfig& c = weights_->config;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t>& tokens = inputs[i]->tokens;
    if (tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("embedding input ", i, " is empty"));
    }
    if (static_cast<int64_t>(tokens.size()) > c.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding input ", i, " has ", tokens.size(),
                       " tokens; the model's max_position_embeddings is ",
                       c.max_position_embeddings));
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
           (end == begin ||
            tokens + static_cast<int64_t>(inputs[end]->tokens.size()) <= budget)) {
      tokens += static_cast<int64_t>(inputs[end++]->tokens.size());
    }
    EmbedPass(inputs.subspan(begin, end - begin), out->data() + begin);
    begin = end;
  }
  return absl::OkStatus();
}

void LlamaModel::EmbedPass(absl::Span<const EmbeddingInput* const> inputs,
                           std::vector<float>* out) {
  const ModelConfig& c = weights_->config;
  StepInputs in;
  in.decode_only = false;
  in.scratch_kv = true;
  for (const EmbeddingInput* input : inputs) {
    const int len = static_cast<int>(input->tokens.size());
    kernels::AttentionSeq a;
    a.query_start = static_cast<int>(in.token_ids.size());
    a.query_len = len;
    a.context_len = len;
    in.attention_seqs.push_back(a);
    for (int p = 0; p < len; ++p) {
      in.slots.push_back(static_cast<int64_t>(in.token_ids.size()));
      in.token_ids.push_back(input->tokens[p]);
      in.positions.push_back(p);
    }
  }
  // Token r's keys and values sit in scratch slot r: each sequence's block table (block_size 1)
  // is the run of slot numbers from its first token.
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t kv_dim = static_cast<int64_t>(num_kv_heads_) * c.head_dim;
  if (static_cast<int64_t>(embed_table_.size()) < t) {
    embed_table_.resize(t);
    for (int64_t r = 0; r < t; ++r) embed_table_[r] = static_cast<int32_t>(r);
  }
  for (kernels::AttentionSeq& a : in.attention_seqs) {
    a.block_table = embed_table_.data() + a.query_start;
  }
  Grow(&embed_keys_, t * kv_dim);
  Grow(&embed_values_, t * kv_dim);
  embed_layout_ = layout_;
  embed_layout_.num_blocks = static_cast<int>(t);
  embed_layout_.block_size = 1;

  RunLayers(in);  // final-norm hidden states -> hidden_

  const int64_t h = c.hidden_size;
  std::vector<double> pooled(h);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const kernels::AttentionSeq& a = in.attention_seqs[i];
    const float* rows = hidden_.data() + static_cast<int64_t>(a.query_start) * h;
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

void LlamaModel::EmbedTokens(const StepInputs& in, int64_t t) {
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
  float* const keys = in.scratch_kv ? embed_keys_.data() : key_cache_[layer].get();
  float* const values = in.scratch_kv ? embed_values_.data() : value_cache_[layer].get();
  const kernels::KvCacheLayout& layout = in.scratch_kv ? embed_layout_ : layout_;
  cpu::WriteKvCache(k_.data(), v_.data(), in.slots.data(), t, layout, keys, values);

  kernels::AttentionParams params;
  params.cache = layout;
  params.num_heads = num_heads_;
  params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  params.num_seqs = static_cast<int>(in.attention_seqs.size());
  params.seqs = in.attention_seqs.data();
  if (in.decode_only) {
    cpu::PagedAttentionDecode(q_.data(), keys, values, params, attn_.data());
  } else {
    cpu::PagedAttention(q_.data(), keys, values, params, attn_.data());
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
