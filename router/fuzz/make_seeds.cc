// Writes the seed corpus (router/fuzz/corpus): one encoded frame of each message kind.
//   carpool_fuzz_make_seeds DIR
#include <fstream>
#include <iostream>
#include <string>

#include "common/codec.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: carpool_fuzz_make_seeds DIR\n";
    return 2;
  }
  using namespace carpool;
  const std::string dir = argv[1];
  int n = 0;
  const auto write = [&](const std::string& name, const std::string& frame) {
    std::ofstream(dir + "/" + name, std::ios::binary) << frame;
    ++n;
  };
  GenerateInput ids;
  ids.request_id = "r1";
  ids.token_ids = {256, 72, 105};
  ids.sampling.max_tokens = 8;
  ids.sampling.temperature = 0.7f;
  ids.sampling.top_k = 40;
  ids.sampling.stop_token_ids = {10, 13};
  ids.sampling.logprobs = 2;
  ids.priority = Priority::kInteractive;
  ids.deadline_ms = 500;
  ids.api_key = "key";
  ids.stream = true;
  write("generate_ids", Encode(ClientMessage(ids)));
  GenerateInput text;
  text.request_id = "t";
  text.has_text = true;
  text.text = "Hello, \xe4\xb8\x96\xe7\x95\x8c";
  text.add_bos = true;
  write("generate_text", Encode(ClientMessage(text)));
  GenerateInput chat;
  chat.request_id = "c";
  chat.chat = ChatInput{R"([{"role":"user","content":"hi"}])",
                        R"([{"type":"function","function":{"name":"f"}}])", false,
                        R"({"enable_thinking":false})"};
  write("generate_chat", Encode(ClientMessage(chat)));
  write("cancel", Encode(ClientMessage(CancelInput{"r1"})));
  write("stats_query", Encode(ClientMessage(StatsQuery{})));
  RegisterInfo reg;
  reg.worker_id = "w";
  reg.max_num_seqs = 8;
  reg.num_kv_blocks = 64;
  reg.block_size = 16;
  write("register", Encode(WorkerMessage(reg)));
  StepTokensInfo step;
  step.epoch = 3;
  TokenEvent e;
  e.dispatch_id = 9;
  e.has_token = true;
  e.token.token = 5;
  e.token.top_logprobs = {{5, -0.1f}, {6, -2.0f}};
  e.finished = true;
  e.finish_reason = "length";
  step.events = {e};
  write("step", Encode(WorkerMessage(step)));
  write("kv_events", Encode(WorkerMessage(KvEventsInfo{3, true, {1, 2, 3}, {4}})));
  DispatchInfo d;
  d.dispatch_id = 9;
  d.prompt_tokens = {1, 2, 3};
  d.output_tokens = {4};
  d.cache_salt = 77;
  write("dispatch", Encode(RouterMessage(d)));
  ErrorInfo err{"r1", absl::StatusCode::kUnavailable, "queue_full", "full", 100};
  write("error", Encode(ServerMessage(err)));
  std::cout << "wrote " << n << " seeds to " << dir << "\n";
  return 0;
}
