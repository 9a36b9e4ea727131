#include "worker/echo_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace carpool::worker {
namespace {

constexpr int kEchoVocabSize = 1 << 30;
constexpr int kDefaultMaxModelLen = 1 << 20;
constexpr int64_t kMaxBlocks = int64_t{1} << 30;

class EchoBackend : public Backend {
 public:
  explicit EchoBackend(const RegisterInfo& capacity) : capacity_(capacity) {}

  RegisterInfo Describe() const override { return capacity_; }

  absl::Status Add(const DispatchInfo& d) override {
    const int64_t prompt_len = static_cast<int64_t>(d.prompt_tokens.size());
    if (prompt_len == 0) return absl::InvalidArgumentError("prompt is empty");
    if (d.sampling.max_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_tokens must be >= 1, got ", d.sampling.max_tokens));
    }
    const int64_t end = std::min<int64_t>(prompt_len, d.sampling.max_tokens);
    const int64_t begin = static_cast<int64_t>(d.output_tokens.size());
    if (begin >= end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request already has ", begin, " output tokens; echo would produce only ", end));
    }
    for (int64_t i = begin; i < end; ++i) {
      TokenEvent e;
      e.dispatch_id = d.dispatch_id;
      e.has_token = true;
      e.token.token = d.prompt_tokens[i];
      e.token.logprob = 0.0f;
      if (i + 1 == end) {
        e.finished = true;
        e.finish_reason = "length";
      }
      pending_.push_back(std::move(e));
    }
    return absl::OkStatus();
  }

  void Cancel(uint64_t dispatch_id) override {
    std::erase_if(pending_, [&](const TokenEvent& e) { return e.dispatch_id == dispatch_id; });
  }
  void CancelAll() override { pending_.clear(); }

  bool has_unfinished() const override { return !pending_.empty(); }

  std::vector<TokenEvent> Step() override { return std::exchange(pending_, {}); }

  WorkerLoad Load() const override {
    WorkerLoad l;
    l.kv_free_blocks = capacity_.num_kv_blocks;
    return l;
  }

  int embed_dim() const override { return kEchoEmbedDim; }

  absl::StatusOr<std::vector<std::vector<float>>> EmbedBatch(
      absl::Span<const EmbeddingInput* const> inputs) override {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i]->tokens.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("embedding input ", i, " is empty"));
      }
      for (size_t j = 0; j < inputs[i]->tokens.size(); ++j) {
        if (inputs[i]->tokens[j] < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "embedding input ", i, ": token ", j, " has id ", inputs[i]->tokens[j],
              ", outside the vocabulary [0, ", kEchoVocabSize, ")"));
        }
      }
    }
    std::vector<std::vector<float>> out;
    for (const EmbeddingInput* in : inputs) {
      out.push_back(EchoEmbedding(in->tokens, in->pooling, in->normalize));
    }
    return out;
  }

 private:
  const RegisterInfo capacity_;
  std::vector<TokenEvent> pending_;  // answers for the next Step(), in dispatch order
};

}  // namespace

std::vector<float> EchoEmbedding(const std::vector<int32_t>& tokens, Pooling pooling,
                                 bool normalize) {
  auto e = [](int32_t t, int j) {
    return static_cast<double>((int64_t{t} + 1) * (j + 1) * 7919 % 2003) / 1001.0 - 1.0;
  };
  std::vector<double> v(kEchoEmbedDim, 0.0);
  for (int j = 0; j < kEchoEmbedDim; ++j) {
    if (pooling == Pooling::kLast) {
      v[j] = e(tokens.back(), j);
    } else {
      for (int32_t t : tokens) v[j] += e(t, j);
      v[j] /= static_cast<double>(tokens.size());
    }
  }
  double scale = 1.0;
  if (normalize) {
    double ss = 0.0;
    for (double x : v) ss += x * x;
    scale = ss > 0.0 ? 1.0 / std::sqrt(ss) : 0.0;
  }
  std::vector<float> out(kEchoEmbedDim);
  for (int j = 0; j < kEchoEmbedDim; ++j) out[j] = static_cast<float>(v[j] * scale);
  return out;
}

std::unique_ptr<Backend> CreateEchoBackend(const EngineOptions& o) {
  RegisterInfo r;
  r.max_num_seqs = o.scheduler.max_num_seqs;
  r.block_size = o.block_size;
  r.max_model_len = o.scheduler.max_model_len > 0 ? o.scheduler.max_model_len : kDefaultMaxModelLen;
  r.vocab_size = kEchoVocabSize;
  r.tokenizer = TokenizerKind::kByte;
  r.max_num_batched_tokens = o.scheduler.max_num_batched_tokens;
  r.hidden_size = kEchoEmbedDim;
  int64_t blocks = o.num_kv_blocks;
  if (blocks <= 0) {
    const int64_t per_seq = (int64_t{r.max_model_len} + r.block_size - 1) / r.block_size;
    blocks = std::min(kMaxBlocks, per_seq * std::max(1, r.max_num_seqs));
  }
  r.num_kv_blocks = static_cast<int>(blocks);
  return std::make_unique<EchoBackend>(r);
}

}  // namespace carpool::worker
