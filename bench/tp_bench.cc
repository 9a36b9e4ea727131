// carpool-bench-tp: decode step time of tensor-parallel groups on the CPU, and the share of it
// spent in all-reduce. Every rank of the mpirun job is one rank of one group (TP = -np):
//
//   mpirun -np 1 build/bin/carpool-bench-tp --model synthetic:small --batch 1,32 --threads 2
//   mpirun -np 2 --bind-to none build/bin/carpool-bench-tp --model synthetic:small --batch 1,32
//
// For each batch size the leader admits that many requests (32-token prompts), runs them into
// decode, then times --steps decode steps of the whole batch (Engine::Step: schedule, forward
// with the step broadcast, all-reduces and logits gather, sampling). It prints one table row per
// batch size and, with --json, writes them to a file. "1 allreduce us" is one all-reduce of
// batch x hidden floats timed back to back before the run: the transport alone; the step's
// all-reduce time also holds the wait for the slower rank.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cluster/mpi_communicator.h"
#include "cluster/mpi_job.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/thread_pool.h"
#include "nlohmann/json.hpp"
#include "worker/engine.h"
#include "worker/mpi_worker.h"

namespace {

using carpool::Clock;
using carpool::worker::CollectiveTimes;
using carpool::worker::Engine;
using carpool::worker::EngineOptions;
using carpool::worker::EngineRequest;

// Mean time of one AllReduceSum of `count` floats, back to back (the transport alone, no rank
// waiting for a slower one's compute). Collective: every rank calls it.
double AllReduceMicros(carpool::cluster::Communicator* group, int64_t count, int reps) {
  std::vector<float> data(count, 1.0f);
  for (int i = 0; i < 10; ++i) (void)group->AllReduceSum(data.data(), count);
  (void)group->Barrier();
  const int64_t start = Clock::Real()->NowMicros();
  for (int i = 0; i < reps; ++i) (void)group->AllReduceSum(data.data(), count);
  return static_cast<double>(Clock::Real()->NowMicros() - start) / reps;
}

struct Row {
  int tp = 1;
  int threads = 0;
  int batch = 0;
  double step_ms_min = 0;
  double step_ms_median = 0;
  double step_ms_p90 = 0;
  double all_reduce_ms_per_step = 0;
  double all_reduce_share = 0;
  double gather_share = 0;
  double broadcast_share = 0;
  double tokens_per_s = 0;
  double all_reduce_alone_us = 0;  // one all-reduce of batch x hidden floats, back to back
  int all_reduces_per_step = 0;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

Row Measure(Engine* engine, int batch, int warmup, int steps) {
  std::mt19937 rng(batch);
  std::uniform_int_distribution<int> token(0, 255);
  std::vector<int64_t> ids;
  for (int i = 0; i < batch; ++i) {
    EngineRequest r;
    r.prompt_tokens.push_back(256);
    for (int j = 0; j < 31; ++j) r.prompt_tokens.push_back(token(rng));
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = warmup + steps + 8;
    ids.push_back(engine->Add(std::move(r)).value());
  }
  // Prefill until every request has its first token, then warm up.
  int with_token = 0;
  while (with_token < batch) {
    for (const auto& e : engine->Step()) with_token += e.has_token ? 1 : 0;
  }
  for (int i = 0; i < warmup; ++i) engine->Step();

  const CollectiveTimes before = engine->model().collective_times();
  std::vector<double> step_ms;
  int64_t total_micros = 0;
  for (int i = 0; i < steps; ++i) {
    const int64_t start = Clock::Real()->NowMicros();
    const size_t events = engine->Step().size();
    const int64_t micros = Clock::Real()->NowMicros() - start;
    if (static_cast<int>(events) != batch) std::fprintf(stderr, "warning: a step of %zu\n", events);
    step_ms.push_back(micros / 1000.0);
    total_micros += micros;
  }
  const CollectiveTimes after = engine->model().collective_times();
  for (int64_t id : ids) engine->Abort(id);

  Row row;
  row.batch = batch;
  row.step_ms_min = Percentile(step_ms, 0);
  row.step_ms_median = Percentile(step_ms, 0.5);
  row.step_ms_p90 = Percentile(step_ms, 0.9);
  const double total = static_cast<double>(total_micros);
  row.all_reduce_ms_per_step = (after.all_reduce_micros - before.all_reduce_micros) / 1000.0 / steps;
  row.all_reduce_share = (after.all_reduce_micros - before.all_reduce_micros) / total;
  row.all_reduces_per_step = static_cast<int>((after.all_reduces - before.all_reduces) / steps);
  row.gather_share = (after.gather_micros - before.gather_micros) / total;
  row.broadcast_share = (after.broadcast_micros - before.broadcast_micros) / total;
  row.tokens_per_s = batch * steps / (total / 1e6);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  EngineOptions options;
  options.model = "synthetic:small";
  options.scheduler.max_model_len = 1024;
  options.scheduler.max_num_seqs = 64;
  std::string batches_text = "1,32", json_path;
  int warmup = 3, steps = 20;
  bool help = false;
  carpool::FlagParser flags;
  flags.AddString("model", &options.model, "synthetic:<preset> or a folder");
  flags.AddString("batch", &batches_text, "batch sizes to time");
  flags.AddInt("steps", &steps, "decode steps timed per batch size");
  flags.AddInt("warmup", &warmup, "decode steps before timing");
  flags.AddInt("threads", &options.num_threads, "kernel threads per rank; 0: one per core");
  flags.AddString("json", &json_path, "also write the rows to this file");
  flags.AddBool("help", &help, "show this help");
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok() || help) {
    std::fprintf(stderr, "%susage: mpirun -np TP carpool-bench-tp [flags]\n%s",
                 s.ok() ? "" : (std::string(s.message()) + "\n").c_str(), flags.Help().c_str());
    return s.ok() ? 0 : 2;
  }
  std::vector<int32_t> batches;
  if (absl::Status s = carpool::ParseIntList(batches_text, "--batch", &batches); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  // Every rank is one rank of one group: TP = the job's size (1 without mpirun).
  const int world = std::max(1, std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")
                                              ? std::getenv("OMPI_COMM_WORLD_SIZE")
                                              : "1"));
  auto job = carpool::cluster::MpiJob::Init(
      &argc, &argv, {.role = carpool::cluster::Role::kWorker, .tensor_parallel = world});
  if (!job.ok()) {
    std::fprintf(stderr, "carpool-bench-tp: %s\n", std::string(job.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<carpool::cluster::MpiCommunicator> group;
  if ((*job)->tp_size() > 1) {
    group = carpool::cluster::MpiCommunicator::Create((*job)->tp_comm(), {}).value();
    options.tensor_parallel_group = group.get();
  }
  auto engine = Engine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "carpool-bench-tp: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  // The transport alone, per batch size, before the followers start following.
  std::vector<double> alone_us;
  if (group != nullptr) {
    for (int batch : batches) {
      alone_us.push_back(
          AllReduceMicros(group.get(), int64_t{batch} * (*engine)->model_config().hidden_size, 200));
    }
  }
  if ((*job)->tp_rank() != 0) {
    absl::Status s = carpool::worker::RunFollower(&(*engine)->model(), group.get());
    (*job)->Finalize(absl::Seconds(10), s.ok() ? 0 : 1);
    return s.ok() ? 0 : 1;
  }

  const int tp = (*job)->tp_size();
  const int threads = (*engine)->thread_pool().num_threads();
  std::printf("carpool-bench-tp: %s, TP=%d, %d kernel thread(s) per rank, %d timed steps\n",
              options.model.c_str(), tp, threads, steps);
  std::printf("%4s %7s %6s %8s %12s %8s %14s %11s %8s %8s %10s %16s\n", "tp", "threads",
              "batch", "step min", "step ms p50", "p90", "allreduce ms", "allreduce %",
              "gather %", "bcast %", "tokens/s", "1 allreduce us");
  nlohmann::json rows = nlohmann::json::array();
  for (size_t b = 0; b < batches.size(); ++b) {
    const int batch = batches[b];
    Row r = Measure(engine->get(), batch, warmup, steps);
    r.tp = tp;
    r.threads = threads;
    r.all_reduce_alone_us = b < alone_us.size() ? alone_us[b] : 0;
    std::printf("%4d %7d %6d %8.2f %12.2f %8.2f %14.2f %10.1f%% %7.1f%% %7.1f%% %10.1f %16.1f\n",
                r.tp, r.threads, r.batch, r.step_ms_min, r.step_ms_median, r.step_ms_p90,
                r.all_reduce_ms_per_step, 100 * r.all_reduce_share, 100 * r.gather_share,
                100 * r.broadcast_share, r.tokens_per_s, r.all_reduce_alone_us);
    rows.push_back({{"model", options.model}, {"tp", r.tp}, {"threads", r.threads},
                    {"batch", r.batch}, {"step_ms_min", r.step_ms_min},
                    {"step_ms_p50", r.step_ms_median},
                    {"step_ms_p90", r.step_ms_p90},
                    {"all_reduce_ms_per_step", r.all_reduce_ms_per_step},
                    {"all_reduce_share", r.all_reduce_share}, {"gather_share", r.gather_share},
                    {"broadcast_share", r.broadcast_share}, {"tokens_per_s", r.tokens_per_s},
                    {"all_reduce_alone_us", r.all_reduce_alone_us},
                    {"all_reduces_per_step", r.all_reduces_per_step}});
  }
  if (group != nullptr) (void)carpool::worker::StopFollowers(group.get());
  if (!json_path.empty()) std::ofstream(json_path) << rows.dump(2) << "\n";
  (*job)->Finalize(absl::Seconds(10), 0);
  return 0;
}
