#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace carpool::metrics {
namespace {

void AtomicAdd(std::atomic<double>* a, double v) {
  double old = a->load(std::memory_order_relaxed);
  while (!a->compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

// `{a="x",b="y"}`, with `extra` (e.g. le="0.5") appended; "" when there are no labels.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     const std::string& extra = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"", EscapeLabelValue(values[i]),
                    "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, out.empty() ? "" : ",", extra);
  return out.empty() ? out : absl::StrCat("{", out, "}");
}

template <typename M>
constexpr const char* TypeName() {
  if constexpr (std::is_same_v<M, Counter>) return "counter";
  if constexpr (std::is_same_v<M, Gauge>) return "gauge";
  return "histogram";
}

}  // namespace

void Counter::Inc(double v) {
  if (v > 0) AtomicAdd(&value_, v);
}

void Gauge::Add(double v) { AtomicAdd(&value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_([&] {
        std::sort(bounds.begin(), bounds.end());
        bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
        return bounds;
      }()),
      buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) { Observe(v, 1); }

void Histogram::Observe(double v, uint64_t times) {
  if (times == 0) return;
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(times, std::memory_order_relaxed);
  count_.fetch_add(times, std::memory_order_relaxed);
  AtomicAdd(&sum_, v * static_cast<double>(times));
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i) {
    // Rounded to 12 significant digits, so 0.1 + 0.1 * 2 is the bound "0.3", not
    // "0.30000000000000004".
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.12g", start + width * i);
    out.push_back(std::strtod(buf, nullptr));
  }
  return out;
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // The shortest form that reads back the same.
  for (int p = 6; p < 17; ++p) {
    char shorter[32];
    std::snprintf(shorter, sizeof(shorter), "%.*g", p, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

template <typename M>
std::vector<std::string> Family<M>::Key(const std::vector<std::string>& label_values) const {
  std::vector<std::string> key(label_names_.size());
  for (size_t i = 0; i < key.size() && i < label_values.size(); ++i) key[i] = label_values[i];
  return key;
}

template <typename M>
M& Family<M>::With(const std::vector<std::string>& label_values) {
  std::vector<std::string> key = Key(label_values);
  absl::MutexLock lock(&mu_);
  std::unique_ptr<M>& m = series_[std::move(key)];
  if (m == nullptr) {
    if constexpr (std::is_same_v<M, Histogram>) {
      m = std::make_unique<Histogram>(bounds_);
    } else {
      m = std::make_unique<M>();
    }
  }
  return *m;
}

template <typename M>
void Family<M>::Remove(const std::vector<std::string>& label_values) {
  absl::MutexLock lock(&mu_);
  series_.erase(Key(label_values));
}

template <typename M>
void Family<M>::Render(std::string* out) const {
  absl::StrAppend(out, "# HELP ", name_, " ", EscapeHelp(help_), "\n# TYPE ", name_, " ",
                  TypeName<M>(), "\n");
  absl::MutexLock lock(&mu_);
  for (const auto& [values, m] : series_) {
    if constexpr (std::is_same_v<M, Histogram>) {
      const std::vector<uint64_t> counts = m->BucketCounts();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        const std::string le =
            i < m->bounds().size() ? FormatValue(m->bounds()[i]) : std::string("+Inf");
        absl::StrAppend(out, name_, "_bucket",
                        LabelSet(label_names_, values, absl::StrCat("le=\"", le, "\"")), " ",
                        cumulative, "\n");
      }
      // The count is the +Inf bucket, so the two always agree.
      absl::StrAppend(out, name_, "_sum", LabelSet(label_names_, values), " ",
                      FormatValue(m->Sum()), "\n", name_, "_count",
                      LabelSet(label_names_, values), " ", cumulative, "\n");
    } else {
      absl::StrAppend(out, name_, LabelSet(label_names_, values), " ", FormatValue(m->Value()),
                      "\n");
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  auto f = std::make_unique<Family<Counter>>(name, help, std::move(label_names));
  Family<Counter>& ref = *f;
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(f));
  return ref;
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  auto f = std::make_unique<Family<Gauge>>(name, help, std::move(label_names));
  Family<Gauge>& ref = *f;
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(f));
  return ref;
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> bounds,
                                          std::vector<std::string> label_names) {
  auto f = std::make_unique<Family<Histogram>>(name, help, std::move(label_names),
                                               std::move(bounds));
  Family<Histogram>& ref = *f;
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(f));
  return ref;
}

std::string Registry::Render() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& f : families_) f->Render(&out);
  return out;
}

}  // namespace carpool::metrics
