// What a finished request cost and how long it took, as the router reports it to clients and
// metrics.
#ifndef CARPOOL_COMMON_USAGE_H_
#define CARPOOL_COMMON_USAGE_H_

namespace carpool {

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;  // prompt tokens served from a worker's prefix cache
};

// Milliseconds from the request's arrival at the router.
struct Timings {
  double queue_ms = 0;  // until it was dispatched to the worker that answered
  double ttft_ms = 0;   // until its first output token
  double total_ms = 0;  // until its final answer
};

}  // namespace carpool

#endif  // CARPOOL_COMMON_USAGE_H_
