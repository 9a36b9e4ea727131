#include "worker/model/fake_async_device.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace carpool::worker {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

template <typename T>
uint64_t MixSpan(uint64_t h, absl::Span<const T> s) {
  for (const T& v : s) h = Mix(h, static_cast<uint64_t>(v));
  return Mix(h, s.size());
}

// splitmix64: the token a computing-free device draws for (seed, position).
uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Whether [a, a + an) and [b, b + bn) (bytes) share memory.
template <typename A, typename B>
bool Overlap(absl::Span<const A> a, absl::Span<const B> b) {
  if (a.empty() || b.empty()) return false;
  const auto* a0 = reinterpret_cast<const char*>(a.data());
  const auto* b0 = reinterpret_cast<const char*>(b.data());
  return a0 < b0 + b.size() * sizeof(B) && b0 < a0 + a.size() * sizeof(A);
}

}  // namespace

FakeAsyncDevice::FakeAsyncDevice(std::unique_ptr<ModelDevice> inner,
                                 const FakeAsyncDeviceOptions& options, FakeDeviceLog* log)
    : inner_(std::move(inner)), options_(options), log_(log), sampler_(std::max(options.vocab, 1)) {
  CARPOOL_CHECK(options.vocab >= 1);
  CARPOOL_CHECK(log != nullptr);
}

FakeAsyncDevice::~FakeAsyncDevice() = default;

StorageType FakeAsyncDevice::storage_type() const {
  return inner_ != nullptr ? inner_->storage_type() : StorageType::kF32;
}

StorageType FakeAsyncDevice::kv_storage_type() const {
  return inner_ != nullptr ? inner_->kv_storage_type() : StorageType::kF32;
}

absl::StatusOr<DeviceArray> FakeAsyncDevice::Weight(const Tensor& host) {
  if (inner_ != nullptr) return inner_->Weight(host);
  return DeviceArray(nullptr, nullptr, host.numel());
}

absl::StatusOr<DeviceArray> FakeAsyncDevice::NormWeight(const Tensor& host) {
  if (inner_ != nullptr) return inner_->NormWeight(host);
  return DeviceArray(nullptr, nullptr, host.numel());
}

absl::StatusOr<DeviceArray> FakeAsyncDevice::Allocate(int64_t numel) {
  if (inner_ != nullptr) return inner_->Allocate(numel);
  return DeviceArray(nullptr, nullptr, numel);
}

absl::StatusOr<DeviceArray> FakeAsyncDevice::AllocateKv(int64_t numel) {
  if (inner_ != nullptr) return inner_->AllocateKv(numel);
  return DeviceArray(nullptr, nullptr, numel);
}

void FakeAsyncDevice::Reserve(DeviceArray* a, int64_t numel) {
  if (inner_ != nullptr) {
    inner_->Reserve(a, numel);
  } else if (a->numel() < numel) {
    *a = DeviceArray(nullptr, nullptr, numel);
  }
}

void FakeAsyncDevice::SetRope(absl::Span<const float> inv_freq, absl::Span<const float> local) {
  if (inner_ != nullptr) inner_->SetRope(inv_freq, local);
}

uint64_t FakeAsyncDevice::Checksum(const StepView& v) {
  uint64_t h = 0;
  h = MixSpan(h, v.token_ids);
  h = MixSpan(h, v.positions);
  h = MixSpan(h, v.slots);
  h = MixSpan(h, v.sample_rows);
  for (const kernels::AttentionSeq& s : v.seqs) {
    h = Mix(h, static_cast<uint64_t>(s.query_start));
    h = Mix(h, static_cast<uint64_t>(s.query_len));
    h = Mix(h, static_cast<uint64_t>(s.context_len));
    const int blocks = (s.context_len + v.block_size - 1) / v.block_size;
    for (int b = 0; b < blocks; ++b) h = Mix(h, static_cast<uint64_t>(s.block_table[b]));
  }
  return h;
}

void FakeAsyncDevice::Violation(std::string note) {
  ++log_->violations;
  log_->violation_notes.push_back(std::move(note));
}

