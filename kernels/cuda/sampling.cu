// Log-softmax, argmax and the device sampler (one thread block per row of logits).
//
// The sampler follows worker/sampler/sampler.cc step for step, without sorting the vocabulary:
// every cut (top-k, top-p, the draw) is "the shortest prefix of the sampling order that reaches
// a count or a mass", which a radix select finds in four passes over the row (8 bits of the
// 32-bit weight or logit key per pass, with a histogram of counts and masses), plus one pass
// to order tokens of exactly equal weight by id when the cut falls inside such a group.
// Weights are recomputed from the logits in every pass instead of being stored. Penalties are
// applied to a copy of the row in a caller's scratch row first (only rows that have any).
#include <cfloat>
#include <climits>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"

namespace carpool::kernels::cuda::internal {
namespace {

constexpr int kRowThreads = 512;
constexpr int kBins = 256;
// The CPU sampler selects top-k of at most this many tokens by logit (a heap), larger ones by
// weight; the two orders differ only for distinct logits of equal weight.
constexpr int kCpuHeapTopK = 1024;

// ---------------------------------------------------------------------------------------------
// Bit-exact twins of the CPU sampler's arithmetic.

// worker/sampler/philox.cc: Philox4x32-10 and CounterUniform.
__device__ double DeviceCounterUniform(uint64_t seed, uint64_t position) {
  uint32_t x0 = static_cast<uint32_t>(position);
  uint32_t x1 = static_cast<uint32_t>(position >> 32);
  uint32_t x2 = 0;
  uint32_t x3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, x0);
    const uint32_t lo0 = 0xD2511F53u * x0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, x2);
    const uint32_t lo1 = 0xCD9E8D57u * x2;
    const uint32_t y0 = hi1 ^ x1 ^ k0;
    const uint32_t y2 = hi0 ^ x3 ^ k1;
    x0 = y0;
    x1 = lo1;
    x2 = y2;
    x3 = lo0;
  }
  const uint64_t bits = (static_cast<uint64_t>(x0) << 32) | x1;
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// sampler.cc's ExpNonPositive, with the roundings of GCC's build of it on an FMA host (GCC
// contracts a * b + c into one fma; checked bit for bit over 2^24 inputs).
__device__ __forceinline__ float ExpNonPositive(float x) {
  constexpr float kMin = -87.0f;
  constexpr float kRoundMagic = 12582912.0f;
  const float clamped = x < kMin ? kMin : x;
  const float shifted = __fmaf_rn(clamped, 1.44269504088896341f, kRoundMagic);
  const float n = __fsub_rn(shifted, kRoundMagic);
  const int32_t exponent = __float_as_int(shifted) - __float_as_int(kRoundMagic);
  float r = __fmaf_rn(-n, 0.693359375f, clamped);
  r = __fmaf_rn(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = __fmaf_rn(p, r, 1.3981999507e-3f);
  p = __fmaf_rn(p, r, 8.3334519073e-3f);
  p = __fmaf_rn(p, r, 4.1665795894e-2f);
  p = __fmaf_rn(p, r, 1.6666665459e-1f);
  p = __fmaf_rn(p, r, 5.0000001201e-1f);
  p = __fadd_rn(__fmaf_rn(__fmul_rn(p, r), r, r), 1.0f);
  const float result = __fmul_rn(p, __int_as_float((exponent + 127) << 23));
  return x < kMin ? 0.0f : result;
}

// Order-preserving map of a float (not NaN) to uint32.
__device__ __forceinline__ uint32_t OrderedBits(float x) {
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// A token's place in an order: larger keys first, equal values by lower id.
__device__ __forceinline__ uint64_t MakeKey(uint32_t value_bits, int32_t token) {
  return (static_cast<uint64_t>(value_bits) << 32) | ~static_cast<uint32_t>(token);
}
__device__ __forceinline__ int32_t TokenOfKey(uint64_t key) {
  return static_cast<int32_t>(~static_cast<uint32_t>(key));
}

// ---------------------------------------------------------------------------------------------
// One row of logits as the CPU sampler sees it.

struct Row {
  const float* logits;
  int vocab;
  float max;          // of the sanitized logits
  float temperature;  // > 0 for Weight()
  bool uniform;       // every logit was -inf (or NaN): all are taken as 0

  // NaN -> -inf, +inf -> the largest float, as Sampler::SanitizedLogits.
  __device__ float Logit(int i) const {
    if (uniform) return 0.0f;
    const float v = logits[i];
    return isnan(v) ? -INFINITY : fminf(v, FLT_MAX);
  }
  // e^((logit - max) / temperature), as Sampler::WeighAll / ExpShifted.
  __device__ float Weight(float logit) const {
    return ExpNonPositive(__fdiv_rn(__fsub_rn(logit, max), temperature));
  }
};

// Which tokens are still candidates: weight > 0 and both keys at or above their bounds.
struct Cut {
  uint64_t min_logit_key = 0;            // over (OrderedBits(logit), id); 0: no bound
  uint64_t min_weight_key = 1ull << 32;  // over (bits(weight), id); this value: weight > 0
};

enum class Order { kLogit, kWeight };
enum class Goal { kCountAtLeast, kMassAtLeast, kMassAbove };

struct Target {
  Goal goal;
  int64_t count;
  double mass;
  __device__ bool Reached(int64_t c, double m) const {
    switch (goal) {
      case Goal::kCountAtLeast:
        return c >= count;
      case Goal::kMassAtLeast:
        return m >= mass;
      default:
        return m > mass;
    }
  }
};

struct Selected {
  uint64_t key;   // the last token of the prefix, in the selection's order
  int64_t count;  // tokens in the prefix
  double mass;    // their weight (only for Order::kWeight)
};

struct SampleShared {
  uint32_t bin_count[kBins];
  double bin_mass[kBins];
  int32_t bin_min_id[kBins];
  float scratch_f[32];
  double scratch_d[32];
  uint64_t scratch_u[32];
  int32_t scratch_i[32];
  // Radix-select state, written by warp 0.
  uint32_t prefix;
  int64_t count_above;
  double mass_above;
  int chosen_bin;
  bool reached;
  int32_t found_id;
};

__device__ __forceinline__ bool IsCandidate(const Row& row, const Cut& cut, int i, float logit,
                                            float weight) {
  if (MakeKey(__float_as_uint(weight), i) < cut.min_weight_key) return false;
  return cut.min_logit_key == 0 || MakeKey(OrderedBits(logit), i) >= cut.min_logit_key;
}

__device__ __forceinline__ uint32_t OrderValue(Order order, float logit, float weight) {
  return order == Order::kLogit ? OrderedBits(logit) : __float_as_uint(weight);
}

// Warp 0 scans the histogram from the top bin down for the bin where `target` is reached,
// given the count and mass above it. Others wait at the caller's barrier.
__device__ void ScanBins(const Target& target, SampleShared& sh) {
  constexpr int kBinsPerLane = kBins / 32;
  const int lane = threadIdx.x % 32;
  // Lane L takes bins [255 - 8L - 7, 255 - 8L], walked downwards.
  const int top = kBins - 1 - lane * kBinsPerLane;
  uint32_t count = 0;
  double mass = 0.0;
  for (int b = top; b > top - kBinsPerLane; --b) {
    count += sh.bin_count[b];
    mass += sh.bin_mass[b];
  }
  // Inclusive prefix over lanes (lane 0 holds the heaviest bins).
  uint32_t count_incl = count;
  double mass_incl = mass;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint32_t c = __shfl_up_sync(kFullMask, count_incl, offset);
    const double m = __shfl_up_sync(kFullMask, mass_incl, offset);
    if (lane >= offset) {
      count_incl += c;
      mass_incl += m;
    }
  }
  const int64_t count_above = sh.count_above;
  const double mass_above = sh.mass_above;
  // The lane holding the answer: the first nonempty one whose bins reach the target, else the
  // last nonempty one (the target is not reached: the prefix is every candidate).
  const unsigned reached = __ballot_sync(
      kFullMask, count > 0 && target.Reached(count_above + count_incl, mass_above + mass_incl));
  const unsigned nonempty = __ballot_sync(kFullMask, count > 0);
  const int owner = reached != 0 ? __ffs(reached) - 1 : 31 - __clz(nonempty);
  if (lane != owner) return;
  int64_t c = count_above + (count_incl - count);
  double m = mass_above + (mass_incl - mass);
  int chosen = -1;
  int64_t c_before = c;
  double m_before = m;
  for (int b = top; b > top - kBinsPerLane; --b) {
    if (sh.bin_count[b] == 0) continue;
    chosen = b;
    c_before = c;
    m_before = m;
    c += sh.bin_count[b];
    m += sh.bin_mass[b];
    // (If rounding keeps the walk below the target although the lane's sum reached it, the
    // lane's last nonempty bin is taken.)
    if (reached != 0 && target.Reached(c, m)) break;
  }
  sh.reached = reached != 0;
  sh.chosen_bin = chosen;
  sh.count_above = c_before;
  sh.mass_above = m_before;
}

// The shortest prefix, in `order` over the candidates of `cut`, that reaches `target` (every
// candidate if none does). REQUIRES: at least one candidate; all threads call it.
__device__ Selected RadixSelect(const Row& row, const Cut& cut, Order order, const Target& target,
                                SampleShared& sh) {
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.count_above = 0;
    sh.mass_above = 0.0;
  }
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      sh.bin_count[b] = 0;
      sh.bin_mass[b] = 0.0;
      sh.bin_min_id[b] = INT_MAX;
    }
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) {
      const float logit = row.Logit(i);
      const float weight = row.Weight(logit);
      if (!IsCandidate(row, cut, i, logit, weight)) continue;
      const uint32_t value = OrderValue(order, logit, weight);
      if ((value & mask) != prefix) continue;
      const int bin = (value >> shift) & (kBins - 1);
      atomicAdd(&sh.bin_count[bin], 1u);
      if (order == Order::kWeight) atomicAdd(&sh.bin_mass[bin], static_cast<double>(weight));
      if (shift == 0) atomicMin(&sh.bin_min_id[bin], i);
    }
    __syncthreads();
    if (threadIdx.x < 32) ScanBins(target, sh);
    __syncthreads();
    if (threadIdx.x == 0) sh.prefix |= static_cast<uint32_t>(sh.chosen_bin) << shift;
    mask |= static_cast<uint32_t>(kBins - 1) << shift;
    __syncthreads();
  }

  // The answer has value `prefix`; among the `ties` candidates of that value (ordered by id),
  // take the first j that reach the target (all of them if it is not reached).
  const uint32_t value = sh.prefix;
  const int64_t ties = sh.bin_count[sh.chosen_bin];
  const int64_t count_above = sh.count_above;
  const double mass_above = sh.mass_above;
  const double each = order == Order::kWeight ? static_cast<double>(__uint_as_float(value)) : 0.0;
  int64_t j = ties;
  if (sh.reached) {
    int64_t lo = 1;  // smallest j in [1, ties] that reaches; monotone in j
    int64_t hi = ties;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (target.Reached(count_above + mid, mass_above + static_cast<double>(mid) * each)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    j = lo;
  }
  int32_t id = sh.bin_min_id[sh.chosen_bin];
  if (j > 1) {
    // The j-th smallest id of that value: contiguous id ranges per thread, a block scan.
    const int per_thread = (row.vocab + blockDim.x - 1) / blockDim.x;
    const int begin = threadIdx.x * per_thread;
    const int end = min(row.vocab, begin + per_thread);
    int mine = 0;
    for (int i = begin; i < end; ++i) {
      const float logit = row.Logit(i);
      const float weight = row.Weight(logit);
      mine += IsCandidate(row, cut, i, logit, weight) && OrderValue(order, logit, weight) == value;
    }
    // Exclusive scan of `mine` over the block.
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    int inclusive = mine;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(kFullMask, inclusive, offset);
      if (lane >= offset) inclusive += other;
    }
    __syncthreads();
    if (lane == 31) sh.scratch_i[warp] = inclusive;
    __syncthreads();
    int before = inclusive - mine;
    for (int w = 0; w < warp; ++w) before += sh.scratch_i[w];
    const int wanted = static_cast<int>(j - 1);  // 0-based rank among the ties
    if (wanted >= before && wanted < before + mine) {
      int rank = before;
      for (int i = begin; i < end; ++i) {
        const float logit = row.Logit(i);
        const float weight = row.Weight(logit);
        if (IsCandidate(row, cut, i, logit, weight) && OrderValue(order, logit, weight) == value) {
          if (rank == wanted) {
            sh.found_id = i;
            break;
          }
          ++rank;
        }
      }
    }
    __syncthreads();
    id = sh.found_id;
  }
  __syncthreads();  // shared state is reused by the next call
  return Selected{MakeKey(value, id), count_above + j, mass_above + static_cast<double>(j) * each};
}

