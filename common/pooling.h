// How an embedding request turns a sequence's final hidden states into one vector.
#ifndef CARPOOL_COMMON_POOLING_H_
#define CARPOOL_COMMON_POOLING_H_

namespace carpool {

// kMean: the mean over every position; kLast: the last position's state.
enum class Pooling { kMean = 0, kLast = 1 };

}  // namespace carpool

#endif  // CARPOOL_COMMON_POOLING_H_
