// The router's tokenizer threads: tokenization (Encode of text prompts, Tokenize / Detokenize
// requests) and tokenizer loading (text::HfTokenizer::FromJson) run here, never on the event
// loop, so a 100,000-token prompt or a 10 MB tokenizer.json delays nobody else's admission.
//
// A job runs on a pool thread and returns its completion; the completion runs on the loop, when
// the loop calls RunCompletions after wake_fd() polled readable (an eventfd: Poll takes it as a
// PollItem fd). Completions run in the order their jobs finished.
//
// Thread safety: Submit and RunCompletions are for the loop's thread; jobs run on the pool's
// threads and must touch nothing of the loop's (copy or share what they read: a
// shared_ptr<const Tokenizer>, the text moved in). The destructor waits for the jobs running,
// drops those not started and the completions not run.
#ifndef CARPOOL_ROUTER_TOKENIZER_POOL_H_
#define CARPOOL_ROUTER_TOKENIZER_POOL_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace carpool::router {

class TokenizerPool {
 public:
  using Completion = absl::AnyInvocable<void() &&>;
  using Job = absl::AnyInvocable<Completion() &&>;

  // `num_threads` >= 1.
  static absl::StatusOr<std::unique_ptr<TokenizerPool>> Create(int num_threads);
  ~TokenizerPool();
  TokenizerPool(const TokenizerPool&) = delete;
  TokenizerPool& operator=(const TokenizerPool&) = delete;

  // Queues `job`; jobs start in the order submitted.
  void Submit(Job job);
  // Readable while completions wait to run.
  int wake_fd() const { return wake_fd_; }
  // Runs the completions ready now (and clears the wake). Call from the loop.
  void RunCompletions();
  // Jobs submitted whose completion has not run yet.
  int pending() const { return pending_; }

 private:
  explicit TokenizerPool(int wake_fd) : wake_fd_(wake_fd) {}
  void ThreadLoop();

  const int wake_fd_;
  int pending_ = 0;  // the loop's
  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<Completion> done_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_TOKENIZER_POOL_H_
