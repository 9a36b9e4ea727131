// carpool-bench-engine-host: the engine thread's host work per step, with the asynchronous step
// on and off (issue 18), on a fake device whose every step takes a fixed time and computes
// nothing (worker/model/fake_async_device.h: kernels are no-ops, tokens are drawn from (seed,
// position)), so what the engine thread spends is the engine's own work: scheduling, the step
// plan, the model's input preparation and kernel calls, the scheduler's update and the events.
//
// Per batch size: `batch` requests of --prompt-len tokens are prefilled, then --steps decode
// steps are timed. Host work per step is the engine thread's CPU time (CLOCK_THREAD_CPUTIME_ID:
// the waits for the device sleep, so they are not counted); wall per step is what a step takes
// end to end, about device + host when synchronous and max(device, host) when asynchronous.
// Prints a table (and JSON with --json). Figures go to docs/PERFORMANCE.md with the command.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/flags.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/engine.h"
#include "worker/model/fake_async_device.h"

namespace carpool::bench {
namespace {

int64_t ThreadCpuMicros() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1'000'000 + t.tv_nsec / 1000;
}

struct Result {
  int batch = 0;
  bool async = false;
  int steps = 0;
  double host_us = 0;  // engine thread CPU time per step
  double wall_us = 0;  // wall time per step
  double wait_us = 0;  // time the engine thread slept waiting for the device, per step
  double tokens_per_step = 0;
  int64_t violations = 0;
};

struct Config {
  std::string model = "synthetic:tiny";
  int64_t step_micros = 10'000;
  int prompt_len = 128;
  int steps = 100;
  int warmup_steps = 5;
};

absl::StatusOr<Result> Run(const Config& cfg, int batch, bool async) {
  worker::EngineOptions o;
  o.model = cfg.model;
  o.num_threads = 1;
  o.scheduler.max_num_seqs = batch;
  o.scheduler.max_num_batched_tokens = std::max(2048, batch * cfg.prompt_len);
  const int max_tokens = cfg.warmup_steps + cfg.steps + 8;
  o.scheduler.max_model_len = cfg.prompt_len + max_tokens + 16;
  o.block_size = 16;
  o.num_kv_blocks = batch * ((o.scheduler.max_model_len + 15) / 16 + 1);
  o.async_step = async ? worker::AsyncStep::kOn : worker::AsyncStep::kOff;
  worker::FakeDeviceLog log;
  worker::FakeAsyncDeviceOptions d;
  d.step_micros = cfg.step_micros;
  d.async = async;
  // The vocabulary is the model's; synthetic presets are small, and the fake only needs a bound.
  d.vocab = 256;
  ASSIGN_OR_RETURN(std::unique_ptr<worker::Engine> engine,
                   worker::Engine::Create(
                       o, nullptr, std::make_unique<worker::FakeAsyncDevice>(nullptr, d, &log)));
  std::mt19937 rng(batch);
  std::uniform_int_distribution<int> token(0, 255);
  for (int i = 0; i < batch; ++i) {
    worker::EngineRequest r;
    for (int j = 0; j < cfg.prompt_len; ++j) r.prompt_tokens.push_back(token(rng));
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.sampling.has_seed = true;
    r.sampling.seed = static_cast<uint64_t>(i + 1);
    RETURN_IF_ERROR(engine->Add(std::move(r)).status());
  }
  // Prefill (and the first tokens) outside the timing, then a few decode steps.
  int with_token = 0;
  std::vector<bool> seen(batch + 1, false);
  for (int guard = 0; with_token < batch && guard < 10 * batch + 100; ++guard) {
    for (const worker::EngineEvent& e : engine->Step()) {
      const size_t k = static_cast<size_t>(e.seq_id) % seen.size();
      if (e.has_token && !seen[k]) {
        seen[k] = true;
        ++with_token;
      }
    }
  }
  for (int i = 0; i < cfg.warmup_steps; ++i) engine->Step();
  const int64_t wait0 = log.wait_micros;
  const int64_t cpu0 = ThreadCpuMicros();
  const int64_t wall0 = Clock::Real()->NowMicros();
  int64_t tokens = 0;
  for (int i = 0; i < cfg.steps; ++i) {
    for (const worker::EngineEvent& e : engine->Step()) tokens += e.has_token;
  }
  const int64_t cpu = ThreadCpuMicros() - cpu0;
  const int64_t wall = Clock::Real()->NowMicros() - wall0;
  Result r;
  r.batch = batch;
  r.async = async;
  r.steps = cfg.steps;
  r.host_us = static_cast<double>(cpu) / cfg.steps;
  r.wall_us = static_cast<double>(wall) / cfg.steps;
  r.wait_us = static_cast<double>(log.wait_micros - wait0) / cfg.steps;
  r.tokens_per_step = static_cast<double>(tokens) / cfg.steps;
  r.violations = log.violations;
  if (engine->steps_async() != async) {
    return absl::InternalError("the engine did not take the asked --async-step");
  }
  return r;
}

}  // namespace
}  // namespace carpool::bench

