#include "client/bench_serve_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace carpool::client::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Runs one request and times it; times are seconds from t0.
RequestOutcome RunOne(const BenchRequest& request, RequestSender* sender,
                      SteadyClock::time_point t0) {
  RequestOutcome o;
  o.prompt_len = request.prompt_len;
  const SteadyClock::time_point sent = SteadyClock::now();
  o.start = std::chrono::duration<double>(sent - t0).count();
  SteadyClock::time_point last = sent;
  int tokens = 0;
  absl::StatusOr<SendResult> r = sender->Send(request, [&](int n) {
    if (n <= 0) return;
    const SteadyClock::time_point now = SteadyClock::now();
    if (tokens == 0) {
      o.ttft = std::chrono::duration<double>(now - sent).count();
    } else {
      o.itl.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
    tokens += n;
  });
  o.latency = SecondsSince(sent);
  if (!r.ok()) {
    o.error = std::string(r.status().message());
    if (o.error.empty()) o.error = absl::StatusCodeToString(r.status().code());
    return o;
  }
  o.output_len = r->completion_tokens > 0 ? r->completion_tokens : tokens;
  if (r->prompt_tokens > 0) o.prompt_len = r->prompt_tokens;
  if (tokens == 0) {
    // Everything came with the final: the first token arrived at the end.
    o.ttft = o.latency;
  }
  o.success = true;
  return o;
}

// Draws "  37/100 [=======>            ]  12.3 s" in place while the run lasts.
class ProgressBar {
 public:
  ProgressBar(std::ostream* out, int total) : out_(out), total_(total) {
    if (out_ != nullptr) thread_ = std::thread([this] { Loop(); });
  }
  ~ProgressBar() {
    if (out_ == nullptr) return;
    stop_.Notify();
    thread_.join();
    Draw();
    *out_ << "\n" << std::flush;
  }
  void Done() { done_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void Loop() {
    while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(250))) Draw();
  }
  void Draw() {
    const int done = done_.load(std::memory_order_relaxed);
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? done * kWidth / total_ : kWidth;
    std::string bar(filled, '=');
    if (filled < kWidth) bar += '>' + std::string(kWidth - filled - 1, ' ');
    *out_ << absl::StrFormat("\r%6d/%d [%s] %7.1f s", done, total_, bar, SecondsSince(start_))
          << std::flush;
  }

  std::ostream* out_;
  const int total_;
  const SteadyClock::time_point start_ = SteadyClock::now();
  std::atomic<int> done_{0};
  absl::Notification stop_;
  std::thread thread_;
};

class ZmqSender : public RequestSender {
 public:
  ZmqSender(Client* client, const ZmqSenderOptions& options)
      : client_(client), options_(options) {}

  absl::StatusOr<SendResult> Send(const BenchRequest& request,
                                  const std::function<void(int)>& on_chunk) override {
    GenerateInput g;
    g.has_text = request.has_text;
    g.text = request.text;
    g.token_ids = request.token_ids;
    g.stream = true;
    g.sampling.max_tokens = request.output_len;
    g.sampling.temperature = options_.temperature;
    g.sampling.ignore_eos = options_.ignore_eos;
    absl::StatusOr<GenerateResult> r = client_->GenerateStream(
        std::move(g),
        [&](const GenerateChunkOut& chunk) { on_chunk(static_cast<int>(chunk.tokens.size())); },
        {.timeout_ms = options_.timeout_ms});
    if (!r.ok()) return r.status();
    return SendResult{r->usage.prompt_tokens, r->usage.completion_tokens};
  }

 private:
  Client* client_;
  const ZmqSenderOptions options_;
};

}  // namespace

absl::Status RunnerOptions::Validate() const {
  if (!(request_rate > 0)) {
    return absl::InvalidArgumentError("--request-rate must be > 0 (inf: all at once)");
  }
  if (!(burstiness > 0) || std::isinf(burstiness)) {
    return absl::InvalidArgumentError("--burstiness must be a number > 0");
  }
  if (max_concurrency < 0) return absl::InvalidArgumentError("--max-concurrency must be >= 0");
  if (num_warmups < 0) return absl::InvalidArgumentError("--num-warmups must be >= 0");
  return absl::OkStatus();
}

RunResult RunWorkload(const std::vector<BenchRequest>& requests, RequestSender* sender,
                      const RunnerOptions& options) {
  for (int i = 0; i < options.num_warmups && !requests.empty(); ++i) {
    RunOne(requests[i % requests.size()], sender, SteadyClock::now());
  }
  const int n = static_cast<int>(requests.size());
  const std::vector<double> offsets =
      ArrivalOffsets(n, options.request_rate, options.burstiness, options.seed);
  RunResult result;
  result.outcomes.resize(n);

  absl::Mutex mu;
  int inflight = 0;  // guarded by mu
  const auto has_slot = [&] {
    return options.max_concurrency <= 0 || inflight < options.max_concurrency;
  };
  std::vector<std::thread> threads;
  threads.reserve(n);
  SteadyClock::time_point last_final;  // guarded by mu
  {
    ProgressBar progress(options.progress, n);
    const SteadyClock::time_point t0 = SteadyClock::now();
    last_final = t0;
    for (int i = 0; i < n; ++i) {
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<SteadyClock::duration>(
                   std::chrono::duration<double>(offsets[i])));
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(&has_slot));
        ++inflight;
      }
      threads.emplace_back([&, i] {
        result.outcomes[i] = RunOne(requests[i], sender, t0);
        progress.Done();
        absl::MutexLock lock(&mu);
        --inflight;
        last_final = std::max(last_final, SteadyClock::now());
      });
    }
    for (std::thread& t : threads) t.join();
    result.duration_s = std::chrono::duration<double>(last_final - t0).count();
  }
  return result;
}

std::unique_ptr<RequestSender> NewZmqSender(Client* client, const ZmqSenderOptions& options) {
  return std::make_unique<ZmqSender>(client, options);
}

}  // namespace carpool::client::bench
