// carpool-bench-engine: the engine's throughput on this machine, against limits measured in the
// same run. Prints a table (and JSON with --json). Not a test: figures go to
// docs/PERFORMANCE.md with the command that produced them.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nlohmann/json.hpp"
#include "worker/engine.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace carpool::bench {
namespace {

using worker::Engine;
using worker::EngineOptions;
using worker::EngineRequest;

double NowSeconds() { return Clock::Real()->NowMicros() / 1e6; }

// Streaming-read bandwidth in bytes/s over `bytes` of memory, split over the thread pool.
double MeasureBandwidth(int64_t bytes, int repeats) {
  const int64_t n = bytes / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  ThreadPool* pool = ThreadPool::Default();
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

// OpenBLAS's own multi-threaded sgemm rate (FLOP/s) at an m x n x k shape.
double MeasureGemm(int64_t m, int64_t n, int64_t k, int repeats) {
  std::vector<float> a(m * k, 0.01f), b(n * k, 0.02f), c(m * n);
  openblas_set_num_threads(ThreadPool::Default()->num_threads());
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
    for (const auto& e : engine->Step()) first.insert(e.request_id);
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

}  // namespace
}  // namespace carpool::bench

int main(int argc, char** argv) {
  using namespace carpool;
  using namespace carpool::bench;
  std::string model = "synthetic:small";
  int decode_steps = 32;
  int batching_seqs = 16;
  int batching_requests = 256;
  bool json_out = false;
  std::string only;
  FlagParser parser;
  parser.AddString("model", &model, "model to measure (default synthetic:small)");
  parser.AddInt("decode-steps", &decode_steps, "timed decode steps per batch size (default 32)");
  parser.AddInt("batching-seqs", &batching_seqs, "max-num-seqs of the batching comparison (16)");
  parser.AddInt("batching-requests", &batching_requests, "requests in the batching comparison (256)");
  parser.AddString("only", &only, "run one part: bandwidth, decode, prefill, batching");
  parser.AddBool("json", &json_out, "also print a JSON object");
  if (auto s = parser.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-bench-engine: " << s.message() << "\n" << parser.Help();
    return 2;
  }
  nlohmann::json out;
  out["model"] = model;
  out["threads"] = ThreadPool::Default()->num_threads();

  EngineOptions options;
  options.model = model;
  options.scheduler.max_model_len = 1024;
  options.scheduler.max_num_seqs = 64;
  auto engine = worker::Engine::Create(options);
  if (!engine.ok()) {
    std::cerr << engine.status() << "\n";
    return 1;
  }
  const double bandwidth = MeasureBandwidth(int64_t{1} << 30, 5);
  const int64_t weight_bytes = (*engine)->model().DecodeWeightBytes();
  const double floor_ms = weight_bytes / bandwidth * 1e3;
  out["bandwidth_gb_s"] = bandwidth / 1e9;
  out["decode_weight_bytes"] = weight_bytes;
  out["batch1_floor_ms"] = floor_ms;
  std::printf("model %s, %d threads, bandwidth %.1f GB/s, decode reads %.1f MB -> floor %.2f ms\n",
              model.c_str(), ThreadPool::Default()->num_threads(), bandwidth / 1e9,
              weight_bytes / 1e6, floor_ms);

  if (only.empty() || only == "decode") {
    std::printf("%-8s %12s %10s %12s\n", "batch", "tokens/s", "step ms", "step/floor");
    double base = 0;
    for (int batch : {1, 8, 32, 64}) {
      DecodeResult r = MeasureDecode(engine->get(), batch, 16, decode_steps);
      if (batch == 1) base = r.tokens_per_s;
      std::printf("%-8d %12.1f %10.2f %12.2f\n", batch, r.tokens_per_s, r.step_ms,
                  r.step_ms / floor_ms);
      out["decode"][std::to_string(batch)] = {{"tokens_per_s", r.tokens_per_s},
                                              {"step_ms", r.step_ms},
                                              {"speedup_vs_batch1", r.tokens_per_s / base}};
    }
  }
  if (only.empty() || only == "prefill") {
    const double gemm = MeasureGemm(512, 2048, 768, 5);
    const double prefill = MeasurePrefill(engine->get(), 8, 256);
    const double flops_per_token = 2.0 * (weight_bytes / 4.0);
    std::printf("prefill %.0f tokens/s = %.1f GFLOP/s; OpenBLAS sgemm 512x2048x768 %.1f GFLOP/s "
                "(ratio %.2f)\n", prefill, prefill * flops_per_token / 1e9, gemm / 1e9,
                prefill * flops_per_token / gemm);
    out["prefill"] = {{"tokens_per_s", prefill},
                      {"gflops", prefill * flops_per_token / 1e9},
                      {"openblas_gflops", gemm / 1e9},
                      {"ratio", prefill * flops_per_token / gemm}};
  }
  if (only.empty() || only == "batching") {
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
  if (json_out) std::cout << out.dump(2) << "\n";
  return 0;
}
