// The pure parts of `carpool bench serve`: workload generation (length distributions, datasets,
// arrival times) and the metrics computed from what each request saw. No sockets, no clocks:
// everything here is a function of its arguments (and a seed), so it is tested exactly.
//
// Units: times in a RequestOutcome are seconds; summaries (BenchMetrics) are milliseconds, as in
// vLLM's benchmark_serving results, whose field names ToJson follows where they mean the same.
#ifndef CARPOOL_CLIENT_BENCH_SERVE_H_
#define CARPOOL_CLIENT_BENCH_SERVE_H_

#include <cstdint>
#include <istream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace carpool::client::bench {

// A distribution of token counts, parsed from
//   "N" or "fixed:N"            always N
//   "uniform:LO:HI"             integers in [LO, HI], equally likely
//   "normal:MEAN:STD"           rounded, clamped to >= 1
//   "exponential:MEAN[:MAX]"    ceil of an exponential draw (so >= 1), clamped to <= MAX
// Every sample is >= 1.
struct LengthDist {
  enum class Kind { kFixed, kUniform, kNormal, kExponential };
  Kind kind = Kind::kFixed;
  double a = 1;  // fixed: N; uniform: LO; normal, exponential: MEAN
  double b = 0;  // uniform: HI; normal: STD; exponential: MAX (0 = none)

  // INVALID_ARGUMENT naming the problem.
  static absl::StatusOr<LengthDist> Parse(absl::string_view spec);
  int Sample(std::mt19937_64& rng) const;
  // The largest value Sample can return (INT32_MAX for an uncapped normal or exponential).
  int Max() const;
  // The canonical spec, e.g. "exponential:48:256".
  std::string ToString() const;
};

// One request of a workload: a prompt (token ids, or text the router tokenizes) and how many
// tokens to generate.
struct BenchRequest {
  bool has_text = false;
  std::string text;                 // when has_text
  std::vector<int32_t> token_ids;   // otherwise
  int prompt_len = 0;               // token count as far as the client knows (text: bytes + BOS)
  int output_len = 1;               // max_tokens; with ignore_eos the exact output length
};

enum class DatasetKind { kRandom, kJsonl, kSharedPrefix };

struct DatasetOptions {
  DatasetKind kind = DatasetKind::kRandom;
  // Requests to produce. JSONL: 0 takes every line once; more than the file holds cycles it.
  // Default: 100.
  int num_prompts = 100;
  // Prompt length (random: the whole prompt; shared-prefix: the part after the prefix).
  // Default: fixed 128.
  LengthDist input = {LengthDist::Kind::kFixed, 128, 0};
  // Output length; JSONL lines with "max_tokens" keep theirs. Default: fixed 128.
  LengthDist output = {LengthDist::Kind::kFixed, 128, 0};
  // Random token ids are drawn from [0, vocab_size). The default keeps them inside the byte
  // tokenizer's range (synthetic models). Default: 256.
  int vocab_size = 256;
  // Shared-prefix: the number of distinct prefixes (request i uses prefix i % num_prefixes) and
  // their length. Default: 4, 512.
  int num_prefixes = 4;
  int prefix_len = 512;
  // JSONL: the prompts file ({"prompt": "..."} or {"prompt_ids": [...]}, optional "max_tokens";
  // the format of `carpool generate --prompts-file`). Required for kJsonl.
  std::string path;
  uint64_t seed = 0;

  absl::Status Validate() const;
};

// A random or shared-prefix workload (kind kJsonl: use ParseJsonlDataset).
absl::StatusOr<std::vector<BenchRequest>> SyntheticDataset(const DatasetOptions& options);
// Requests from JSONL text (options.path is not read; lines in order, blank lines skipped).
// Errors name the line.
absl::StatusOr<std::vector<BenchRequest>> ParseJsonlDataset(std::istream& in,
                                                           const DatasetOptions& options);
// Any kind; kJsonl reads options.path.
absl::StatusOr<std::vector<BenchRequest>> BuildDataset(const DatasetOptions& options);

