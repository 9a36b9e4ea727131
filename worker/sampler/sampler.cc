#include "worker/sampler/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "common/status.h"

namespace carpool::worker {
namespace {

constexpr float kMaxFloat = std::numeric_limits<float>::max();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Top-k at or below this size is selected with a heap over the logits; larger k with the
// quickselect over all weighted tokens.
constexpr int kHeapTopK = 1024;
// Ranges this short are sorted outright by the mass quickselect.
constexpr int kSortBelow = 32;
// Without top-k, tokens weighing at least this much relative to the top one are collected
// first; the (usually long, light) rest only when top-p or the draw reaches past them.
constexpr float kHeavyWeight = 1.0f / 1024;
// Independent accumulators, so the compiler can vectorize the passes over the vocabulary.
constexpr int kLanes = 8;

// e^x for x <= 0 (not NaN), relative error ~1e-7; 0 below -87 (so exp(-inf) = 0). Branch-free
// so that the loops using it vectorize. Cephes expf: x = n ln2 + r, e^r by polynomial.
inline float ExpNonPositive(float x) {
  constexpr float kMin = -87.0f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float clamped = x < kMin ? kMin : x;
  const float shifted = clamped * 1.44269504088896341f + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const int32_t exponent = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRoundMagic);
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float result = p * std::bit_cast<float>((exponent + 127) << 23);
  return x < kMin ? 0.0f : result;
}

// Largest value; *bad is set when any value is NaN or +inf.
float ScanMax(const float* values, int n, bool* bad) {
  float lane_max[kLanes];
  int lane_bad[kLanes] = {};
  std::fill(lane_max, lane_max + kLanes, kNegInf);
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = values[i + j];
      lane_bad[j] |= !(v <= kMaxFloat);
      lane_max[j] = lane_max[j] < v ? v : lane_max[j];
    }
  }
  float max = kNegInf;
  int any_bad = 0;
  for (; i < n; ++i) {
    any_bad |= !(values[i] <= kMaxFloat);
    max = max < values[i] ? values[i] : max;
  }
  for (int j = 0; j < kLanes; ++j) {
    any_bad |= lane_bad[j];
    max = max < lane_max[j] ? lane_max[j] : max;
  }
  *bad = any_bad != 0;
  return max;
}

// Lowest id among the largest values. REQUIRES: no NaN.
int32_t Argmax(const float* values, int n) {
  bool unused;
  const float max = ScanMax(values, n, &unused);
  return static_cast<int32_t>(std::find(values, values + n, max) - values);
}

// out[i] = e^((values[i] - shift) / temperature). REQUIRES: values[i] <= shift.
void ExpShifted(const float* values, int n, float shift, float temperature, float* out) {
  for (int i = 0; i < n; ++i) out[i] = ExpNonPositive((values[i] - shift) / temperature);
}

// Sum in double, in a fixed order (lane j takes every kLanes-th value).
double Sum(const float* values, int n) {
  double lane_sum[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane_sum[j] += values[i + j];
  }
  double sum = 0.0;
  for (; i < n; ++i) sum += values[i];
  for (int j = 0; j < kLanes; ++j) sum += lane_sum[j];
  return sum;
}

// The k best ids by (value desc, id asc), best first, into *out. REQUIRES: no NaN.
void SelectTop(const float* values, int n, int k, std::vector<int32_t>* out) {
  out->clear();
  k = std::min(k, n);
  if (k <= 0) return;
  const auto better = [values](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  };
  for (int32_t t = 0; t < k; ++t) out->push_back(t);
  std::make_heap(out->begin(), out->end(), better);  // front: the worst kept so far
  float threshold = values[out->front()];
  for (int32_t t = k; t < n; ++t) {
    // Ids grow, so a value equal to the threshold loses the tie.
    if (values[t] <= threshold) continue;
    std::pop_heap(out->begin(), out->end(), better);
    out->back() = t;
    std::push_heap(out->begin(), out->end(), better);
    threshold = values[out->front()];
  }
  std::sort_heap(out->begin(), out->end(), better);
}

