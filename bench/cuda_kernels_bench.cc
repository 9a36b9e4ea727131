// carpool-bench-cuda-kernels: GPU kernel micro-benchmarks, compared within one run.
//
//   carpool-bench-cuda-kernels [--json PATH] [--quick]
//
// Measures, on device 0: device-to-device copy bandwidth (the memory roof every other figure is
// compared with), cuBLASLt bf16 GEMM at Llama-3-8B decode and prefill shapes (TFLOP/s and the
// weight bytes streamed per second), paged-attention decode bandwidth and prefill TFLOP/s at a
// few (batch, context) points, and the device sampler's latency. Inputs rotate through buffers
// larger than the L2 cache so that bandwidth figures are DRAM figures. Prints one table and, with
// --json, writes every row. Exit status 1 without a CUDA device or on a CUDA error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"

namespace carpool::kernels::cuda {
namespace {

// Inputs of one timed call are spread over at least this many bytes (H200's L2 is 50 MiB).
constexpr size_t kRotationBytes = size_t{512} << 20;

struct Row {
  std::string group;
  std::string shape;
  double microseconds = 0.0;
  double value = 0.0;  // in `unit`
  std::string unit;
  std::string note;
};

struct BenchOptions {
  bool quick = false;
  std::string json_path;
};

class Bench {
 public:
  explicit Bench(const BenchOptions& options) : options_(options) {}
  ~Bench() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }

  absl::Status Init() {
    CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream_));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_));
    ASSIGN_OR_RETURN(gemm_, Gemm::Create());
    return absl::OkStatus();
  }

  absl::Status Run() {
    RETURN_IF_ERROR(Copy());
    RETURN_IF_ERROR(Gemms());
    RETURN_IF_ERROR(AttentionDecode());
    RETURN_IF_ERROR(AttentionPrefill());
    RETURN_IF_ERROR(Sampling());
    return absl::OkStatus();
  }

  void Print() const;
  absl::Status WriteJson() const;

 private:
  int Reps(int full) const { return options_.quick ? std::max(2, full / 5) : full; }

  // Average milliseconds of launch(i) for i = 0 .. reps-1, after a few warm-up calls.
  absl::StatusOr<double> TimeMs(const std::function<absl::Status(int)>& launch, int reps) {
    for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(launch(i));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream_));
    for (int i = 0; i < reps; ++i) RETURN_IF_ERROR(launch(i));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, stream_));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    return static_cast<double>(ms) / reps;
  }

  absl::Status Copy();
  absl::Status Gemms();
  absl::Status AttentionDecode();
  absl::Status AttentionPrefill();
  absl::Status Sampling();

  BenchOptions options_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  double copy_gbps_ = 0.0;  // bytes read + written per second, in GB/s
  std::vector<Row> rows_;
};

std::string Shape(const char* format, long a, long b = 0, long c = 0) {
  char buffer[96];
  std::snprintf(buffer, sizeof(buffer), format, a, b, c);
  return buffer;
}

std::string Percent(double part, double whole) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.0f%% of copy", 100.0 * part / whole);
  return buffer;
}

absl::Status Bench::Copy() {
  const size_t bytes = size_t{1} << 30;
  ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::Allocate(bytes));
  ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src.data(), 1, bytes, stream_));
  ASSIGN_OR_RETURN(
      const double ms,
      TimeMs([&](int) { return CopyOnDevice(dst.data(), src.data(), bytes, stream_); }, Reps(20)));
  copy_gbps_ = 2.0 * bytes / (ms * 1e-3) / 1e9;
  rows_.push_back({"d2d copy", "1 GiB", ms * 1e3, copy_gbps_, "GB/s", "read + write"});
  return absl::OkStatus();
}

