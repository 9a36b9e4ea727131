// Naive float64 kernels: the ground truth every backend's tests compare against.
// Same shapes and contracts as kernels/cpu/cpu_kernels.h, written for clarity, not speed.
// Inputs are fp32 (what the backends see); math and outputs are double.
#ifndef CARPOOL_KERNELS_REFERENCE_REFERENCE_KERNELS_H_
#define CARPOOL_KERNELS_REFERENCE_REFERENCE_KERNELS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/kernel_params.h"

namespace carpool::kernels::reference {

std::vector<double> Linear(const float* x, const float* w, const float* bias, int64_t m, int64_t n,
                           int64_t k);
std::vector<double> RmsNorm(const float* x, const float* weight, double eps, int64_t t, int64_t h);
// Returns {residual + x, RmsNorm(residual + x)}.
std::pair<std::vector<double>, std::vector<double>> AddRmsNorm(const float* x,
                                                               const float* residual,
                                                               const float* weight, double eps,
                                                               int64_t t, int64_t h);
std::vector<double> RotaryEmbedding(const float* x, const int32_t* positions, const float* inv_freq,
                                    int64_t t, int num_heads, int head_dim, int rotary_dim);
std::vector<double> SiluMul(const float* gate, const float* up, int64_t t, int64_t inter);
// 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * up, the formula as written.
std::vector<double> GeluTanhMul(const float* gate, const float* up, int64_t t, int64_t inter);
// cap * tanh(x / cap).
std::vector<double> SoftCap(const float* x, double cap, int64_t n);
std::vector<double> EmbeddingGather(const float* table, const int32_t* ids, int64_t t, int64_t h);
// Attention computed from the paged cache by walking each sequence's block table position by
// position, with a plain two-pass softmax in double. Honors params.sliding_window (keys
// outside a query's window are not read) and params.logit_softcap.
std::vector<double> PagedAttention(const float* q, const float* key_cache, const float* value_cache,
                                   const AttentionParams& params);
std::vector<double> LogSoftmax(const float* x, int64_t rows, int64_t n);

}  // namespace carpool::kernels::reference

#endif  // CARPOOL_KERNELS_REFERENCE_REFERENCE_KERNELS_H_