// Total weight of the candidates of `cut`, in double.
__device__ double CandidateMass(const Row& row, const Cut& cut, SampleShared& sh) {
  double mass = 0.0;
  for (int i = threadIdx.x; i < row.vocab; i += blockDim.x) {
    const float logit = row.Logit(i);
    const float weight = row.Weight(logit);
    if (IsCandidate(row, cut, i, logit, weight)) mass += weight;
  }
  return BlockSum(mass, sh.scratch_d);
}

// Steps 4-7 of Sampler::Sample for temperature > 0 (SampleFromTruncated).
__device__ int32_t SampleTruncated(Row row, const SamplingRow& p, SampleShared& sh) {
  row.temperature = p.temperature;
  const float floor = fmaxf(p.min_p, FLT_TRUE_MIN);
  const uint64_t floor_key = MakeKey(__float_as_uint(floor), -1);
  Cut cut;
  double total = 0.0;  // mass of the top-k distribution, which top-p is relative to
  double kept = 0.0;   // mass of the candidates left
  if (p.top_k > 0 && p.top_k < row.vocab) {
    const Target k{Goal::kCountAtLeast, p.top_k, 0.0};
    if (p.top_k <= kCpuHeapTopK) {
      cut.min_logit_key = RadixSelect(row, cut, Order::kLogit, k, sh).key;
      total = CandidateMass(row, cut, sh);
    } else {
      const Selected top = RadixSelect(row, cut, Order::kWeight, k, sh);
      cut.min_weight_key = top.key;
      total = top.mass;
    }
    kept = total;
    if (p.min_p > 0.0f) {
      cut.min_weight_key = cut.min_weight_key > floor_key ? cut.min_weight_key : floor_key;
      kept = CandidateMass(row, cut, sh);
    }
  } else {
    total = CandidateMass(row, cut, sh);
    cut.min_weight_key = floor_key;
    kept = p.min_p > 0.0f ? CandidateMass(row, cut, sh) : total;
  }
  const double threshold = static_cast<double>(p.top_p) * total;
  if (p.top_p < 1.0f && kept >= threshold) {
    const Selected nucleus =
        RadixSelect(row, cut, Order::kWeight, Target{Goal::kMassAtLeast, 0, threshold}, sh);
    cut.min_weight_key = nucleus.key;
    kept = nucleus.mass;
  }
  const double u = DeviceCounterUniform(p.seed, static_cast<uint64_t>(p.position));
  const Selected drawn =
      RadixSelect(row, cut, Order::kWeight, Target{Goal::kMassAbove, 0, u * kept}, sh);
  return TokenOfKey(drawn.key);
}

