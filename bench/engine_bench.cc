// carpool-bench-engine: the engine's throughput on this machine, against limits measured in the
// same run. Prints a table (and JSON with --json). Not a test: figures go to
// docs/PERFORMANCE.md with the command that produced them.
#include <cblas.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/linear_int8.h"
#include "nlohmann/json.hpp"
#include "worker/device_options.h"
#include "worker/engine.h"
#include "worker/weights/weights.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace carpool::bench {
namespace {

using worker::Engine;
using worker::EngineOptions;
using worker::EngineRequest;

double NowSeconds() { return Clock::Real()->NowMicros() / 1e6; }

// The process's peak resident set so far, in bytes.
int64_t PeakRssBytes() {
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return int64_t{usage.ru_maxrss} * 1024;  // KiB on Linux
}

// The process's resident set now, in bytes (0 where /proc is missing).
int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * sysconf(_SC_PAGESIZE);
}

// Multiply-adds of one token through every linear layer and the head (whatever the weights'
// storage type: decode bytes / 4 counts only fp32 weights).
int64_t LinearParams(const worker::ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_kv_heads} * c.head_dim;
  return c.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * c.intermediate_size) +
         int64_t{c.vocab_size} * h;
}

// Streaming-read bandwidth in bytes/s over `bytes` of memory, split over `pool` (the engine's,
// so the limit is measured on the threads the kernels run on).
double MeasureBandwidth(ThreadPool* pool, int64_t bytes, int repeats) {
  const int64_t n = bytes / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    std::vector<double> partial(pool->num_threads(), 0.0);
    const double t0 = NowSeconds();
    pool->ParallelFor(n, [&](int64_t b, int64_t e) {
      float acc[16] = {0};
      int64_t i = b;
      for (; i + 16 <= e; i += 16) {
        for (int j = 0; j < 16; ++j) acc[j] += buf[i + j];
      }
      float s = 0;
      for (int j = 0; j < 16; ++j) s += acc[j];
      for (; i < e; ++i) s += buf[i];
      partial[b * pool->num_threads() / n] += s;
    });
    const double dt = NowSeconds() - t0;
    double sum = 0;
    for (double p : partial) sum += p;
    if (sum < 0) std::cerr << "";  // keep the reads
    best = std::max(best, bytes / dt);
  }
  return best;
}

// OpenBLAS's own multi-threaded sgemm rate (FLOP/s) at an m x n x k shape, on `threads`.
double MeasureGemm(int threads, int64_t m, int64_t n, int64_t k, int repeats) {
  std::vector<float> a(m * k, 0.01f), b(n * k, 0.02f), c(m * n);
  openblas_set_num_threads(threads);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = NowSeconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
                0.0f, c.data(), n);
    best = std::max(best, 2.0 * m * n * k / (NowSeconds() - t0));
  }
  openblas_set_num_threads(1);
  return best;
}

std::vector<int32_t> RandomPrompt(std::mt19937* rng, int len, int vocab) {
  std::uniform_int_distribution<int32_t> tok(0, std::min(vocab, 256) - 1);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = tok(*rng);
  return p;
}

EngineRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

struct DecodeResult {
  double tokens_per_s = 0;
  double step_ms = 0;
};

// Decode throughput at `batch` concurrent sequences: timed from the moment every sequence has
// its first token (prefill done) to the end.
DecodeResult MeasureDecode(Engine* engine, int batch, int prompt_len, int decode_steps) {
  std::mt19937 rng(batch);
  for (int i = 0; i < batch; ++i) {
    (void)engine->Add(Greedy(RandomPrompt(&rng, prompt_len, engine->model_config().vocab_size),
                             decode_steps + 1));
  }
  // Prefill until every sequence has its first token; from then on every step is a decode.
  std::set<int64_t> first;
  while (static_cast<int>(first.size()) < batch) {
    for (const auto& e : engine->Step()) first.insert(e.seq_id);
  }
  int64_t tokens = 0;
  int steps = 0;
  const double t0 = NowSeconds();
  while (engine->has_unfinished()) {
    for (const auto& e : engine->Step()) tokens += e.has_token ? 1 : 0;
    ++steps;
  }
  const double dt = NowSeconds() - t0;
  return {tokens / dt, steps > 0 ? dt / steps * 1e3 : 0};
}

