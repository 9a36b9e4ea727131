// carpool-bench-gpu-model: Llama decode and prefill on one GPU through CudaDevice, compared
// within one run.
//
//   carpool-bench-gpu-model [--presets 1b,8b] [--real-model 1b] [--layers N] [--steps N]
//                           [--context N] [--dtype bfloat16|float16|float32] [--json PATH]
//                           [--engine-presets 1b] [--engine-batches 1,8,64,256]
//                           [--engine-prompt 128]
//
// For each synthetic preset (worker/weights/synthetic.cc shapes; --layers N keeps only N layers
// and scales the weight bytes accordingly): decode tokens/s at batch 1, 8, 64 and 256 (every
// sequence at --context tokens), CUDA graphs on and off at batch 1, model-bandwidth utilisation
// at batch 1 (weight bytes read per step / step time / device-to-device copy bandwidth measured
// in the same run), and prefill tokens/s of one 2048-token prompt.
//
// Presets in --real-model (default 1b) run through the real LlamaModel (ModelBench): synthetic
// weights generated on the host (LoadWeights("synthetic:<preset>"), fp32), uploaded by the
// CudaDevice (and then dropped from the host), steps through LlamaModel::Forward, as the
// engine runs them. The others (default 8b) run LlamaModel's order of kernels written out here
// over the ModelDevice interface (KernelBench: embedding, per layer norm, q/k/v, RoPE, KV write,
// paged attention, o, add+norm, gate/up, SiLU·mul, down; final norm, sampled rows, head; logits
// read back), so that the weights can be filled on the device: an 8B model's fp32 weights take
// 32 GB of host memory and an unmeasured time to generate on the GPU machine's host, twice
// (graphs on and off). Nothing about the output is checked.
//
// Presets in --engine-presets (default 1b; the full preset, --layers does not apply) then run
// through the whole Engine (EngineBench: schedule, forward, sample, update, as carpool-worker
// steps) in three configurations, each a fresh Engine::Create: device sampling with the
// asynchronous step, device sampling without it, and host sampling (logits copied back, the CPU
// Sampler; async needs device sampling). For each batch in --engine-batches, that many greedy
// requests of --engine-prompt tokens are prefilled, then decode tokens/s is timed over --steps
// Engine::Step calls. The ratios device/host sampling and async on/off at each batch, and graphs
// on/off at batch 1, are printed and written with the rows.
//
// JSON (--json): {"copy_bandwidth_gb_per_s", "rows": [{section, model, layers, cell, batch,
// graphs, sampling, async, ms_per_step, tokens_per_s, mbu?}], "ratios": [{name, batch, value}]}.
// Exit status: 0 done; 77 no CUDA device visible (nothing measured, the message says so; the
// JSON, if asked for, says {"skipped": reason}); 1 a CUDA or model error; 2 bad flags.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/status.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/device_options.h"
#include "worker/engine.h"
#include "worker/model/cuda_device.h"
#include "worker/model/llama_model.h"
#include "worker/weights/weights.h"

