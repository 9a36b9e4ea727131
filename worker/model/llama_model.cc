#include "worker/model/llama_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
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
    std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape) {
  if (weights == nullptr) return absl::InvalidArgumentError("no weights");
  if (kv_shape.num_blocks <= 0 || kv_shape.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache needs at least one block of size >= 1, got ",
                                                   kv_shape.num_blocks, " blocks of ",
                                                   kv_shape.block_size));
  }
  return std::unique_ptr<LlamaModel>(new LlamaModel(std::move(weights), kv_shape));
}

LlamaModel::LlamaModel(std::unique_ptr<LlamaWeights> weights, const KvCacheShape& kv_shape)
    : weights_(std::move(weights)), kv_shape_(kv_shape) {
  const ModelConfig& c = weights_->config;
  layout_.num_blocks = kv_shape.num_blocks;
  layout_.block_size = kv_shape.block_size;
  layout_.num_kv_heads = c.num_kv_heads;
  layout_.head_dim = c.head_dim;
  inv_freq_ = RopeInvFreq(c);
  const int64_t per_layer =
      static_cast<int64_t>(kv_shape.num_blocks) * kv_shape.block_size * c.num_kv_heads * c.head_dim;
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

void LlamaModel::Forward(const BatchPlan& plan, std::vector<float>* logits) {
  const ModelConfig& c = weights_->config;
  StepInputs in;
  PrepareInputs(plan, &in);
  const int64_t t = static_cast<int64_t>(in.token_ids.size());
  const int64_t h = c.hidden_size;
  Grow(&residual_, t * h);
  Grow(&hidden_, t * h);
  Grow(&out_, t * h);
  const float eps = static_cast<float>(c.rms_norm_eps);

  cpu::EmbeddingGather(weights_->embed_tokens.data(), in.token_ids.data(), residual_.data(), t, h);
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

  // Logits only for the rows that sample.
  const int64_t s = static_cast<int64_t>(in.sample_rows.size());
  Grow(&out_, s * h);
  for (int64_t i = 0; i < s; ++i) {
    std::copy_n(hidden_.data() + in.sample_rows[i] * h, h, out_.data() + i * h);
  }
  logits->resize(s * c.vocab_size);
  cpu::Linear(out_.data(), weights_->lm_head.data(), nullptr, logits->data(), s, c.vocab_size, h);
}

void LlamaModel::Attention(int layer, const StepInputs& in, int64_t t) {
  const ModelConfig& c = weights_->config;
  const LayerWeights& lw = weights_->layers[layer];
  const int64_t h = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  Grow(&q_, t * q_dim);
  Grow(&k_, t * kv_dim);
  Grow(&v_, t * kv_dim);
  Grow(&attn_, t * q_dim);
  cpu::Linear(hidden_.data(), lw.q_proj.data(), OrNull(lw.q_bias), q_.data(), t, q_dim, h);
  cpu::Linear(hidden_.data(), lw.k_proj.data(), OrNull(lw.k_bias), k_.data(), t, kv_dim, h);
  cpu::Linear(hidden_.data(), lw.v_proj.data(), OrNull(lw.v_bias), v_.data(), t, kv_dim, h);
  cpu::RotaryEmbedding(q_.data(), in.positions.data(), inv_freq_.data(), t, c.num_heads,
                       c.head_dim, c.head_dim);
  cpu::RotaryEmbedding(k_.data(), in.positions.data(), inv_freq_.data(), t, c.num_kv_heads,
                       c.head_dim, c.head_dim);
  cpu::WriteKvCache(k_.data(), v_.data(), in.slots.data(), t, layout_, key_cache_[layer].get(),
                    value_cache_[layer].get());

  kernels::AttentionParams params;
  params.cache = layout_;
  params.num_heads = c.num_heads;
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
}

void LlamaModel::Mlp(int layer, int64_t t) {
  const ModelConfig& c = weights_->config;
  const LayerWeights& lw = weights_->layers[layer];
  const int64_t h = c.hidden_size;
  const int64_t inter = c.intermediate_size;
  Grow(&gate_, t * inter);
  Grow(&up_, t * inter);
  cpu::Linear(hidden_.data(), lw.gate_proj.data(), nullptr, gate_.data(), t, inter, h);
  cpu::Linear(hidden_.data(), lw.up_proj.data(), nullptr, up_.data(), t, inter, h);
  cpu::SiluMul(gate_.data(), up_.data(), gate_.data(), t, inter);
  cpu::Linear(gate_.data(), lw.down_proj.data(), nullptr, out_.data(), t, h, inter);
}

}  // namespace carpool::worker
