// Counter-based random numbers for the sampler.
//
// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11) maps a
// 128-bit counter and a 64-bit key to 128 random bits with no state, so a draw depends only on
// its inputs and a sequence can be resumed anywhere without replaying earlier draws.
//
// Thread safety: pure functions, safe from any thread.
#ifndef CARPOOL_WORKER_SAMPLER_PHILOX_H_
#define CARPOOL_WORKER_SAMPLER_PHILOX_H_

#include <array>
#include <cstdint>

namespace carpool::worker {

// One Philox4x32-10 block. Bit-exact with Random123's philox4x32 (R = 10).
std::array<uint32_t, 4> Philox4x32(const std::array<uint32_t, 4>& counter,
                                   const std::array<uint32_t, 2>& key);

// Uniform double in [0, 1) that depends only on (seed, position): one Philox4x32-10 block with
// key = {low 32 bits of seed, high 32 bits of seed} and counter = {low 32 bits of position,
// high 32 bits of position, 0, 0}; the top 53 bits of (out[0] << 32 | out[1]) become the double.
double CounterUniform(uint64_t seed, uint64_t position);

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_SAMPLER_PHILOX_H_
