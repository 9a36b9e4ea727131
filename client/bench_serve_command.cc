#include "client/bench_serve_command.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "client/bench_serve.h"
#include "client/bench_serve_runner.h"
#include "client/carpool_client.h"
#include "common/flags.h"
#include "common/status.h"

namespace carpool::client {
namespace {

using bench::DatasetKind;
using bench::DatasetOptions;
using bench::LengthDist;
using bench::RunnerOptions;

constexpr char kUsage[] =
    "usage: carpool bench serve [--router ENDPOINT] [workload flags] [--goodput ttft:MS "
    "tpot:MS e2el:MS] [--json]\n";

struct ServeFlags {
  std::string backend = "zmq";
  ClientOptions client;
  DatasetOptions dataset;
  std::string dataset_name = "random";
  RunnerOptions runner;
  bench::ZmqSenderOptions sender;
  bench::HttpSenderOptions http;
  std::string goodput;
  int64_t seed = 0;
  bool json = false;
  std::string result_file;
  bool save_detailed = false;
  int stats_interval_ms = 250;
  bool progress = true;
  bool help = false;
};

absl::Status ParseLength(const std::string& v, LengthDist* out) {
  absl::StatusOr<LengthDist> d = LengthDist::Parse(v);
  if (!d.ok()) return d.status();
  *out = *d;
  return absl::OkStatus();
}

void RegisterServeFlags(FlagParser* p, ServeFlags* f) {
  p->AddString("backend", &f->backend,
               "zmq (the router's ZeroMQ frontend) or http (the OpenAI gateway at --url)");
  p->AddString("url", &f->http.url,
               "http: the gateway's base URL; --router still serves the stats when reachable");
  p->AddString("model", &f->http.model, "http: the model name to send; none: the served model");
  p->AddString("router", &f->client.router_endpoint, "the router's client endpoint");
  p->AddInt("num-prompts", &f->dataset.num_prompts,
            "requests to send; jsonl: 0 = every line once, the default with jsonl");
  p->AddString("dataset", &f->dataset_name, "random, jsonl or shared-prefix");
  p->AddString("dataset-path", &f->dataset.path,
               "jsonl: prompts file, {\"prompt\": ...} or {\"prompt_ids\": [...]} per line, "
               "optional \"max_tokens\"");
  p->AddCustom(
      "input-len", [f](const std::string& v) { return ParseLength(v, &f->dataset.input); },
      "prompt length: N, uniform:LO:HI, normal:MEAN:STD, exponential:MEAN[:MAX] "
      "(shared-prefix: the part after the prefix)",
      f->dataset.input.ToString());
  p->AddCustom(
      "output-len", [f](const std::string& v) { return ParseLength(v, &f->dataset.output); },
      "output length, same forms (jsonl lines with max_tokens keep theirs)",
      f->dataset.output.ToString());
  p->AddInt("num-prefixes", &f->dataset.num_prefixes, "shared-prefix: distinct prefixes");
  p->AddInt("prefix-len", &f->dataset.prefix_len, "shared-prefix: prefix tokens");
  p->AddInt("vocab-size", &f->dataset.vocab_size,
            "random token ids are drawn from [0, N); 256: the byte tokenizer's bytes");
  p->AddCustom(
      "request-rate",
      [f](const std::string& v) {
        double r;
        if (v == "inf") {
          f->runner.request_rate = std::numeric_limits<double>::infinity();
        } else if (absl::SimpleAtod(v, &r) && r > 0) {
          f->runner.request_rate = r;
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("--request-rate must be > 0 or inf, got '", v, "'"));
        }
        return absl::OkStatus();
      },
      "requests per second, Poisson (or gamma with --burstiness); inf = all at once",
      absl::StrCat(f->runner.request_rate));
  p->AddDouble("burstiness", &f->runner.burstiness,
               "gamma shape of the gaps: 1 Poisson, < 1 burstier, > 1 more regular");
  p->AddInt("max-concurrency", &f->runner.max_concurrency, "most requests in flight; 0: unlimited");
  p->AddString("goodput", &f->goodput,
               "SLOs for goodput, e.g. --goodput ttft:500 tpot:50 e2el:5000 (ms)");
  p->AddInt64("seed", &f->seed, "seed of the dataset and arrival times");
  p->AddInt("num-warmups", &f->runner.num_warmups,
            "requests sent one by one before the run, not measured");
  p->AddFloat("temperature", &f->sender.temperature, "sampling temperature; 0: greedy");
  p->AddBool("ignore-eos", &f->sender.ignore_eos, "generate exactly the dataset's output lengths");
  p->AddInt64("timeout-ms", &f->sender.timeout_ms, "per request");
  p->AddBool("json", &f->json, "print the result as one JSON object instead of the report");
  p->AddString("result-file", &f->result_file, "also write the result JSON to this file");
  p->AddBool("save-detailed", &f->save_detailed,
             "add per-request input_lens, output_lens, ttfts, itls, e2els, errors to the JSON");
  p->AddInt("stats-interval-ms", &f->stats_interval_ms,
            "sample the router's stats this often for peak running sequences and KV blocks "
            "(0 = off)");
  p->AddBool("progress", &f->progress, "progress bar on stderr when it is a terminal");
  p->AddBool("help", &f->help, "show this help");
}

// vLLM spells `--goodput ttft:500 tpot:50` with one value per objective; FlagParser takes one
// value per flag, so the words after --goodput up to the next flag are joined into one.
std::vector<std::string> JoinGoodputValues(int argc, char** argv, int first) {
  std::vector<std::string> args;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a != "--goodput") {
      args.push_back(std::move(a));
      continue;
    }
    std::string value;
    while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      absl::StrAppend(&value, value.empty() ? "" : " ", argv[++i]);
    }
    args.push_back("--goodput=" + value);
  }
  return args;
}