namespace carpool::worker {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Layer {
  DeviceArray in_norm, q, k, v, o, post_norm, gate, up, down;
};

constexpr int kPrefill = 2048;

// Steps timed by both benches: median seconds of `steps` after 3 warm-up steps (which include
// graph captures).
template <typename StepFn>
double TimeSteps(int steps, const StepFn& step) {
  for (int i = 0; i < 3; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const double start = Now();
    step();
    times.push_back(Now() - start);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The real model: LlamaModel over synthetic host weights, stepped with StepPlans. Decode
// sequence s owns blocks [s * decode_blocks, ...); a prompt takes the kPrefill / 16 blocks after
// all of them.
class ModelBench {
 public:
  ModelBench(std::string preset, int layers, int max_seqs, int context)
      : preset_(std::move(preset)), layers_(layers), max_seqs_(max_seqs), context_(context) {}

  absl::Status Init(std::unique_ptr<CudaDevice> device) {
    ASSIGN_OR_RETURN(std::unique_ptr<LlamaWeights> w, LoadWeights("synthetic:" + preset_));
    if (layers_ > 0 && layers_ < w->config.num_layers) {
      w->config.num_layers = layers_;
      w->layers.resize(layers_);
    }
    vocab_ = w->config.vocab_size;
    decode_blocks_ = (context_ + 15) / 16;
    prefill_base_ = std::max(max_seqs_, 1) * decode_blocks_;
    device_ = device.get();
    ASSIGN_OR_RETURN(model_, LlamaModel::Create(std::move(w), {prefill_base_ + kPrefill / 16, 16},
                                                nullptr, std::move(device)));
    return device_->Synchronize();
  }

  const LlamaModel& model() const { return *model_; }

  void Step(int n, bool prefill) {
    StepPlan plan;
    const int seqs = prefill ? 1 : n;
    for (int s = 0; s < seqs; ++s) {
      StepPlan::Seq q;
      q.seq_id = s;
      q.start_position = prefill ? 0 : context_ - 1;
      q.num_tokens = prefill ? n : 1;
      q.sample = true;
      const int blocks = (q.start_position + q.num_tokens + 15) / 16;
      const int base = prefill ? prefill_base_ : s * decode_blocks_;
      for (int b = 0; b < blocks; ++b) q.block_table.push_back(base + b);
      plan.seqs.push_back(std::move(q));
    }
    for (int i = 0; i < n; ++i) plan.token_ids.push_back((i * 7919) % vocab_);
    model_->Forward(plan, &logits_);
  }

  double Time(int n, bool prefill, int steps) {
    return TimeSteps(steps, [&] { Step(n, prefill); });
  }

 private:
  const std::string preset_;
  const int layers_, max_seqs_, context_;
  int vocab_ = 0, decode_blocks_ = 0, prefill_base_ = 0;
  CudaDevice* device_ = nullptr;  // owned by model_
  std::unique_ptr<LlamaModel> model_;
  std::vector<float> logits_;
};

// LlamaModel's kernels written out over weights filled on the device (see the header).
class KernelBench {
 public:
  KernelBench(const ModelConfig& c, CudaDevice* d, int max_seqs, int context)
      : c_(c), d_(d), context_(context) {
    // Decode sequence s owns blocks [s * decode_blocks_, ...); the prompt of a prefill step
    // takes the kPrefill / 16 blocks after all of them.
    layout_ = {0, 16, c.num_kv_heads, c.head_dim};
    decode_blocks_ = (context + 15) / 16;
    prefill_base_ = std::max(max_seqs, 1) * decode_blocks_;
    layout_.num_blocks = prefill_base_ + kPrefill / 16;
  }

  absl::Status Init() {
    std::vector<float> chunk(int64_t{1} << 22);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.02f, 0.02f);
    for (float& x : chunk) x = u(rng);
    auto make = [&](int64_t n) -> absl::StatusOr<DeviceArray> {
      absl::StatusOr<DeviceArray> a = d_->Allocate(n);
      if (!a.ok()) return a;
      for (int64_t at = 0; at < n; at += chunk.size()) {
        d_->FromHost(chunk.data(), at, std::min<int64_t>(chunk.size(), n - at), &*a);
      }
      return a;
    };
    const int64_t h = c_.hidden_size, q = int64_t{c_.num_heads} * c_.head_dim,
                  kv = int64_t{c_.num_kv_heads} * c_.head_dim, in = c_.intermediate_size;
    auto take = [&](int64_t n, DeviceArray* out) -> absl::Status {
      absl::StatusOr<DeviceArray> a = make(n);
      if (!a.ok()) return a.status();
      *out = std::move(*a);
      weight_bytes_ += n * (d_->storage_type() == StorageType::kF32 ? 4 : 2);
      return absl::OkStatus();
    };
    // Norm weights are fp32 on every device (ModelDevice::NormWeight).
    auto norm = [&](DeviceArray* out) -> absl::Status {
      ASSIGN_OR_RETURN(*out, d_->NormWeight(Tensor::Owned(std::vector<float>(h, 1.0f), {h})));
      weight_bytes_ += h * 4;
      return absl::OkStatus();
    };
    layers_.resize(c_.num_layers);
    for (Layer& l : layers_) {
      RETURN_IF_ERROR(norm(&l.in_norm));
      RETURN_IF_ERROR(take(q * h, &l.q));
      RETURN_IF_ERROR(take(kv * h, &l.k));
      RETURN_IF_ERROR(take(kv * h, &l.v));
      RETURN_IF_ERROR(take(h * q, &l.o));
      RETURN_IF_ERROR(norm(&l.post_norm));
      RETURN_IF_ERROR(take(in * h, &l.gate));
      RETURN_IF_ERROR(take(in * h, &l.up));
      RETURN_IF_ERROR(take(h * in, &l.down));
    }
    RETURN_IF_ERROR(norm(&final_norm_));
    RETURN_IF_ERROR(take(int64_t{c_.vocab_size} * h, &head_));
    ASSIGN_OR_RETURN(embed_, make(int64_t{c_.vocab_size} * h));
    weight_bytes_ += h * (d_->storage_type() == StorageType::kF32 ? 4 : 2);  // one embedding row
    const int64_t pool = int64_t{layout_.num_blocks} * 16 * kv;
    for (int i = 0; i < c_.num_layers; ++i) {
      ASSIGN_OR_RETURN(DeviceArray kc, d_->Allocate(pool));
      ASSIGN_OR_RETURN(DeviceArray vc, d_->Allocate(pool));
      key_cache_.push_back(std::move(kc));
      value_cache_.push_back(std::move(vc));
    }
    std::vector<float> inv_freq(c_.head_dim / 2);
    for (int i = 0; i < c_.head_dim / 2; ++i) {
      inv_freq[i] = static_cast<float>(std::pow(c_.rope_theta, -2.0 * i / c_.head_dim));
    }
    d_->SetRope(inv_freq, inv_freq);
    return d_->Synchronize();
  }

  int64_t weight_bytes() const { return weight_bytes_; }

  // One step: `n` decode sequences at context_ (prefill = false), or one prompt of n <= kPrefill
  // tokens.
  void Step(int n, bool prefill) {
    const int t = n, seqs = prefill ? 1 : n;
    tokens_.assign(t, 0);
    positions_.resize(t);
    slots_.resize(t);
    tables_.resize(seqs);
    seqs_.resize(seqs);
    sample_rows_.assign(seqs, 0);
    for (int s = 0; s < seqs; ++s) {
      const int blocks = prefill ? kPrefill / 16 : decode_blocks_;
      const int base = prefill ? prefill_base_ : s * decode_blocks_;
      tables_[s].resize(blocks);
      for (int b = 0; b < blocks; ++b) tables_[s][b] = base + b;
      const int len = prefill ? n : context_;
      seqs_[s] = {prefill ? 0 : s, prefill ? n : 1, len, tables_[s].data()};
      sample_rows_[s] = prefill ? n - 1 : s;
    }
    for (int i = 0; i < t; ++i) {
      tokens_[i] = (i * 7919) % c_.vocab_size;
      positions_[i] = prefill ? i : context_ - 1;
      const int s = prefill ? 0 : i;
      slots_[i] = int64_t{tables_[s][positions_[i] / 16]} * 16 + positions_[i] % 16;
    }
    StepView v;
    v.token_ids = tokens_;
    v.positions = positions_;
    v.slots = slots_;
    v.seqs = seqs_;
    v.block_size = 16;
    v.sample_rows = sample_rows_;
    v.decode_only = !prefill;
    d_->SetStep(v);
    const int64_t h = c_.hidden_size, q = int64_t{c_.num_heads} * c_.head_dim,
                  kv = int64_t{c_.num_kv_heads} * c_.head_dim, in = c_.intermediate_size;
    for (DeviceArray* a : {&residual_, &hidden_, &attn_, &out_}) d_->Reserve(a, t * std::max(h, q));
    d_->Reserve(&q_, t * q);
    d_->Reserve(&k_, t * kv);
    d_->Reserve(&v_, t * kv);
    d_->Reserve(&gate_, t * in);
    d_->Reserve(&up_, t * in);
    d_->Reserve(&logits_, int64_t{seqs} * c_.vocab_size);
    d_->Reserve(&rows_, int64_t{seqs} * h);
    const float eps = static_cast<float>(c_.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    d_->RunStep([&] {
      d_->EmbeddingGather(embed_, h, &residual_);
      for (int i = 0; i < c_.num_layers; ++i) {
        Layer& l = layers_[i];
        if (i == 0) {
          d_->RmsNorm(residual_, l.in_norm, eps, t, h, &hidden_);
        } else {
          d_->AddRmsNorm(out_, &residual_, l.in_norm, eps, t, h, &hidden_);
        }
        d_->Linear(hidden_, l.q, DeviceArray(), t, q, h, &q_);
        d_->Linear(hidden_, l.k, DeviceArray(), t, kv, h, &k_);
        d_->Linear(hidden_, l.v, DeviceArray(), t, kv, h, &v_);
        d_->Rope(c_.num_heads, c_.head_dim, /*local=*/false, &q_);
        d_->Rope(c_.num_kv_heads, c_.head_dim, /*local=*/false, &k_);
        d_->WriteKv(k_, v_, layout_, &key_cache_[i], &value_cache_[i]);
        d_->Attention(q_, key_cache_[i], value_cache_[i], layout_, c_.num_heads, {.scale = scale},
                      &attn_);
        d_->Linear(attn_, l.o, DeviceArray(), t, h, q, &out_);
        d_->AddRmsNorm(out_, &residual_, l.post_norm, eps, t, h, &hidden_);
        d_->Linear(hidden_, l.gate, DeviceArray(), t, in, h, &gate_);
        d_->Linear(hidden_, l.up, DeviceArray(), t, in, h, &up_);
        d_->SiluMul(gate_, up_, t, in, &gate_);
        d_->Linear(gate_, l.down, DeviceArray(), t, h, in, &out_);
      }
      d_->AddRmsNorm(out_, &residual_, final_norm_, eps, t, h, &hidden_);
      d_->GatherRows(hidden_, h, &rows_);
      d_->Linear(rows_, head_, DeviceArray(), seqs, c_.vocab_size, h, &logits_);
    });
    host_logits_.resize(int64_t{seqs} * c_.vocab_size);
    d_->ToHost(logits_, 0, host_logits_.size(), host_logits_.data());
  }

  double Time(int n, bool prefill, int steps) {
    return TimeSteps(steps, [&] { Step(n, prefill); });
  }

 private:
  const ModelConfig c_;
  CudaDevice* d_;
  const int context_;
  int decode_blocks_ = 0;
  int prefill_base_ = 0;
  kernels::KvCacheLayout layout_;
  int64_t weight_bytes_ = 0;
  std::vector<Layer> layers_;
  DeviceArray final_norm_, head_, embed_;
  std::vector<DeviceArray> key_cache_, value_cache_;
  DeviceArray residual_, hidden_, q_, k_, v_, attn_, out_, gate_, up_, logits_, rows_;
  std::vector<int32_t> tokens_, positions_;
  std::vector<int64_t> slots_, sample_rows_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<kernels::AttentionSeq> seqs_;
  std::vector<float> host_logits_;
};

// The whole engine on a GPU: Engine::Create over synthetic:<preset>, greedy requests stepped with
// Engine::Step. One instance per (sampling, async) configuration.
class EngineBench {
 public:
  static absl::StatusOr<std::unique_ptr<EngineBench>> Create(const std::string& preset,
                                                             StorageType dtype, bool graphs,
                                                             DeviceSampling sampling,
                                                             AsyncStep async, int max_seqs,
                                                             int max_model_len) {
    EngineOptions o;
    o.model = "synthetic:" + preset;
    o.device.kind = DeviceKind::kCuda;
    o.device.dtype = dtype;
    o.device.cuda_graphs = graphs;
    o.device_sampling = sampling;
    o.async_step = async;
    o.scheduler.max_num_seqs = max_seqs;
    o.scheduler.max_model_len = max_model_len;
    o.scheduler.max_num_batched_tokens = 2048;
    o.enable_prefix_caching = false;  // every request's prompt is computed
    ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(o));
    return std::unique_ptr<EngineBench>(new EngineBench(std::move(engine)));
  }

  Engine& engine() { return *engine_; }

  // Decode seconds per step for `batch` requests of `prompt` tokens: they are prefilled until
  // each has its first token, 3 warm-up steps run, then `steps` steps are timed (median).
  // *tokens_per_step: decode tokens the timed steps produced, per step (batch, unless the
  // engine preempted). The requests are aborted afterwards.
  absl::StatusOr<double> Time(int batch, int prompt, int steps, double* tokens_per_step) {
    std::vector<int64_t> ids;
    for (int i = 0; i < batch; ++i) {
      EngineRequest r;
      for (int j = 0; j < prompt; ++j) {
        r.prompt_tokens.push_back((i * 7919 + j * 104729 + 1) % engine_->model_config().vocab_size);
      }
      r.sampling.temperature = 0;
      r.sampling.ignore_eos = true;
      r.sampling.max_tokens = steps + 16;
      ASSIGN_OR_RETURN(int64_t id, engine_->Add(std::move(r)));
      ids.push_back(id);
    }
    absl::flat_hash_set<int64_t> with_token;
    for (int guard = 0; static_cast<int>(with_token.size()) < batch; ++guard) {
      if (guard > 100000) return absl::InternalError("prefill did not finish");
      for (const EngineEvent& e : engine_->Step()) {
        if (e.has_token) with_token.insert(e.seq_id);
      }
    }
    for (int i = 0; i < 3; ++i) engine_->Step();
    std::vector<double> times;
    int64_t tokens = 0;
    for (int i = 0; i < steps; ++i) {
      const double start = Now();
      for (const EngineEvent& e : engine_->Step()) tokens += e.has_token ? 1 : 0;
      times.push_back(Now() - start);
    }
    for (int64_t id : ids) engine_->Abort(id);
    while (engine_->has_unfinished()) engine_->Step();
    std::sort(times.begin(), times.end());
    *tokens_per_step = static_cast<double>(tokens) / steps;
    return times[times.size() / 2];
  }

 private:
  explicit EngineBench(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}
  std::unique_ptr<Engine> engine_;
};

// Device-to-device copy bandwidth (bytes read + written per second) over 1 GiB buffers.
absl::StatusOr<double> CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  ASSIGN_OR_RETURN(kernels::cuda::DeviceBuffer a, kernels::cuda::DeviceBuffer::Allocate(bytes));
  ASSIGN_OR_RETURN(kernels::cuda::DeviceBuffer b, kernels::cuda::DeviceBuffer::Allocate(bytes));
  RETURN_IF_ERROR(kernels::cuda::CopyOnDevice(b.data(), a.data(), bytes));
  RETURN_IF_ERROR(kernels::cuda::Synchronize(nullptr));
  const int reps = 10;
  const double start = Now();
  for (int i = 0; i < reps; ++i)
    RETURN_IF_ERROR(kernels::cuda::CopyOnDevice(b.data(), a.data(), bytes));
  RETURN_IF_ERROR(kernels::cuda::Synchronize(nullptr));
  return 2.0 * bytes * reps / (Now() - start);
}

struct Args {
  std::string presets = "1b,8b";
  std::string real_model = "1b";
  std::string engine_presets = "1b";
  std::string engine_batches = "1,8,64,256";
  int engine_prompt = 128;
  int layers = 0;
  int steps = 10;
  int context = 512;
  StorageType dtype = StorageType::kBF16;
  std::string json;
};

// The rows and ratios of one run, printed as they come and written as JSON at the end.
class Report {
 public:
  struct Row {
    std::string section, model, cell;
    int layers = 0, batch = 0;
    bool graphs = true, async = false;
    std::string sampling = "host";
    double seconds = 0, tokens = 0;
    double mbu = -1;  // < 0: not measured
    std::string note;
  };