void FakeAsyncDevice::SetStep(const StepView& view) {
  if (!view.async) {
    for (int32_t id : view.token_ids) {
      if (id < 0) Violation("a synchronous step has a placeholder token id");
    }
    if (inner_ != nullptr) inner_->SetStep(view);
    return;
  }
  if (!options_.async) Violation("an asynchronous step on a device that said it has none");
  if (in_flight_.size() >= 2) {
    Violation(absl::StrCat("step ", next_step_, " launched with ", in_flight_.size(),
                           " steps in flight"));
  }
  for (InFlight& f : in_flight_) {
    const StepView& o = f.view;
    if (Overlap(view.token_ids, o.token_ids) || Overlap(view.positions, o.positions) ||
        Overlap(view.slots, o.slots) || Overlap(view.seqs, o.seqs) ||
        Overlap(view.sample_rows, o.sample_rows)) {
      Violation(absl::StrCat("step ", next_step_, "'s inputs share memory with step ", f.step,
                             ", still in flight"));
      // Its memory now holds the new step (or was freed): not checked again.
      f.clobbered = true;
    }
  }
  InFlight f;
  f.step = next_step_++;
  f.view = view;
  f.checksum = Checksum(view);
  in_flight_.push_back(std::move(f));
  // The device's gather: placeholders become the previous step's sampled tokens.
  resolved_ids_.assign(view.token_ids.begin(), view.token_ids.end());
  for (int32_t& id : resolved_ids_) {
    if (id >= 0) continue;
    const int row = PendingTokenRow(id);
    if (row >= static_cast<int>(previous_.size())) {
      Violation(
          absl::StrCat("placeholder for row ", row, " of a step that sampled ", previous_.size()));
      id = 0;
      continue;
    }
    id = previous_[row].token;
    ++log_->gathered_tokens;
  }
  if (inner_ != nullptr) {
    StepView resolved = view;
    resolved.token_ids = resolved_ids_;
    inner_->SetStep(resolved);
  }
}

void FakeAsyncDevice::EmbeddingGather(const DeviceArray& table, int64_t h, DeviceArray* out) {
  if (inner_ != nullptr) inner_->EmbeddingGather(table, h, out);
}
void FakeAsyncDevice::RmsNorm(const DeviceArray& x, const DeviceArray& w, float eps, int64_t rows,
                              int64_t h, DeviceArray* out) {
  if (inner_ != nullptr) inner_->RmsNorm(x, w, eps, rows, h, out);
}
void FakeAsyncDevice::AddRmsNorm(const DeviceArray& x, DeviceArray* residual, const DeviceArray& w,
                                 float eps, int64_t rows, int64_t h, DeviceArray* out) {
  if (inner_ != nullptr) inner_->AddRmsNorm(x, residual, w, eps, rows, h, out);
}
void FakeAsyncDevice::Linear(const DeviceArray& x, const DeviceArray& w, const DeviceArray& bias,
                             int64_t m, int64_t n, int64_t k, DeviceArray* y) {
  if (inner_ != nullptr) inner_->Linear(x, w, bias, m, n, k, y);
}
void FakeAsyncDevice::Rope(int num_heads, int head_dim, bool local, DeviceArray* x) {
  if (inner_ != nullptr) inner_->Rope(num_heads, head_dim, local, x);
}
void FakeAsyncDevice::HeadRmsNorm(const DeviceArray& w, float eps, int64_t rows, int num_heads,
                                  int head_dim, DeviceArray* x) {
  if (inner_ != nullptr) inner_->HeadRmsNorm(w, eps, rows, num_heads, head_dim, x);
}
void FakeAsyncDevice::SiluMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows,
                              int64_t inter, DeviceArray* out) {
  if (inner_ != nullptr) inner_->SiluMul(gate, up, rows, inter, out);
}
void FakeAsyncDevice::GeluTanhMul(const DeviceArray& gate, const DeviceArray& up, int64_t rows,
                                  int64_t inter, DeviceArray* out) {
  if (inner_ != nullptr) inner_->GeluTanhMul(gate, up, rows, inter, out);
}
void FakeAsyncDevice::SoftCap(float cap, int64_t n, DeviceArray* x) {
  if (inner_ != nullptr) inner_->SoftCap(cap, n, x);
}
void FakeAsyncDevice::Scale(float factor, int64_t n, DeviceArray* x) {
  if (inner_ != nullptr) inner_->Scale(factor, n, x);
}
void FakeAsyncDevice::WriteKv(const DeviceArray& k, const DeviceArray& v,
                              const kernels::KvCacheLayout& layout, DeviceArray* key_cache,
                              DeviceArray* value_cache) {
  if (inner_ != nullptr) inner_->WriteKv(k, v, layout, key_cache, value_cache);
}
void FakeAsyncDevice::Attention(const DeviceArray& q, const DeviceArray& key_cache,
                                const DeviceArray& value_cache,
                                const kernels::KvCacheLayout& layout, int num_heads,
                                const AttentionOptions& options, DeviceArray* out) {
  if (inner_ != nullptr) {
    inner_->Attention(q, key_cache, value_cache, layout, num_heads, options, out);
  }
}
void FakeAsyncDevice::GatherRows(const DeviceArray& x, int64_t h, DeviceArray* out) {
  if (inner_ != nullptr) inner_->GatherRows(x, h, out);
}
int FakeAsyncDevice::GraphBatchSize(int num_seqs) const {
  return inner_ != nullptr ? inner_->GraphBatchSize(num_seqs) : 0;
}
void FakeAsyncDevice::RunStep(const std::function<void()>& body) {
  if (inner_ != nullptr) {
    inner_->RunStep(body);
  } else {
    body();
  }
}

