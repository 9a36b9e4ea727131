// Prometheus metrics: counters, gauges and histograms with labels, rendered in the Prometheus
// text exposition format (version 0.0.4). Debian 12 ships no prometheus-cpp, so carpool keeps
// this small registry of its own; the format is the one Prometheus documents
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
//   metrics::Registry registry;
//   metrics::Family<metrics::Counter>& rejected =
//       registry.AddCounter("carpool_rejections_total", "Requests refused, by reason.", {"reason"});
//   rejected.With({"queue_full"}).Inc();
//   std::string page = registry.Render();
//
// Thread-safe: families are added during setup (AddX is locked too), series are created on first
// use under the family's lock, and updates are lock-free atomics. A Counter/Gauge/Histogram
// reference stays valid as long as its Registry.
#ifndef CARPOOL_COMMON_METRICS_H_
#define CARPOOL_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace carpool::metrics {

// Only goes up. Inc with a negative value is ignored.
class Counter {
 public:
  void Inc(double v = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Cumulative buckets: bucket i counts observations <= bounds[i]; +Inf is implicit.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // `times` observations of `v` at once (e.g. counts from a worker's cumulative histogram).
  void Observe(double v, uint64_t times);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket (not cumulative), bounds().size() + 1 entries (the last is +Inf).
  std::vector<uint64_t> BucketCounts() const;
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  double Sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

// Bucket bounds start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// Bucket bounds start, start+width, ... (count of them).
std::vector<double> LinearBuckets(double start, double width, int count);

enum class MetricType { kCounter, kGauge, kHistogram };

class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual void Render(std::string* out) const = 0;
};

// One metric name with its series, one per combination of label values.
template <typename M>
class Family final : public FamilyBase {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds = {})
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        bounds_(std::move(bounds)) {}

  // The series for these label values (as many as the family has label names; missing ones are
  // empty, extra ones ignored), created at zero on first use.
  M& With(const std::vector<std::string>& label_values);
  // Drops a series (e.g. a worker that left).
  void Remove(const std::vector<std::string>& label_values);

  void Render(std::string* out) const override;

 private:
  std::vector<std::string> Key(const std::vector<std::string>& label_values) const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<M>> series_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Names follow Prometheus' rules ([a-zA-Z_:][a-zA-Z0-9_:]*); counters end in _total.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> bounds,
                                  std::vector<std::string> label_names = {});

  // Every family in the order added, series sorted by label values.
  std::string Render() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// Text-format helpers, exposed for tests.
std::string EscapeLabelValue(const std::string& v);  // \\, \", \n
std::string EscapeHelp(const std::string& v);        // \\, \n
std::string FormatValue(double v);                   // shortest round trip; +Inf, -Inf, NaN

}  // namespace carpool::metrics

#endif  // CARPOOL_COMMON_METRICS_H_