// Step 2 of Sampler::Sample (ApplyPenalties): the sanitized row `raw` with the row's penalties
// applied, into `penalized`, with the roundings of GCC's build of it on an FMA host (which
// contracts the frequency penalty's v - f * count into one fma; repetition first, presence
// last, then capped at the largest float). Entries are distinct tokens, so threads never touch
// the same one. REQUIRES: all threads call it.
__device__ void Penalize(const Row& raw, const SamplingRow& p, const PenaltyToken* entries,
                         float* penalized) {
  for (int i = threadIdx.x; i < raw.vocab; i += blockDim.x) penalized[i] = raw.Logit(i);
  __syncthreads();
  const bool repetition = p.repetition_penalty != 1.0f;
  for (int j = threadIdx.x; j < p.num_penalty_tokens; j += blockDim.x) {
    const PenaltyToken e = entries[p.penalty_begin + j];
    if (e.token < 0 || e.token >= raw.vocab) continue;
    float v = penalized[e.token];
    if (repetition) {
      v = v > 0.0f ? __fdiv_rn(v, p.repetition_penalty) : __fmul_rn(v, p.repetition_penalty);
    }
    if (e.count > 0) {
      v = __fmaf_rn(-p.frequency_penalty, static_cast<float>(e.count), v);
      v = __fsub_rn(v, p.presence_penalty);
    }
    penalized[e.token] = FLT_MAX < v ? FLT_MAX : v;
  }
  __syncthreads();  // global writes of the block are visible to the block after it
}