int main(int argc, char** argv) {
  using namespace carpool;
  using namespace carpool::bench;
  Config cfg;
  std::string batches = "1,8,64,256";
  bool json_out = false;
  std::string json_file;
  FlagParser parser;
  parser.AddString("model", &cfg.model, "model whose shapes the engine plans for");
  parser.AddInt64("step-micros", &cfg.step_micros, "the fake device's time per step");
  parser.AddInt("prompt-len", &cfg.prompt_len, "prompt tokens per request");
  parser.AddInt("steps", &cfg.steps, "timed decode steps per batch size and mode");
  parser.AddString("batches", &batches, "comma-separated batch sizes");
  parser.AddBool("json", &json_out, "also print a JSON object");
  parser.AddString("json-file", &json_file, "also write the JSON object to this file");
  if (auto s = parser.Parse(argc, argv, 1); !s.ok()) {
    std::cerr << "carpool-bench-engine-host: " << s.message() << "\n" << parser.Help();
    return 2;
  }
  std::vector<int> sizes;
  {
    std::stringstream list(batches);
    for (std::string b; std::getline(list, b, ',');) {
      if (b.empty()) continue;
      const int n = std::atoi(b.c_str());
      if (n < 1) {
        std::cerr << "carpool-bench-engine-host: bad batch size '" << b << "' in --batches\n";
        return 2;
      }
      sizes.push_back(n);
    }
  }
  if (cfg.steps < 1 || cfg.prompt_len < 1 || cfg.step_micros < 0) {
    std::cerr << "carpool-bench-engine-host: --steps and --prompt-len must be >= 1, "
                 "--step-micros >= 0\n";
    return 2;
  }
  nlohmann::json out;
  out["model"] = cfg.model;
  out["step_micros"] = cfg.step_micros;
  out["prompt_len"] = cfg.prompt_len;
  out["steps"] = cfg.steps;
  std::printf(
      "fake device: %.1f ms a step, no compute; model %s; prompts %d tokens; %d timed "
      "decode steps\n",
      cfg.step_micros / 1e3, cfg.model.c_str(), cfg.prompt_len, cfg.steps);
  std::printf("%6s %6s %14s %16s %14s %14s %10s\n", "batch", "async", "host us/step",
              "host % of step", "wall us/step", "wait us/step", "tok/step");
  bool ok = true;
  for (int batch : sizes) {
    for (bool async : {false, true}) {
      absl::StatusOr<Result> r = Run(cfg, batch, async);
      if (!r.ok()) {
        std::cerr << "batch " << batch << (async ? " async: " : " sync: ") << r.status() << "\n";
        return 1;
      }
      const double share = cfg.step_micros > 0 ? 100.0 * r->host_us / cfg.step_micros : 0.0;
      std::printf("%6d %6s %14.1f %15.2f%% %14.1f %14.1f %10.1f\n", batch, async ? "on" : "off",
                  r->host_us, share, r->wall_us, r->wait_us, r->tokens_per_step);
      if (r->violations != 0) {
        std::printf("  %lld input violations (the device's check failed)\n",
                    static_cast<long long>(r->violations));
        ok = false;
      }
      out["runs"].push_back({{"batch", batch},
                             {"async", async},
                             {"host_us_per_step", r->host_us},
                             {"host_share_of_step", share / 100.0},
                             {"wall_us_per_step", r->wall_us},
                             {"wait_us_per_step", r->wait_us},
                             {"tokens_per_step", r->tokens_per_step},
                             {"violations", r->violations}});
      if (batch == 64 && async) {
        const bool met = r->host_us < 0.15 * cfg.step_micros;
        out["target_batch64_host_under_15pct"] = met;
        std::printf("  target (batch 64, async): host work < 15%% of the device step: %s\n",
                    met ? "met" : "NOT met");
      }
    }
  }
  const std::string text = out.dump(2);
  if (json_out) std::printf("%s\n", text.c_str());
  if (!json_file.empty()) std::ofstream(json_file) << text << "\n";
  return ok ? 0 : 1;
}
