// `carpool bench serve` without a server: length distributions, datasets, arrival statistics
// with fixed seeds, metric arithmetic on hand-made traces, and the load generator against a
// fake sender.
#include "client/bench_serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/bench_serve_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::client::bench {
namespace {

using ::testing::AllOf;
using ::testing::Each;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::Le;

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

double Variance(const std::vector<double>& v) {
  const double m = Mean(v);
  double sq = 0;
  for (double x : v) sq += (x - m) * (x - m);
  return sq / (v.size() - 1);
}

std::vector<double> Draw(const LengthDist& d, int n, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = d.Sample(rng);
  return v;
}

LengthDist Dist(const std::string& spec) {
  absl::StatusOr<LengthDist> d = LengthDist::Parse(spec);
  EXPECT_TRUE(d.ok()) << spec << ": " << d.status();
  return d.value_or(LengthDist{});
}

// ---- length distributions

TEST(LengthDistTest, ParsesEveryFormAndPrintsItBack) {
  EXPECT_EQ(Dist("128").ToString(), "fixed:128");
  EXPECT_EQ(Dist("fixed:7").ToString(), "fixed:7");
  EXPECT_EQ(Dist("uniform:16:64").ToString(), "uniform:16:64");
  EXPECT_EQ(Dist("normal:100:20").ToString(), "normal:100:20");
  EXPECT_EQ(Dist("exponential:48").ToString(), "exponential:48");
  EXPECT_EQ(Dist("exponential:48:256").ToString(), "exponential:48:256");
}

TEST(LengthDistTest, RejectsMalformedSpecsNamingThem) {
  for (const char* bad : {"", "0", "-3", "1.5", "fixed", "fixed:1:2", "uniform:5", "uniform:9:3",
                          "uniform:0:3", "normal:10", "normal:10:-1", "exponential:0",
                          "exponential:10:0", "poisson:3", "uniform:a:b", "fixed:inf"}) {
    absl::StatusOr<LengthDist> d = LengthDist::Parse(bad);
    EXPECT_FALSE(d.ok()) << bad;
    EXPECT_THAT(d.status().message(), HasSubstr(absl::StrCat("'", bad, "'"))) << bad;
  }
}

TEST(LengthDistTest, FixedIsAlwaysN) {
  EXPECT_THAT(Draw(Dist("fixed:33"), 100), Each(33));
}

TEST(LengthDistTest, UniformCoversTheRangeEvenly) {
  const std::vector<double> v = Draw(Dist("uniform:10:19"), 20000);
  EXPECT_THAT(v, Each(AllOf(Ge(10), Le(19))));
  EXPECT_EQ(std::set<double>(v.begin(), v.end()).size(), 10u);
  EXPECT_NEAR(Mean(v), 14.5, 0.1);
  EXPECT_NEAR(Variance(v), (10 * 10 - 1) / 12.0, 0.3);  // discrete uniform: (n^2 - 1) / 12
}

TEST(LengthDistTest, NormalHasItsMeanAndStd) {
  const std::vector<double> v = Draw(Dist("normal:200:30"), 20000);
  EXPECT_NEAR(Mean(v), 200, 1.0);
  EXPECT_NEAR(std::sqrt(Variance(v)), 30, 1.0);
  EXPECT_THAT(Draw(Dist("normal:2:50"), 2000), Each(Ge(1)));  // clamped to >= 1
}

TEST(LengthDistTest, ExponentialHasItsMeanAndRespectsTheCap) {
  // ceil(X) for X ~ Exp(mean m) has mean 1 / (1 - exp(-1/m)), about m + 0.5.
  const std::vector<double> v = Draw(Dist("exponential:48"), 40000);
  EXPECT_NEAR(Mean(v), 1 / (1 - std::exp(-1 / 48.0)), 1.0);
  EXPECT_THAT(v, Each(Ge(1)));
  // Heavy tail: the standard deviation is about the mean, unlike a normal around 48.
  EXPECT_NEAR(std::sqrt(Variance(v)), 48, 2.0);
  const std::vector<double> capped = Draw(Dist("exponential:48:64"), 20000);
  EXPECT_THAT(capped, Each(AllOf(Ge(1), Le(64))));
  EXPECT_GT(std::count(capped.begin(), capped.end(), 64.0), 0);
}

// ---- datasets

TEST(DatasetTest, RandomPromptsFollowTheDistributionsAndTheVocabulary) {
  DatasetOptions o;
  o.num_prompts = 500;
  o.input = Dist("uniform:4:40");
  o.output = Dist("exponential:20:100");
  o.vocab_size = 256;
  o.seed = 5;
  absl::StatusOr<std::vector<BenchRequest>> a = SyntheticDataset(o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 500u);
  double out_sum = 0;
  for (const BenchRequest& r : *a) {
    EXPECT_FALSE(r.has_text);
    EXPECT_EQ(r.prompt_len, static_cast<int>(r.token_ids.size()));
    EXPECT_THAT(r.prompt_len, AllOf(Ge(4), Le(40)));
    EXPECT_THAT(r.token_ids, Each(AllOf(Ge(0), Le(255))));
    EXPECT_THAT(r.output_len, AllOf(Ge(1), Le(100)));
    out_sum += r.output_len;
  }
  EXPECT_NEAR(out_sum / 500, 20.5, 2.5);
  // Same seed, same workload; another seed, another one.
  absl::StatusOr<std::vector<BenchRequest>> b = SyntheticDataset(o);
  EXPECT_EQ((*a)[17].token_ids, (*b)[17].token_ids);
  o.seed = 6;
  absl::StatusOr<std::vector<BenchRequest>> c = SyntheticDataset(o);
  EXPECT_NE((*a)[17].token_ids, (*c)[17].token_ids);
}

TEST(DatasetTest, SharedPrefixPromptsShareTheirGroupsPrefix) {
  DatasetOptions o;
  o.kind = DatasetKind::kSharedPrefix;
  o.num_prompts = 12;
  o.num_prefixes = 3;
  o.prefix_len = 32;
  o.input = Dist("fixed:8");
  absl::StatusOr<std::vector<BenchRequest>> d = SyntheticDataset(o);
  ASSERT_TRUE(d.ok()) << d.status();
  const auto prefix = [&](int i) {
    const std::vector<int32_t>& t = (*d)[i].token_ids;
    return std::vector<int32_t>(t.begin(), t.begin() + 32);
  };
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ((*d)[i].prompt_len, 40);
    EXPECT_EQ(prefix(i), prefix(i % 3)) << i;
  }
  EXPECT_NE(prefix(0), prefix(1));
  EXPECT_NE((*d)[0].token_ids, (*d)[3].token_ids);  // same prefix, own suffix
}

