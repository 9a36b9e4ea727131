#include "router/handler_pool.h"

#include <iostream>
#include <system_error>

namespace carpool::router {

bool HandlerPool::TryRun(std::function<void()> job, std::function<void()> then) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || busy_ >= max_) return false;
  jobs_.push_back(Job{std::move(job), std::move(then)});
  // Every queued job needs an idle thread of its own: a notify that finds none is lost.
  if (jobs_.size() > static_cast<size_t>(idle_)) {
    try {
      threads_.emplace_back([this] { Work(); });
    } catch (const std::system_error& e) {
      jobs_.pop_back();
      std::cerr << "carpool-router: cannot start an HTTP handler thread: " << e.what() << "\n";
      return false;
    }
  } else {
    cv_.notify_one();
  }
  ++busy_;
  return true;
}

int64_t HandlerPool::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void HandlerPool::Join() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

void HandlerPool::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (jobs_.empty()) {
      if (stopping_) return;
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      --idle_;
      continue;
    }
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job.run();
    lock.lock();
    --busy_;
    if (job.then) {
      lock.unlock();
      job.then();
      lock.lock();
    }
  }
}

}  // namespace carpool::router