// Peaks of the router's stats while the run lasts, summed over workers.
class StatsSampler {
 public:
  StatsSampler(Client* client, int interval_ms) : client_(client), interval_ms_(interval_ms) {
    if (interval_ms_ > 0) thread_ = std::thread([this] { Loop(); });
  }
  ~StatsSampler() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    stop_.Notify();
    thread_.join();
  }
  void Sample(const StatsOut& s) {
    int running = 0, used = 0, blocks = 0, max_seqs = 0;
    for (const WorkerStatsOut& w : s.workers) {
      if (!w.healthy) continue;
      running += w.running;
      used += w.kv_used_blocks;
      blocks += w.num_kv_blocks;
      max_seqs += w.max_num_seqs;
    }
    ++samples_;
    workers_ = static_cast<int>(s.workers.size());
    peak_running_ = std::max(peak_running_, running);
    peak_kv_used_ = std::max(peak_kv_used_, used);
    num_kv_blocks_ = blocks;
    max_num_seqs_ = max_seqs;
  }
  nlohmann::json ToJson() const {
    return {{"stats_interval_ms", interval_ms_}, {"stats_samples", samples_},
            {"workers", workers_},               {"max_num_seqs", max_num_seqs_},
            {"peak_running", peak_running_},     {"peak_kv_used_blocks", peak_kv_used_},
            {"num_kv_blocks", num_kv_blocks_}};
  }
  std::string Report() const {
    return absl::StrFormat(
        "Server (router stats every %d ms, %d samples): %d workers, peak running %d of %d "
        "sequences, peak KV blocks used %d of %d\n",
        interval_ms_, samples_, workers_, peak_running_, max_num_seqs_, peak_kv_used_,
        num_kv_blocks_);
  }

 private:
  void Loop() {
    while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(interval_ms_))) {
      absl::StatusOr<StatsOut> s = client_->Stats(2000);
      if (s.ok()) Sample(*s);
    }
  }

  Client* client_;
  const int interval_ms_;
  absl::Notification stop_;
  std::thread thread_;
  // Written by the sampling thread only, read after Stop().
  int samples_ = 0, workers_ = 0, peak_running_ = 0, peak_kv_used_ = 0, num_kv_blocks_ = 0,
      max_num_seqs_ = 0;
};

int Fail(const absl::Status& s, int code) {
  std::cerr << "carpool bench serve: " << s.message() << "\n";
  return code;
}

absl::Status Resolve(const FlagParser& parser, ServeFlags* f) {
  if (!parser.positionals().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parser.positionals()[0], "'"));
  }
  if (f->backend != "zmq" && f->backend != "http") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be zmq or http, got '", f->backend, "'"));
  }
  if (f->dataset_name == "random") {
    f->dataset.kind = DatasetKind::kRandom;
  } else if (f->dataset_name == "jsonl") {
    f->dataset.kind = DatasetKind::kJsonl;
    if (!parser.WasSet("num-prompts")) f->dataset.num_prompts = 0;
  } else if (f->dataset_name == "shared-prefix") {
    f->dataset.kind = DatasetKind::kSharedPrefix;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dataset must be random, jsonl or shared-prefix, got '", f->dataset_name, "'"));
  }
  if (f->dataset.kind != DatasetKind::kJsonl && !f->dataset.path.empty()) {
    return absl::InvalidArgumentError("--dataset-path needs --dataset jsonl");
  }
  if (f->sender.timeout_ms <= 0) return absl::InvalidArgumentError("--timeout-ms must be > 0");
  if (f->stats_interval_ms < 0) {
    return absl::InvalidArgumentError("--stats-interval-ms must be >= 0");
  }
  f->dataset.seed = static_cast<uint64_t>(f->seed);
  f->runner.seed = f->dataset.seed ^ 0x9e3779b97f4a7c15ull;
  RETURN_IF_ERROR(f->runner.Validate());
  return f->dataset.Validate();
}