// A candidate packed so that the sampling order (heavier first, then lower id) is descending
// unsigned order: the weight's bits (monotone for weights >= 0) above the complemented id.
using Key = uint64_t;

inline Key MakeKey(float weight, int32_t token) {
  return static_cast<Key>(std::bit_cast<uint32_t>(weight)) << 32 | ~static_cast<uint32_t>(token);
}
inline float WeightOf(Key key) { return std::bit_cast<float>(static_cast<uint32_t>(key >> 32)); }
inline int32_t TokenOf(Key key) { return static_cast<int32_t>(~static_cast<uint32_t>(key)); }

// Total weight of keys[0, n), in double, in a fixed order.
double SumWeights(const Key* keys, int n) {
  double lane_sum[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane_sum[j] += WeightOf(keys[i + j]);
  }
  double sum = 0.0;
  for (; i < n; ++i) sum += WeightOf(keys[i]);
  for (int j = 0; j < kLanes; ++j) sum += lane_sum[j];
  return sum;
}

// Candidates, double-buffered: partitions read buffer `cur` and write the other.
struct Candidates {
  Key* buffer[2];
  int cur = 0;

  Key* keys() const { return buffer[cur]; }
  Key* other() const { return buffer[1 - cur]; }
};

Key MedianOfThree(Key a, Key b, Key c) {
  return std::max(std::min(a, b), std::min(std::max(a, b), c));
}

// Partitions cur[lo, hi) around `pivot` (one of its keys) into the other buffer, which becomes
// cur: keys before the pivot in sampling order land in [lo, m), the pivot at m, the rest in
// (m, hi). Returns m. Branch-free: each key is written to both open ends and the wrong copy is
// overwritten later.
int Partition(Candidates* c, int lo, int hi, Key pivot) {
  const Key* in = c->keys();
  Key* out = c->other();
  int left = lo;
  int right = hi - 1;
  for (int i = lo; i < hi; ++i) {
    const Key key = in[i];
    out[left] = key;
    out[right] = key;
    left += key > pivot;
    right -= key < pivot;
  }
  out[left] = pivot;  // left == right: the one slot left
  c->cur = 1 - c->cur;
  return left;
}

// Finds the smallest k in (lo, hi] for which reaches(k, mass of the first k candidates in
// sampling order) holds (hi if none) and leaves those k at cur[0, k), the k-th of them at
// k - 1. *prefix_mass gets their mass. A quickselect that recurses only into the side holding
// the answer: expected O(hi - lo). REQUIRES: hi > lo; cur[0, lo) holds the lo first candidates,
// of mass `base`, and reaches(lo, base) is false; `reaches` is monotone.
template <typename Reaches>
int SelectPrefix(Candidates* c, int lo, int hi, double base, const Reaches& reaches,
                 double* prefix_mass) {
  // Invariant: [0, lo) is final and the same in both buffers.
  if (hi - lo > kSortBelow) std::copy(c->keys(), c->keys() + lo, c->other());
  while (hi - lo > kSortBelow) {
    const Key* keys = c->keys();
    const int m =
        Partition(c, lo, hi, MedianOfThree(keys[lo], keys[lo + (hi - lo) / 2], keys[hi - 1]));
    const double before_pivot = base + SumWeights(c->keys() + lo, m - lo);
    const double with_pivot = before_pivot + WeightOf(c->keys()[m]);
    if (reaches(m, before_pivot)) {
      hi = m;
    } else if (reaches(m + 1, with_pivot)) {
      *prefix_mass = with_pivot;
      return m + 1;
    } else {
      std::copy(c->keys() + lo, c->keys() + m + 1, c->other() + lo);
      base = with_pivot;
      lo = m + 1;
    }
  }
  Key* keys = c->keys();
  std::sort(keys + lo, keys + hi, std::greater<Key>());
  for (int i = lo; i < hi; ++i) {
    base += WeightOf(keys[i]);
    if (reaches(i + 1, base)) {
      *prefix_mass = base;
      return i + 1;
    }
  }
  // Not reached (at the end, or by rounding against a mass summed in another order).
  *prefix_mass = base;
  return hi;
}

