#include "worker/batching/dynamic_batcher.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace carpool::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Requests are ints; the batch function answers 10 * request.
using Batcher = DynamicBatcher<int, int>;
using Batch = Batcher::Batch;
using Ticket = Batcher::Ticket;

constexpr int64_t kStart = 1'000'000;

std::vector<int> Values(const Batch& batch) {
  std::vector<int> values;
  for (const int* request : batch.requests()) values.push_back(*request);
  return values;
}

std::vector<int> TimesTen(const Batch& batch) {
  std::vector<int> responses;
  for (const int* request : batch.requests()) responses.push_back(*request * 10);
  return responses;
}

// Pull mode on a fake clock: the test is the engine loop. Request values must be unique.
class DynamicBatcherTest : public ::testing::Test {
 protected:
  struct Outcome {
    int calls = 0;
    absl::StatusOr<int> result = absl::UnknownError("no callback yet");
  };

  static DynamicBatcherOptions Options(int max_batch_size, int64_t max_wait_micros) {
    DynamicBatcherOptions options;
    options.max_batch_size = max_batch_size;
    options.max_wait_micros = max_wait_micros;
    return options;
  }

  void Init(DynamicBatcherOptions options) {
    options.clock = &clock_;
    auto batcher = Batcher::Create(options);
    ASSERT_TRUE(batcher.ok()) << batcher.status();
    batcher_ = *std::move(batcher);
  }

  // Every accepted request's callback ran exactly once, counting those the destructor settles.
  void TearDown() override {
    batcher_.reset();
    for (const auto& [value, outcome] : outcomes_) EXPECT_EQ(outcome.calls, 1) << value;
  }

  absl::StatusOr<Ticket> TrySubmit(int value, std::optional<int64_t> timeout_micros = {}) {
    auto done = [this, value](absl::StatusOr<int> result) {
      Outcome& outcome = outcomes_[value];
      ++outcome.calls;
      outcome.result = std::move(result);
    };
    absl::StatusOr<Ticket> ticket = timeout_micros ? batcher_->Submit(value, done, *timeout_micros)
                                                   : batcher_->Submit(value, done);
    if (ticket.ok()) outcomes_.try_emplace(value);
    return ticket;
  }

  Ticket Submit(int value, std::optional<int64_t> timeout_micros = {}) {
    absl::StatusOr<Ticket> ticket = TrySubmit(value, timeout_micros);
    EXPECT_TRUE(ticket.ok()) << ticket.status();
    return ticket.value_or(0);
  }

  void SubmitRange(int first, int count) {
    for (int value = first; value < first + count; ++value) Submit(value);
  }

  std::optional<Batch> Take() { return batcher_->TryTakeBatch(clock_.NowMicros()); }

  // Takes the due batch and returns its request values; empty when none is due.
  std::vector<int> TakeValues() {
    std::optional<Batch> batch = Take();
    return batch ? Values(*batch) : std::vector<int>{};
  }

  // Completes `batch` with 10 * each request.
  void CompleteOk(std::optional<Batch>& batch) {
    std::vector<int> responses = TimesTen(*batch);
    batcher_->Complete(*std::move(batch), std::move(responses));
  }

  // Takes and completes the due batch; returns its request values.
  std::vector<int> RunOnce() {
    std::optional<Batch> batch = Take();
    if (!batch) return {};
    std::vector<int> values = Values(*batch);
    CompleteOk(batch);
    return values;
  }

  // Drives the batcher to quiescence with a batch function that fails any batch holding one of
  // `poison`; returns every batch the function saw.
  std::vector<std::vector<int>> RunWithPoison(const std::vector<int>& poison) {
    std::vector<std::vector<int>> seen;
    while (std::optional<Batch> batch = Take()) {
      seen.push_back(Values(*batch));
      const bool poisoned = std::any_of(seen.back().begin(), seen.back().end(), [&](int v) {
        return std::find(poison.begin(), poison.end(), v) != poison.end();
      });
      if (poisoned) {
        batcher_->Complete(*std::move(batch), absl::InvalidArgumentError("poison"));
      } else {
        CompleteOk(batch);
      }
    }
    return seen;
  }