  void Add(const Row& r) {
    std::printf("%-8s %-6s %-7d %-34s %12.3f %12.0f %s\n", r.section.c_str(), r.model.c_str(),
                r.layers, r.cell.c_str(), r.seconds * 1e3, r.tokens / r.seconds, r.note.c_str());
    std::fflush(stdout);
    absl::StrAppend(
        &rows_, rows_.empty() ? "" : ",\n", "    {\"section\": \"", r.section, "\", \"model\": \"",
        r.model, "\", \"layers\": ", r.layers, ", \"cell\": \"", r.cell, "\", \"batch\": ", r.batch,
        ", \"graphs\": ", r.graphs ? "true" : "false", ", \"sampling\": \"", r.sampling,
        "\", \"async\": ", r.async ? "true" : "false", ", \"ms_per_step\": ", r.seconds * 1e3,
        ", \"tokens_per_s\": ", r.tokens / r.seconds);
    if (r.mbu >= 0) absl::StrAppend(&rows_, ", \"mbu\": ", r.mbu);
    absl::StrAppend(&rows_, "}");
  }

  // A speed-up: tokens/s of `faster` over tokens/s of `slower`.
  void Ratio(const std::string& name, const std::string& model, int batch, double faster,
             double slower) {
    const double value = faster / slower;
    std::printf("ratio %-40s %-6s b=%-4d %6.3fx\n", name.c_str(), model.c_str(), batch, value);
    absl::StrAppend(&ratios_, ratios_.empty() ? "" : ",\n", "    {\"name\": \"", name,
                    "\", \"model\": \"", model, "\", \"batch\": ", batch, ", \"value\": ", value,
                    "}");
  }