// Appends to `out` the keys of the tokens whose weight is in [lo, hi), in id order; returns
// how many. Written for the common case where few tokens qualify.
int Collect(const float* weights, int n, float lo, float hi, Key* out) {
  int count = 0;
  for (int32_t t = 0; t < n; ++t) {
    const float w = weights[t];
    if (w >= lo && w < hi) out[count++] = MakeKey(w, t);
  }
  return count;
}

// Total of the weights >= lo, in double, in a fixed order.
double MassAtLeast(const float* weights, int n, float lo) {
  double lane_sum[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      lane_sum[j] += weights[i + j] >= lo ? weights[i + j] : 0.0f;
    }
  }
  double sum = 0.0;
  for (; i < n; ++i) sum += weights[i] >= lo ? weights[i] : 0.0f;
  for (int j = 0; j < kLanes; ++j) sum += lane_sum[j];
  return sum;
}

// Keeps the cur[0, n) keys with weight >= min_weight, in order; returns their count and mass.
int KeepAtLeast(Candidates* c, int n, float min_weight, double* mass) {
  Key* keys = c->keys();
  const Key min_key = MakeKey(min_weight, -1);  // the lightest key of that weight
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    const Key key = keys[i];
    keys[kept] = key;
    kept += key >= min_key;
  }
  *mass = SumWeights(keys, kept);
  return kept;
}

}  // namespace

Sampler::Sampler(int vocab_size)
    : vocab_size_(vocab_size),
      scratch_logits_(vocab_size),
      scratch_weights_(vocab_size),
      candidates_{std::vector<uint64_t>(vocab_size), std::vector<uint64_t>(vocab_size)},
      scratch_counts_(vocab_size, 0) {
  CARPOOL_CHECK(vocab_size >= 1);
}

SampleResult Sampler::Sample(const SampleInput& input) {
  const SamplingParams& params = *input.params;
  SampleResult result;

  // 1. Raw log-softmax normalizer: max + log(sum(exp(l - max))), summed in double.
  float raw_max = kNegInf;
  const float* raw = SanitizedLogits(input.logits, &raw_max);
  float* weights = scratch_weights_.data();
  ExpShifted(raw, vocab_size_, raw_max, 1.0f, weights);
  const double raw_mass = Sum(weights, vocab_size_);
  const double log_normalizer = raw_max + std::log(raw_mass);

  // 2-7.
  const float* penalized = ApplyPenalties(input, raw);
  if (params.temperature == 0.0f) {
    result.token = penalized == raw
                       ? static_cast<int32_t>(std::find(raw, raw + vocab_size_, raw_max) - raw)
                       : Argmax(penalized, vocab_size_);
  } else {
    // scratch_weights_ can be reused when it already holds e^((logit - max) / temperature).
    const bool reuse = penalized == raw && params.temperature == 1.0f;
    result.token =
        SampleFromTruncated(penalized, params, input.position, reuse ? &raw_mass : nullptr);
  }

  result.logprob = static_cast<float>(raw[result.token] - log_normalizer);
  FillTopLogprobs(raw, log_normalizer, params.logprobs, &result);
  return result;
}

const float* Sampler::SanitizedLogits(const float* logits, float* max_logit) {
  bool bad = false;
  float max = ScanMax(logits, vocab_size_, &bad);
  if (!bad && max != kNegInf) {
    *max_logit = max;
    return logits;
  }
  scratch_raw_.resize(vocab_size_);
  max = kNegInf;
  for (int i = 0; i < vocab_size_; ++i) {
    const float l = logits[i];
    scratch_raw_[i] = std::isnan(l) ? kNegInf : std::min(l, kMaxFloat);
    max = std::max(max, scratch_raw_[i]);
  }
  if (max == kNegInf) {  // nothing left to choose from: uniform
    std::fill(scratch_raw_.begin(), scratch_raw_.end(), 0.0f);
    max = 0.0f;
  }
  *max_logit = max;
  return scratch_raw_.data();
}

