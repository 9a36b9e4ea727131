#include "client/bench_serve.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/generate_command.h"
#include "common/status.h"

namespace carpool::client::bench {
namespace {

constexpr int kMaxLen = std::numeric_limits<int32_t>::max();

absl::Status BadSpec(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "length '", spec, "': ", why,
      " (expected N, fixed:N, uniform:LO:HI, normal:MEAN:STD or exponential:MEAN[:MAX])"));
}

int ClampLen(double v, int max) {
  if (!(v >= 1)) return 1;  // also NaN
  if (v >= max) return max;
  return static_cast<int>(v);
}

std::vector<int32_t> RandomIds(std::mt19937_64& rng, int n, int vocab_size) {
  std::uniform_int_distribution<int32_t> id(0, vocab_size - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& t : ids) t = id(rng);
  return ids;
}

}  // namespace

// ---- LengthDist

absl::StatusOr<LengthDist> LengthDist::Parse(absl::string_view spec) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  std::vector<double> nums;
  const size_t first = parts.size() == 1 ? 0 : 1;
  for (size_t i = first; i < parts.size(); ++i) {
    double v;
    if (!absl::SimpleAtod(parts[i], &v) || !std::isfinite(v)) {
      return BadSpec(spec, absl::StrCat("'", parts[i], "' is not a number"));
    }
    nums.push_back(v);
  }
  const absl::string_view kind = parts.size() == 1 ? "fixed" : parts[0];
  LengthDist d;
  if (kind == "fixed") {
    if (nums.size() != 1) return BadSpec(spec, "fixed takes one number");
    d.kind = Kind::kFixed;
    d.a = nums[0];
    if (d.a < 1 || d.a != std::floor(d.a)) return BadSpec(spec, "N must be an integer >= 1");
  } else if (kind == "uniform") {
    if (nums.size() != 2) return BadSpec(spec, "uniform takes LO and HI");
    d.kind = Kind::kUniform;
    d.a = nums[0];
    d.b = nums[1];
    if (d.a < 1 || d.a != std::floor(d.a) || d.b != std::floor(d.b) || d.b < d.a) {
      return BadSpec(spec, "LO and HI must be integers with 1 <= LO <= HI");
    }
  } else if (kind == "normal") {
    if (nums.size() != 2) return BadSpec(spec, "normal takes MEAN and STD");
    d.kind = Kind::kNormal;
    d.a = nums[0];
    d.b = nums[1];
    if (d.a < 1 || d.b < 0) return BadSpec(spec, "MEAN must be >= 1 and STD >= 0");
  } else if (kind == "exponential") {
    if (nums.size() != 1 && nums.size() != 2) {
      return BadSpec(spec, "exponential takes MEAN and an optional MAX");
    }
    d.kind = Kind::kExponential;
    d.a = nums[0];
    d.b = nums.size() == 2 ? nums[1] : 0;
    if (d.a < 1) return BadSpec(spec, "MEAN must be >= 1");
    if (nums.size() == 2 && (d.b < 1 || d.b != std::floor(d.b))) {
      return BadSpec(spec, "MAX must be an integer >= 1");
    }
  } else {
    return BadSpec(spec, absl::StrCat("unknown distribution '", kind, "'"));
  }
  return d;
}

int LengthDist::Sample(std::mt19937_64& rng) const {
  switch (kind) {
    case Kind::kFixed:
      return static_cast<int>(a);
    case Kind::kUniform:
      return std::uniform_int_distribution<int>(static_cast<int>(a), static_cast<int>(b))(rng);
    case Kind::kNormal:
      return ClampLen(std::round(std::normal_distribution<double>(a, b)(rng)), kMaxLen);
    case Kind::kExponential:
      return ClampLen(std::ceil(std::exponential_distribution<double>(1.0 / a)(rng)), Max());
  }
  return 1;
}

int LengthDist::Max() const {
  switch (kind) {
    case Kind::kFixed:
      return static_cast<int>(a);
    case Kind::kUniform:
      return static_cast<int>(b);
    case Kind::kNormal:
      return b == 0 ? ClampLen(std::round(a), kMaxLen) : kMaxLen;
    case Kind::kExponential:
      return b > 0 ? static_cast<int>(b) : kMaxLen;
  }
  return kMaxLen;
}

std::string LengthDist::ToString() const {
  switch (kind) {
    case Kind::kFixed:
      return absl::StrCat("fixed:", a);
    case Kind::kUniform:
      return absl::StrCat("uniform:", a, ":", b);
    case Kind::kNormal:
      return absl::StrCat("normal:", a, ":", b);
    case Kind::kExponential:
      return b > 0 ? absl::StrCat("exponential:", a, ":", b) : absl::StrCat("exponential:", a);
  }
  return "";
}

