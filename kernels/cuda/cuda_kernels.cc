// Argument checks and launches; the kernels themselves are in the .cu files (see launch.h).
#include "kernels/cuda/cuda_kernels.h"

#include <cstdint>
#include <string>

#include "common/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"

namespace carpool::kernels::cuda {
namespace {

// Rows go into gridDim.x, which holds up to 2^31 - 1 blocks.
constexpr int64_t kMaxRows = (int64_t{1} << 31) - 1;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::Status CheckRows(const char* kernel, int64_t t, int64_t h) {
  if (t < 0 || t > kMaxRows || h <= 0) {
    return Invalid(std::string(kernel) + ": bad shape t=" + std::to_string(t) +
                   " h=" + std::to_string(h));
  }
  return absl::OkStatus();
}

absl::Status CheckAttention(const char* kernel, const PagedAttentionBatch& b, const void* q,
                            const void* key_cache, const void* value_cache, const void* out) {
  const KvCacheLayout& c = b.cache;
  std::string error;
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) {
    error = "head_dim must be 64, 128 or 256, got " + std::to_string(c.head_dim);
  } else if (c.num_kv_heads <= 0 || b.num_heads <= 0 || b.num_heads % c.num_kv_heads != 0) {
    error = "num_heads (" + std::to_string(b.num_heads) +
            ") must be a positive multiple of num_kv_heads (" + std::to_string(c.num_kv_heads) +
            ")";
  } else if (c.block_size <= 0 || c.num_blocks <= 0) {
    error = "empty cache layout";
  } else if (b.num_seqs < 0 || b.num_seqs > 65535) {
    error = "num_seqs must be in [0, 65535], got " + std::to_string(b.num_seqs);
  } else if (b.max_query_len < 1 || b.max_context_len < b.max_query_len) {
    error = "need 1 <= max_query_len <= max_context_len";
  } else if (b.block_table_stride < (b.max_context_len + c.block_size - 1) / c.block_size) {
    error = "block_table_stride too small for max_context_len";
  } else if (b.num_seqs > 0 && (b.context_lens == nullptr || b.block_tables == nullptr)) {
    error = "context_lens and block_tables are required";
  } else if (((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(key_cache) |
               reinterpret_cast<uintptr_t>(value_cache)) %
              16) != 0) {
    error = "q and the caches must be 16-byte aligned";
  } else if (out == q) {
    error = "out may not alias q";
  } else if (b.sliding_window < 0 || b.logit_softcap < 0.0f) {
    error = "sliding_window and logit_softcap must be >= 0";
  }
  if (error.empty()) return absl::OkStatus();
  return Invalid(std::string(kernel) + ": " + error);
}

}  // namespace