const float* Sampler::ApplyPenalties(const SampleInput& input, const float* raw) {
  const SamplingParams& params = *input.params;
  const bool repetition = params.repetition_penalty != 1.0f &&
                          (!input.prompt_tokens.empty() || !input.output_tokens.empty());
  const bool output_penalties =
      (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) &&
      !input.output_tokens.empty();
  if (!repetition && !output_penalties) return raw;

  float* logits = scratch_logits_.data();
  std::copy(raw, raw + vocab_size_, logits);
  const auto in_vocab = [this](int32_t t) { return t >= 0 && t < vocab_size_; };
  const auto repeat = [&params](float v) {
    return v > 0.0f ? v / params.repetition_penalty : v * params.repetition_penalty;
  };

  // scratch_counts_[t]: > 0 = occurrences in the output, not yet penalized; -1 = penalized.
  for (int32_t t : input.output_tokens) {
    if (in_vocab(t)) ++scratch_counts_[t];
  }
  for (int32_t t : input.output_tokens) {
    if (!in_vocab(t) || scratch_counts_[t] <= 0) continue;
    float v = logits[t];
    if (repetition) v = repeat(v);
    v -= params.frequency_penalty * static_cast<float>(scratch_counts_[t]);
    v -= params.presence_penalty;
    logits[t] = std::min(v, kMaxFloat);
    scratch_counts_[t] = -1;
  }
  if (repetition) {
    for (int32_t t : input.prompt_tokens) {
      if (!in_vocab(t) || scratch_counts_[t] != 0) continue;
      logits[t] = std::min(repeat(logits[t]), kMaxFloat);
      scratch_counts_[t] = -1;
    }
  }
  // Restore the all-zero invariant, touching only what was touched.
  for (int32_t t : input.output_tokens) {
    if (in_vocab(t)) scratch_counts_[t] = 0;
  }
  for (int32_t t : input.prompt_tokens) {
    if (in_vocab(t)) scratch_counts_[t] = 0;
  }
  return logits;
}

int Sampler::WeighTopK(const float* logits, const SamplingParams& params, const double* known_mass,
                       double* total) {
  const float temperature = params.temperature;
  const int top_k = params.top_k;
  Key* out = candidates_[0].data();
  int n = 0;
  if (top_k <= kHeapTopK) {
    // Only the k best logits ever need a weight.
    SelectTop(logits, vocab_size_, top_k, &scratch_top_);
    const float max = logits[scratch_top_[0]];
    for (int32_t t : scratch_top_) {
      const float w = ExpNonPositive((logits[t] - max) / temperature);
      out[n] = MakeKey(w, t);
      n += w > 0.0f;
    }
    *total = SumWeights(out, n);
    return n;
  }
  const float* weights = WeighAll(logits, temperature, known_mass, total);
  n = Collect(weights, vocab_size_, std::numeric_limits<float>::denorm_min(), 2.0f, out);
  if (top_k < n) {
    Candidates candidates{{candidates_[0].data(), candidates_[1].data()}};
    n = SelectPrefix(
        &candidates, 0, n, 0.0, [top_k](int count, double) { return count >= top_k; }, total);
    if (candidates.cur != 0) std::copy(candidates.keys(), candidates.keys() + n, out);
  }
  return n;
}

const float* Sampler::WeighAll(const float* logits, float temperature, const double* known_mass,
                               double* total) {
  float* weights = scratch_weights_.data();
  if (known_mass != nullptr) {
    *total = *known_mass;
    return weights;
  }
  bool unused;
  const float max = ScanMax(logits, vocab_size_, &unused);
  ExpShifted(logits, vocab_size_, max, temperature, weights);
  *total = Sum(weights, vocab_size_);
  return weights;
}

