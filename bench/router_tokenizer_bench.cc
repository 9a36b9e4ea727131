// carpool-bench-router-tokenizer: what tokenizing text costs the router (issue 13). In one run on
// loopback TCP: client (this process) -> carpool-router -> a scripted worker (a thread of this
// process that registers with a Hugging Face tokenizer handed over, as a folder model does, and
// answers every dispatch with one token at once, so the worker costs next to nothing) -> router
// -> client. For each --threads value a fresh router is started with --tokenizer-threads N and
// measured for:
//   throughput: requests/s of --prompt-tokens text prompts (max_tokens 1, --window in flight);
//   latency:    p50 / p99 of --latency-tokens text prompts (64 distinct ones in turn) against the
//               same prompts sent as their token ids, one request in flight, the two interleaved;
//               the p50 difference is what tokenizing adds.
// Prompts are cut from the text of --text-dir's *.md files: windows of exactly N tokens of the
// tokenizer whose decode encodes back to the same ids, so the router does the same work for
// every request. Each reply is checked (no error, usage.prompt_tokens as expected).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/codec.h"
#include "common/flags.h"
#include "common/transport.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "text/tokenizer_factory.h"

namespace carpool::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Micros = std::chrono::duration<double, std::micro>;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<Socket> Dealer(zmq::context_t* ctx, const std::string& endpoint,
                               const std::string& id) {
  SocketOptions so;
  so.routing_id = id;
  so.max_message_bytes = 64 << 20;
  auto s = Socket::Create(ctx, zmq::socket_type::dealer, so);
  if (!s.ok() || !(*s)->Connect(endpoint).ok()) return nullptr;
  return std::move(*s);
}

// The scripted worker: registers `r`, then answers every dispatch with one finished token and
// heartbeats every 500 ms, until `stop`.
void RunWorker(zmq::context_t* ctx, std::string backend, RegisterInfo r, std::atomic<bool>* stop,
               std::atomic<bool>* registered) {
  auto s = Dealer(ctx, backend, r.worker_id);
  if (s == nullptr || !s->Send({Encode(WorkerMessage(r))}).ok()) return;
  uint64_t epoch = 0;
  auto last_beat = Clock::now();
  while (!stop->load()) {
    auto frames = s->Recv(100);
    if (epoch != 0 && Clock::now() - last_beat > std::chrono::milliseconds(500)) {
      (void)s->Send({Encode(WorkerMessage(HeartbeatInfo{epoch, WorkerLoad{}}))});
      last_beat = Clock::now();
    }
    if (!frames.ok() || !frames->has_value() || (*frames)->empty()) continue;
    auto m = DecodeRouterMessage((**frames)[0]);
    if (!m.ok()) continue;
    if (auto* ack = std::get_if<RegisterAckInfo>(&*m)) {
      epoch = ack->epoch;
      registered->store(true);
    } else if (auto* d = std::get_if<DispatchInfo>(&*m)) {
      TokenEvent e;
      e.dispatch_id = d->dispatch_id;
      e.has_token = true;
      e.token.token = d->prompt_tokens.empty() ? 0 : d->prompt_tokens.back();
      e.finished = true;
      e.finish_reason = "length";
      StepTokensInfo step;
      step.epoch = epoch;
      step.events.push_back(e);
      (void)s->Send({Encode(WorkerMessage(step))});
    }
  }
}

GenerateInput TextRequest(const std::string& id, const std::string& text) {
  GenerateInput g;
  g.request_id = id;
  g.has_text = true;
  g.text = text;
  g.add_bos = false;  // the router's ids are then exactly the prompt's ids
  g.sampling.max_tokens = 1;
  g.sampling.temperature = 0;
  return g;
}

GenerateInput IdsRequest(const std::string& id, const std::vector<int32_t>& ids) {
  GenerateInput g;
  g.request_id = id;
  g.token_ids = ids;
  g.sampling.max_tokens = 1;
  g.sampling.temperature = 0;
  return g;
}