// ---- datasets

absl::Status DatasetOptions::Validate() const {
  if (num_prompts < 0 || (num_prompts == 0 && kind != DatasetKind::kJsonl)) {
    return absl::InvalidArgumentError("--num-prompts must be >= 1");
  }
  if (vocab_size < 1) return absl::InvalidArgumentError("--vocab-size must be >= 1");
  if (kind == DatasetKind::kSharedPrefix) {
    if (num_prefixes < 1) return absl::InvalidArgumentError("--num-prefixes must be >= 1");
    if (prefix_len < 1) return absl::InvalidArgumentError("--prefix-len must be >= 1");
  }
  if (kind == DatasetKind::kJsonl && path.empty()) {
    return absl::InvalidArgumentError("--dataset jsonl needs --dataset-path");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BenchRequest>> SyntheticDataset(const DatasetOptions& o) {
  RETURN_IF_ERROR(o.Validate());
  if (o.kind == DatasetKind::kJsonl) {
    return absl::InvalidArgumentError("SyntheticDataset: use ParseJsonlDataset for JSONL");
  }
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<int32_t>> prefixes;
  if (o.kind == DatasetKind::kSharedPrefix) {
    for (int g = 0; g < o.num_prefixes; ++g) {
      prefixes.push_back(RandomIds(rng, o.prefix_len, o.vocab_size));
    }
  }
  std::vector<BenchRequest> out;
  out.reserve(o.num_prompts);
  for (int i = 0; i < o.num_prompts; ++i) {
    BenchRequest r;
    if (!prefixes.empty()) r.token_ids = prefixes[i % prefixes.size()];
    const std::vector<int32_t> tail = RandomIds(rng, o.input.Sample(rng), o.vocab_size);
    r.token_ids.insert(r.token_ids.end(), tail.begin(), tail.end());
    r.prompt_len = static_cast<int>(r.token_ids.size());
    r.output_len = o.output.Sample(rng);
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<BenchRequest>> ParseJsonlDataset(std::istream& in,
                                                           const DatasetOptions& o) {
  RETURN_IF_ERROR(o.Validate());
  std::mt19937_64 rng(o.seed);
  SamplingParams defaults;
  defaults.max_tokens = 0;  // "not on the line": drawn from o.output
  std::vector<BenchRequest> lines;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    absl::StatusOr<PromptSpec> spec = ParsePromptSpec(line, defaults);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompts file line ", line_no, ": ", spec.status().message()));
    }
    if (spec->sampling.max_tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompts file line ", line_no, ": \"max_tokens\" must be >= 1"));
    }
    BenchRequest r;
    r.has_text = spec->has_text;
    r.text = std::move(spec->text);
    r.token_ids = std::move(spec->token_ids);
    r.prompt_len = r.has_text ? static_cast<int>(r.text.size()) + 1 : r.token_ids.size();
    r.output_len = spec->sampling.max_tokens > 0 ? spec->sampling.max_tokens : o.output.Sample(rng);
    lines.push_back(std::move(r));
  }
  if (lines.empty()) return absl::InvalidArgumentError("the prompts file holds no prompts");
  if (o.num_prompts == 0) return lines;
  std::vector<BenchRequest> out;
  out.reserve(o.num_prompts);
  for (int i = 0; i < o.num_prompts; ++i) out.push_back(lines[i % lines.size()]);
  return out;
}

absl::StatusOr<std::vector<BenchRequest>> BuildDataset(const DatasetOptions& o) {
  if (o.kind != DatasetKind::kJsonl) return SyntheticDataset(o);
  RETURN_IF_ERROR(o.Validate());
  std::ifstream in(o.path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", o.path));
  return ParseJsonlDataset(in, o);
}

// ---- arrivals

std::vector<double> ArrivalOffsets(int n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> out(std::max(n, 0), 0.0);
  if (std::isinf(rate)) return out;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (int i = 1; i < n; ++i) out[i] = out[i - 1] + gap(rng);
  return out;
}

// ---- metrics

absl::StatusOr<Slo> Slo::Parse(absl::string_view text) {
  Slo slo;
  for (absl::string_view item : absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    double ms;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &ms) || !(ms > 0) || std::isinf(ms)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--goodput: '", item, "' is not NAME:MS with NAME ttft, tpot or e2el and MS > 0"));
    }
    std::optional<double>* slot = kv[0] == "ttft"   ? &slo.ttft_ms
                                  : kv[0] == "tpot" ? &slo.tpot_ms
                                  : kv[0] == "e2el" ? &slo.e2el_ms
                                                    : nullptr;
    if (slot == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput: unknown metric '", kv[0], "' (ttft, tpot or e2el)"));
    }
    if (slot->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("--goodput: '", kv[0], "' given twice"));
    }
    *slot = ms;
  }
  if (slo.empty()) return absl::InvalidArgumentError("--goodput: no objective given");
  return slo;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * (values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - lo);
}