// When each of `n` requests is sent, in seconds from the start, ascending; the first at 0. With
// an infinite rate all are 0. Otherwise the gaps are independent Gamma(shape = burstiness,
// scale = 1 / (rate * burstiness)) draws: mean 1 / rate, variance 1 / (rate^2 * burstiness).
// burstiness 1 is a Poisson process; below 1 burstier, above 1 more regular.
// REQUIRES: rate > 0, burstiness > 0.
std::vector<double> ArrivalOffsets(int n, double rate, double burstiness, uint64_t seed);

// What one request saw, as measured by the client.
struct RequestOutcome {
  bool success = false;
  std::string error;        // when !success
  int prompt_len = 0;
  int output_len = 0;       // tokens received
  double start = 0;         // when it was sent, seconds from the run's start
  double ttft = 0;          // send -> first token, seconds
  double latency = 0;       // send -> final answer, seconds
  std::vector<double> itl;  // gaps between successive token-bearing chunks, seconds
};

// Service-level objectives for goodput: a request is good when it succeeded and meets every
// objective that is set (value <= objective).
struct Slo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;

  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
  // "ttft:500 tpot:50 e2el:3000" (spaces or commas between; any subset; each at most once).
  static absl::StatusOr<Slo> Parse(absl::string_view text);
};

// Linear interpolation between closest ranks (numpy's default); p in [0, 100]. 0 when empty.
double Percentile(std::vector<double> values, double p);

// Mean, median, standard deviation (population), p90, p99 of a set of values, in ms.
struct Summary {
  double mean = 0, median = 0, std = 0, p90 = 0, p99 = 0;
  static Summary Of(const std::vector<double>& values_ms);
};

struct BenchMetrics {
  int completed = 0;
  int failed = 0;
  int good_completed = 0;            // meets the Slo (all completed when the Slo is empty)
  int64_t total_input_tokens = 0;    // over completed requests
  int64_t total_output_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0;     // completed / duration
  std::optional<double> request_goodput;  // good / duration; set when the Slo is not empty
  double output_throughput = 0;      // output tokens / duration
  double total_token_throughput = 0; // (input + output tokens) / duration
  int max_concurrent_requests = 0;   // most requests between send and final at once
  // TPOT per request: (latency - ttft) / (output_len - 1), over requests with output_len > 1.
  // ITL: every gap of every request. E2EL: latency.
  Summary ttft, tpot, itl, e2el;
};

// Metrics of a run that lasted duration_s (first send to last final).
BenchMetrics ComputeMetrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                            const Slo& slo);

// The run's settings, echoed in the report.
struct RunInfo {
  std::string backend = "zmq";
  std::string endpoint;
  int num_prompts = 0;
  double request_rate = 0;           // +inf: all at once
  double burstiness = 1;
  int max_concurrency = 0;           // 0: unlimited
  std::string dataset;               // e.g. "random input=fixed:128 output=exponential:48:256"
  Slo slo;
};

// vLLM's benchmark_serving result fields where they mean the same thing (duration, completed,
// failed, total_input_tokens, total_output_tokens, request_throughput, request_goodput,
// output_throughput, total_token_throughput, max_concurrent_requests, {mean,median,std,p90,p99}
// _{ttft,tpot,itl,e2el}_ms, request_rate, burstiness, max_concurrency, num_prompts), plus
// carpool's: backend, endpoint, dataset, goodput_slo, good_completed. With `detailed`, also the
// per-request arrays input_lens, output_lens, ttfts, itls (seconds), e2els (seconds), errors.
nlohmann::json ToJson(const BenchMetrics& m, const RunInfo& info,
                      const std::vector<RequestOutcome>* detailed);
// The human-readable report (vLLM's layout).
std::string FormatReport(const BenchMetrics& m, const RunInfo& info);

}  // namespace carpool::client::bench

#endif  // CARPOOL_CLIENT_BENCH_SERVE_H_