absl::Status Bench::Gemms() {
  struct Layer {
    const char* name;
    int64_t n;
    int64_t k;
  };
  // Llama-3-8B: hidden 4096, 32 q / 8 kv heads of 128, intermediate 14336, vocab 128256.
  const Layer layers[] = {{"qkv", 6144, 4096},
                          {"o", 4096, 4096},
                          {"gate_up", 28672, 4096},
                          {"down", 4096, 14336},
                          {"lm_head", 128256, 4096}};
  const int64_t batches[] = {1, 8, 64, 256, 2048};
  const int64_t max_m = 2048;
  ASSIGN_OR_RETURN(DeviceBuffer x, DeviceBuffer::Allocate(max_m * 14336 * sizeof(BFloat16)));
  ASSIGN_OR_RETURN(DeviceBuffer y, DeviceBuffer::Allocate(max_m * 128256 * sizeof(float)));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x.data(), 0, x.size(), stream_));
  for (const Layer& layer : layers) {
    const size_t weight_bytes = static_cast<size_t>(layer.n) * layer.k * sizeof(BFloat16);
    const int copies = static_cast<int>(std::max<size_t>(1, kRotationBytes / weight_bytes + 1));
    ASSIGN_OR_RETURN(DeviceBuffer w, DeviceBuffer::Allocate(weight_bytes * copies));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.data(), 0, w.size(), stream_));
    const bool logits = std::strcmp(layer.name, "lm_head") == 0;
    for (const int64_t m : batches) {
      const auto launch = [&](int i) -> absl::Status {
        const BFloat16* weights = w.as<BFloat16>() + (i % copies) * layer.n * layer.k;
        if (logits) {
          return gemm_->Linear<BFloat16, float>(x.as<BFloat16>(), weights, nullptr, y.as<float>(),
                                                m, layer.n, layer.k, stream_);
        }
        return gemm_->Linear<BFloat16, BFloat16>(x.as<BFloat16>(), weights, nullptr,
                                                 y.as<BFloat16>(), m, layer.n, layer.k, stream_);
      };
      ASSIGN_OR_RETURN(const double ms, TimeMs(launch, Reps(m >= 256 ? 10 : 30)));
      const double seconds = ms * 1e-3;
      const double tflops = 2.0 * m * layer.n * layer.k / seconds / 1e12;
      const double weight_gbps = weight_bytes / seconds / 1e9;
      char note[96];
      std::snprintf(note, sizeof(note), "weights %.0f GB/s (%s)", weight_gbps,
                    Percent(weight_gbps, copy_gbps_).c_str());
      rows_.push_back({std::string("gemm bf16 ") + layer.name + (logits ? " ->f32" : ""),
                       Shape("M=%ld N=%ld K=%ld", m, layer.n, layer.k), ms * 1e3, tflops, "TFLOP/s",
                       note});
    }
  }
  return absl::OkStatus();
}

// A bf16 paged KV cache of Llama-3-8B attention shape with `copies` disjoint block-table sets,
// so consecutive calls read different memory.
struct PagedSetup {
  PagedAttentionBatch batch;
  DeviceBuffer key_cache;
  DeviceBuffer value_cache;
  DeviceBuffer q;
  DeviceBuffer out;
  DeviceBuffer query_start;
  DeviceBuffer context_lens;
  std::vector<DeviceBuffer> tables;  // one per copy
  DeviceBuffer workspace;
  size_t kv_bytes_per_call = 0;
};

absl::StatusOr<PagedSetup> MakePaged(int num_seqs, int query_len, int context_len,
                                     cudaStream_t stream) {
  constexpr int kHeads = 32;
  constexpr int kKvHeads = 8;
  constexpr int kHeadDim = 128;
  constexpr int kBlockSize = 16;
  PagedSetup s;
  const int blocks_per_seq = (context_len + kBlockSize - 1) / kBlockSize;
  const size_t block_bytes = size_t{kBlockSize} * kKvHeads * kHeadDim * sizeof(BFloat16);
  s.kv_bytes_per_call =
      2 * static_cast<size_t>(num_seqs) * context_len * kKvHeads * kHeadDim * sizeof(BFloat16);
  const int copies =
      static_cast<int>(std::clamp<size_t>(kRotationBytes / s.kv_bytes_per_call + 1, 1, 16));
  const int num_blocks = blocks_per_seq * num_seqs * copies;
  ASSIGN_OR_RETURN(s.key_cache, DeviceBuffer::Allocate(num_blocks * block_bytes));
  ASSIGN_OR_RETURN(s.value_cache, DeviceBuffer::Allocate(num_blocks * block_bytes));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s.key_cache.data(), 0, s.key_cache.size(), stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s.value_cache.data(), 0, s.value_cache.size(), stream));
  const int64_t rows = static_cast<int64_t>(num_seqs) * query_len;
  const size_t q_bytes = rows * kHeads * kHeadDim * sizeof(BFloat16);
  ASSIGN_OR_RETURN(s.q, DeviceBuffer::Allocate(q_bytes));
  ASSIGN_OR_RETURN(s.out, DeviceBuffer::Allocate(q_bytes));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s.q.data(), 0, q_bytes, stream));
  std::vector<int32_t> starts(num_seqs + 1);
  for (int i = 0; i <= num_seqs; ++i) starts[i] = i * query_len;
  ASSIGN_OR_RETURN(s.query_start, DeviceBuffer::FromHost(starts));
  ASSIGN_OR_RETURN(s.context_lens,
                   DeviceBuffer::FromHost(std::vector<int32_t>(num_seqs, context_len)));
  // Blocks shuffled over the pool, as a long-running server's are.
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), std::mt19937(1));
  for (int c = 0; c < copies; ++c) {
    std::vector<int32_t> table(physical.begin() + c * blocks_per_seq * num_seqs,
                               physical.begin() + (c + 1) * blocks_per_seq * num_seqs);
    ASSIGN_OR_RETURN(DeviceBuffer t, DeviceBuffer::FromHost(table));
    s.tables.push_back(std::move(t));
  }
  s.batch.cache = {num_blocks, kBlockSize, kKvHeads, kHeadDim};
  s.batch.num_heads = kHeads;
  s.batch.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  s.batch.num_seqs = num_seqs;
  s.batch.query_start = s.query_start.as<int32_t>();
  s.batch.context_lens = s.context_lens.as<int32_t>();
  s.batch.block_tables = s.tables[0].as<int32_t>();
  s.batch.block_table_stride = blocks_per_seq;
  s.batch.max_query_len = query_len;
  s.batch.max_context_len = context_len;
  ASSIGN_OR_RETURN(s.workspace,
                   DeviceBuffer::Allocate(PagedAttentionDecodeWorkspaceBytes(s.batch)));
  return s;
}

