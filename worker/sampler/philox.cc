#include "worker/sampler/philox.h"

namespace carpool::worker {
namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kRounds = 10;

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

}  // namespace

std::array<uint32_t, 4> Philox4x32(const std::array<uint32_t, 4>& counter,
                                   const std::array<uint32_t, 2>& key) {
  std::array<uint32_t, 4> x = counter;
  uint32_t k0 = key[0];
  uint32_t k1 = key[1];
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kMultiplier0, x[0], &hi0, &lo0);
    MulHiLo(kMultiplier1, x[2], &hi1, &lo1);
    x = {hi1 ^ x[1] ^ k0, lo1, hi0 ^ x[3] ^ k1, lo0};
  }
  return x;
}

double CounterUniform(uint64_t seed, uint64_t position) {
  const std::array<uint32_t, 4> out =
      Philox4x32({static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), 0u, 0u},
                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = (static_cast<uint64_t>(out[0]) << 32) | out[1];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace carpool::worker