TEST(DatasetTest, JsonlKeepsLineLengthsDrawsTheRestAndCycles) {
  std::istringstream in(
      "{\"prompt_ids\": [1, 2, 3], \"max_tokens\": 7}\n"
      "\n"
      "{\"prompt\": \"hello\"}\n");
  DatasetOptions o;
  o.kind = DatasetKind::kJsonl;
  o.path = "unused";
  o.num_prompts = 5;
  o.output = Dist("fixed:11");
  absl::StatusOr<std::vector<BenchRequest>> d = ParseJsonlDataset(in, o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 5u);
  EXPECT_EQ((*d)[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ((*d)[0].prompt_len, 3);
  EXPECT_EQ((*d)[0].output_len, 7);
  EXPECT_TRUE((*d)[1].has_text);
  EXPECT_EQ((*d)[1].text, "hello");
  EXPECT_EQ((*d)[1].prompt_len, 6);  // bytes + BOS, until the server says otherwise
  EXPECT_EQ((*d)[1].output_len, 11);
  EXPECT_EQ((*d)[4].token_ids, (*d)[0].token_ids);
}

TEST(DatasetTest, JsonlErrorsNameTheLine) {
  std::istringstream in("{\"prompt_ids\": [1]}\n{\"prompt_ids\": \"x\"}\n");
  DatasetOptions o;
  o.kind = DatasetKind::kJsonl;
  o.path = "unused";
  absl::StatusOr<std::vector<BenchRequest>> d = ParseJsonlDataset(in, o);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("line 2"));
  std::istringstream empty("\n\n");
  EXPECT_FALSE(ParseJsonlDataset(empty, o).ok());
}

// ---- arrivals

std::vector<double> Gaps(const std::vector<double>& offsets) {
  std::vector<double> gaps;
  for (size_t i = 1; i < offsets.size(); ++i) gaps.push_back(offsets[i] - offsets[i - 1]);
  return gaps;
}

TEST(ArrivalTest, InfiniteRateSendsEverythingAtOnce) {
  EXPECT_THAT(ArrivalOffsets(10, std::numeric_limits<double>::infinity(), 1, 3), Each(0.0));
}

TEST(ArrivalTest, PoissonGapsHaveMeanAndVarianceOfAnExponential) {
  const double rate = 8;
  const std::vector<double> offsets = ArrivalOffsets(50001, rate, 1.0, 42);
  EXPECT_EQ(offsets[0], 0);
  EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
  const std::vector<double> gaps = Gaps(offsets);
  EXPECT_NEAR(Mean(gaps), 1 / rate, 0.02 / rate);
  EXPECT_NEAR(Variance(gaps), 1 / (rate * rate), 0.05 / (rate * rate));
  // Memoryless: P(gap > mean) = 1/e.
  const double above = std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g > 1 / rate; });
  EXPECT_NEAR(above / gaps.size(), std::exp(-1.0), 0.01);
  EXPECT_EQ(ArrivalOffsets(100, rate, 1.0, 42)[99], ArrivalOffsets(100, rate, 1.0, 42)[99]);
  EXPECT_NE(ArrivalOffsets(100, rate, 1.0, 42)[99], ArrivalOffsets(100, rate, 1.0, 43)[99]);
}