absl::Status Bench::AttentionDecode() {
  const std::pair<int, int> points[] = {{1, 4096}, {1, 32768}, {8, 4096}, {64, 2048}, {256, 1024}};
  for (const auto& [seqs, context] : points) {
    ASSIGN_OR_RETURN(PagedSetup s, MakePaged(seqs, 1, context, stream_));
    const auto launch = [&](int i) {
      PagedAttentionBatch batch = s.batch;
      batch.block_tables = s.tables[i % s.tables.size()].as<int32_t>();
      return PagedAttentionDecode(s.q.as<BFloat16>(), s.key_cache.as<BFloat16>(),
                                  s.value_cache.as<BFloat16>(), batch, s.workspace.data(),
                                  s.workspace.size(), s.out.as<BFloat16>(), stream_);
    };
    ASSIGN_OR_RETURN(const double ms, TimeMs(launch, Reps(30)));
    const double gbps = s.kv_bytes_per_call / (ms * 1e-3) / 1e9;
    rows_.push_back({"attn decode bf16 32q/8kv d128", Shape("batch=%ld ctx=%ld", seqs, context),
                     ms * 1e3, gbps, "GB/s", Percent(gbps, copy_gbps_)});
  }
  return absl::OkStatus();
}

absl::Status Bench::AttentionPrefill() {
  const std::pair<int, int> points[] = {{1, 2048}, {4, 1024}, {1, 8192}};
  for (const auto& [seqs, tokens] : points) {
    ASSIGN_OR_RETURN(PagedSetup s, MakePaged(seqs, tokens, tokens, stream_));
    const auto launch = [&](int) {
      return PagedAttention(s.q.as<BFloat16>(), s.key_cache.as<BFloat16>(),
                            s.value_cache.as<BFloat16>(), s.batch, s.out.as<BFloat16>(), stream_);
    };
    ASSIGN_OR_RETURN(const double ms, TimeMs(launch, Reps(5)));
    // Causal: query j attends to j + 1 keys; QK^T and PV are 2 FLOPs per (query, key, feature).
    const double pairs = static_cast<double>(seqs) * tokens * (tokens + 1) / 2.0;
    const double tflops = 4.0 * pairs * 32 * 128 / (ms * 1e-3) / 1e12;
    rows_.push_back({"attn prefill bf16 32q/8kv d128", Shape("seqs=%ld tokens=%ld", seqs, tokens),
                     ms * 1e3, tflops, "TFLOP/s", "CUDA cores, causal"});
  }
  return absl::OkStatus();
}

