#include "router/tokenizer_pool.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace carpool::router {

absl::StatusOr<std::unique_ptr<TokenizerPool>> TokenizerPool::Create(int num_threads) {
  if (num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer-threads is ", num_threads, "; it must be >= 1"));
  }
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<TokenizerPool> pool(new TokenizerPool(fd));
  for (int i = 0; i < num_threads; ++i)
    pool->threads_.emplace_back([p = pool.get()] { p->ThreadLoop(); });
  return pool;
}

TokenizerPool::~TokenizerPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
  close(wake_fd_);
}

void TokenizerPool::Submit(Job job) {
  ++pending_;
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

void TokenizerPool::ThreadLoop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](TokenizerPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || !p->jobs_.empty(); },
          this));
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Completion done = std::move(job)();
    {
      absl::MutexLock lock(&mu_);
      done_.push_back(std::move(done));
    }
    const uint64_t one = 1;
    // Only EAGAIN can fail it (the counter is near overflow): the loop is awake anyway.
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

void TokenizerPool::RunCompletions() {
  uint64_t count = 0;
  (void)!read(wake_fd_, &count, sizeof(count));
  std::deque<Completion> done;
  {
    absl::MutexLock lock(&mu_);
    done.swap(done_);
  }
  for (Completion& c : done) {
    --pending_;
    std::move(c)();
  }
}

}  // namespace carpool::router
