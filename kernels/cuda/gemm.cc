#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"

namespace carpool::kernels::cuda {
namespace {

template <typename T>
constexpr cudaDataType_t DataTypeOf() {
  if constexpr (std::is_same_v<T, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<T, Half>) {
    return CUDA_R_16F;
  } else {
    static_assert(std::is_same_v<T, BFloat16>);
    return CUDA_R_16BF;
  }
}

// Largest power of two (up to 256) dividing the address: what cuBLASLt may assume.
uint32_t AlignmentOf(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// One shape's cuBLASLt objects and chosen algorithm.
//
// Row-major y[M,N] = x[M,K] · w[N,K]^T is, in cuBLASLt's column-major terms,
// y^T[N,M] = op(w)[N,K] · x^T[K,M] with w seen as a K x N matrix and transposed: A = w
// (K x N, ld K, op T), B = x (K x M, ld K), C = D = y (N x M, ld N). The bias epilogue adds
// bias[N] down each column of D, i.e. to every row of y.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatrixLayout_t b = nullptr;
  cublasLtMatrixLayout_t c = nullptr;
  cublasLtMatmulAlgo_t algo = {};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

// m, n, k, input type, output type, has bias, alignments of x, w, y, bias.
using PlanKey =
    std::tuple<int64_t, int64_t, int64_t, int, int, bool, uint32_t, uint32_t, uint32_t, uint32_t>;

}  // namespace

struct Gemm::Impl {
  GemmOptions options;
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  absl::StatusOr<Plan*> GetPlan(const PlanKey& key, cudaDataType_t in_type,
                                cudaDataType_t out_type);
};

absl::StatusOr<Plan*> Gemm::Impl::GetPlan(const PlanKey& key, cudaDataType_t in_type,
                                          cudaDataType_t out_type) {
  if (auto it = plans.find(key); it != plans.end()) return it->second.get();
  const auto [m, n, k, in_id, out_id, has_bias, align_x, align_w, align_y, align_bias] = key;
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = in_type == CUDA_R_32F && options.allow_tf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t no_transpose = CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &transpose, sizeof(transpose)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &no_transpose, sizeof(no_transpose)));
  if (has_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = out_type;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                          &epilogue, sizeof(epilogue)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, in_type, k, n, k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, in_type, k, m, k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, out_type, n, m, n));

  cublasLtMatmulPreference_t preference = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = workspace.size();
  const uint32_t align_d = align_y;
  cublasStatus_t status =
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const uint32_t*> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d}};
  for (const auto& [attribute, value] : alignments) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, value, sizeof(*value));
    }
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int returned = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                            preference, 1, &result, &returned);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  CUBLAS_RETURN_IF_ERROR(status);
  (void)align_bias;  // part of the key only: the bias vector is read with its own alignment
  if (returned == 0) {
    return absl::UnimplementedError("cuBLASLt has no algorithm for m=" + std::to_string(m) + " n=" +
                                    std::to_string(n) + " k=" + std::to_string(k) + " types " +
                                    std::to_string(in_id) + "->" + std::to_string(out_id));
  }
  plan->algo = result.algo;
  Plan* raw = plan.get();
  plans.emplace(key, std::move(plan));
  return raw;
}

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(const GemmOptions& options) {
  if (DeviceCount() == 0) return absl::UnavailableError("Gemm: no CUDA device");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->handle));
  ASSIGN_OR_RETURN(impl->workspace, DeviceBuffer::Allocate(options.workspace_bytes));
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

template <typename In, typename Out>
absl::Status Gemm::Linear(const In* x, const In* w, const Out* bias, Out* y, int64_t m, int64_t n,
                          int64_t k, Stream stream) {
  if (m <= 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError("Gemm::Linear: bad shape m=" + std::to_string(m) +
                                      " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  constexpr cudaDataType_t kIn = DataTypeOf<In>();
  constexpr cudaDataType_t kOut = DataTypeOf<Out>();
  const PlanKey key{m,
                    n,
                    k,
                    static_cast<int>(kIn),
                    static_cast<int>(kOut),
                    bias != nullptr,
                    AlignmentOf(x),
                    AlignmentOf(w),
                    AlignmentOf(y),
                    bias != nullptr ? AlignmentOf(bias) : 256u};
  ASSIGN_OR_RETURN(Plan * plan, impl_->GetPlan(key, kIn, kOut));
  if (bias != nullptr) {
    const void* bias_pointer = bias;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer, sizeof(bias_pointer)));
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(impl_->handle, plan->desc, &alpha, w, plan->a, x, plan->b,
                                        &beta, y, plan->c, y, plan->c, &plan->algo,
                                        impl_->workspace.data(), impl_->workspace.size(), stream));
  return absl::OkStatus();
}

template absl::Status Gemm::Linear<float, float>(const float*, const float*, const float*, float*,
                                                 int64_t, int64_t, int64_t, Stream);
template absl::Status Gemm::Linear<BFloat16, BFloat16>(const BFloat16*, const BFloat16*,
                                                       const BFloat16*, BFloat16*, int64_t, int64_t,
                                                       int64_t, Stream);
template absl::Status Gemm::Linear<BFloat16, float>(const BFloat16*, const BFloat16*, const float*,
                                                    float*, int64_t, int64_t, int64_t, Stream);
template absl::Status Gemm::Linear<Half, Half>(const Half*, const Half*, const Half*, Half*,
                                               int64_t, int64_t, int64_t, Stream);
template absl::Status Gemm::Linear<Half, float>(const Half*, const Half*, const float*, float*,
                                                int64_t, int64_t, int64_t, Stream);

}  // namespace carpool::kernels::cuda