  const Outcome& OutcomeOf(int value) { return outcomes_[value]; }
  absl::StatusCode CodeOf(int value) { return OutcomeOf(value).result.status().code(); }

  FakeClock clock_{kStart};
  std::unique_ptr<Batcher> batcher_;
  std::map<int, Outcome> outcomes_;
};

TEST(DynamicBatcherOptionsTest, ValidateRejectsBadValues) {
  EXPECT_TRUE(DynamicBatcherOptions().Validate().ok());
  auto invalid = [](auto mutate) {
    DynamicBatcherOptions options;
    mutate(options);
    return options.Validate().code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(invalid([](auto& o) { o.max_batch_size = 0; }));
  EXPECT_TRUE(invalid([](auto& o) { o.max_wait_micros = -1; }));
  EXPECT_TRUE(invalid([](auto& o) { o.preferred_batch_sizes = {0}; }));
  EXPECT_TRUE(invalid([](auto& o) { o.preferred_batch_sizes = {o.max_batch_size + 1}; }));
  EXPECT_TRUE(invalid([](auto& o) { o.max_concurrent_batches = 0; }));
  EXPECT_TRUE(invalid([](auto& o) { o.max_queue_size = o.max_batch_size - 1; }));
  EXPECT_TRUE(invalid([](auto& o) { o.default_timeout_micros = -1; }));
  DynamicBatcherOptions bad;
  bad.max_batch_size = 0;
  EXPECT_FALSE(Batcher::Create(bad).ok());
  EXPECT_FALSE(Batcher::Create(DynamicBatcherOptions(), Batcher::BatchFunction()).ok());
}

TEST_F(DynamicBatcherTest, BatchLeavesAsSoonAsFull) {
  Init(Options(/*max_batch_size=*/4, /*max_wait_micros=*/1000));
  EXPECT_EQ(batcher_->NextDeadline(), std::nullopt);
  SubmitRange(0, 3);
  EXPECT_THAT(TakeValues(), IsEmpty());
  EXPECT_EQ(batcher_->NextDeadline(), kStart + 1000);
  Submit(3);
  EXPECT_LE(*batcher_->NextDeadline(), clock_.NowMicros());
  EXPECT_THAT(RunOnce(), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(batcher_->NextDeadline(), std::nullopt);
  for (int value = 0; value < 4; ++value) EXPECT_EQ(*OutcomeOf(value).result, value * 10);
}

TEST_F(DynamicBatcherTest, BatchLeavesMaxWaitAfterItsFirstRequest) {
  Init(Options(/*max_batch_size=*/8, /*max_wait_micros=*/1000));
  Submit(0);
  clock_.AdvanceMicros(600);
  Submit(1);  // does not restart the wait
  EXPECT_EQ(batcher_->NextDeadline(), kStart + 1000);
  clock_.AdvanceMicros(399);
  EXPECT_THAT(TakeValues(), IsEmpty());
  clock_.AdvanceMicros(1);
  EXPECT_THAT(RunOnce(), ElementsAre(0, 1));
}

TEST_F(DynamicBatcherTest, LeftoversOfAFullBatchWaitFromTheirOwnFirstRequest) {
  Init(Options(/*max_batch_size=*/4, /*max_wait_micros=*/1000));
  SubmitRange(0, 2);
  clock_.AdvanceMicros(500);
  SubmitRange(2, 4);  // 6 queued: a full batch leaves, 4 and 5 stay
  EXPECT_THAT(RunOnce(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(TakeValues(), IsEmpty());
  EXPECT_EQ(batcher_->NextDeadline(), kStart + 1500);
  clock_.AdvanceMicros(1000);
  EXPECT_THAT(RunOnce(), ElementsAre(4, 5));
}

TEST_F(DynamicBatcherTest, PreferredSizesLeaveEarlyAtTheLargestThatFits) {
  DynamicBatcherOptions options = Options(/*max_batch_size=*/16, /*max_wait_micros=*/1000);
  options.preferred_batch_sizes = {8, 4};
  Init(options);
  SubmitRange(0, 3);
  EXPECT_THAT(TakeValues(), IsEmpty());
  Submit(3);
  EXPECT_THAT(RunOnce(), ElementsAre(0, 1, 2, 3));
  SubmitRange(10, 7);  // 7 queued: 4 fits, 8 does not
  EXPECT_THAT(RunOnce(), ElementsAre(10, 11, 12, 13));
  EXPECT_THAT(TakeValues(), IsEmpty());
  SubmitRange(20, 7);  // 10 queued: 8
  EXPECT_THAT(RunOnce(), ElementsAre(14, 15, 16, 20, 21, 22, 23, 24));
  EXPECT_THAT(TakeValues(), IsEmpty());  // 2 left, below every preferred size
  clock_.AdvanceMicros(1000);
  EXPECT_THAT(RunOnce(), ElementsAre(25, 26));
}

TEST_F(DynamicBatcherTest, NoMoreThanMaxConcurrentBatchesInFlight) {
  DynamicBatcherOptions options = Options(/*max_batch_size=*/2, /*max_wait_micros=*/0);
  options.max_concurrent_batches = 2;
  Init(options);
  SubmitRange(0, 7);
  std::optional<Batch> first = Take();
  std::optional<Batch> second = Take();
  ASSERT_TRUE(first && second);
  EXPECT_FALSE(Take().has_value());
  EXPECT_EQ(batcher_->NextDeadline(), std::nullopt);  // only a Complete can help
  EXPECT_EQ(batcher_->Stats().batches_in_flight, 2);
  CompleteOk(first);
  std::optional<Batch> third = Take();
  ASSERT_TRUE(third);
  EXPECT_THAT(Values(*third), ElementsAre(4, 5));
  EXPECT_FALSE(Take().has_value());
  CompleteOk(second);
  CompleteOk(third);
  EXPECT_THAT(RunOnce(), ElementsAre(6));
  EXPECT_EQ(batcher_->Stats().batches_in_flight, 0);
}

TEST_F(DynamicBatcherTest, FullQueueRefusesAtOnceWithoutCallingBack) {
  DynamicBatcherOptions options = Options(/*max_batch_size=*/4, /*max_wait_micros=*/1000);
  options.max_queue_size = 4;
  Init(options);
  SubmitRange(0, 4);
  EXPECT_EQ(TrySubmit(4).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(outcomes_.count(4), 0u);
  std::optional<Batch> batch = Take();  // in flight: no longer counts against the queue
  ASSERT_TRUE(batch);
  EXPECT_TRUE(TrySubmit(5).ok());
  CompleteOk(batch);
  EXPECT_EQ(batcher_->Stats().refused, 1);
}

TEST_F(DynamicBatcherTest, ExpiredRequestsNeverReachTheBatchFunction) {
  DynamicBatcherOptions options = Options(/*max_batch_size=*/8, /*max_wait_micros=*/1000);
  options.default_timeout_micros = 300;
  Init(options);
  Submit(0, /*timeout_micros=*/500);
  Submit(1, /*timeout_micros=*/0);  // no limit
  Submit(2);                        // the default, 300
  Submit(3, /*timeout_micros=*/2000);
  EXPECT_EQ(batcher_->NextDeadline(), kStart + 300);
  clock_.AdvanceMicros(300);
  EXPECT_THAT(TakeValues(), IsEmpty());
  EXPECT_EQ(CodeOf(2), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(OutcomeOf(0).calls, 0);
  EXPECT_EQ(batcher_->NextDeadline(), kStart + 500);
  clock_.AdvanceMicros(200);
  EXPECT_THAT(TakeValues(), IsEmpty());
  EXPECT_EQ(CodeOf(0), absl::StatusCode::kDeadlineExceeded);
  clock_.AdvanceMicros(500);
  EXPECT_THAT(RunOnce(), ElementsAre(1, 3));
  EXPECT_EQ(*OutcomeOf(3).result, 30);
  EXPECT_EQ(batcher_->Stats().timed_out, 2);
  EXPECT_EQ(TrySubmit(9, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DynamicBatcherTest, ExpiryRunsEvenWhenEverySlotIsBusy) {
  Init(Options(/*max_batch_size=*/1, /*max_wait_micros=*/0));
  Submit(0);
  std::optional<Batch> running = Take();
  ASSERT_TRUE(running);
  Submit(1, /*timeout_micros=*/100);
  EXPECT_EQ(batcher_->NextDeadline(), kStart + 100);
  clock_.AdvanceMicros(100);
  EXPECT_FALSE(Take().has_value());
  EXPECT_EQ(CodeOf(1), absl::StatusCode::kDeadlineExceeded);
  CompleteOk(running);
}

TEST_F(DynamicBatcherTest, CancelBeforeBatchingRemovesTheRequest) {
  Init(Options(/*max_batch_size=*/4, /*max_wait_micros=*/1000));
  SubmitRange(0, 2);
  const Ticket ticket = Submit(2);
  EXPECT_TRUE(batcher_->Cancel(ticket));
  EXPECT_EQ(CodeOf(2), absl::StatusCode::kCancelled);
  EXPECT_FALSE(batcher_->Cancel(ticket));
  Submit(3);  // 4 were submitted but only 3 are queued: not full
  EXPECT_THAT(TakeValues(), IsEmpty());
  clock_.AdvanceMicros(1000);
  EXPECT_THAT(RunOnce(), ElementsAre(0, 1, 3));
}

TEST_F(DynamicBatcherTest, CancelWhileRunningDiscardsTheResult) {
  Init(Options(/*max_batch_size=*/3, /*max_wait_micros=*/1000));
  Submit(0);
  const Ticket ticket = Submit(1);
  Submit(2);
  std::optional<Batch> batch = Take();
  ASSERT_TRUE(batch);
  EXPECT_TRUE(batcher_->Cancel(ticket));
  EXPECT_EQ(CodeOf(1), absl::StatusCode::kCancelled);  // at once, not at Complete
  EXPECT_FALSE(batcher_->Cancel(ticket));
  EXPECT_EQ(*batch->requests()[1], 1);  // the running batch still reads it
  CompleteOk(batch);
  EXPECT_EQ(CodeOf(1), absl::StatusCode::kCancelled);
  EXPECT_EQ(*OutcomeOf(0).result, 0);
  EXPECT_EQ(*OutcomeOf(2).result, 20);
  EXPECT_FALSE(batcher_->Cancel(ticket));
}

TEST_F(DynamicBatcherTest, CancelAfterCompletionIsANoOp) {
  Init(Options(/*max_batch_size=*/1, /*max_wait_micros=*/0));
  const Ticket ticket = Submit(0);
  EXPECT_THAT(RunOnce(), ElementsAre(0));
  EXPECT_FALSE(batcher_->Cancel(ticket));
  EXPECT_FALSE(batcher_->Cancel(ticket + 100));  // never issued
  EXPECT_EQ(*OutcomeOf(0).result, 0);
  EXPECT_EQ(batcher_->Stats().cancelled, 0);
}

TEST_F(DynamicBatcherTest, OnePoisonAmongSixteenFailsAlone) {
  Init(Options(/*max_batch_size=*/16, /*max_wait_micros=*/1000));
  SubmitRange(0, 16);
  std::vector<std::vector<int>> seen = RunWithPoison({11});
  // 16 -> 8 -> 4 -> 2 -> 1: four splits, each retrying both halves.
  EXPECT_EQ(seen.size(), 9u);
  EXPECT_THAT(seen.back(), ElementsAre(11));
  for (int value = 0; value < 16; ++value) {
    if (value == 11) {
      EXPECT_EQ(CodeOf(value), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(OutcomeOf(value).result.status().message(), "poison");
    } else {
      EXPECT_EQ(*OutcomeOf(value).result, value * 10) << value;
    }
  }
  const DynamicBatcherStats stats = batcher_->Stats();
  EXPECT_EQ(stats.answered, 15);
  EXPECT_EQ(stats.failed, 1);
  EXPECT_EQ(stats.batch_splits, 4);
  EXPECT_EQ(stats.batches, 9);
  EXPECT_EQ(stats.queue_wait_count, 16);  // retries are not a second queue wait
}

TEST_F(DynamicBatcherTest, TwoPoisonsAndACancelDuringTheSplit) {
  Init(Options(/*max_batch_size=*/8, /*max_wait_micros=*/1000));
  std::vector<Ticket> tickets;
  for (int value = 0; value < 8; ++value) tickets.push_back(Submit(value));
  std::optional<Batch> batch = Take();
  ASSERT_TRUE(batch);
  EXPECT_TRUE(batcher_->Cancel(tickets[0]));  // while running
  batcher_->Complete(*std::move(batch), absl::InternalError("poison"));
  EXPECT_TRUE(batcher_->Cancel(tickets[7]));  // while waiting for its retry
  std::vector<std::vector<int>> seen = RunWithPoison({2, 5});
  for (const std::vector<int>& values : seen) {
    EXPECT_THAT(values, ::testing::Not(::testing::Contains(0)));
    EXPECT_THAT(values, ::testing::Not(::testing::Contains(7)));
  }
  EXPECT_EQ(CodeOf(0), absl::StatusCode::kCancelled);
  EXPECT_EQ(CodeOf(7), absl::StatusCode::kCancelled);
  EXPECT_EQ(CodeOf(2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(5), absl::StatusCode::kInvalidArgument);
  for (int value : {1, 3, 4, 6}) EXPECT_EQ(*OutcomeOf(value).result, value * 10);
}

TEST_F(DynamicBatcherTest, WrongResponseCountFailsTheBatchWithoutRetrying) {
  Init(Options(/*max_batch_size=*/2, /*max_wait_micros=*/0));
  SubmitRange(0, 2);
  std::optional<Batch> batch = Take();
  ASSERT_TRUE(batch);
  batcher_->Complete(*std::move(batch), std::vector<int>{1});
  EXPECT_FALSE(Take().has_value());
  EXPECT_EQ(CodeOf(0), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeOf(1), absl::StatusCode::kInternal);
  EXPECT_EQ(batcher_->Stats().batch_splits, 0);
}

TEST_F(DynamicBatcherTest, DestructionAnswersEveryPendingRequest) {
  Init(Options(/*max_batch_size=*/2, /*max_wait_micros=*/0));
  SubmitRange(0, 3);
  std::optional<Batch> running = Take();  // never completed
  ASSERT_TRUE(running);
  batcher_.reset();
  for (int value = 0; value < 3; ++value) {
    EXPECT_EQ(CodeOf(value), absl::StatusCode::kUnavailable);
  }
}

TEST_F(DynamicBatcherTest, StatsCountEveryEvent) {
  DynamicBatcherOptions options = Options(/*max_batch_size=*/4, /*max_wait_micros=*/1000);
  options.max_queue_size = 5;
  Init(options);
  SubmitRange(0, 4);                                // t=0
  EXPECT_THAT(RunOnce(), ElementsAre(0, 1, 2, 3));  // size 4, waits 0
  Submit(4);                                        // t=0
  clock_.AdvanceMicros(400);
  Submit(5, /*timeout_micros=*/100);  // t=400, expires at 500
  const Ticket cancelled = Submit(6);
  SubmitRange(7, 2);
  EXPECT_FALSE(TrySubmit(9).ok());  // 5 queued
  EXPECT_TRUE(batcher_->Cancel(cancelled));
  DynamicBatcherStats stats = batcher_->Stats();
  EXPECT_EQ(stats.queued, 4);
  clock_.AdvanceMicros(600);                     // t=1000
  EXPECT_THAT(RunOnce(), ElementsAre(4, 7, 8));  // size 3, waits 1000, 600, 600
  stats = batcher_->Stats();
  EXPECT_EQ(stats.submitted, 9);
  EXPECT_EQ(stats.refused, 1);
  EXPECT_EQ(stats.timed_out, 1);
  EXPECT_EQ(stats.cancelled, 1);
  EXPECT_EQ(stats.answered, 7);
  EXPECT_EQ(stats.failed, 0);
  EXPECT_EQ(stats.batches, 2);
  EXPECT_THAT(stats.batch_size_counts, ElementsAre(0, 0, 0, 1, 1));
  EXPECT_DOUBLE_EQ(stats.MeanFillRatio(), (1.0 + 0.75) / 2);
  EXPECT_EQ(stats.queue_wait_count, 7);
  EXPECT_EQ(stats.queue_wait_sum_micros, 2200);
  EXPECT_EQ(stats.queue_wait_max_micros, 1000);
  EXPECT_DOUBLE_EQ(stats.MeanQueueWaitMicros(), 2200.0 / 7);
  EXPECT_EQ(stats.queued, 0);
  EXPECT_EQ(stats.batches_in_flight, 0);
}

// Real threads and the real clock: 8 submitting threads, 3 workers, and poisoned requests that
// force splits. Every request is answered exactly once, correctly.
TEST(DynamicBatcherThreadedTest, EveryRequestFromEightThreadsIsAnsweredOnce) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 250;
  constexpr int kTotal = kThreads * kPerThread;
  auto is_poison = [](int value) { return value % 101 == 7; };

  std::atomic<int> running{0};
  std::atomic<int> max_running{0};
  Batcher::BatchFunction fn =
      [&](absl::Span<const int* const> requests) -> absl::StatusOr<std::vector<int>> {
    const int now_running = running.fetch_add(1) + 1;
    int seen = max_running.load();
    while (now_running > seen && !max_running.compare_exchange_weak(seen, now_running)) {
    }
    std::vector<int> responses;
    bool poisoned = false;
    for (const int* request : requests) {
      poisoned |= is_poison(*request);
      responses.push_back(*request * 10);
    }
    running.fetch_sub(1);
    if (poisoned) return absl::InvalidArgumentError("poison");
    return responses;
  };

  DynamicBatcherOptions options;
  options.max_batch_size = 16;
  options.max_wait_micros = 200;
  options.preferred_batch_sizes = {8};
  options.max_concurrent_batches = 3;
  options.max_queue_size = kTotal;
  auto created = Batcher::Create(options, fn);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Batcher> batcher = *std::move(created);

  absl::Mutex mu;
  std::vector<int> calls(kTotal, 0);
  std::vector<absl::StatusOr<int>> results(kTotal, absl::UnknownError("unset"));
  int answered = 0;
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int value = t * kPerThread + i;
        auto ticket = batcher->Submit(value, [&, value](absl::StatusOr<int> result) {
          absl::MutexLock lock(&mu);
          ++calls[value];
          results[value] = std::move(result);
          ++answered;
        });
        EXPECT_TRUE(ticket.ok()) << ticket.status();
      }
    });
  }
  for (std::thread& submitter : submitters) submitter.join();
  {
    absl::MutexLock lock(&mu);
    const absl::Condition all_answered(
        +[](int* n) { return *n >= kTotal; }, &answered);
    ASSERT_TRUE(mu.AwaitWithTimeout(all_answered, absl::Seconds(60)))
        << answered << " of " << kTotal << " answered";
  }
  batcher.reset();  // joins the workers; nothing is left to settle

  absl::MutexLock lock(&mu);
  EXPECT_EQ(answered, kTotal);
  for (int value = 0; value < kTotal; ++value) {
    ASSERT_EQ(calls[value], 1) << value;
    if (is_poison(value)) {
      EXPECT_EQ(results[value].status().code(), absl::StatusCode::kInvalidArgument) << value;
    } else {
      ASSERT_TRUE(results[value].ok()) << value << ": " << results[value].status();
      EXPECT_EQ(*results[value], value * 10);
    }
  }
  EXPECT_LE(max_running.load(), 3);
}

}  // namespace
}  // namespace carpool::worker