TEST(ArrivalTest, BurstinessKeepsTheRateAndScalesTheVariance) {
  const double rate = 4;
  for (double burstiness : {0.25, 4.0}) {
    const std::vector<double> gaps = Gaps(ArrivalOffsets(50001, rate, burstiness, 7));
    // Gamma(k, 1 / (rate k)): mean 1 / rate, variance 1 / (rate^2 k).
    EXPECT_NEAR(Mean(gaps), 1 / rate, 0.03 / rate) << burstiness;
    const double expected_var = 1 / (rate * rate * burstiness);
    EXPECT_NEAR(Variance(gaps), expected_var, 0.08 * expected_var) << burstiness;
  }
}

// ---- metrics

TEST(PercentileTest, InterpolatesLikeNumpy) {
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 3.97);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({5}, 99), 5);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(SloTest, ParsesObjectivesAndRejectsNonsense) {
  absl::StatusOr<Slo> s = Slo::Parse("ttft:500 tpot:50,e2el:3000");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ttft_ms, 500);
  EXPECT_EQ(s->tpot_ms, 50);
  EXPECT_EQ(s->e2el_ms, 3000);
  s = Slo::Parse("tpot:20");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->ttft_ms.has_value());
  for (const char* bad : {"", "ttft", "ttft:0", "ttft:-1", "itl:5", "ttft:5 ttft:6", "ttft:x"}) {
    EXPECT_FALSE(Slo::Parse(bad).ok()) << bad;
  }
}

RequestOutcome Outcome(double start, double ttft, std::vector<double> itl, int prompt_len) {
  RequestOutcome o;
  o.success = true;
  o.start = start;
  o.ttft = ttft;
  o.itl = std::move(itl);
  o.latency = ttft + std::accumulate(o.itl.begin(), o.itl.end(), 0.0);
  o.output_len = static_cast<int>(o.itl.size()) + 1;
  o.prompt_len = prompt_len;
  return o;
}

// Three requests with hand-picked times (seconds):
//   A: sent 0.0, first token 0.1, then gaps 0.02 0.02 0.02   -> e2el 0.16, tpot 0.02, 4 tokens
//   B: sent 0.05, first token 0.3, then gaps 0.05 0.15        -> e2el 0.50, tpot 0.10, 3 tokens
//   C: sent 0.2, first token 0.2, no more tokens              -> e2el 0.20, 1 token (no tpot)
//   D: sent 0.3, failed after 0.1 s
std::vector<RequestOutcome> Trace() {
  std::vector<RequestOutcome> t = {Outcome(0.0, 0.1, {0.02, 0.02, 0.02}, 10),
                                   Outcome(0.05, 0.3, {0.05, 0.15}, 20),
                                   Outcome(0.2, 0.2, {}, 30)};
  RequestOutcome failed;
  failed.start = 0.3;
  failed.latency = 0.1;
  failed.prompt_len = 40;
  failed.error = "queue_full";
  t.push_back(failed);
  return t;
}