double MeasurePrefill(Engine* engine, int num_prompts, int prompt_len) {
  std::mt19937 rng(7);
  for (int i = 0; i < num_prompts; ++i) {
    (void)engine->Add(
        Greedy(RandomPrompt(&rng, prompt_len, engine->model_config().vocab_size), 1));
  }
  const double t0 = NowSeconds();
  while (engine->has_unfinished()) engine->Step();
  return num_prompts * prompt_len / (NowSeconds() - t0);
}

// Offline throughput (output tokens/s) on requests with exponentially distributed output
// lengths, all queued at once.
double MeasureWorkload(Engine* engine, int num_requests, double mean_output, int max_output) {
  std::mt19937 rng(11);
  std::exponential_distribution<double> len(1.0 / mean_output);
  std::vector<EngineRequest> requests;
  int64_t total = 0;
  for (int i = 0; i < num_requests; ++i) {
    const int out = std::clamp(static_cast<int>(std::ceil(len(rng))), 1, max_output);
    total += out;
    requests.push_back(Greedy(RandomPrompt(&rng, 32, engine->model_config().vocab_size), out));
  }
  const double t0 = NowSeconds();
  engine->Generate(std::move(requests));
  return total / (NowSeconds() - t0);
}

struct OverheadResult {
  double forward_ms_per_step = 0;
  double step_ms = 0;
  double ratio = 0;  // forward time / step wall time
  int steps = 0;
};

// Engine overhead: wall time inside the model's forward over the wall time of Engine::Step(),
// over the steps after `prefill_first` (when true, every sequence has its first token before
// timing starts, so the timed steps are pure decode).
OverheadResult TimeSteps(Engine* engine, bool prefill_first, int expected) {
  if (prefill_first) {
    std::set<int64_t> first;
    while (static_cast<int>(first.size()) < expected) {
      for (const auto& e : engine->Step()) first.insert(e.seq_id);
    }
  }
  OverheadResult r;
  const int64_t f0 = engine->forward_micros();
  const double t0 = NowSeconds();
  while (engine->has_unfinished()) {
    engine->Step();
    ++r.steps;
  }
  const double wall = NowSeconds() - t0;
  const double forward = (engine->forward_micros() - f0) / 1e6;
  r.ratio = wall > 0 ? forward / wall : 0;
  r.step_ms = r.steps > 0 ? wall / r.steps * 1e3 : 0;
  r.forward_ms_per_step = r.steps > 0 ? forward / r.steps * 1e3 : 0;
  return r;
}

// Decode-only overhead at `batch` sequences.
OverheadResult MeasureDecodeOverhead(Engine* engine, int batch, int decode_steps) {
  std::mt19937 rng(100 + batch);
  for (int i = 0; i < batch; ++i) {
    (void)engine->Add(
        Greedy(RandomPrompt(&rng, 16, engine->model_config().vocab_size), decode_steps + 1));
  }
  return TimeSteps(engine, /*prefill_first=*/true, batch);
}

// Overhead on a saturated mixed workload: `num_requests` queued at once (32-token prompts,
// exponential output lengths), so every step is full and prefill chunks ride with decodes.
OverheadResult MeasureMixedOverhead(Engine* engine, int num_requests) {
  std::mt19937 rng(13);
  std::exponential_distribution<double> len(1.0 / 48);
  for (int i = 0; i < num_requests; ++i) {
    const int out = std::clamp(static_cast<int>(std::ceil(len(rng))), 1, 256);
    (void)engine->Add(Greedy(RandomPrompt(&rng, 32, engine->model_config().vocab_size), out));
  }
  return TimeSteps(engine, /*prefill_first=*/false, 0);
}

struct PagedResult {
  int kv_tokens = 0;          // the KV budget: num_kv_blocks * block_size
  int contiguous_seqs = 0;    // kv_tokens / max_model_len: a max-length slot per sequence
  int peak_running = 0;
  double mean_running = 0;    // over steps with requests still waiting (the cache is the limit)
  double mean_seq_tokens = 0; // prompt + output, averaged over requests
  int64_t preemptions = 0;
  int saturated_steps = 0;
};