__global__ void __launch_bounds__(kRowThreads)
    SampleKernel(const float* logits, const SamplingRow* rows, int vocab,
                 const PenaltyToken* penalties, float* penalized, SampledToken* out) {
  __shared__ SampleShared sh;
  const SamplingRow p = rows[blockIdx.x];
  Row row{logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab, 0.0f, 1.0f, false};

  // 1. Sanitized max and the raw log-softmax normalizer (weights at temperature 1, in double).
  float max_logit = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) max_logit = fmaxf(max_logit, row.Logit(i));
  max_logit = BlockMax(max_logit, sh.scratch_f);
  if (max_logit == -INFINITY) {
    row.uniform = true;
    max_logit = 0.0f;
  }
  row.max = max_logit;
  double raw_mass = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) raw_mass += row.Weight(row.Logit(i));
  raw_mass = BlockSum(raw_mass, sh.scratch_d);
  const double log_normalizer = static_cast<double>(max_logit) + log(raw_mass);

  // 2. Penalties on a copy (the logprobs stay those of the raw row): steps 3-7 read the
  // penalized row, whose maximum the weights are relative to.
  Row sampled = row;
  if (p.num_penalty_tokens > 0 && penalties != nullptr && penalized != nullptr) {
    float* copy = penalized + static_cast<int64_t>(p.penalized_row) * vocab;
    Penalize(row, p, penalties, copy);
    float copy_max = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) copy_max = fmaxf(copy_max, copy[i]);
    copy_max = BlockMax(copy_max, sh.scratch_f);
    // Finite: the raw row's largest value stays finite, and an all-masked row is all zeros.
    sampled = Row{copy, vocab, copy_max, 1.0f, false};
  }

  // 3. Greedy: the lowest id of the largest logit. Otherwise 4-7.
  int32_t token;
  if (p.temperature == 0.0f) {
    uint64_t best = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const uint64_t key = MakeKey(OrderedBits(sampled.Logit(i)), i);
      best = key > best ? key : best;
    }
    token = TokenOfKey(BlockMaxU64(best, sh.scratch_u));
  } else {
    token = SampleTruncated(sampled, p, sh);
  }

  // Logprobs of the raw distribution; top ones by (logit desc, id asc).
  SampledToken* result = out + blockIdx.x;
  if (threadIdx.x == 0) {
    result->token = token;
    result->logprob = static_cast<float>(row.Logit(token) - log_normalizer);
  }
  const int num_top = min(min(max(p.num_top_logprobs, 0), kMaxTopLogprobs), vocab);
  uint64_t below = ~0ull;
  for (int n = 0; n < num_top; ++n) {
    uint64_t best = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const uint64_t key = MakeKey(OrderedBits(row.Logit(i)), i);
      if (key < below && key > best) best = key;
    }
    below = BlockMaxU64(best, sh.scratch_u);
    if (threadIdx.x == 0) {
      const int32_t t = TokenOfKey(below);
      result->top_tokens[n] = t;
      result->top_logprobs[n] = static_cast<float>(row.Logit(t) - log_normalizer);
    }
  }
}

