#include "client/router_generate.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/generate_command.h"

namespace carpool::client {
namespace {

// "message (RESOURCE_EXHAUSTED, reason queue_full, retry after 200 ms)".
std::string Describe(const absl::Status& status) {
  std::string text = absl::StrCat(status.message(), " (", absl::StatusCodeToString(status.code()));
  if (const std::string reason = ErrorReason(status); !reason.empty()) {
    absl::StrAppend(&text, ", reason ", reason);
  }
  if (const int64_t ms = RetryAfterMs(status); ms > 0) {
    absl::StrAppend(&text, ", retry after ", ms, " ms");
  }
  return absl::StrCat(text, ")");
}

int FailRequest(const absl::Status& status) {
  std::cerr << "carpool generate: " << Describe(status) << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

absl::StatusOr<GenerateResult> Run(Client& client, GenerateInput request,
                                   const RouterGenerateOptions& o,
                                   const std::function<void(const GenerateChunkOut&)>& on_chunk) {
  if (!o.stream) return client.Generate(std::move(request), o.call);
  return client.GenerateStream(std::move(request), on_chunk, o.call);
}

int RunOne(Client& client, const RouterGenerateOptions& o) {
  if (o.requests.empty()) return FailRequest(absl::InvalidArgumentError("no prompt"));
  if (!o.requests.front().ok()) return FailRequest(o.requests.front().status());
  const bool print_chunks = o.stream && !o.json;
  bool printed = false;
  absl::StatusOr<GenerateResult> result =
      Run(client, *o.requests.front(), o, [&](const GenerateChunkOut& chunk) {
        if (!print_chunks || chunk.text.empty()) return;
        std::cout << chunk.text << std::flush;
        printed = true;
      });
  if (printed) std::cout << "\n";
  if (!result.ok()) return FailRequest(result.status());
  if (o.json) {
    std::cout << DumpJson(ResultToJson(*result, o.top_logprobs)) << "\n";
  } else if (!printed) {
    // Not streamed, or streamed without text (a model without a tokenizer): the whole result.
    if (!result->text.empty() || result->tokens.empty()) {
      std::cout << result->text << "\n";
    } else {
      std::cout << nlohmann::json(result->TokenIds()) << "\n";
    }
  }
  return 0;
}

// Keeps o.concurrency requests in flight and prints each result as soon as every earlier one
// has been printed, so the output follows the input order.
int RunBatch(Client& client, const RouterGenerateOptions& o) {
  const size_t n = o.requests.size();
  std::vector<std::optional<absl::StatusOr<GenerateResult>>> results(n);
  absl::Mutex mu;
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      absl::StatusOr<GenerateResult> r =
          o.requests[i].ok() ? Run(client, *o.requests[i], o, nullptr)
                             : absl::StatusOr<GenerateResult>(o.requests[i].status());
      absl::MutexLock lock(&mu);
      results[i] = std::move(r);
    }
  };
  std::vector<std::thread> threads;
  const size_t num_threads = std::min<size_t>(static_cast<size_t>(o.concurrency), n);
  for (size_t t = 0; t < num_threads; ++t) threads.emplace_back(work);

  int exit_code = 0;
  for (size_t i = 0; i < n; ++i) {
    absl::StatusOr<GenerateResult> r = absl::InternalError("unset");
    {
      absl::MutexLock lock(&mu);
      const auto ready = [&] { return results[i].has_value(); };
      mu.Await(absl::Condition(&ready));
      r = std::move(*results[i]);
    }
    if (r.ok()) {
      std::cout << DumpJson(ResultToJson(*r, o.top_logprobs)) << "\n";
    } else {
      std::cout << DumpJson(ErrorToJson(r.status(), static_cast<int>(i) + 1)) << "\n";
      exit_code = 1;
    }
    std::cout.flush();
  }
  for (std::thread& t : threads) t.join();
  return exit_code;
}

}  // namespace

int RunRouterGenerate(RouterGenerateOptions o) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(o.client);
  if (!client.ok()) {
    std::cerr << "carpool generate: " << client.status().message() << "\n";
    return 2;
  }
  if (o.batch_mode) return RunBatch(**client, o);
  return RunOne(**client, o);
}

}  // namespace carpool::client