// Paged KV: how many sequences run at once on a fixed KV budget, against allocating every
// sequence a contiguous max_model_len region. Requests: prompts uniform in [64, 512], outputs
// exponential (mean 128, at most 1024), all queued at once.
absl::StatusOr<PagedResult> MeasurePaged(const std::string& model, int num_kv_blocks,
                                         int max_model_len, int num_requests) {
  EngineOptions o;
  o.model = model;
  o.num_kv_blocks = num_kv_blocks;
  o.scheduler.max_model_len = max_model_len;
  o.scheduler.max_num_seqs = 256;
  o.enable_prefix_caching = false;  // random prompts share nothing; keep the count honest
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(o));
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> prompt_len(64, 512);
  std::exponential_distribution<double> out_len(1.0 / 128);
  int64_t total_tokens = 0;
  for (int i = 0; i < num_requests; ++i) {
    const int p = prompt_len(rng);
    const int out = std::clamp(static_cast<int>(std::ceil(out_len(rng))), 1, 1024);
    total_tokens += p + out;
    RETURN_IF_ERROR(
        engine->Add(Greedy(RandomPrompt(&rng, p, engine->model_config().vocab_size), out))
            .status());
  }
  PagedResult r;
  r.kv_tokens = num_kv_blocks * o.block_size;
  r.contiguous_seqs = r.kv_tokens / max_model_len;
  r.mean_seq_tokens = static_cast<double>(total_tokens) / num_requests;
  int64_t running_sum = 0;
  while (engine->has_unfinished()) {
    const bool saturated = engine->scheduler().num_waiting() > 0;
    engine->Step();
    const int running = engine->scheduler().num_running();
    r.peak_running = std::max(r.peak_running, running);
    if (saturated) {
      running_sum += running;
      ++r.saturated_steps;
    }
  }
  r.mean_running = r.saturated_steps > 0 ? static_cast<double>(running_sum) / r.saturated_steps : 0;
  r.preemptions = engine->scheduler().num_preemptions();
  return r;
}

}  // namespace
}  // namespace carpool::bench