  std::string Json(double bandwidth) const {
    return absl::StrCat("{\n  \"copy_bandwidth_gb_per_s\": ", bandwidth / 1e9, ",\n  \"rows\": [\n",
                        rows_, "\n  ],\n  \"ratios\": [\n", ratios_, "\n  ]\n}\n");
  }

 private:
  std::string rows_, ratios_;
};

// Decode and prefill of `preset` through ModelBench or KernelBench, graphs on then off.
absl::Status RunModel(const Args& args, const std::string& preset, bool real, double bandwidth,
                      Report* report) {
  ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(preset));
  if (args.layers > 0) config.num_layers = std::min(config.num_layers, args.layers);
  double graphs_on_b1 = 0;
  for (bool graphs : {true, false}) {
    CudaDeviceOptions o;
    o.storage = args.dtype;
    o.cuda_graphs = graphs;
    o.max_num_seqs = 256;
    o.max_context_len = std::max(args.context, kPrefill);
    o.max_num_batched_tokens = 2048;
    ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> d, CreateCudaDevice(o));
    // The real model or the written-out kernels: the same cells either way.
    CudaDevice* device = d.get();
    const int max_seqs = graphs ? 256 : 1;
    std::unique_ptr<ModelBench> model_bench;
    std::unique_ptr<KernelBench> kernel_bench;
    std::function<double(int, bool, int)> time;
    int64_t weight_bytes = 0;
    const double load_start = Now();
    if (real) {
      model_bench = std::make_unique<ModelBench>(preset, args.layers, max_seqs, args.context);
      RETURN_IF_ERROR(model_bench->Init(std::move(d)));
      weight_bytes = model_bench->model().DecodeWeightBytes();
      time = [&](int n, bool prefill, int steps) { return model_bench->Time(n, prefill, steps); };
    } else {
      kernel_bench = std::make_unique<KernelBench>(config, device, max_seqs, args.context);
      RETURN_IF_ERROR(kernel_bench->Init());
      weight_bytes = kernel_bench->weight_bytes();
      time = [&](int n, bool prefill, int steps) { return kernel_bench->Time(n, prefill, steps); };
    }
    std::printf("# %s: %s, graphs %s, weights ready in %.1f s\n", preset.c_str(),
                real ? "real LlamaModel" : "kernel sequence", graphs ? "on" : "off",
                Now() - load_start);
    Report::Row r;
    r.section = real ? "model" : "kernels";
    r.model = preset;
    r.layers = config.num_layers;
    r.graphs = graphs;
    r.batch = 1;
    r.cell = graphs ? "decode b=1 graphs" : "decode b=1 no-graphs";
    r.seconds = time(1, false, args.steps);
    r.tokens = 1;
    r.mbu = weight_bytes / r.seconds / bandwidth;
    r.note = absl::StrCat("MBU ", static_cast<int>(r.mbu * 100 + 0.5), "% (", weight_bytes >> 20,
                          " MiB/step)");
    report->Add(r);
    RETURN_IF_ERROR(device->status());
    if (graphs) {
      graphs_on_b1 = r.seconds;
    } else {
      report->Ratio("graphs on/off decode", preset, 1, 1 / graphs_on_b1, 1 / r.seconds);
      continue;
    }
    r.mbu = -1;
    r.note.clear();
    for (int b : {8, 64, 256}) {
      r.batch = b;
      r.cell = absl::StrCat("decode b=", b);
      r.seconds = time(b, false, args.steps);
      r.tokens = b;
      report->Add(r);
    }
    r.batch = 1;
    r.cell = absl::StrCat("prefill ", kPrefill);
    r.seconds = time(kPrefill, true, 3);
    r.tokens = kPrefill;
    report->Add(r);
    RETURN_IF_ERROR(device->status());
  }
  return absl::OkStatus();
}