__global__ void __launch_bounds__(kRowThreads) LogSoftmaxKernel(float* x, int64_t n) {
  __shared__ float scratch[32];
  float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float row_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row_max = fmaxf(row_max, row[i]);
  row_max = BlockMax(row_max, scratch);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(row[i] - row_max);
  sum = BlockSum(sum, scratch);
  const float shift = row_max + logf(sum);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row[i] -= shift;
}

__global__ void __launch_bounds__(kRowThreads)
    ArgmaxKernel(const float* x, int64_t n, int32_t* out) {
  __shared__ uint64_t scratch[32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = isnan(row[i]) ? -INFINITY : row[i];
    const uint64_t key = MakeKey(OrderedBits(v), static_cast<int32_t>(i));
    best = key > best ? key : best;
  }
  best = BlockMaxU64(best, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = TokenOfKey(best);
}

__global__ void CounterUniformKernel(const uint64_t* seeds, const uint64_t* positions, double* out,
                                     int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = DeviceCounterUniform(seeds[i], positions[i]);
}

}  // namespace

cudaError_t LaunchLogSoftmax(float* x, int64_t rows, int64_t n, cudaStream_t stream) {
  LogSoftmaxKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, n);
  return cudaGetLastError();
}

cudaError_t LaunchArgmax(const float* x, int64_t rows, int64_t n, int32_t* out,
                         cudaStream_t stream) {
  ArgmaxKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchSample(const float* logits, const SamplingRow* rows, int64_t num_rows,
                         int64_t vocab, const PenaltyToken* penalties, float* penalized,
                         SampledToken* out, cudaStream_t stream) {
  SampleKernel<<<static_cast<unsigned>(num_rows), kRowThreads, 0, stream>>>(
      logits, rows, static_cast<int>(vocab), penalties, penalized, out);
  return cudaGetLastError();
}

cudaError_t LaunchCounterUniform(const uint64_t* seeds, const uint64_t* positions, double* out,
                                 int64_t n, cudaStream_t stream) {
  CounterUniformKernel<<<CeilDiv(n, 256), 256, 0, stream>>>(seeds, positions, out, n);
  return cudaGetLastError();
}

}  // namespace carpool::kernels::cuda::internal