TEST(MetricsTest, LatenciesFromAHandMadeTrace) {
  const BenchMetrics m = ComputeMetrics(Trace(), 0.8, Slo{});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input_tokens, 60);   // the failed request's prompt does not count
  EXPECT_EQ(m.total_output_tokens, 8);
  EXPECT_DOUBLE_EQ(m.request_throughput, 3 / 0.8);
  EXPECT_DOUBLE_EQ(m.output_throughput, 8 / 0.8);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 68 / 0.8);
  EXPECT_FALSE(m.request_goodput.has_value());
  // TTFT {100, 300, 200} ms.
  EXPECT_NEAR(m.ttft.mean, 200, 1e-9);
  EXPECT_NEAR(m.ttft.median, 200, 1e-9);
  EXPECT_NEAR(m.ttft.p90, 280, 1e-9);
  EXPECT_NEAR(m.ttft.p99, 298, 1e-9);
  EXPECT_NEAR(m.ttft.std, std::sqrt(20000.0 / 3), 1e-9);
  // TPOT over requests with more than one token: {20, 100} ms.
  EXPECT_NEAR(m.tpot.mean, 60, 1e-9);
  EXPECT_NEAR(m.tpot.median, 60, 1e-9);
  EXPECT_NEAR(m.tpot.p99, 99.2, 1e-9);
  // ITL: every gap, {20, 20, 20, 50, 150} ms.
  EXPECT_NEAR(m.itl.mean, 52, 1e-9);
  EXPECT_NEAR(m.itl.median, 20, 1e-9);
  EXPECT_NEAR(m.itl.p90, 110, 1e-9);
  // E2EL {160, 500, 200} ms.
  EXPECT_NEAR(m.e2el.mean, 860.0 / 3, 1e-9);
  EXPECT_NEAR(m.e2el.median, 200, 1e-9);
  EXPECT_NEAR(m.e2el.p99, 494, 1e-9);
  // In flight: A [0, .16], B [.05, .55], C [.2, .4], D [.3, .4]: three at once from .3 to .4.
  EXPECT_EQ(m.max_concurrent_requests, 3);
}

TEST(MetricsTest, GoodputCountsRequestsMeetingEveryObjective) {
  Slo slo;
  slo.ttft_ms = 250;  // B fails it
  BenchMetrics m = ComputeMetrics(Trace(), 0.8, slo);
  EXPECT_EQ(m.good_completed, 2);
  EXPECT_DOUBLE_EQ(*m.request_goodput, 2 / 0.8);
  slo.tpot_ms = 10;  // A (20 ms) fails too; C has one token: TPOT 0 passes
  m = ComputeMetrics(Trace(), 0.8, slo);
  EXPECT_EQ(m.good_completed, 1);
  slo = Slo{};
  slo.e2el_ms = 200;  // boundary: C at exactly 200 ms is good; A 160 good; B 500 not
  m = ComputeMetrics(Trace(), 0.8, slo);
  EXPECT_EQ(m.good_completed, 2);
}

TEST(MetricsTest, BackToBackRequestsDoNotOverlap) {
  const std::vector<RequestOutcome> t = {Outcome(0.0, 0.5, {0.5}, 1), Outcome(1.0, 0.5, {}, 1)};
  EXPECT_EQ(ComputeMetrics(t, 1.5, Slo{}).max_concurrent_requests, 1);
}

TEST(ReportTest, JsonUsesVllmFieldNames) {
  Slo slo;
  slo.ttft_ms = 250;
  RunInfo info;
  info.num_prompts = 4;
  info.request_rate = std::numeric_limits<double>::infinity();
  info.max_concurrency = 2;
  info.slo = slo;
  const std::vector<RequestOutcome> trace = Trace();
  const nlohmann::json j = ToJson(ComputeMetrics(trace, 0.8, slo), info, &trace);
  for (const char* key :
       {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
        "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
        "max_concurrent_requests", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms",
        "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
        "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms",
        "request_rate", "burstiness", "max_concurrency", "num_prompts", "input_lens",
        "output_lens", "ttfts", "itls", "errors"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["completed"], 3);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 2 / 0.8);
  EXPECT_DOUBLE_EQ(j["median_ttft_ms"].get<double>(), 200);
  EXPECT_EQ(j["itls"][0].size(), 3u);
  const std::string text = FormatReport(ComputeMetrics(trace, 0.8, slo), info);
  EXPECT_THAT(text, HasSubstr("Request goodput (req/s) [ttft:250]:"));
  EXPECT_THAT(text, HasSubstr("Median TTFT (ms):"));
}