// The engine in its three configurations (see the header), every batch of --engine-batches.
absl::Status RunEngine(const Args& args, const std::string& preset,
                       const std::vector<int32_t>& batches, Report* report) {
  struct Config {
    const char* name;
    DeviceSampling sampling;
    AsyncStep async;
  };
  const Config configs[] = {{"device-sampling async", DeviceSampling::kOn, AsyncStep::kOn},
                            {"device-sampling sync", DeviceSampling::kOn, AsyncStep::kOff},
                            {"host-sampling sync", DeviceSampling::kOff, AsyncStep::kOff}};
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  // tokens/s per configuration, per batch.
  std::vector<std::vector<double>> speed(3, std::vector<double>(batches.size(), 0));
  for (int c = 0; c < 3; ++c) {
    const double load_start = Now();
    ASSIGN_OR_RETURN(std::unique_ptr<EngineBench> bench,
                     EngineBench::Create(preset, args.dtype, /*graphs=*/true, configs[c].sampling,
                                         configs[c].async, std::max(max_batch, 1),
                                         args.engine_prompt + args.steps + 64));
    std::printf("# %s engine, %s: samples on device %s, async %s, ready in %.1f s\n",
                preset.c_str(), configs[c].name, bench->engine().samples_on_device() ? "yes" : "no",
                bench->engine().steps_async() ? "yes" : "no", Now() - load_start);
    for (size_t i = 0; i < batches.size(); ++i) {
      double tokens_per_step = 0;
      ASSIGN_OR_RETURN(double seconds,
                       bench->Time(batches[i], args.engine_prompt, args.steps, &tokens_per_step));
      Report::Row r;
      r.section = "engine";
      r.model = preset;
      r.layers = bench->engine().model_config().num_layers;
      r.batch = batches[i];
      r.graphs = true;
      r.sampling = bench->engine().samples_on_device() ? "device" : "host";
      r.async = bench->engine().steps_async();
      r.cell = absl::StrCat("decode b=", batches[i], " ", configs[c].name);
      r.seconds = seconds;
      r.tokens = tokens_per_step;
      if (tokens_per_step != batches[i]) {
        r.note = absl::StrCat(tokens_per_step, " tokens/step (preempted?)");
      }
      report->Add(r);
      speed[c][i] = tokens_per_step / seconds;
    }
    if (auto* cuda = dynamic_cast<CudaDevice*>(&bench->engine().model().device())) {
      RETURN_IF_ERROR(cuda->status());
    }
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    report->Ratio("device/host sampling (sync)", preset, batches[i], speed[1][i], speed[2][i]);
    report->Ratio("async on/off (device sampling)", preset, batches[i], speed[0][i], speed[1][i]);
  }
  return absl::OkStatus();
}