int main(int argc, char** argv) {
  using namespace carpool;
  using namespace carpool::bench;
  std::string model = "synthetic:small";
  int decode_steps = 32;
  int decode_prompt_len = 16;
  std::string decode_batches = "1,8,32,64";
  int batching_seqs = 16;
  int batching_requests = 256;
  std::string paged_model = "synthetic:tiny";
  int paged_kv_blocks = 512;
  int paged_max_model_len = 2048;
  int paged_requests = 200;
  bool json_out = false;
  std::string json_file;
  std::string only;
  worker::DeviceOptions device = {.kind = worker::DeviceKind::kCpu};
  FlagParser parser;
  parser.AddString("model", &model, "model to measure");
  parser.AddCustom(
      "dtype",
      [&device](const std::string& v) -> absl::Status {
        absl::StatusOr<std::optional<worker::StorageType>> t = worker::ParseDtypeFlag(v);
        if (!t.ok()) return t.status();
        device.dtype = *t;
        return absl::OkStatus();
      },
      "weights: auto, float32 or bfloat16 (as carpool-worker's --dtype on the CPU)", "auto");
  parser.AddCustom(
      "quantization",
      [&device](const std::string& v) -> absl::Status {
        absl::StatusOr<worker::Quantization> q = worker::ParseQuantization(v);
        if (!q.ok()) return q.status();
        device.quantization = *q;
        return absl::OkStatus();
      },
      "none or int8", "none");
  parser.AddCustom(
      "kv-cache-dtype",
      [&device](const std::string& v) -> absl::Status {
        absl::StatusOr<std::optional<worker::StorageType>> t = worker::ParseKvCacheDtypeFlag(v);
        if (!t.ok()) return t.status();
        device.kv_cache_dtype = *t;
        return absl::OkStatus();
      },
      "auto, bfloat16 or float32", "auto");
  parser.AddInt("decode-steps", &decode_steps, "timed decode steps per batch size");
  parser.AddString("decode-batches", &decode_batches,
                   "comma-separated batch sizes of the decode measurement");
  parser.AddInt("decode-prompt-len", &decode_prompt_len,
                "prompt tokens of each decode sequence (128 for llama-batched-bench -npp 128)");
  parser.AddInt("batching-seqs", &batching_seqs, "max-num-seqs of the batching comparison");
  parser.AddInt("batching-requests", &batching_requests, "requests in the batching comparison");
  parser.AddString("paged-model", &paged_model, "model of the paged-KV count");
  parser.AddInt("paged-kv-blocks", &paged_kv_blocks, "KV budget of the paged-KV count");
  parser.AddInt("paged-max-model-len", &paged_max_model_len, "max-model-len of it");
  parser.AddInt("paged-requests", &paged_requests, "requests of the paged-KV count");
  parser.AddString("only", &only,
                   "comma-separated parts: bandwidth, decode, prefill, batching, overhead, paged, "
                   "embed, window; none: all");
  parser.AddBool("json", &json_out, "also print a JSON object");
  parser.AddString("json-file", &json_file, "also write the JSON object to this file");
  if (auto s = parser.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-bench-engine: " << s.message() << "\n" << parser.Help();
    return 2;
  }
  std::set<std::string> parts;
  {
    std::stringstream list(only);
    for (std::string part; std::getline(list, part, ',');) {
      if (part.empty()) continue;
      if (part != "bandwidth" && part != "decode" && part != "prefill" && part != "batching" &&
          part != "overhead" && part != "paged" && part != "embed" && part != "window") {
        std::cerr << "carpool-bench-engine: unknown part '" << part << "' in --only\n";
        return 2;
      }
      parts.insert(part);
    }
  }
  const auto run = [&](const char* part) { return parts.empty() || parts.count(part) > 0; };
  nlohmann::json out;
  out["model"] = model;
  // Every engine here has options.num_threads 0: a pool of one thread per core.
  const int threads = ThreadPool::CoreCount();
  out["threads"] = threads;

  if (absl::Status s = device.Validate(); !s.ok()) {
    std::cerr << "carpool-bench-engine: " << s.message() << "\n";
    return 2;
  }
  EngineOptions options;
  options.model = model;
  options.device = device;
  options.scheduler.max_model_len = 1024;
  options.scheduler.max_num_seqs = 64;
  std::unique_ptr<worker::Engine> engine;
  if (run("bandwidth") || run("decode") || run("prefill") || run("batching") || run("overhead")) {
    auto created = worker::Engine::Create(options);
    if (!created.ok()) {
      std::cerr << created.status() << "\n";
      return 1;
    }
    engine = std::move(*created);
    // Before the bandwidth probe's buffer: the peak of loading (a conversion's transient copies
    // included) and of the engine as built.
    const int64_t load_peak = PeakRssBytes();
    out["peak_rss_after_load_bytes"] = load_peak;
    const double bandwidth = MeasureBandwidth(&engine->thread_pool(), int64_t{1} << 30, 5);
    const int64_t weight_bytes = engine->model().DecodeWeightBytes();
    const double floor_ms = weight_bytes / bandwidth * 1e3;
    const worker::ModelDevice& d = engine->model().device();
    const std::string weight_type = d.weight_type();
    const char* kv_type = worker::StorageTypeName(d.kv_storage_type());
    out["weights"] = weight_type;
    out["kv_cache"] = kv_type;
    // The kernels' paths on this CPU (each chooses at run time from the instructions it has).
    out["kernel_paths"] = {{"bf16", kernels::cpu::LinearBf16Path()},
                           {"int8", kernels::cpu::LinearInt8Path()}};
    out["bandwidth_gb_s"] = bandwidth / 1e9;
    out["decode_weight_bytes"] = weight_bytes;
    out["batch1_floor_ms"] = floor_ms;
    std::printf(
        "model %s, weights %s, KV cache %s, %d threads, bandwidth %.1f GB/s, decode reads "
        "%.1f MB -> floor %.2f ms, peak RSS after load %.0f MiB; kernel paths: bf16 %s, int8 %s\n",
        model.c_str(), weight_type.c_str(), kv_type, engine->thread_pool().num_threads(),
        bandwidth / 1e9, weight_bytes / 1e6, floor_ms, load_peak / 1048576.0,
        kernels::cpu::LinearBf16Path(), kernels::cpu::LinearInt8Path());

    if (run("decode")) {
      std::printf("%-8s %12s %10s %12s\n", "batch", "tokens/s", "step ms", "step/floor");
      double base = 0;
      for (absl::string_view b : absl::StrSplit(decode_batches, ',', absl::SkipEmpty())) {
        int batch = 0;
        if (!absl::SimpleAtoi(b, &batch) || batch <= 0) {
          std::fprintf(stderr, "carpool-bench-engine: --decode-batches: not a batch size: %s\n",
                       std::string(b).c_str());
          return 2;
        }
        DecodeResult r = MeasureDecode(engine.get(), batch, decode_prompt_len, decode_steps);
        if (batch == 1) base = r.tokens_per_s;
        std::printf("%-8d %12.1f %10.2f %12.2f\n", batch, r.tokens_per_s, r.step_ms,
                    r.step_ms / floor_ms);
        out["decode"][std::to_string(batch)] = {{"tokens_per_s", r.tokens_per_s},
                                                {"step_ms", r.step_ms},
                                                {"step_over_floor", r.step_ms / floor_ms},
                                                {"speedup_vs_batch1", base > 0 ? r.tokens_per_s / base : 0.0}};
      }
    }
    if (run("prefill")) {
      const double gemm = MeasureGemm(threads, 512, 2048, 768, 5);
      const double prefill = MeasurePrefill(engine.get(), 8, 256);
      const double flops_per_token =
          2.0 * static_cast<double>(LinearParams(engine->model_config()));
      std::printf(
          "prefill %.0f tokens/s = %.1f GFLOP/s; OpenBLAS sgemm 512x2048x768 %.1f GFLOP/s "
          "(ratio %.2f)\n",
          prefill, prefill * flops_per_token / 1e9, gemm / 1e9, prefill * flops_per_token / gemm);
      out["prefill"] = {{"tokens_per_s", prefill},
                        {"gflops", prefill * flops_per_token / 1e9},
                        {"openblas_gflops", gemm / 1e9},
                        {"ratio", prefill * flops_per_token / gemm}};
    }
  }
  if (run("embed")) {
    // The engine's own embedding passes, without the serving path: what batching can gain at
    // most. inputs/s of one pass of `batch` inputs of `len` tokens, best of 5 (after a warm-up).
    auto e = worker::Engine::Create(options);
    if (!e.ok()) return 1;
    std::mt19937 rng(5);
    std::printf("embedding passes (in-process Engine::Embed, best of 5)\n");
    std::printf("%-8s %-8s %12s %10s %14s\n", "tokens", "batch", "inputs/s", "pass ms",
                "vs batch 1");
    for (int len : {4, 8, 16}) {
      double base = 0;
      for (int batch : {1, 8, 32}) {
        std::vector<worker::EmbeddingInput> inputs(batch);
        std::vector<const worker::EmbeddingInput*> ptrs;
        for (worker::EmbeddingInput& in : inputs) {
          in.tokens = RandomPrompt(&rng, len, (*e)->model().config().vocab_size);
          ptrs.push_back(&in);
        }
        double best = 1e30;
        for (int r = 0; r < 6; ++r) {
          const double t0 = NowSeconds();
          if (!(*e)->Embed(ptrs).ok()) return 1;
          if (r > 0) best = std::min(best, NowSeconds() - t0);
        }
        const double per_s = batch / best;
        if (batch == 1) base = per_s;
        std::printf("%-8d %-8d %12.1f %10.2f %14.2f\n", len, batch, per_s, best * 1e3,
                    per_s / base);
        out["embed"][std::to_string(len)][std::to_string(batch)] = {
            {"inputs_per_s", per_s}, {"pass_ms", best * 1e3}, {"vs_batch1", per_s / base}};
      }
    }
  }
  if (run("batching")) {
    double result[2];
    for (int i = 0; i < 2; ++i) {
      EngineOptions o = options;
      o.scheduler.max_num_seqs = batching_seqs;
      o.scheduler.policy = i == 0 ? worker::SchedulerPolicy::kContinuous
                                  : worker::SchedulerPolicy::kStatic;
      o.scheduler.static_batch_timeout_micros = 0;
      auto e = worker::Engine::Create(o);
      if (!e.ok()) return 1;
      result[i] = MeasureWorkload(e->get(), batching_requests, 48, 256);
    }
    std::printf("exponential output lengths (mean 48, %d requests, %d seqs): continuous %.1f "
                "tokens/s, static %.1f tokens/s, ratio %.2f\n", batching_requests, batching_seqs,
                result[0], result[1], result[0] / result[1]);
    out["batching"] = {{"continuous_tokens_per_s", result[0]},
                       {"static_tokens_per_s", result[1]},
                       {"ratio", result[0] / result[1]}};
  }
  if (run("window")) {
    // Decode at a context of one window and of four: with a sliding window on every layer the
    // attention reads at most a window of keys, so the second should not be slower; a model
    // without one (its "window" here: 512) reads the whole context.
    auto config = worker::SyntheticConfig(model.rfind("synthetic:", 0) == 0 ? model.substr(10)
                                                                             : "");
    const int window = config.ok() && config->sliding_window > 0 ? config->sliding_window : 512;
    EngineOptions o = options;
    o.scheduler.max_model_len = 4 * window + decode_steps + 8;
    auto e = worker::Engine::Create(o);
    if (!e.ok()) {
      std::cerr << e.status() << "\n";
      return 1;
    }
    std::printf("decode at context = window and 4 x window (window %d%s)\n", window,
                config.ok() && config->sliding_window > 0 ? "" : ", the model does not slide");
    std::printf("%-8s %-10s %12s %10s\n", "batch", "context", "tokens/s", "step ms");
    for (int batch : {1, 8}) {
      double at_window = 0;
      for (int factor : {1, 4}) {
        const int prompt_len = factor * window - decode_steps / 2;
        DecodeResult r = MeasureDecode(e->get(), batch, prompt_len, decode_steps);
        if (factor == 1) at_window = r.tokens_per_s;
        std::printf("%-8d %-10d %12.1f %10.2f\n", batch, factor * window, r.tokens_per_s,
                    r.step_ms);
        out["window"][std::to_string(batch)][std::to_string(factor)] = {
            {"context", factor * window},
            {"tokens_per_s", r.tokens_per_s},
            {"step_ms", r.step_ms},
            {"vs_window", r.tokens_per_s / at_window}};
      }
    }
    out["window"]["window"] = window;
    out["window"]["slides"] = config.ok() && config->sliding_window > 0;
  }
  if (run("overhead")) {
    std::printf("engine overhead: forward time / Engine::Step wall time\n");
    std::printf("%-22s %8s %14s %10s %8s\n", "load", "steps", "forward ms", "step ms", "ratio");
    const auto print = [&](const std::string& name, const OverheadResult& r) {
      std::printf("%-22s %8d %14.2f %10.2f %8.3f\n", name.c_str(), r.steps,
                  r.forward_ms_per_step, r.step_ms, r.ratio);
      out["overhead"][name] = {{"steps", r.steps},
                               {"forward_ms_per_step", r.forward_ms_per_step},
                               {"step_ms", r.step_ms},
                               {"ratio", r.ratio}};
    };
    for (int batch : {1, 16, 64}) {
      print("decode_batch_" + std::to_string(batch),
            MeasureDecodeOverhead(engine.get(), batch, decode_steps));
    }
    print("mixed_saturated", MeasureMixedOverhead(engine.get(), 2 * options.scheduler.max_num_seqs));
  }
  if (run("paged")) {
    absl::StatusOr<PagedResult> r =
        MeasurePaged(paged_model, paged_kv_blocks, paged_max_model_len, paged_requests);
    if (!r.ok()) {
      std::cerr << "paged: " << r.status() << "\n";
      return 1;
    }
    std::printf(
        "paged KV (%s): budget %d tokens; contiguous max-length (%d) slots: %d sequences; paged: "
        "peak %d, mean %.1f running while requests waited (%d steps); mean sequence %.0f "
        "tokens; %lld preemptions\n",
        paged_model.c_str(), r->kv_tokens, paged_max_model_len, r->contiguous_seqs,
        r->peak_running, r->mean_running, r->saturated_steps, r->mean_seq_tokens,
        static_cast<long long>(r->preemptions));
    out["paged"] = {{"model", paged_model},
                    {"kv_tokens", r->kv_tokens},
                    {"num_kv_blocks", paged_kv_blocks},
                    {"max_model_len", paged_max_model_len},
                    {"requests", paged_requests},
                    {"contiguous_seqs", r->contiguous_seqs},
                    {"peak_running", r->peak_running},
                    {"mean_running", r->mean_running},
                    {"saturated_steps", r->saturated_steps},
                    {"mean_seq_tokens", r->mean_seq_tokens},
                    {"preemptions", r->preemptions}};
  }
  // With the first engine (and its KV pool, grown by the runs) still alive; the bandwidth
  // probe's buffer is freed by now.
  out["rss_at_end_bytes"] = RssBytes();
  std::printf("RSS at the end %.0f MiB\n", RssBytes() / 1048576.0);
  if (json_out) std::cout << out.dump(2) << "\n";
  if (!json_file.empty()) {
    std::ofstream f(json_file);
    f << out.dump(2) << "\n";
    if (!f) {
      std::cerr << "carpool-bench-engine: cannot write " << json_file << "\n";
      return 1;
    }
  }
  return 0;
}
