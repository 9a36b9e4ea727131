// carpool-bench-gpu-model: Llama decode and prefill on one GPU through CudaDevice, compared
// within one run.
//
//   carpool-bench-gpu-model [--presets 1b,8b] [--real-model 1b] [--layers N] [--steps N]
//                           [--context N] [--dtype bfloat16|float16|float32] [--json PATH]
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
// Exit status 1 without a CUDA device or on a CUDA error.
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
    ASSIGN_OR_RETURN(model_, LlamaModel::Create(std::move(w),
                                                {prefill_base_ + kPrefill / 16, 16}, nullptr,
                                                std::move(device)));
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
  int layers = 0;
  int steps = 10;
  int context = 512;
  StorageType dtype = StorageType::kBF16;
  std::string json;
};

int Run(const Args& args) {
  if (kernels::cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "carpool-bench-gpu-model: no CUDA device\n");
    return 1;
  }
  absl::StatusOr<double> bw = CopyBandwidth();
  if (!bw.ok()) {
    std::fprintf(stderr, "copy bandwidth: %s\n", bw.status().ToString().c_str());
    return 1;
  }
  std::printf("device-to-device copy bandwidth: %.0f GB/s (read + write)\n", *bw / 1e9);
  std::printf("%-6s %-7s %-22s %12s %12s\n", "model", "layers", "cell", "ms/step", "tokens/s");
  std::string json = "[\n";
  auto row = [&](const std::string& model, int layers, const std::string& cell, double sec,
                 double tokens, const std::string& extra) {
    std::printf("%-6s %-7d %-22s %12.3f %12.0f %s\n", model.c_str(), layers, cell.c_str(),
                sec * 1e3, tokens / sec, extra.c_str());
    std::fflush(stdout);
    absl::StrAppend(&json, json.size() > 2 ? ",\n" : "", "  {\"model\": \"", model,
                    "\", \"layers\": ", layers, ", \"cell\": \"", cell,
                    "\", \"ms_per_step\": ", sec * 1e3, ", \"tokens_per_s\": ", tokens / sec, "}");
  };
  const absl::flat_hash_set<std::string> real_presets =
      absl::StrSplit(args.real_model, ',', absl::SkipEmpty());
  for (absl::string_view preset : absl::StrSplit(args.presets, ',')) {
    absl::StatusOr<ModelConfig> config = SyntheticConfig(std::string(preset));
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
      return 1;
    }
    if (args.layers > 0) config->num_layers = std::min(config->num_layers, args.layers);
    for (bool graphs : {true, false}) {
      CudaDeviceOptions o;
      o.storage = args.dtype;
      o.cuda_graphs = graphs;
      o.max_num_seqs = 256;
      o.max_context_len = std::max(args.context, kPrefill);
      o.max_num_batched_tokens = 2048;
      absl::StatusOr<std::unique_ptr<CudaDevice>> d = CreateCudaDevice(o);
      if (!d.ok()) {
        std::fprintf(stderr, "%s\n", d.status().ToString().c_str());
        return 1;
      }
      // The real model or the written-out kernels: the same cells either way.
      CudaDevice* device = d->get();
      const int max_seqs = graphs ? 256 : 1;
      std::unique_ptr<ModelBench> real;
      std::unique_ptr<KernelBench> kernels;
      std::function<double(int, bool, int)> time;
      int64_t weight_bytes = 0;
      const double load_start = Now();
      if (real_presets.contains(std::string(preset))) {
        real = std::make_unique<ModelBench>(std::string(preset), args.layers, max_seqs,
                                            args.context);
        if (absl::Status s = real->Init(std::move(*d)); !s.ok()) {
          std::fprintf(stderr, "%s: %s\n", std::string(preset).c_str(), s.ToString().c_str());
          return 1;
        }
        weight_bytes = real->model().DecodeWeightBytes();
        time = [&](int n, bool prefill, int steps) { return real->Time(n, prefill, steps); };
      } else {
        kernels = std::make_unique<KernelBench>(*config, device, max_seqs, args.context);
        if (absl::Status s = kernels->Init(); !s.ok()) {
          std::fprintf(stderr, "%s: %s\n", std::string(preset).c_str(), s.ToString().c_str());
          return 1;
        }
        weight_bytes = kernels->weight_bytes();
        time = [&](int n, bool prefill, int steps) { return kernels->Time(n, prefill, steps); };
      }
      std::printf("# %s: %s, weights ready in %.1f s\n", std::string(preset).c_str(),
                  real != nullptr ? "real LlamaModel" : "kernel sequence", Now() - load_start);
      const std::string model(preset);
      const double one = time(1, false, args.steps);
      const double mbu = weight_bytes / one / *bw;
      row(model, config->num_layers, graphs ? "decode b=1 graphs" : "decode b=1 no-graphs", one, 1,
          absl::StrCat("MBU ", static_cast<int>(mbu * 100 + 0.5), "% (", weight_bytes >> 20,
                       " MiB/step)"));
      if (!graphs) continue;
      for (int b : {8, 64, 256}) {
        row(model, config->num_layers, absl::StrCat("decode b=", b),
            time(b, false, args.steps), b, "");
      }
      row(model, config->num_layers, absl::StrCat("prefill ", kPrefill),
          time(kPrefill, true, 3), kPrefill, "");
      if (!device->status().ok()) {
        std::fprintf(stderr, "%s\n", device->status().ToString().c_str());
        return 1;
      }
    }
  }
  absl::StrAppend(&json, "\n]\n");
  if (!args.json.empty()) std::ofstream(args.json) << json;
  return 0;
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
