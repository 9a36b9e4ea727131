// A first carpool client: one blocking generate, then one streaming generate printing chunks.
//
//   carpool-example-client [ENDPOINT] [PROMPT]
//   (defaults: tcp://127.0.0.1:5555 and "The carpool left at dawn")
#include <iostream>
#include <string>

#include "client/carpool_client.h"

int main(int argc, char** argv) {
  carpool::ClientOptions options;
  if (argc > 1) options.router_endpoint = argv[1];
  options.default_timeout_ms = 30000;
  const std::string prompt = argc > 2 ? argv[2] : "The carpool left at dawn";

  absl::StatusOr<std::unique_ptr<carpool::Client>> client = carpool::Client::Connect(options);
  if (!client.ok()) {
    std::cerr << "connect: " << client.status() << "\n";
    return 1;
  }

  carpool::GenerateInput request;
  request.has_text = true;
  request.text = prompt;
  request.sampling.max_tokens = 16;
  request.sampling.temperature = 0;

  // Blocking: one answer with every token.
  absl::StatusOr<carpool::GenerateResult> result = (*client)->Generate(request);
  if (!result.ok()) {
    std::cerr << "generate: " << result.status() << " (reason '"
              << carpool::ErrorReason(result.status()) << "')\n";
    return 1;
  }
  std::cout << "blocking: " << result->text << "\n  " << result->usage.completion_tokens
            << " tokens, finish " << result->finish_reason << ", ttft " << result->timings.ttft_ms
            << " ms, total " << result->timings.total_ms << " ms\n";

  // Streaming: chunks as the workers produce them, on this thread.
  std::cout << "streaming: ";
  absl::StatusOr<carpool::GenerateResult> streamed = (*client)->GenerateStream(
      request,
      [](const carpool::GenerateChunkOut& chunk) { std::cout << chunk.text << std::flush; });
  std::cout << "\n";
  if (!streamed.ok()) {
    std::cerr << "stream: " << streamed.status() << "\n";
    return 1;
  }
  std::cout << "  " << streamed->tokens.size() << " tokens, finish " << streamed->finish_reason
            << "\n";
  return 0;
}