// Waits for one reply; returns its prompt token count, or -1 (and says why) on an error.
int RecvFinal(Socket* client, int timeout_ms = 10000) {
  auto frames = client->Recv(timeout_ms);
  if (!frames.ok() || !frames->has_value() || (*frames)->empty()) {
    std::cerr << "no reply within " << timeout_ms << " ms\n";
    return -1;
  }
  auto m = DecodeServerMessage((**frames)[0]);
  if (!m.ok()) {
    std::cerr << "undecodable reply: " << m.status() << "\n";
    return -1;
  }
  if (auto* f = std::get_if<GenerateFinalOut>(&*m)) return f->usage.prompt_tokens;
  if (auto* e = std::get_if<ErrorInfo>(&*m)) {
    std::cerr << "error reply for " << e->request_id << ": " << e->reason << " " << e->message
              << "\n";
  } else {
    std::cerr << "unexpected reply (message index " << m->index() << ")\n";
  }
  return -1;
}

// CPU seconds (user + system) a process has used so far, from /proc/PID/stat; "self" for this one.
double CpuSeconds(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);  // utime, stime
  }
  return ticks / sysconf(_SC_CLK_TCK);
}

struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
};

// Windows of exactly n tokens of `ids` whose decode encodes back to the same ids.
std::vector<Prompt> CutPrompts(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t n,
                               size_t most) {
  std::vector<Prompt> out;
  for (size_t at = 0; at + n <= ids.size() && out.size() < most; at += n) {
    std::vector<int32_t> window(ids.begin() + at, ids.begin() + at + n);
    std::string text = tok.Decode(window, false);
    auto again = tok.Encode(text, false);
    if (again.ok() && *again == window) out.push_back({std::move(text), std::move(window)});
  }
  return out;
}

struct Result {
  int threads = 0;
  double rps = 0;
  double router_cores = 0, bench_cores = 0;  // CPU seconds per second of the throughput run
  int throughput_requests = 0;
  double text_p50_us = 0, text_p99_us = 0, ids_p50_us = 0, ids_p99_us = 0;
};

}  // namespace
}  // namespace carpool::bench