void WriteJson(const std::string& path, const std::string& text) {
  if (!path.empty()) std::ofstream(path) << text;
}

int Run(const Args& args) {
  std::vector<int32_t> batches;
  if (absl::Status s = ParseIntList(args.engine_batches, "--engine-batches", &batches); !s.ok()) {
    std::fprintf(stderr, "carpool-bench-gpu-model: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (kernels::cuda::DeviceCount() == 0) {
    std::printf("carpool-bench-gpu-model: skipped: no CUDA device visible\n");
    WriteJson(args.json, "{\"skipped\": \"no CUDA device visible\"}\n");
    return 77;
  }
  absl::StatusOr<double> bw = CopyBandwidth();
  if (!bw.ok()) {
    std::fprintf(stderr, "copy bandwidth: %s\n", bw.status().ToString().c_str());
    return 1;
  }
  std::printf("device-to-device copy bandwidth: %.0f GB/s (read + write)\n", *bw / 1e9);
  std::printf("%-8s %-6s %-7s %-34s %12s %12s\n", "section", "model", "layers", "cell", "ms/step",
              "tokens/s");
  Report report;
  const absl::flat_hash_set<std::string> real_presets =
      absl::StrSplit(args.real_model, ',', absl::SkipEmpty());
  int rc = 0;
  for (absl::string_view preset : absl::StrSplit(args.presets, ',', absl::SkipEmpty())) {
    const std::string p(preset);
    if (absl::Status s = RunModel(args, p, real_presets.contains(p), *bw, &report); !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", p.c_str(), s.ToString().c_str());
      rc = 1;
    }
  }
  for (absl::string_view preset : absl::StrSplit(args.engine_presets, ',', absl::SkipEmpty())) {
    const std::string p(preset);
    if (absl::Status s = RunEngine(args, p, batches, &report); !s.ok()) {
      std::fprintf(stderr, "%s engine: %s\n", p.c_str(), s.ToString().c_str());
      rc = 1;
    }
  }
  WriteJson(args.json, report.Json(*bw));
  return rc;
}

}  // namespace
}  // namespace carpool::worker