template <typename T>
absl::Status EmbeddingGather(const T* table, int64_t vocab, const int32_t* ids, T* out, int64_t t,
                             int64_t h, Stream stream) {
  RETURN_IF_ERROR(CheckRows("EmbeddingGather", t, h));
  if (t == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchEmbeddingGather(table, vocab, ids, out, t, h, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status RmsNorm(const T* x, const float* weight, float eps, T* out, int64_t t, int64_t h,
                     Stream stream) {
  RETURN_IF_ERROR(CheckRows("RmsNorm", t, h));
  if (t == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchAddRmsNorm<T>(x, nullptr, weight, eps, out, t, h, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status AddRmsNorm(const T* x, T* residual, const float* weight, float eps, T* out, int64_t t,
                        int64_t h, Stream stream) {
  RETURN_IF_ERROR(CheckRows("AddRmsNorm", t, h));
  if (residual == nullptr) return Invalid("AddRmsNorm: residual is required");
  if (t == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchAddRmsNorm(x, residual, weight, eps, out, t, h, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status RotaryEmbedding(T* x, const int32_t* positions, const float* inv_freq, int64_t t,
                             int num_heads, int head_dim, int rotary_dim, Stream stream) {
  RETURN_IF_ERROR(CheckRows("RotaryEmbedding", t, int64_t{num_heads} * head_dim));
  if (num_heads <= 0 || rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return Invalid("RotaryEmbedding: need num_heads > 0 and an even rotary_dim in (0, head_dim]");
  }
  if (t == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchRotaryEmbedding(x, positions, inv_freq, t, num_heads,
                                                       head_dim, rotary_dim, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status SiluMul(const T* gate, const T* up, T* out, int64_t t, int64_t inter, Stream stream) {
  RETURN_IF_ERROR(CheckRows("SiluMul", t, inter));
  if (t == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchSiluMul(gate, up, out, t * inter, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status GeluTanhMul(const T* gate, const T* up, T* out, int64_t t, int64_t inter,
                         Stream stream) {
  RETURN_IF_ERROR(CheckRows("GeluTanhMul", t, inter));
  if (t == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchGeluTanhMul(gate, up, out, t * inter, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status HeadRmsNorm(T* x, const float* weight, float eps, int64_t t, int num_heads,
                         int head_dim, Stream stream) {
  RETURN_IF_ERROR(CheckRows("HeadRmsNorm", t * num_heads, head_dim));
  if (num_heads <= 0) return Invalid("HeadRmsNorm: num_heads must be > 0");
  if (t == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      internal::LaunchHeadRmsNorm(x, weight, eps, t * num_heads, head_dim, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status SoftCap(T* x, float cap, int64_t n, Stream stream) {
  if (n < 0 || !(cap > 0.0f)) return Invalid("SoftCap: need n >= 0 and cap > 0");
  if (n == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchSoftCap(x, cap, n, stream));
  return absl::OkStatus();
}

absl::Status GatherPendingTokens(int32_t* ids, int64_t n, const SampledToken* previous,
                                 int64_t num_previous, Stream stream) {
  if (n < 0 || num_previous < 0) {
    return Invalid("GatherPendingTokens: need n >= 0 and num_previous >= 0");
  }
  if (n == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchGatherPendingTokens(ids, n, previous, num_previous, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status Scale(T* x, float factor, int64_t n, Stream stream) {
  if (n < 0) return Invalid("Scale: n < 0");
  if (n == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchScale(x, factor, n, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status WriteKvCache(const T* k, const T* v, const int64_t* slots, int64_t t,
                          const KvCacheLayout& layout, T* key_cache, T* value_cache,
                          Stream stream) {
  RETURN_IF_ERROR(CheckRows("WriteKvCache", t, int64_t{layout.num_kv_heads} * layout.head_dim));
  if (layout.num_blocks <= 0 || layout.block_size <= 0) {
    return Invalid("WriteKvCache: empty cache layout");
  }
  if (t == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      internal::LaunchWriteKvCache(k, v, slots, t, layout, key_cache, value_cache, stream));
  return absl::OkStatus();
}

size_t PagedAttentionDecodeWorkspaceBytes(const PagedAttentionBatch& batch) {
  if (batch.cache.num_kv_heads <= 0 || batch.num_heads % batch.cache.num_kv_heads != 0) return 0;
  return internal::PlanDecode(batch).workspace_bytes;
}

template <typename T>
absl::Status PagedAttentionDecode(const T* q, const T* key_cache, const T* value_cache,
                                  const PagedAttentionBatch& batch, void* workspace,
                                  size_t workspace_bytes, T* out, Stream stream) {
  RETURN_IF_ERROR(CheckAttention("PagedAttentionDecode", batch, q, key_cache, value_cache, out));
  if (batch.max_query_len != 1) {
    return Invalid("PagedAttentionDecode: max_query_len must be 1");
  }
  if (batch.num_seqs == 0) return absl::OkStatus();
  const internal::DecodePlan plan = internal::PlanDecode(batch);
  if (workspace_bytes < plan.workspace_bytes ||
      (plan.workspace_bytes > 0 && workspace == nullptr)) {
    return Invalid("PagedAttentionDecode: workspace needs " + std::to_string(plan.workspace_bytes) +
                   " bytes, got " + std::to_string(workspace_bytes));
  }
  CUDA_RETURN_IF_ERROR(internal::LaunchPagedAttentionDecode(q, key_cache, value_cache, batch, plan,
                                                            workspace, out, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status PagedAttention(const T* q, const T* key_cache, const T* value_cache,
                            const PagedAttentionBatch& batch, T* out, Stream stream) {
  RETURN_IF_ERROR(CheckAttention("PagedAttention", batch, q, key_cache, value_cache, out));
  if (batch.num_seqs > 0 && batch.query_start == nullptr) {
    return Invalid("PagedAttention: query_start is required");
  }
  if (batch.num_seqs == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      internal::LaunchPagedAttentionPrefill(q, key_cache, value_cache, batch, out, stream));
  return absl::OkStatus();
}

absl::Status LogSoftmax(float* x, int64_t rows, int64_t n, Stream stream) {
  RETURN_IF_ERROR(CheckRows("LogSoftmax", rows, n));
  if (rows == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchLogSoftmax(x, rows, n, stream));
  return absl::OkStatus();
}

absl::Status Argmax(const float* x, int64_t rows, int64_t n, int32_t* out, Stream stream) {
  RETURN_IF_ERROR(CheckRows("Argmax", rows, n));
  if (n > INT32_MAX) return Invalid("Argmax: n must fit in int32");
  if (rows == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchArgmax(x, rows, n, out, stream));
  return absl::OkStatus();
}

absl::Status Sample(const float* logits, const SamplingRow* rows, int64_t num_rows, int64_t vocab,
                    SampledToken* out, Stream stream) {
  return Sample(logits, rows, num_rows, vocab, nullptr, nullptr, out, stream);
}

absl::Status Sample(const float* logits, const SamplingRow* rows, int64_t num_rows, int64_t vocab,
                    const PenaltyToken* penalties, float* penalized, SampledToken* out,
                    Stream stream) {
  RETURN_IF_ERROR(CheckRows("Sample", num_rows, vocab));
  if (vocab > INT32_MAX) return Invalid("Sample: vocab must fit in int32");
  if ((penalties == nullptr) != (penalized == nullptr)) {
    return Invalid("Sample: penalties and penalized go together");
  }
  if (num_rows == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchSample(logits, rows, num_rows, vocab, penalties, penalized,
                                              out, stream));
  return absl::OkStatus();
}

absl::Status CounterUniform(const uint64_t* seeds, const uint64_t* positions, double* out,
                            int64_t n, Stream stream) {
  if (n < 0) return Invalid("CounterUniform: n < 0");
  if (n == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchCounterUniform(seeds, positions, out, n, stream));
  return absl::OkStatus();
}

template <typename From, typename To>
absl::Status Convert(const From* in, To* out, int64_t n, Stream stream) {
  if (n < 0) return Invalid("Convert: n < 0");
  if (n == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(internal::LaunchConvert(in, out, n, stream));
  return absl::OkStatus();
}

#define CARPOOL_INSTANTIATE(T)                                                                   \
  template absl::Status EmbeddingGather<T>(const T*, int64_t, const int32_t*, T*, int64_t,       \
                                           int64_t, Stream);                                     \
  template absl::Status RmsNorm<T>(const T*, const float*, float, T*, int64_t, int64_t, Stream); \
  template absl::Status AddRmsNorm<T>(const T*, T*, const float*, float, T*, int64_t, int64_t,   \
                                      Stream);                                                   \
  template absl::Status RotaryEmbedding<T>(T*, const int32_t*, const float*, int64_t, int, int,  \
                                           int, Stream);                                         \
  template absl::Status SiluMul<T>(const T*, const T*, T*, int64_t, int64_t, Stream);            \
  template absl::Status GeluTanhMul<T>(const T*, const T*, T*, int64_t, int64_t, Stream);        \
  template absl::Status HeadRmsNorm<T>(T*, const float*, float, int64_t, int, int, Stream);      \
  template absl::Status SoftCap<T>(T*, float, int64_t, Stream);                                  \
  template absl::Status Scale<T>(T*, float, int64_t, Stream);                                    \
  template absl::Status WriteKvCache<T>(const T*, const T*, const int64_t*, int64_t,             \
                                        const KvCacheLayout&, T*, T*, Stream);                   \
  template absl::Status PagedAttentionDecode<T>(                                                 \
      const T*, const T*, const T*, const PagedAttentionBatch&, void*, size_t, T*, Stream);      \
  template absl::Status PagedAttention<T>(const T*, const T*, const T*,                          \
                                          const PagedAttentionBatch&, T*, Stream);
CARPOOL_INSTANTIATE(float)
CARPOOL_INSTANTIATE(Half)
CARPOOL_INSTANTIATE(BFloat16)
#undef CARPOOL_INSTANTIATE

#define CARPOOL_INSTANTIATE_CONVERT(From, To) \
  template absl::Status Convert<From, To>(const From*, To*, int64_t, Stream);
CARPOOL_INSTANTIATE_CONVERT(float, float)
CARPOOL_INSTANTIATE_CONVERT(float, Half)
CARPOOL_INSTANTIATE_CONVERT(float, BFloat16)
CARPOOL_INSTANTIATE_CONVERT(Half, float)
CARPOOL_INSTANTIATE_CONVERT(Half, Half)
CARPOOL_INSTANTIATE_CONVERT(Half, BFloat16)
CARPOOL_INSTANTIATE_CONVERT(BFloat16, float)
CARPOOL_INSTANTIATE_CONVERT(BFloat16, Half)
CARPOOL_INSTANTIATE_CONVERT(BFloat16, BFloat16)
#undef CARPOOL_INSTANTIATE_CONVERT

}  // namespace carpool::kernels::cuda