// ---- the load generator

// Answers every request after `first_ms`, then sends output_len - 1 more one-token chunks
// `gap_ms` apart; fails prompts whose first token id is 999. Tracks the most requests in flight.
class FakeSender : public RequestSender {
 public:
  FakeSender(int first_ms, int gap_ms) : first_ms_(first_ms), gap_ms_(gap_ms) {}
  absl::StatusOr<SendResult> Send(const BenchRequest& r,
                                  const std::function<void(int)>& on_chunk) override {
    const int now = inflight_.fetch_add(1) + 1;
    int seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(first_ms_));
    if (!r.token_ids.empty() && r.token_ids[0] == 999) {
      inflight_.fetch_sub(1);
      return absl::ResourceExhaustedError("queue_full");
    }
    on_chunk(1);
    for (int i = 1; i < r.output_len; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms_));
      on_chunk(1);
    }
    inflight_.fetch_sub(1);
    sent_.fetch_add(1);
    return SendResult{r.prompt_len + 1, 0};  // the server counts a BOS the client did not
  }
  int peak() const { return peak_.load(); }
  int sent() const { return sent_.load(); }

 private:
  const int first_ms_, gap_ms_;
  std::atomic<int> inflight_{0}, peak_{0}, sent_{0};
};

std::vector<BenchRequest> Requests(int n, int output_len) {
  std::vector<BenchRequest> v(n);
  for (BenchRequest& r : v) {
    r.token_ids = {1, 2};
    r.prompt_len = 2;
    r.output_len = output_len;
  }
  return v;
}

TEST(RunnerTest, TimesEveryRequestAndRespectsMaxConcurrency) {
  FakeSender sender(/*first_ms=*/20, /*gap_ms=*/5);
  std::vector<BenchRequest> requests = Requests(12, 3);
  requests[5].token_ids = {999};
  RunnerOptions o;
  o.max_concurrency = 3;
  o.num_warmups = 2;
  ASSERT_TRUE(o.Validate().ok());
  const RunResult run = RunWorkload(requests, &sender, o);
  EXPECT_LE(sender.peak(), 3);
  EXPECT_EQ(sender.peak(), 3);
  EXPECT_EQ(sender.sent(), 11 + 2);  // warmups are sent but not measured
  ASSERT_EQ(run.outcomes.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    const RequestOutcome& r = run.outcomes[i];
    if (i == 5) {
      EXPECT_FALSE(r.success);
      EXPECT_EQ(r.error, "queue_full");
      continue;
    }
    EXPECT_TRUE(r.success) << i;
    EXPECT_GE(r.ttft, 0.020) << i;
    ASSERT_EQ(r.itl.size(), 2u) << i;
    EXPECT_THAT(r.itl, Each(Ge(0.005)));
    EXPECT_GE(r.latency, r.ttft + 0.010);
    EXPECT_EQ(r.output_len, 3);
    EXPECT_EQ(r.prompt_len, 3);  // the server's count wins
  }
  // 12 requests, 3 at a time, each >= 30 ms: at least 4 rounds.
  EXPECT_GE(run.duration_s, 4 * 0.020);
  const BenchMetrics m = ComputeMetrics(run.outcomes, run.duration_s, Slo{});
  EXPECT_EQ(m.completed, 11);
  EXPECT_LE(m.max_concurrent_requests, 3);
}

TEST(RunnerTest, ARequestRateSpreadsTheSends) {
  FakeSender sender(/*first_ms=*/1, /*gap_ms=*/0);
  RunnerOptions o;
  o.request_rate = 100;  // mean gap 10 ms
  o.seed = 9;
  const std::vector<double> offsets = ArrivalOffsets(20, o.request_rate, 1, o.seed);
  const RunResult run = RunWorkload(Requests(20, 1), &sender, o);
  for (int i = 0; i < 20; ++i) {
    // Never before its release time.
    EXPECT_GE(run.outcomes[i].start, offsets[i] - 1e-6) << i;
  }
  EXPECT_GE(run.duration_s, offsets.back());
}

TEST(RunnerTest, ValidateRejectsBadSettings) {
  RunnerOptions o;
  o.request_rate = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = RunnerOptions{};
  o.burstiness = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = RunnerOptions{};
  o.max_concurrency = -1;
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace carpool::client::bench