Summary Summary::Of(const std::vector<double>& v) {
  Summary s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(sq / v.size());
  s.median = Percentile(v, 50);
  s.p90 = Percentile(v, 90);
  s.p99 = Percentile(v, 99);
  return s;
}

BenchMetrics ComputeMetrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                            const Slo& slo) {
  BenchMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  std::vector<std::pair<double, int>> events;  // (time, +1 send / -1 final)
  for (const RequestOutcome& o : outcomes) {
    events.emplace_back(o.start, 1);
    events.emplace_back(o.start + o.latency, -1);
    if (!o.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input_tokens += o.prompt_len;
    m.total_output_tokens += o.output_len;
    const double tpot = o.output_len > 1 ? (o.latency - o.ttft) / (o.output_len - 1) : 0.0;
    ttfts.push_back(o.ttft * 1e3);
    if (o.output_len > 1) tpots.push_back(tpot * 1e3);
    for (double gap : o.itl) itls.push_back(gap * 1e3);
    e2els.push_back(o.latency * 1e3);
    const bool good = (!slo.ttft_ms || o.ttft * 1e3 <= *slo.ttft_ms) &&
                      (!slo.tpot_ms || tpot * 1e3 <= *slo.tpot_ms) &&
                      (!slo.e2el_ms || o.latency * 1e3 <= *slo.e2el_ms);
    m.good_completed += good ? 1 : 0;
  }
  // Finals before sends at the same instant: back-to-back requests do not overlap.
  std::sort(events.begin(), events.end());
  int inflight = 0;
  for (const auto& [t, delta] : events) {
    inflight += delta;
    m.max_concurrent_requests = std::max(m.max_concurrent_requests, inflight);
  }
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.output_throughput = m.total_output_tokens / duration_s;
    m.total_token_throughput = (m.total_input_tokens + m.total_output_tokens) / duration_s;
    if (!slo.empty()) m.request_goodput = m.good_completed / duration_s;
  } else if (!slo.empty()) {
    m.request_goodput = 0;
  }
  m.ttft = Summary::Of(ttfts);
  m.tpot = Summary::Of(tpots);
  m.itl = Summary::Of(itls);
  m.e2el = Summary::Of(e2els);
  return m;
}

// ---- reports