int main(int argc, char** argv) {
  using namespace carpool;
  using namespace carpool::bench;
  std::string tokenizer_path, bin_dir, text_dir = "docs", threads_list = "1,2";
  int prompt_tokens = 1000, latency_tokens = 100, window = 32, requests = 20000,
      latency_requests = 2000;
  double seconds = 20;
  bool json = false;
  FlagParser flags;
  flags.AddString("tokenizer", &tokenizer_path,
                  "a Hugging Face folder (tokenizer.json, tokenizer_config.json)");
  flags.AddString("bin-dir", &bin_dir, "where carpool-router is; none: this binary's folder");
  flags.AddString("text-dir", &text_dir, "prompts are cut from the *.md files here");
  flags.AddString("threads", &threads_list, "comma-separated --tokenizer-threads values");
  flags.AddInt("prompt-tokens", &prompt_tokens, "tokens per prompt of the throughput run");
  flags.AddInt("latency-tokens", &latency_tokens, "tokens of the latency run's prompt");
  flags.AddInt("window", &window, "requests in flight for the throughput run");
  flags.AddInt("requests", &requests, "most requests of one throughput run");
  flags.AddDouble("seconds", &seconds, "most seconds of one throughput run");
  flags.AddInt("latency-requests", &latency_requests, "round trips of each kind (text, ids)");
  flags.AddBool("json", &json, "also print JSON");
  if (auto s = flags.Parse(argc, argv, 1); !s.ok() || tokenizer_path.empty()) {
    std::cerr << (s.ok() ? "--tokenizer is required" : s.message()) << "\n" << flags.Help();
    return 2;
  }
  if (bin_dir.empty()) {
    std::string self = argv[0];
    bin_dir = self.substr(0, self.find_last_of('/'));
  }
  const std::filesystem::path folder(tokenizer_path);
  auto tok = text::LoadTokenizer(tokenizer_path);
  if (!tok.ok()) {
    std::cerr << tok.status() << "\n";
    return 1;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(text_dir)) {
    if (e.path().extension() == ".md") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& f : files) all += ReadFile(f) + "\n\n";
  auto all_ids = (*tok)->Encode(all, false);
  if (!all_ids.ok()) {
    std::cerr << all_ids.status() << "\n";
    return 1;
  }
  const std::vector<Prompt> prompts = CutPrompts(**tok, *all_ids, prompt_tokens, 256);
  const std::vector<Prompt> short_prompts = CutPrompts(**tok, *all_ids, latency_tokens, 64);
  if (prompts.empty() || short_prompts.empty()) {
    std::cerr << "no prompt of " << prompt_tokens << " / " << latency_tokens << " tokens in "
              << text_dir << "'s " << files.size() << " .md files (" << all_ids->size()
              << " tokens)\n";
    return 1;
  }
  size_t prompt_bytes = 0;
  for (const auto& p : prompts) prompt_bytes += p.text.size();
  size_t short_bytes = 0;
  for (const auto& p : short_prompts) short_bytes += p.text.size();
  std::printf(
      "%zu distinct prompts of %d tokens (%.0f bytes on average) and %zu of %d tokens "
      "(%.0f bytes) from %zu files in %s\n",
      prompts.size(), prompt_tokens, double(prompt_bytes) / prompts.size(), short_prompts.size(),
      latency_tokens, double(short_bytes) / short_prompts.size(), files.size(), text_dir.c_str());

  RegisterInfo reg;
  reg.worker_id = "bench-worker";
  reg.model = folder.filename() == "models" ? folder.parent_path().filename().string()
                                            : folder.filename().string();
  reg.max_num_seqs = 4096;
  reg.num_kv_blocks = 4'000'000;
  reg.block_size = 16;
  reg.max_model_len = 32768;
  reg.vocab_size = 200'000;
  reg.tokenizer = TokenizerKind::kHuggingFace;
  reg.tokenizer_json = ReadFile(folder / "tokenizer.json");
  if (std::filesystem::exists(folder / "tokenizer_config.json")) {
    reg.tokenizer_config_json = ReadFile(folder / "tokenizer_config.json");
  }
  if (reg.tokenizer_json.empty()) {
    std::cerr << "no tokenizer.json in " << tokenizer_path << "\n";
    return 1;
  }

  std::vector<Result> results;
  for (const std::string& t : std::vector<std::string>(absl::StrSplit(threads_list, ','))) {
    Result res;
    res.threads = std::stoi(t);
    // One log per run: the router's endpoints are read from it.
    const std::string log = absl::StrCat("/tmp/carpool_bench_router_tok_", getpid(), "_",
                                         results.size(), "_", t, ".log");
    std::filesystem::remove(log);
    testing::Subprocess router(
        {bin_dir + "/carpool-router", "--frontend", "tcp://127.0.0.1:*", "--backend",
         "tcp://127.0.0.1:*", "--tokenizer-threads", t, "--heartbeat-timeout-ms", "10000",
         "--max-queued-requests", "100000", "--max-queued-tokens", "1000000000",
         "--max-inflight-tokens", "1000000000"},
        log);
    testing::RouterEndpoints ep;
    if (!testing::WaitForRouterEndpoints(router, &ep)) {
      std::cerr << "router did not start\n" << router.Log();
      return 1;
    }
    zmq::context_t ctx(1);
    std::atomic<bool> stop{false}, registered{false};
    std::thread worker(RunWorker, &ctx, ep.backend, reg, &stop, &registered);
    auto finish = [&](int rc) {
      stop.store(true);
      worker.join();
      return rc;
    };
    auto client = Dealer(&ctx, ep.frontend, "bench-client");
    const auto start_wait = Clock::now();
    while (!registered.load() && Clock::now() - start_wait < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // Warm-up: the tokenizer is built from the handover on the pool; wait for the first answer.
    if (!registered.load() || !client->Send({Encode(ClientMessage(TextRequest("w", "hi")))}).ok() ||
        RecvFinal(client.get(), 30000) < 0) {
      std::cerr << "router with --tokenizer-threads " << t << " did not serve text\n"
                << router.Log();
      return finish(1);
    }
    for (int i = 0; i < 200; ++i) {
      const Prompt& p = prompts[i % prompts.size()];
      if (!client->Send({Encode(ClientMessage(TextRequest(absl::StrCat("w", i), p.text)))}).ok() ||
          RecvFinal(client.get()) != prompt_tokens) {
        std::cerr << "warm-up request " << i << " failed or had the wrong token count\n";
        return finish(1);
      }
    }

    // Throughput: `window` text requests in flight.
    const std::string router_pid = std::to_string(router.pid());
    const double router_cpu0 = CpuSeconds(router_pid), bench_cpu0 = CpuSeconds("self");
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::duration<double>(seconds);
    int sent = 0, done = 0;
    bool stop_sending = false;
    while (done < sent || !stop_sending) {
      while (!stop_sending && sent - done < window) {
        const Prompt& p = prompts[sent % prompts.size()];
        if (!client->Send({Encode(ClientMessage(TextRequest(absl::StrCat("t", sent), p.text)))})
                 .ok()) {
          return finish(1);
        }
        ++sent;
        if (sent >= requests || Clock::now() > deadline) stop_sending = true;
      }
      const int got = RecvFinal(client.get());
      if (got != prompt_tokens) {
        std::cerr << "throughput reply " << done << ": prompt_tokens " << got << ", expected "
                  << prompt_tokens << "\n";
        return finish(1);
      }
      ++done;
      if (Clock::now() > deadline) stop_sending = true;
    }
    res.throughput_requests = done;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    res.rps = done / wall;
    res.router_cores = (CpuSeconds(router_pid) - router_cpu0) / wall;
    res.bench_cores = (CpuSeconds("self") - bench_cpu0) / wall;

    // Latency: the short prompt as text and as ids, one in flight, interleaved.
    std::vector<double> text_us, ids_us;
    for (int i = 0; i < latency_requests; ++i) {
      const Prompt& sp = short_prompts[i % short_prompts.size()];
      for (int kind = 0; kind < 2; ++kind) {
        const std::string id = absl::StrCat(kind == 0 ? "lt" : "li", i);
        const auto s0 = Clock::now();
        GenerateInput g = kind == 0 ? TextRequest(id, sp.text) : IdsRequest(id, sp.ids);
        if (!client->Send({Encode(ClientMessage(g))}).ok()) return finish(1);
        const int got = RecvFinal(client.get());
        if (got != latency_tokens) {
          std::cerr << "latency reply: prompt_tokens " << got << ", expected " << latency_tokens
                    << "\n";
          return finish(1);
        }
        (kind == 0 ? text_us : ids_us).push_back(Micros(Clock::now() - s0).count());
      }
    }
    res.text_p50_us = Percentile(text_us, 0.5);
    res.text_p99_us = Percentile(text_us, 0.99);
    res.ids_p50_us = Percentile(ids_us, 0.5);
    res.ids_p99_us = Percentile(ids_us, 0.99);
    finish(0);
    results.push_back(res);
  }

  std::printf(
      "model %s, %d-token text prompts (throughput, %d in flight), %d-token prompt "
      "(latency, one in flight, text vs ids), max_tokens 1\n",
      reg.model.c_str(), prompt_tokens, window, latency_tokens);
  std::printf("%-18s %9s %9s %8s %8s %12s %12s %12s %12s %12s\n", "tokenizer-threads", "requests",
              "req/s", "router", "client", "text p50 us", "ids p50 us", "added p50", "text p99 us",
              "ids p99 us");
  std::printf("%-18s %9s %9s %8s %8s\n", "", "", "", "cores", "cores");
  for (const Result& r : results) {
    std::printf("%-18d %9d %9.0f %8.2f %8.2f %12.1f %12.1f %12.1f %12.1f %12.1f\n", r.threads,
                r.throughput_requests, r.rps, r.router_cores, r.bench_cores, r.text_p50_us,
                r.ids_p50_us, r.text_p50_us - r.ids_p50_us, r.text_p99_us, r.ids_p99_us);
  }
  std::printf(
      "(router / client cores: CPU seconds per second of the throughput run used by "
      "carpool-router and by this process, client and scripted worker)\n");
  // A thread count given more than once (--threads 1,2,1,2): its best run counts.
  std::map<int, double> best_rps;
  for (const Result& r : results) best_rps[r.threads] = std::max(best_rps[r.threads], r.rps);
  if (best_rps.size() >= 2 && best_rps.begin()->second > 0) {
    std::printf("best req/s with %d threads / with %d: %.2fx\n", best_rps.rbegin()->first,
                best_rps.begin()->first, best_rps.rbegin()->second / best_rps.begin()->second);
  }
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Result& r : results) {
      j.push_back({{"tokenizer_threads", r.threads},
                   {"requests", r.throughput_requests},
                   {"rps", r.rps},
                   {"router_cores", r.router_cores},
                   {"bench_cores", r.bench_cores},
                   {"text_p50_us", r.text_p50_us},
                   {"ids_p50_us", r.ids_p50_us},
                   {"added_p50_us", r.text_p50_us - r.ids_p50_us},
                   {"text_p99_us", r.text_p99_us},
                   {"ids_p99_us", r.ids_p99_us}});
    }
    std::cout << j.dump(1) << "\n";
  }
  return 0;
}
