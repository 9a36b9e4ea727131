#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::metrics {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, CounterRendersWithHelpTypeAndLabels) {
  Registry r;
  Family<Counter>& c = r.AddCounter("carpool_x_total", "Things.\nMore", {"reason"});
  c.With({"queue_full"}).Inc();
  c.With({"queue_full"}).Inc(2);
  c.With({"a\"b\\c\nd"}).Inc();
  c.With({"queue_full"}).Inc(-5);  // ignored: counters only go up
  EXPECT_EQ(r.Render(),
            "# HELP carpool_x_total Things.\\nMore\n"
            "# TYPE carpool_x_total counter\n"
            "carpool_x_total{reason=\"a\\\"b\\\\c\\nd\"} 1\n"
            "carpool_x_total{reason=\"queue_full\"} 3\n");
}

TEST(MetricsTest, GaugeWithoutLabelsAndRemove) {
  Registry r;
  Family<Gauge>& g = r.AddGauge("carpool_g", "A gauge.", {"worker"});
  g.With({"w1"}).Set(0.25);
  g.With({"w2"}).Set(3);
  g.With({"w2"}).Add(-1);
  g.Remove({"w1"});
  Family<Gauge>& plain = r.AddGauge("carpool_plain", "No labels.");
  plain.With({}).Set(-1.5);
  EXPECT_EQ(r.Render(),
            "# HELP carpool_g A gauge.\n# TYPE carpool_g gauge\ncarpool_g{worker=\"w2\"} 2\n"
            "# HELP carpool_plain No labels.\n# TYPE carpool_plain gauge\ncarpool_plain -1.5\n");
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  Registry r;
  Family<Histogram>& h = r.AddHistogram("carpool_h_seconds", "Latency.", {0.1, 1, 0.5});
  Histogram& s = h.With({});
  for (double v : {0.05, 0.1, 0.3, 0.7, 5.0}) s.Observe(v);
  EXPECT_EQ(r.Render(),
            "# HELP carpool_h_seconds Latency.\n# TYPE carpool_h_seconds histogram\n"
            "carpool_h_seconds_bucket{le=\"0.1\"} 2\n"
            "carpool_h_seconds_bucket{le=\"0.5\"} 3\n"
            "carpool_h_seconds_bucket{le=\"1\"} 4\n"
            "carpool_h_seconds_bucket{le=\"+Inf\"} 5\n"
            "carpool_h_seconds_sum 6.15\n"
            "carpool_h_seconds_count 5\n");
}

TEST(MetricsTest, HistogramObserveManyTimesIsRepeatedObserve) {
  Histogram once({1, 2, 4});
  Histogram many({1, 2, 4});
  for (int i = 0; i < 3; ++i) once.Observe(2);
  once.Observe(8);
  many.Observe(2, 3);
  many.Observe(8, 1);
  many.Observe(1, 0);  // nothing
  EXPECT_EQ(many.BucketCounts(), once.BucketCounts());
  EXPECT_EQ(many.BucketCounts(), (std::vector<uint64_t>{0, 3, 0, 1}));
  EXPECT_EQ(many.Count(), 4u);
  EXPECT_DOUBLE_EQ(many.Sum(), 14);
}

TEST(MetricsTest, HistogramWithLabelsPutsLeLast) {
  Registry r;
  Family<Histogram>& h = r.AddHistogram("carpool_b", "Batch.", {1, 2}, {"worker"});
  h.With({"w"}).Observe(2);
  EXPECT_THAT(r.Render(), HasSubstr("carpool_b_bucket{worker=\"w\",le=\"1\"} 0\n"
                                    "carpool_b_bucket{worker=\"w\",le=\"2\"} 1\n"
                                    "carpool_b_bucket{worker=\"w\",le=\"+Inf\"} 1\n"
                                    "carpool_b_sum{worker=\"w\"} 2\n"));
}

TEST(MetricsTest, FormatValueRoundTrips) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  const double third = 1.0 / 3.0;
  EXPECT_EQ(std::strtod(FormatValue(third).c_str(), nullptr), third);
}

TEST(MetricsTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0, 0.5, 3), (std::vector<double>{0, 0.5, 1}));
  EXPECT_EQ(FormatValue(LinearBuckets(0.1, 0.1, 10)[2]), "0.3");
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Registry r;
  Family<Counter>& c = r.AddCounter("carpool_c_total", "C.", {"t"});
  Family<Histogram>& h = r.AddHistogram("carpool_h", "H.", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.With({"x"}).Inc();
        h.With({}).Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.With({"x"}).Value(), 40000);
  EXPECT_EQ(h.With({}).Count(), 40000u);
  EXPECT_EQ(h.With({}).Sum(), 20000);
}

}  // namespace
}  // namespace carpool::metrics