std::string DescribeDataset(const ServeFlags& f) {
  const DatasetOptions& d = f.dataset;
  switch (d.kind) {
    case DatasetKind::kRandom:
      return absl::StrCat("random input=", d.input.ToString(), " output=", d.output.ToString());
    case DatasetKind::kSharedPrefix:
      return absl::StrCat("shared-prefix prefixes=", d.num_prefixes, "x", d.prefix_len,
                          " suffix=", d.input.ToString(), " output=", d.output.ToString());
    case DatasetKind::kJsonl:
      return absl::StrCat("jsonl ", d.path, " output=", d.output.ToString());
  }
  return "";
}

int RunServe(int argc, char** argv, int first) {
  ServeFlags f;
  FlagParser parser;
  RegisterServeFlags(&parser, &f);
  std::vector<std::string> args = JoinGoodputValues(argc, argv, first);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  if (absl::Status s = parser.Parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data(), 0);
      !s.ok()) {
    std::cerr << "carpool bench serve: " << s.message() << "\n" << kUsage;
    return 2;
  }
  if (f.help) {
    std::cout << kUsage << parser.Help();
    return 0;
  }
  bench::Slo slo;
  if (parser.WasSet("goodput")) {
    absl::StatusOr<bench::Slo> parsed = bench::Slo::Parse(f.goodput);
    if (!parsed.ok()) return Fail(parsed.status(), 2);
    slo = *parsed;
  }
  if (absl::Status s = Resolve(parser, &f); !s.ok()) return Fail(s, 2);
  absl::StatusOr<std::vector<bench::BenchRequest>> requests = bench::BuildDataset(f.dataset);
  if (!requests.ok()) return Fail(requests.status(), 2);

  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(f.client);
  if (!client.ok()) return Fail(client.status(), 2);
  const bool http = f.backend == "http";
  absl::StatusOr<StatsOut> first_stats = (*client)->Stats(http ? 1000 : 5000);
  if (!first_stats.ok() && !http) {
    return Fail(absl::UnavailableError(absl::StrCat("no router answered at ",
                                                    f.client.router_endpoint, ": ",
                                                    first_stats.status().message())),
                1);
  }
  std::unique_ptr<bench::RequestSender> sender;
  if (http) {
    f.http.timeout_ms = f.sender.timeout_ms;
    f.http.temperature = f.sender.temperature;
    f.http.ignore_eos = f.sender.ignore_eos;
    f.http.api_key = f.client.api_key;
    sender = bench::NewHttpSender(f.http);
  } else {
    sender = bench::NewZmqSender(client->get(), f.sender);
  }
  // Over HTTP without a reachable router frontend: no server stats.
  if (!first_stats.ok()) f.stats_interval_ms = 0;
  if (f.progress && isatty(STDERR_FILENO)) f.runner.progress = &std::cerr;

  StatsSampler sampler(client->get(), f.stats_interval_ms);
  if (first_stats.ok()) sampler.Sample(*first_stats);
  const bench::RunResult run = bench::RunWorkload(*requests, sender.get(), f.runner);
  sampler.Stop();

  bench::RunInfo info;
  info.backend = f.backend;
  info.endpoint = http ? f.http.url : f.client.router_endpoint;
  info.num_prompts = static_cast<int>(requests->size());
  info.request_rate = f.runner.request_rate;
  info.burstiness = f.runner.burstiness;
  info.max_concurrency = f.runner.max_concurrency;
  info.dataset = DescribeDataset(f);
  info.slo = slo;
  const bench::BenchMetrics metrics = bench::ComputeMetrics(run.outcomes, run.duration_s, slo);
  nlohmann::json j = bench::ToJson(metrics, info, f.save_detailed ? &run.outcomes : nullptr);
  if (f.stats_interval_ms > 0) j["server"] = sampler.ToJson();
  if (!f.result_file.empty()) {
    std::ofstream out(f.result_file);
    out << j.dump(2) << "\n";
    if (!out) {
      std::cerr << "carpool bench serve: cannot write " << f.result_file << "\n";
    }
  }
  if (f.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << bench::FormatReport(metrics, info);
    if (f.stats_interval_ms > 0) std::cout << sampler.Report();
  }
  if (metrics.failed > 0) {
    for (const bench::RequestOutcome& o : run.outcomes) {
      if (o.success) continue;
      std::cerr << "carpool bench serve: " << metrics.failed
                << " requests failed; the first: " << o.error << "\n";
      break;
    }
  }
  return metrics.completed > 0 ? 0 : 1;
}

}  // namespace

int RunBench(int argc, char** argv, int first) {
  if (first >= argc || std::strcmp(argv[first], "--help") == 0) {
    std::cout << "usage: carpool bench serve [flags]   (carpool bench serve --help)\n";
    return first >= argc ? 2 : 0;
  }
  if (std::strcmp(argv[first], "serve") == 0) return RunServe(argc, argv, first + 1);
  std::cerr << "carpool bench: unknown benchmark '" << argv[first] << "' (serve)\n";
  return 2;
}

}  // namespace carpool::client
