// Time sources. Components take a Clock* so that tests can drive time by hand.
#ifndef CARPOOL_COMMON_CLOCK_H_
#define CARPOOL_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>

namespace carpool {

// Thread-safe. Times are microseconds on a monotonic scale with an arbitrary origin.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMicros() const = 0;

  // The process-wide monotonic clock. Never null, never deleted.
  static Clock* Real();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_micros = 0) : now_(start_micros) {}
  int64_t NowMicros() const override { return now_.load(std::memory_order_relaxed); }
  void AdvanceMicros(int64_t micros) { now_.fetch_add(micros, std::memory_order_relaxed); }
  void SetMicros(int64_t micros) { now_.store(micros, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace carpool

#endif  // CARPOOL_COMMON_CLOCK_H_
