#include "worker/engine_loop.h"

#include <pthread.h>

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

void EngineLoop::Run() {
  BlockTerminationSignals();
  bool stalled = false;  // work queued but the last step ran nothing (static batching waits)
  for (;;) {
    const int wait = !backend_->has_unfinished() ? idle_wait_ms_ : (stalled ? 1 : 0);
    DrainInbox(wait);
    stalled = backend_->has_unfinished() && !StepOnce();
    load_->Publish(backend_->Load());
    if (draining_ && !backend_->has_unfinished()) break;
  }
  if (absl::Status s = pair_->Send({kTagDone}); !s.ok()) {
    Log("engine: cannot report done: ", s.ToString());
  }
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
  } else if (const auto* c = std::get_if<WorkerCancelInfo>(&*m)) {
    backend_->Cancel(c->request_id);
  }
}

void EngineLoop::OnEpoch(uint64_t epoch) {
  epoch_ = epoch;
  if (epoch == 0) return;
  if (owner_epoch_ != 0 && owner_epoch_ != epoch) {
    // The router gave up this worker's old registration and with it these requests.
    backend_->CancelAll();
  }
  owner_epoch_ = epoch;
  // The router forgets a registration's prefix blocks: tell the new one everything held.
  SendKvEvents(/*snapshot=*/true);
}

void EngineLoop::SendKvEvents(bool snapshot) {
  std::optional<KvEventsInfo> kv = backend_->TakeKvEvents(snapshot, Clock::Real()->NowMicros());
  if (!kv.has_value()) return;
  kv->epoch = epoch_;
  SendToRouter(*kv);
}

void EngineLoop::OnDispatch(const DispatchInfo& d) {
  // Dispatches that arrive after a drain are refused by the I/O thread and never get here.
  const absl::Status s = backend_->Add(d);
  if (s.ok()) return;
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    Fail(d.request_id, s.code(), reason::kInvalidArgument, std::string(s.message()));
  } else {
    Fail(d.request_id, absl::StatusCode::kInternal, reason::kInternal, s.ToString());
  }
}

bool EngineLoop::StepOnce() {
  std::vector<TokenEvent> events = backend_->Step();
  if (events.empty()) return false;
  // Before the step: a router that reads a request's final already knows its cached prefix.
  SendKvEvents(/*snapshot=*/false);
  StepTokensInfo step;
  step.epoch = epoch_;
  step.events = std::move(events);
  step.load = backend_->Load();
  SendToRouter(step);
  return true;
}

void EngineLoop::Fail(uint64_t request_id, absl::StatusCode code, const char* reason,
                      std::string message) {
  RequestFailedInfo f;
  f.epoch = epoch_;
  f.request_id = request_id;
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
