#include "worker/engine_loop.h"

#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/clock.h"
#include "common/codec.h"

namespace carpool::worker::internal {
namespace {

// Signals go to the I/O thread, whose poll tolerates EINTR.
void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace

DynamicBatcherOptions EngineLoopOptions::DefaultEmbedOptions() {
  DynamicBatcherOptions o;
  o.max_batch_size = 32;
  o.max_wait_micros = 2'000;
  o.max_concurrent_batches = 1;
  o.max_queue_size = 1024;
  return o;
}

EngineLoop::EngineLoop(Backend* backend, Socket* pair, SharedLoad* load,
                       const EngineLoopOptions& options)
    : backend_(backend),
      pair_(pair),
      load_(load),
      idle_wait_ms_(options.idle_wait_ms),
      embed_options_(options.embed),
      clock_(options.embed.clock != nullptr ? options.embed.clock : Clock::Real()),
      described_(backend->Describe()) {
  if (backend_->embed_dim() <= 0) return;
  absl::StatusOr<std::unique_ptr<EmbedBatcher>> batcher = EmbedBatcher::Create(embed_options_);
  if (!batcher.ok()) {
    // WorkerServerOptions::Validate has checked the options; embed dispatches fail if not.
    Log("engine: embeddings disabled: ", batcher.status().ToString());
    return;
  }
  embedder_ = *std::move(batcher);
}

EngineLoop::~EngineLoop() {
  embeds_.clear();  // the batcher's last callbacks (UNAVAILABLE) find nothing to answer
  embedder_.reset();
}

void EngineLoop::Run() {
  BlockTerminationSignals();
  bool stalled = false;  // work queued but the last step ran nothing (static batching waits)
  for (;;) {
    DrainInbox(WaitMs(stalled));
    stalled = backend_->has_unfinished() && !StepOnce();
    RunEmbedBatch();  // at most one between two steps
    load_->Publish(CurrentLoad());
    PublishEmbedBatcher();
    if (draining_ && !backend_->has_unfinished() && embeds_.empty()) break;
  }
  if (absl::Status s = pair_->Send({kTagDone}); !s.ok()) {
    Log("engine: cannot report done: ", s.ToString());
  }
}

int EngineLoop::WaitMs(bool stalled) const {
  int64_t wait = !backend_->has_unfinished() ? idle_wait_ms_ : (stalled ? 1 : 0);
  if (embedder_ != nullptr && wait > 0) {
    if (std::optional<int64_t> due = embedder_->NextDeadline(); due.has_value()) {
      const int64_t micros = *due - clock_->NowMicros();
      wait = micros <= 0 ? 0 : std::min(wait, (micros + 999) / 1000);
    }
  }
  return static_cast<int>(wait);
}

void EngineLoop::DrainInbox(int timeout_ms) {
  for (int i = 0; i < kMaxFramesPerWake; ++i) {
    absl::StatusOr<std::optional<Frames>> frames = pair_->Recv(i == 0 ? timeout_ms : 0);
    if (!frames.ok()) {
      Log("engine: inbox: ", frames.status().ToString());
      return;
    }
    if (!frames->has_value()) return;
    Handle(**frames);
  }
}

void EngineLoop::Handle(const Frames& f) {
  if (f.size() == 2 && f[0] == kTagRouter) {
    HandleRouterFrame(f[1]);
  } else if (f.size() == 2 && f[0] == kTagEpoch) {
    uint64_t epoch = 0;
    if (absl::SimpleAtoi(f[1], &epoch)) OnEpoch(epoch);
  } else if (f.size() == 1 && f[0] == kTagDrain) {
    draining_ = true;
  }
}

void EngineLoop::HandleRouterFrame(const std::string& frame) {
  absl::StatusOr<RouterMessage> m = DecodeRouterMessage(frame);
  if (!m.ok()) return;  // the I/O thread has checked it already
  if (const auto* d = std::get_if<DispatchInfo>(&*m)) {
    OnDispatch(*d);
  } else if (auto* e = std::get_if<EmbedDispatchInfo>(&*m)) {
    OnEmbedDispatch(std::move(*e));
  } else if (const auto* c = std::get_if<WorkerCancelInfo>(&*m)) {
    backend_->Cancel(c->dispatch_id);
    CancelEmbed(c->dispatch_id);
  }
}

void EngineLoop::OnEpoch(uint64_t epoch) {
  epoch_ = epoch;
  // Epoch 0: the router does not know this registration (it restarted, or declared us dead),
  // so it holds none of these requests. Drop them now: a restarted router numbers epochs and
  // dispatches from 1 again, so waiting for a *different* epoch would let an old dispatch
  // answer (or collide with) a new one of the same id.
  if (owner_epoch_ != 0 && owner_epoch_ != epoch) {
    // The router gave up this worker's old registration and with it these requests.
    backend_->CancelAll();
    std::vector<uint64_t> embeds;
    for (const auto& [id, job] : embeds_) embeds.push_back(id);
    for (uint64_t id : embeds) CancelEmbed(id);
  }
  owner_epoch_ = epoch;
  // The I/O thread drops what was stamped before this: the next router may number its epochs
  // and dispatches as the lost one did, and an old request's tokens would pass for a new one's.
  (void)pair_->Send({kTagEpochSeen, absl::StrCat(epoch)});
  if (epoch == 0) return;
  // The router forgets a registration's prefix blocks: tell the new one everything held.
  SendKvEvents(/*snapshot=*/true);
}

void EngineLoop::SendKvEvents(bool snapshot) {
  std::optional<KvEventsInfo> kv = backend_->TakeKvEvents(snapshot);
  if (!kv.has_value()) return;
  kv->epoch = epoch_;
  SendToRouter(*kv);
}

void EngineLoop::OnDispatch(const DispatchInfo& d) {
  // Dispatches that arrive after a drain are refused by the I/O thread and never get here.
  const absl::Status s = backend_->Add(d);
  if (s.ok()) return;
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    Fail(d.dispatch_id, s.code(), reason::kInvalidArgument, std::string(s.message()));
  } else {
    Fail(d.dispatch_id, absl::StatusCode::kInternal, reason::kInternal, s.ToString());
  }
}

absl::Status EngineLoop::CheckEmbedDispatch(const EmbedDispatchInfo& d) const {
  if (embedder_ == nullptr) {
    return absl::InvalidArgumentError(
        "this worker cannot compute embeddings (it registered embed_queue_size 0)");
  }
  if (embeds_.contains(d.dispatch_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", d.dispatch_id, " is already running on this worker"));
  }
  if (d.inputs.empty()) return absl::InvalidArgumentError("embed request has no inputs");
  if (static_cast<int64_t>(d.inputs.size()) > embed_options_.max_queue_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("embed request has ", d.inputs.size(),
                     " inputs; this worker's embed queue holds ", embed_options_.max_queue_size));
  }
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const std::vector<int32_t>& tokens = d.inputs[i];
    if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("input ", i, " is empty"));
    if (described_.max_model_len > 0 &&
        static_cast<int64_t>(tokens.size()) > described_.max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, " has ", tokens.size(),
                                                     " tokens; max_model_len is ",
                                                     described_.max_model_len));
    }
    for (size_t j = 0; j < tokens.size(); ++j) {
      if (tokens[j] < 0 || (described_.vocab_size > 0 && tokens[j] >= described_.vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", i, ": token ", j, " has id ", tokens[j],
                         ", outside the vocabulary [0, ", described_.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

void EngineLoop::OnEmbedDispatch(EmbedDispatchInfo d) {
  if (absl::Status s = CheckEmbedDispatch(d); !s.ok()) {
    Fail(d.dispatch_id, s.code(), reason::kInvalidArgument, std::string(s.message()));
    return;
  }
  const int64_t queued = embedder_->Stats().queued;
  const int64_t n = static_cast<int64_t>(d.inputs.size());
  if (queued + n > embed_options_.max_queue_size) {
    embed_refused_inputs_ += n;
    Fail(d.dispatch_id, absl::StatusCode::kResourceExhausted, reason::kQueueFull,
         absl::StrCat("embed queue is full: ", queued, " of ", embed_options_.max_queue_size,
                      " inputs queued, the request has ", n));
    return;
  }
  EmbedJob& job = embeds_[d.dispatch_id];
  job.results.resize(d.inputs.size());
  job.remaining = d.inputs.size();
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    EmbeddingInput input;
    input.tokens = std::move(d.inputs[i]);
    input.pooling = d.pooling;
    input.normalize = d.normalize;
    const uint64_t id = d.dispatch_id;
    absl::StatusOr<EmbedBatcher::Ticket> ticket =
        embedder_->Submit(std::move(input), [this, id, i](absl::StatusOr<std::vector<float>> r) {
          OnEmbedResult(id, i, std::move(r));
        });
    if (!ticket.ok()) {  // not expected after the check above: nothing else fills the queue
      CancelEmbed(id);
      Fail(id, absl::StatusCode::kResourceExhausted, reason::kQueueFull,
           std::string(ticket.status().message()));
      return;
    }
    embeds_[id].tickets.push_back(*ticket);
  }
}

void EngineLoop::OnEmbedResult(uint64_t dispatch_id, size_t index,
                               absl::StatusOr<std::vector<float>> r) {
  auto it = embeds_.find(dispatch_id);
  if (it == embeds_.end()) return;  // cancelled, or failed by another input
  if (!r.ok()) {
    // Report once, and drop the other inputs still queued.
    CancelEmbed(dispatch_id);
    const bool invalid = r.status().code() == absl::StatusCode::kInvalidArgument;
    Fail(dispatch_id, invalid ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kInternal,
         invalid ? reason::kInvalidArgument : reason::kInternal,
         absl::StrCat("embedding input ", index, " of the request failed: ",
                      invalid ? std::string(r.status().message()) : r.status().ToString()));
    return;
  }
  EmbedJob& job = it->second;
  job.results[index] = *std::move(r);
  if (--job.remaining > 0) return;
  EmbedDoneInfo done;
  done.epoch = epoch_;
  done.dispatch_id = dispatch_id;
  done.embeddings = std::move(job.results);
  embeds_.erase(it);
  SendToRouter(done);
}

void EngineLoop::CancelEmbed(uint64_t dispatch_id) {
  auto it = embeds_.find(dispatch_id);
  if (it == embeds_.end()) return;
  const std::vector<EmbedBatcher::Ticket> tickets = std::move(it->second.tickets);
  embeds_.erase(it);  // first: Cancel runs the CANCELLED callbacks right here
  for (EmbedBatcher::Ticket t : tickets) embedder_->Cancel(t);
}

bool EngineLoop::RunEmbedBatch() {
  if (embedder_ == nullptr) return false;
  std::optional<EmbedBatcher::Batch> batch = embedder_->TryTakeBatch(clock_->NowMicros());
  if (!batch.has_value()) return false;
  absl::StatusOr<std::vector<std::vector<float>>> results =
      backend_->EmbedBatch(batch->requests());
  embedder_->Complete(*std::move(batch), std::move(results));
  return true;
}

WorkerLoad EngineLoop::CurrentLoad() const {
  WorkerLoad l = backend_->Load();
  l.embed_queued = embedder_ == nullptr ? 0 : static_cast<int>(embedder_->Stats().queued);
  return l;
}

void EngineLoop::PublishEmbedBatcher() {
  if (embedder_ == nullptr) return;
  const DynamicBatcherStats stats = embedder_->Stats();
  EmbedBatcherCounters c;
  c.submitted = stats.submitted;
  c.refused = stats.refused + embed_refused_inputs_;
  c.timed_out = stats.timed_out;
  c.cancelled = stats.cancelled;
  c.answered = stats.answered;
  c.failed = stats.failed;
  c.batches = stats.batches;
  c.batch_size_counts = stats.batch_size_counts;
  c.max_batch_size = embed_options_.max_batch_size;
  c.queue_wait_count = stats.queue_wait_count;
  c.queue_wait_sum_micros = stats.queue_wait_sum_micros;
  if (published_embed_ == c) return;
  load_->PublishEmbedBatcher(c);
  published_embed_ = std::move(c);
}

bool EngineLoop::StepOnce() {
  std::vector<TokenEvent> events = backend_->Step();
  // Before the step's message: a router that reads a request's final already knows its cached
  // prefix. Also after a step that produced no tokens (a prefill chunk): what it evicted is
  // told at once.
  SendKvEvents(/*snapshot=*/false);
  if (events.empty()) return false;
  StepTokensInfo step;
  step.epoch = epoch_;
  step.events = std::move(events);
  step.load = CurrentLoad();
  SendToRouter(step);
  return true;
}

void EngineLoop::Fail(uint64_t dispatch_id, absl::StatusCode code, const char* reason,
                      std::string message) {
  RequestFailedInfo f;
  f.epoch = epoch_;
  f.dispatch_id = dispatch_id;
  f.error.code = code;
  f.error.reason = reason;
  f.error.message = std::move(message);
  SendToRouter(f);
}

void EngineLoop::SendToRouter(const WorkerMessage& message) {
  if (epoch_ == 0) return;
  const absl::Status s = pair_->Send({kTagSend, absl::StrCat(epoch_), Encode(message)});
  if (!s.ok() && ShouldLogCount(++send_failures_)) {
    Log("engine: dropped ", send_failures_, " message(s) to the I/O thread: ", s.ToString());
  }
}

}  // namespace carpool::worker::internal
