// Threads for the HTTP server's handlers (router/http_server.h): started on demand up to a
// bound, kept once started. TryRun refuses a job beyond the bound instead of queueing it.
//
// Thread-safe.
#ifndef CARPOOL_ROUTER_HANDLER_POOL_H_
#define CARPOOL_ROUTER_HANDLER_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace carpool::router {

class HandlerPool {
 public:
  // REQUIRES: max_threads >= 1.
  explicit HandlerPool(int max_threads) : max_(max_threads) {}
  ~HandlerPool() { Join(); }
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Runs `job` on a pool thread, then `then` once the job's slot counts as free again (so work
  // `then` starts may take the slot). False, and nothing runs, when max_threads jobs are
  // running or queued, the pool is stopping, or no thread can be started.
  bool TryRun(std::function<void()> job, std::function<void()> then = nullptr);

  // Jobs running or queued.
  int64_t busy() const;

  // Runs the jobs already queued, then ends the threads. Later TryRun calls return false.
  void Join();

 private:
  struct Job {
    std::function<void()> run;
    std::function<void()> then;
  };
  void Work();

  const int max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  std::deque<Job> jobs_;
  std::vector<std::thread> threads_;
  int busy_ = 0;
  int idle_ = 0;
  bool stopping_ = false;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_HANDLER_POOL_H_