void FakeAsyncDevice::ToHost(const DeviceArray& x, int64_t offset, int64_t n, float* host) {
  if (inner_ != nullptr) {
    inner_->ToHost(x, offset, n, host);
  } else {
    std::fill_n(host, n, 0.0f);
  }
}

void FakeAsyncDevice::FromHost(const float* host, int64_t offset, int64_t n, DeviceArray* x) {
  if (inner_ != nullptr) inner_->FromHost(host, offset, n, x);
}

void FakeAsyncDevice::Draw(const DeviceArray& logits, int64_t vocab,
                           absl::Span<const SampleRequest> requests, bool resolve,
                           std::vector<SampleResult>* out) {
  const int64_t n = static_cast<int64_t>(requests.size());
  out->assign(n, SampleResult());
  if (inner_ == nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t seed = requests[i].params->has_seed ? requests[i].params->seed : 0;
      (*out)[i].token = static_cast<int32_t>(
          SplitMix(seed ^ SplitMix(static_cast<uint64_t>(requests[i].position))) %
          static_cast<uint64_t>(vocab));
    }
    return;
  }
  host_logits_.resize(n * vocab);
  if (n > 0) inner_->ToHost(logits, 0, n * vocab, host_logits_.data());
  if (static_cast<int64_t>(resolved_outputs_.size()) < n) resolved_outputs_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const SampleRequest& r = requests[i];
    SampleInput in;
    in.logits = host_logits_.data() + i * vocab;
    in.params = r.params;
    in.prompt_tokens = r.prompt_tokens;
    in.output_tokens = r.output_tokens;
    in.position = r.position;
    // The penalties' history: a placeholder is the previous step's token, as for the ids.
    const bool has_placeholder = std::any_of(r.output_tokens.begin(), r.output_tokens.end(),
                                             [](int32_t t) { return t < 0; });
    if (has_placeholder) {
      if (!resolve) Violation("a synchronous sample request has a placeholder token");
      const bool penalized = r.params->repetition_penalty != 1.0f ||
                             r.params->frequency_penalty != 0.0f ||
                             r.params->presence_penalty != 0.0f;
      if (penalized && !options_.samples_pending_penalties) {
        Violation(
            "a placeholder in a penalized request's output tokens on a device that does "
            "not gather them");
      }
      std::vector<int32_t>& tokens = resolved_outputs_[i];
      tokens.assign(r.output_tokens.begin(), r.output_tokens.end());
      for (int32_t& t : tokens) {
        if (t >= 0) continue;
        const int row = PendingTokenRow(t);
        t = row < static_cast<int>(previous_.size()) ? previous_[row].token : 0;
      }
      in.output_tokens = tokens;
    }
    (*out)[i] = sampler_.Sample(in);
  }
}

int64_t FakeAsyncDevice::ScheduleDeviceTime() {
  const int64_t start = std::max(NowMicros(), device_free_at_);
  device_free_at_ = start + options_.step_micros;
  return device_free_at_;
}

void FakeAsyncDevice::SleepUntil(int64_t micros) {
  const int64_t now = NowMicros();
  if (micros <= now) return;
  std::this_thread::sleep_for(std::chrono::microseconds(micros - now));
  log_->wait_micros += NowMicros() - now;
}

void FakeAsyncDevice::Sample(const DeviceArray& logits, int64_t vocab,
                             absl::Span<const SampleRequest> requests,
                             std::vector<SampleResult>* out) {
  if (!in_flight_.empty()) Violation("a synchronous step while asynchronous ones are in flight");
  ++log_->sync_steps;
  SleepUntil(ScheduleDeviceTime());
  Draw(logits, vocab, requests, /*resolve=*/false, out);
}

void FakeAsyncDevice::SampleAsync(const DeviceArray& logits, int64_t vocab,
                                  absl::Span<const SampleRequest> requests) {
  if (in_flight_.empty()) {
    Violation("SampleAsync without an asynchronous SetStep");
    return;
  }
  InFlight& f = in_flight_.back();
  // Computed now (the inner device already ran the step's kernels); visible at done_at.
  Draw(logits, vocab, requests, /*resolve=*/true, &f.samples);
  previous_ = f.samples;
  f.done_at = ScheduleDeviceTime();
  ++log_->async_steps;
  log_->events.push_back({FakeDeviceLog::Kind::kLaunch, f.step});
}

void FakeAsyncDevice::FinishSample(std::vector<SampleResult>* out) {
  if (in_flight_.empty()) {
    Violation("FinishSample with no step in flight");
    out->clear();
    return;
  }
  InFlight& f = in_flight_.front();
  SleepUntil(f.done_at);
  if (!f.clobbered && Checksum(f.view) != f.checksum) {
    Violation(absl::StrCat("step ", f.step, "'s inputs changed while it was in flight"));
  }
  log_->events.push_back({FakeDeviceLog::Kind::kFinish, f.step});
  *out = std::move(f.samples);
  in_flight_.pop_front();
}

}  // namespace carpool::worker