namespace {

nlohmann::json OptionalMs(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

void AddSummary(const char* name, const Summary& s, nlohmann::json* j) {
  (*j)[absl::StrCat("mean_", name, "_ms")] = s.mean;
  (*j)[absl::StrCat("median_", name, "_ms")] = s.median;
  (*j)[absl::StrCat("std_", name, "_ms")] = s.std;
  (*j)[absl::StrCat("p90_", name, "_ms")] = s.p90;
  (*j)[absl::StrCat("p99_", name, "_ms")] = s.p99;
}

std::string Line(absl::string_view label, const std::string& value) {
  return absl::StrFormat("%-40s %s\n", label, value);
}

std::string Header(absl::string_view title) {
  const int width = 50;
  const int pad = std::max(0, width - static_cast<int>(title.size()));
  return absl::StrCat(std::string(pad / 2, '-'), title, std::string(pad - pad / 2, '-'), "\n");
}

std::string SummaryLines(const char* metric, const char* title, const Summary& s) {
  return absl::StrCat(Header(title),
                      Line(absl::StrCat("Mean ", metric, " (ms):"), absl::StrFormat("%.2f", s.mean)),
                      Line(absl::StrCat("Median ", metric, " (ms):"),
                           absl::StrFormat("%.2f", s.median)),
                      Line(absl::StrCat("P90 ", metric, " (ms):"), absl::StrFormat("%.2f", s.p90)),
                      Line(absl::StrCat("P99 ", metric, " (ms):"), absl::StrFormat("%.2f", s.p99)));
}

std::string SloText(const Slo& slo) {
  std::vector<std::string> parts;
  if (slo.ttft_ms) parts.push_back(absl::StrCat("ttft:", *slo.ttft_ms));
  if (slo.tpot_ms) parts.push_back(absl::StrCat("tpot:", *slo.tpot_ms));
  if (slo.e2el_ms) parts.push_back(absl::StrCat("e2el:", *slo.e2el_ms));
  return absl::StrJoin(parts, " ");
}

}  // namespace

nlohmann::json ToJson(const BenchMetrics& m, const RunInfo& info,
                      const std::vector<RequestOutcome>* detailed) {
  nlohmann::json j;
  j["backend"] = info.backend;
  j["endpoint"] = info.endpoint;
  j["dataset"] = info.dataset;
  j["num_prompts"] = info.num_prompts;
  j["request_rate"] = std::isinf(info.request_rate) ? nlohmann::json("inf")
                                                    : nlohmann::json(info.request_rate);
  j["burstiness"] = info.burstiness;
  j["max_concurrency"] =
      info.max_concurrency > 0 ? nlohmann::json(info.max_concurrency) : nlohmann::json(nullptr);
  j["goodput_slo"] = info.slo.empty() ? nlohmann::json(nullptr)
                                      : nlohmann::json{{"ttft_ms", OptionalMs(info.slo.ttft_ms)},
                                                       {"tpot_ms", OptionalMs(info.slo.tpot_ms)},
                                                       {"e2el_ms", OptionalMs(info.slo.e2el_ms)}};
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["good_completed"] = m.good_completed;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = OptionalMs(m.request_goodput);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  AddSummary("ttft", m.ttft, &j);
  AddSummary("tpot", m.tpot, &j);
  AddSummary("itl", m.itl, &j);
  AddSummary("e2el", m.e2el, &j);
  if (detailed != nullptr) {
    nlohmann::json input_lens = nlohmann::json::array(), output_lens = nlohmann::json::array(),
                   ttfts = nlohmann::json::array(), itls = nlohmann::json::array(),
                   e2els = nlohmann::json::array(), errors = nlohmann::json::array();
    for (const RequestOutcome& o : *detailed) {
      input_lens.push_back(o.prompt_len);
      output_lens.push_back(o.output_len);
      ttfts.push_back(o.ttft);
      itls.push_back(o.itl);
      e2els.push_back(o.latency);
      errors.push_back(o.error);
    }
    j["input_lens"] = std::move(input_lens);
    j["output_lens"] = std::move(output_lens);
    j["ttfts"] = std::move(ttfts);
    j["itls"] = std::move(itls);
    j["e2els"] = std::move(e2els);
    j["errors"] = std::move(errors);
  }
  return j;
}

std::string FormatReport(const BenchMetrics& m, const RunInfo& info) {
  std::string out = absl::StrCat(std::string(12, '='), " Serving Benchmark Result ",
                                 std::string(12, '='), "\n");
  out += Line("Backend:", absl::StrCat(info.backend, " ", info.endpoint));
  out += Line("Dataset:", info.dataset);
  out += Line("Traffic request rate:", std::isinf(info.request_rate)
                                           ? std::string("inf")
                                           : absl::StrFormat("%.2f", info.request_rate));
  out += Line("Burstiness factor:", absl::StrFormat("%.2f%s", info.burstiness,
                                                    info.burstiness == 1 ? " (Poisson)" : ""));
  out += Line("Max request concurrency:",
              info.max_concurrency > 0 ? absl::StrCat(info.max_concurrency) : "unlimited");
  out += Line("Successful requests:", absl::StrCat(m.completed));
  out += Line("Failed requests:", absl::StrCat(m.failed));
  out += Line("Benchmark duration (s):", absl::StrFormat("%.2f", m.duration_s));
  out += Line("Total input tokens:", absl::StrCat(m.total_input_tokens));
  out += Line("Total generated tokens:", absl::StrCat(m.total_output_tokens));
  out += Line("Request throughput (req/s):", absl::StrFormat("%.2f", m.request_throughput));
  if (m.request_goodput) {
    out += Line(absl::StrCat("Request goodput (req/s) [", SloText(info.slo), "]:"),
                absl::StrFormat("%.2f (%d good)", *m.request_goodput, m.good_completed));
  }
  out += Line("Output token throughput (tok/s):", absl::StrFormat("%.2f", m.output_throughput));
  out += Line("Total token throughput (tok/s):", absl::StrFormat("%.2f", m.total_token_throughput));
  out += Line("Peak concurrent requests:", absl::StrCat(m.max_concurrent_requests));
  out += SummaryLines("TTFT", "Time to First Token", m.ttft);
  out += SummaryLines("TPOT", "Time per Output Token (excl. 1st token)", m.tpot);
  out += SummaryLines("ITL", "Inter-token Latency", m.itl);
  out += SummaryLines("E2EL", "End-to-end Latency", m.e2el);
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace carpool::client::bench
