#include "worker/engine_flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/linear_int8.h"

namespace carpool::worker {

void RegisterEngineFlags(FlagParser* p, EngineOptions* o) {
  o->scheduler.max_model_len = 0;  // the model's unless set
  p->AddString("model", &o->model, "synthetic:<tiny|small|1b|8b> or a Hugging Face folder");
  p->AddInt("block-size", &o->block_size, "tokens per KV block");
  p->AddInt("num-kv-blocks", &o->num_kv_blocks, "KV pool size in blocks; 0: from memory");
  p->AddBytes("kv-cache-memory", &o->kv_cache_memory_bytes,
              "KV pool size in bytes, e.g. 512MiB; 0: on the CPU max-num-seqs full-length "
              "sequences, at most 1GiB, on a GPU what --gpu-memory-utilization leaves");
  p->AddInt("max-num-batched-tokens", &o->scheduler.max_num_batched_tokens,
            "token budget of one step");
  p->AddInt("max-num-seqs", &o->scheduler.max_num_seqs, "sequences in one step");
  p->AddInt("max-model-len", &o->scheduler.max_model_len,
            "longest prompt + output; 0: the model's max_position_embeddings");
  p->AddCustom(
      "scheduler",
      [o](const std::string& v) {
        if (v == "continuous") {
          o->scheduler.policy = SchedulerPolicy::kContinuous;
        } else if (v == "static") {
          o->scheduler.policy = SchedulerPolicy::kStatic;
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("--scheduler must be continuous or static, got '", v, "'"));
        }
        return absl::OkStatus();
      },
      "continuous or static (baseline: whole batches, nobody joins)",
      o->scheduler.policy == SchedulerPolicy::kStatic ? "static" : "continuous");
  p->AddBool("enable-chunked-prefill", &o->scheduler.enable_chunked_prefill,
             "split long prompts over steps");
  p->AddBool("enable-prefix-caching", &o->enable_prefix_caching, "reuse cached prompt blocks");
  p->AddCustom(
      "static-batch-timeout-ms",
      [o](const std::string& v) {
        double ms;
        if (!absl::SimpleAtod(v, &ms) || !(ms >= 0)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--static-batch-timeout-ms must be a number >= 0, got '", v, "'"));
        }
        o->scheduler.static_batch_timeout_micros = static_cast<int64_t>(ms * 1000);
        return absl::OkStatus();
      },
      "static scheduler: how long to collect a batch",
      absl::StrCat(o->scheduler.static_batch_timeout_micros / 1000.0));
  p->AddInt("threads", &o->num_threads, "kernel threads; 0: one per core");
  p->AddCustom(
      "device-sampling",
      [o](const std::string& v) -> absl::Status {
        if (v == "auto") {
          o->device_sampling = DeviceSampling::kAuto;
        } else if (v == "on") {
          o->device_sampling = DeviceSampling::kOn;
        } else if (v == "off") {
          o->device_sampling = DeviceSampling::kOff;
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("--device-sampling must be auto, on or off, got '", v, "'"));
        }
        return absl::OkStatus();
      },
      "auto, on or off: sample on the GPU, copying back only the ids and logprobs (auto: on a "
      "GPU, alone or under --tp-transport nccl), or copy the logits to the host and sample there",
      DeviceSamplingName(o->device_sampling));
  p->AddCustom(
      "async-step",
      [o](const std::string& v) -> absl::Status {
        if (v == "auto") {
          o->async_step = AsyncStep::kAuto;
        } else if (v == "on") {
          o->async_step = AsyncStep::kOn;
        } else if (v == "off") {
          o->async_step = AsyncStep::kOff;
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("--async-step must be auto, on or off, got '", v, "'"));
        }
        return absl::OkStatus();
      },
      "auto, on or off: schedule and upload step N + 1 while the device runs step N (auto: "
      "where the device can, a GPU that samples on the device without tensor parallelism), or "
      "finish each step before scheduling the next",
      AsyncStepName(o->async_step));
  // Binaries use the GPU when there is one, and pick the storage types by --dtype auto.
  o->device.kind = DeviceKind::kAuto;
  o->device.dtype = std::nullopt;
  RegisterDeviceFlags(p, &o->device);
}

void RegisterDeviceFlags(FlagParser* p, DeviceOptions* o) {
  p->AddCustom(
      "device",
      [o](const std::string& v) -> absl::Status {
        absl::StatusOr<DeviceKind> kind = ParseDeviceKind(v);
        if (!kind.ok()) return kind.status();
        o->kind = *kind;
        return absl::OkStatus();
      },
      "cpu, cuda or auto: cuda when this build has CUDA and a GPU is visible",
      DeviceKindName(o->kind));
  p->AddInt("gpu", &o->gpu_index,
            "CUDA device index; -1: the local rank under mpirun/srun modulo the GPU count, "
            "else 0");
  p->AddCustom(
      "dtype",
      [o](const std::string& v) -> absl::Status {
        absl::StatusOr<std::optional<StorageType>> t = ParseDtypeFlag(v);
        if (!t.ok()) return t.status();
        o->dtype = *t;
        return absl::OkStatus();
      },
      "auto, bfloat16, float16 or float32: on a GPU the storage type of weights, activations "
      "and KV cache (auto: bfloat16); on the CPU that of the weights, float32 or bfloat16 "
      "(auto: bfloat16 for a BF16 checkpoint, else float32)",
      DtypeFlagName(o->dtype));
  p->AddCustom(
      "quantization",
      [o](const std::string& v) -> absl::Status {
        absl::StatusOr<Quantization> q = ParseQuantization(v);
        if (!q.ok()) return q.status();
        o->quantization = *q;
        return absl::OkStatus();
      },
      absl::StrCat("none or int8: int8 weights with a scale per group of ",
                   kernels::cpu::kInt8Group,
                   " along K, quantized at load from any checkpoint (the CPU only)"),
      QuantizationName(o->quantization));
  p->AddCustom(
      "kv-cache-dtype",
      [o](const std::string& v) -> absl::Status {
        absl::StatusOr<std::optional<StorageType>> t = ParseKvCacheDtypeFlag(v);
        if (!t.ok()) return t.status();
        o->kv_cache_dtype = *t;
        return absl::OkStatus();
      },
      "auto, bfloat16 or float32: the CPU's KV cache (auto: bfloat16 when the weights are "
      "bfloat16 or int8, else float32; bfloat16 holds twice the tokens in --kv-cache-memory); "
      "a GPU's is its --dtype",
      DtypeFlagName(o->kv_cache_dtype));
  p->AddDouble("gpu-memory-utilization", &o->gpu_memory_utilization,
               "fraction of GPU memory the worker fills; the KV pool gets what the weights and "
               "activations leave");
  p->AddBool("cuda-graphs", &o->cuda_graphs,
             "replay decode steps as CUDA graphs at padded batch sizes (--no-cuda-graphs "
             "turns them off)");
  p->AddCustom(
      "tp-transport",
      [o](const std::string& v) -> absl::Status {
        absl::StatusOr<TpTransport> t = ParseTpTransport(v);
        if (!t.ok()) return t.status();
        o->tp_transport = *t;
        return absl::OkStatus();
      },
      "auto, mpi or nccl: how a tensor-parallel group's sums and logits travel; nccl on the "
      "GPUs' buffers, mpi through host memory (auto: nccl when every rank has a GPU)",
      TpTransportName(o->tp_transport));
}

}  // namespace carpool::worker