absl::Status Bench::Sampling() {
  const int vocab = 128256;
  const int batches[] = {1, 64, 256};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(batches[2]) * vocab);
  for (float& l : logits) l = normal(rng);
  ASSIGN_OR_RETURN(DeviceBuffer d_logits, DeviceBuffer::FromHost(logits));
  ASSIGN_OR_RETURN(DeviceBuffer d_out, DeviceBuffer::Allocate(batches[2] * sizeof(SampledToken)));
  ASSIGN_OR_RETURN(DeviceBuffer d_tokens, DeviceBuffer::Allocate(batches[2] * sizeof(int32_t)));
  struct Mode {
    const char* name;
    float temperature;
    int top_k;
    float top_p;
  };
  const Mode modes[] = {{"top_p=0.9 T=0.8", 0.8f, 0, 0.9f}, {"top_k=50 T=0.8", 0.8f, 50, 1.0f}};
  for (const Mode& mode : modes) {
    std::vector<SamplingRow> params(batches[2]);
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].seed = i;
      params[i].position = 100 + i;
      params[i].temperature = mode.temperature;
      params[i].top_k = mode.top_k;
      params[i].top_p = mode.top_p;
    }
    ASSIGN_OR_RETURN(DeviceBuffer d_params, DeviceBuffer::FromHost(params));
    for (const int rows : batches) {
      const auto launch = [&](int) {
        return Sample(d_logits.as<float>(), d_params.as<SamplingRow>(), rows, vocab,
                      d_out.as<SampledToken>(), stream_);
      };
      ASSIGN_OR_RETURN(const double ms, TimeMs(launch, Reps(20)));
      rows_.push_back({std::string("sample ") + mode.name, Shape("rows=%ld vocab=%ld", rows, vocab),
                       ms * 1e3, ms * 1e3, "us", ""});
    }
  }
  for (const int rows : batches) {
    const auto launch = [&](int) {
      return Argmax(d_logits.as<float>(), rows, vocab, d_tokens.as<int32_t>(), stream_);
    };
    ASSIGN_OR_RETURN(const double ms, TimeMs(launch, Reps(20)));
    rows_.push_back(
        {"argmax", Shape("rows=%ld vocab=%ld", rows, vocab), ms * 1e3, ms * 1e3, "us", ""});
  }
  return absl::OkStatus();
}

void Bench::Print() const {
  std::printf("%-34s %-26s %12s %14s  %s\n", "benchmark", "shape", "time (us)", "result", "note");
  for (const Row& r : rows_) {
    char result[48];
    std::snprintf(result, sizeof(result), "%.1f %s", r.value, r.unit.c_str());
    std::printf("%-34s %-26s %12.1f %14s  %s\n", r.group.c_str(), r.shape.c_str(), r.microseconds,
                result, r.note.c_str());
  }
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

absl::Status Bench::WriteJson() const {
  if (options_.json_path.empty()) return absl::OkStatus();
  std::FILE* f = std::fopen(options_.json_path.c_str(), "w");
  if (f == nullptr) return absl::UnavailableError("cannot write " + options_.json_path);
  cudaDeviceProp prop;
  const bool have_prop = cudaGetDeviceProperties(&prop, 0) == cudaSuccess;
  std::fprintf(f, "{\"device\": %s, \"copy_gbps\": %.1f, \"rows\": [\n",
               JsonString(have_prop ? prop.name : "unknown").c_str(), copy_gbps_);
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    std::fprintf(f,
                 "  {\"benchmark\": %s, \"shape\": %s, \"microseconds\": %.3f, \"value\": %.4f, "
                 "\"unit\": %s, \"note\": %s}%s\n",
                 JsonString(r.group).c_str(), JsonString(r.shape).c_str(), r.microseconds, r.value,
                 JsonString(r.unit).c_str(), JsonString(r.note).c_str(),
                 i + 1 < rows_.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  return std::fclose(f) == 0 ? absl::OkStatus()
                             : absl::UnavailableError("cannot write " + options_.json_path);
}

int Main(int argc, char** argv) {
  BenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--json" && i + 1 < argc) {
      options.json_path = argv[++i];
    } else if (arg.rfind("--json=", 0) == 0) {
      options.json_path = arg.substr(7);
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (DeviceCount() == 0) {
    std::fprintf(stderr, "carpool-bench-cuda-kernels: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("device 0: %s, %d SMs, %.0f GiB, compute capability %d.%d\n", prop.name,
                prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.major,
                prop.minor);
  }
  Bench bench(options);
  absl::Status status = bench.Init();
  if (status.ok()) status = bench.Run();
  bench.Print();
  if (status.ok()) status = bench.WriteJson();
  if (!status.ok()) {
    std::fprintf(stderr, "carpool-bench-cuda-kernels: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace carpool::kernels::cuda

int main(int argc, char** argv) { return carpool::kernels::cuda::Main(argc, argv); }