int main(int argc, char** argv) {
  carpool::worker::Args args;
  carpool::FlagParser p;
  p.AddString("presets", &args.presets, "synthetic presets, comma-separated");
  p.AddString("real-model", &args.real_model,
              "presets run through the real LlamaModel over host-generated weights; the others "
              "run the kernel sequence over weights filled on the device");
  p.AddString("engine-presets", &args.engine_presets,
              "presets run through the whole Engine (device vs host sampling, async on/off); "
              "empty: none");
  p.AddString("engine-batches", &args.engine_batches, "batch sizes of the engine rows");
  p.AddInt("engine-prompt", &args.engine_prompt, "prompt tokens of each engine request");
  p.AddInt("layers", &args.layers, "keep only this many layers; 0: all");
  p.AddInt("steps", &args.steps, "timed steps per cell");
  p.AddInt("context", &args.context, "context of every decode sequence");
  p.AddCustom(
      "dtype",
      [&args](const std::string& v) -> absl::Status {
        absl::StatusOr<carpool::worker::StorageType> t = carpool::worker::ParseStorageType(v);
        if (!t.ok()) return t.status();
        args.dtype = *t;
        return absl::OkStatus();
      },
      "bfloat16, float16 or float32", carpool::worker::StorageTypeFlagName(args.dtype));
  p.AddString("json", &args.json, "write the rows here");
  if (absl::Status s = p.Parse(argc, argv, 1); !s.ok()) {
    std::fprintf(stderr, "carpool-bench-gpu-model: %s\n%s", std::string(s.message()).c_str(),
                 p.Help().c_str());
    return 2;
  }
  return carpool::worker::Run(args);
}
