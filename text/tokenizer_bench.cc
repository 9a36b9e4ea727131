// carpool-bench-tokenizer --tokenizer PATH --inputs-file FILE [--passes N] [--ids-out FILE]
// [--json] [--threads N]: single-thread encode and decode throughput of one tokenizer over whole
// documents (JSON lines {"text": ...}), without special tokens (encode) and keeping them (decode),
// as Hugging Face's encode(text, add_special_tokens=False) and decode(ids, skip=False). The first
// pass warms the caches and is not timed; the best of the timed passes is printed.
// --ids-out writes one line per document, {"ids": [...], "text": "<decode of those ids>"}, so a
// driver (bench/tokenizer_bench.py) can check that another implementation did the same work.
// --threads N (N > 1) then also times N threads encoding every document at once with the same
// tokenizer object (as the router's tokenizer threads share one), and prints the aggregate rate.
// --chat-messages FILE (with --tokenizer DIR, a model folder, instead of --inputs-file) times
// rendering that conversation with the folder's chat template against encoding the prompt it
// renders (text/chat_template_bench.h).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "nlohmann/json.hpp"
#include "text/chat_template_bench.h"
#include "text/tokenizer_factory.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// CPU seconds this process has used (every thread): unlike wall time, it leaves out the time
// the process waited for a core, which on a shared machine is most of the noise.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, inputs_file, ids_out, chat_messages;
  int passes = 3, threads = 1;
  bool json = false;
  carpool::FlagParser parser;
  parser.AddString("tokenizer", &tokenizer_path, "a Hugging Face folder or tokenizer.json");
  parser.AddString("inputs-file", &inputs_file, "JSON lines of {\"text\": ...} documents");
  parser.AddInt("passes", &passes, "timed passes (the best is printed)");
  parser.AddString("ids-out", &ids_out,
                   "write {\"ids\": [...], \"text\": decode} per document to this file");
  parser.AddBool("json", &json, "print the result as one JSON object");
  parser.AddInt("threads", &threads, "also time this many threads encoding at once (> 1)");
  parser.AddString("chat-messages", &chat_messages,
                   "a JSON array of chat messages: time the --tokenizer folder's chat template "
                   "on it against encoding its output");
  if (absl::Status s = parser.Parse(argc, argv, 1);
      !s.ok() || tokenizer_path.empty() || (inputs_file.empty() == chat_messages.empty()) ||
      passes < 1 || threads < 1) {
    std::cerr << "usage: carpool-bench-tokenizer --tokenizer PATH "
                 "(--inputs-file FILE | --chat-messages FILE)\n"
              << parser.Help();
    return 2;
  }
  const auto load_start = std::chrono::steady_clock::now();
  auto tokenizer = carpool::text::LoadTokenizer(tokenizer_path);
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  const double load_s = Seconds(load_start);
  if (!chat_messages.empty()) {
    return carpool::text::RunChatTemplateBench(
        **tokenizer, {.model_dir = tokenizer_path, .messages_file = chat_messages,
                      .passes = passes, .json = json});
  }
  std::vector<std::string> docs;
  size_t bytes = 0;
  std::ifstream in(inputs_file);
  if (!in) {
    std::cerr << "cannot open " << inputs_file << "\n";
    return 1;
  }
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("text") && j["text"].is_string()) {
      docs.push_back(j["text"].get<std::string>());
      bytes += docs.back().size();
    }
  }
  std::vector<std::vector<int32_t>> ids(docs.size());
  std::vector<std::string> decoded(docs.size());
  double encode_s = 1e30, decode_s = 1e30, encode_cpu_s = 1e30, decode_cpu_s = 1e30;
  size_t tokens = 0, decoded_bytes = 0;
  for (int pass = 0; pass <= passes; ++pass) {
    auto start = std::chrono::steady_clock::now();
    double cpu_start = ProcessCpuSeconds();
    tokens = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      auto r = (*tokenizer)->Encode(docs[i], false);
      if (!r.ok()) {
        std::cerr << "document " << i << ": " << r.status() << "\n";
        return 1;
      }
      ids[i] = std::move(*r);
      tokens += ids[i].size();
    }
    if (pass > 0) {
      encode_s = std::min(encode_s, Seconds(start));
      encode_cpu_s = std::min(encode_cpu_s, ProcessCpuSeconds() - cpu_start);
    }
    start = std::chrono::steady_clock::now();
    cpu_start = ProcessCpuSeconds();
    decoded_bytes = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      decoded[i] = (*tokenizer)->Decode(ids[i], false);
      decoded_bytes += decoded[i].size();
    }
    if (pass > 0) {
      decode_s = std::min(decode_s, Seconds(start));
      decode_cpu_s = std::min(decode_cpu_s, ProcessCpuSeconds() - cpu_start);
    }
    if (decoded_bytes == 0 && bytes > 0) std::cerr << "decode produced nothing\n";
  }
  // N threads at once, each encoding every document; the best of `passes` timed passes.
  double threads_s = 0;
  if (threads > 1) {
    threads_s = 1e30;
    for (int pass = 0; pass < passes; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&] {
          for (const std::string& d : docs) (void)(*tokenizer)->Encode(d, false);
        });
      }
      for (auto& t : pool) t.join();
      threads_s = std::min(threads_s, Seconds(start));
    }
  }
  if (!ids_out.empty()) {
    std::ofstream out(ids_out);
    for (size_t i = 0; i < ids.size(); ++i) {
      nlohmann::json row = {{"ids", ids[i]}, {"text", decoded[i]}};
      // Replace, not throw, if a decode is not valid UTF-8 (the driver then reports a mismatch).
      out << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
    if (!out) {
      std::cerr << "cannot write " << ids_out << "\n";
      return 1;
    }
  }
  // MB/s of decode counts the bytes it produced (the documents' bytes when decode round-trips).
  if (json) {
    nlohmann::json r = {
        {"documents", docs.size()},       {"bytes", bytes},   {"tokens", tokens},
        {"decoded_bytes", decoded_bytes}, {"load_s", load_s}, {"encode_s", encode_s},
        {"decode_s", decode_s},           {"passes", passes}, {"encode_cpu_s", encode_cpu_s},
        {"decode_cpu_s", decode_cpu_s}};
    if (threads > 1) {
      r["threads"] = threads;
      r["encode_threads_s"] = threads_s;  // wall time of `threads` threads each encoding all
    }
    std::cout << r.dump() << "\n";
    return 0;
  }
  std::cout << absl::StrFormat(
      "%d documents, %.2f MB, %d tokens; load %.2f s\n"
      "encode %.2f MB/s %.2f Mtok/s\ndecode %.2f MB/s %.2f Mtok/s\n",
      docs.size(), bytes / 1e6, tokens, load_s, bytes / 1e6 / encode_s, tokens / 1e6 / encode_s,
      decoded_bytes / 1e6 / decode_s, tokens / 1e6 / decode_s);
  if (threads > 1) {
    std::cout << absl::StrFormat("encode, %d threads at once: %.2f MB/s %.2f Mtok/s (%.2fx one)\n",
                                 threads, threads * bytes / 1e6 / threads_s,
                                 threads * tokens / 1e6 / threads_s,
                                 threads * encode_s / threads_s);
  }
  return 0;
}