int32_t Sampler::SampleFromTruncated(const float* logits, const SamplingParams& params,
                                     int64_t position, const double* known_mass) {
  // 4. Temperature and top-k. Weights are e^((logit - max) / temperature), so the top token
  // weighs exactly 1, and min-p keeps weights >= min_p.
  Candidates c{{candidates_[0].data(), candidates_[1].data()}};
  Key* keys = candidates_[0].data();
  const float floor = std::max(params.min_p, std::numeric_limits<float>::denorm_min());
  double total = 0.0;      // mass of the top-k distribution, which top-p is relative to
  double kept_mass = 0.0;  // mass of the candidates that min-p keeps
  int heavy = 0;           // keys[0, heavy): the heaviest candidates, built first
  double heavy_mass = 0.0;
  int n = 0;             // keys[0, n): the candidates built so far
  bool complete = true;  // whether keys[0, n) holds every candidate min-p keeps
  const float* weights = nullptr;
  float heavy_floor = 0.0f;
  if (params.top_k > 0 && params.top_k < vocab_size_) {
    n = WeighTopK(logits, params, known_mass, &total);
    kept_mass = total;
    if (params.min_p > 0.0f) n = KeepAtLeast(&c, n, floor, &kept_mass);
  } else {
    weights = WeighAll(logits, params.temperature, known_mass, &total);
    heavy_floor = std::max(kHeavyWeight, floor);
    heavy = n = Collect(weights, vocab_size_, heavy_floor, 2.0f, keys);
    heavy_mass = SumWeights(keys, heavy);
    complete = floor >= heavy_floor;
    kept_mass = complete ? heavy_mass
                         : (params.min_p > 0.0f ? MassAtLeast(weights, vocab_size_, floor) : total);
  }
  const auto complete_candidates = [&] {
    if (complete) return;
    n += Collect(weights, vocab_size_, floor, heavy_floor, keys + n);
    complete = true;
  };

  // Selects the shortest prefix of the first `limit` candidates (all of them if -1) that
  // reaches(count, mass). The heavy ones come first, so it looks no further when they suffice.
  const auto select = [&](int limit, const auto& reaches, double* mass) {
    if (limit == -1 || limit > heavy) {
      if (!reaches(heavy, heavy_mass)) {
        complete_candidates();
        const int hi = limit == -1 ? n : limit;
        if (hi > heavy) return SelectPrefix(&c, heavy, hi, heavy_mass, reaches, mass);
      }
      limit = heavy;  // within the heavy ones (or, by rounding, nothing lies beyond them)
    }
    return SelectPrefix(&c, 0, limit, 0.0, reaches, mass);
  };

  // 5. Top-p over the top-k distribution and 6. min-p each keep a prefix of the sampling order;
  // the shorter one wins. When min-p keeps less mass than top-p asks for, it is the shorter.
  int kept = -1;  // unknown: every candidate min-p keeps
  const double threshold = static_cast<double>(params.top_p) * total;
  if (params.top_p < 1.0f && kept_mass >= threshold) {
    kept = select(
        -1, [threshold](int, double mass) { return mass >= threshold; }, &kept_mass);
  }

  // 7. Inverse CDF: the first token in sampling order whose cumulative mass exceeds u * mass.
  const uint64_t seed = params.has_seed ? params.seed : 0;
  const double target = CounterUniform(seed, static_cast<uint64_t>(position)) * kept_mass;
  double unused;
  const int k = select(
      kept, [target](int, double mass) { return mass > target; }, &unused);
  return TokenOf(c.keys()[k - 1]);
}

void Sampler::FillTopLogprobs(const float* raw, double log_normalizer, int count,
                              SampleResult* result) {
  SelectTop(raw, vocab_size_, count, &scratch_top_);
  result->top_logprobs.clear();
  result->top_logprobs.reserve(scratch_top_.size());
  for (int32_t t : scratch_top_) {
    result->top_logprobs.push_back({t, static_cast<float>(raw[t] - log_normalizer)});
  }
}

}  // namespace carpool::worker
