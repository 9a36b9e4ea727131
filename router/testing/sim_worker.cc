#include "router/testing/sim_worker.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "common/codec.h"

namespace carpool::router::testing {
namespace {

int64_t NowMicros() { return Clock::Real()->NowMicros(); }

struct Running {
  uint64_t dispatch_id = 0;
  int left = 0;
};

}  // namespace

SimWorker::SimWorker(const std::string& backend, const SimWorkerOptions& options)
    : options_(options) {
  thread_ = std::thread([this, backend] { Run(backend); });
}

SimWorker::~SimWorker() {
  stop_.store(true);
  thread_.join();
}

std::map<int, int64_t> SimWorker::dispatch_times() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dispatch_times_;
}

int SimWorker::dispatches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dispatches_;
}

void SimWorker::Run(std::string backend) {
  zmq::context_t context;
  SocketOptions so;
  so.routing_id = options_.id;
  auto socket = Socket::Create(&context, zmq::socket_type::dealer, so);
  if (!socket.ok() || !(*socket)->Connect(backend).ok()) return;
  Socket& s = **socket;
  RegisterInfo reg;
  reg.worker_id = options_.id;
  reg.model = "sim";
  reg.max_num_seqs = options_.max_num_seqs;
  reg.num_kv_blocks = options_.num_kv_blocks;
  reg.block_size = options_.block_size;
  reg.max_model_len = options_.max_model_len;
  reg.vocab_size = 300;
  reg.tokenizer = TokenizerKind::kByte;
  reg.bos_token_id = 256;
  (void)s.Send({Encode(WorkerMessage(reg))});
  uint64_t epoch = 0;
  std::vector<Running> running;
  int64_t next_step = NowMicros();
  int64_t next_beat = NowMicros();
  while (!stop_.load()) {
    auto frames = s.Recv(1);
    if (frames.ok() && frames->has_value() && (*frames)->size() == 1) {
      auto m = DecodeRouterMessage((**frames)[0]);
      if (m.ok()) {
        if (auto* ack = std::get_if<RegisterAckInfo>(&*m)) {
          if (ack->epoch == 0) {
            running.clear();
            (void)s.Send({Encode(WorkerMessage(reg))});
          }
          epoch = ack->epoch;
        } else if (auto* d = std::get_if<DispatchInfo>(&*m)) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            dispatch_times_.emplace(Tag(d->prompt_tokens), NowMicros());
            ++dispatches_;
          }
          running.push_back(
              {d->dispatch_id,
               d->sampling.max_tokens - static_cast<int>(d->output_tokens.size())});
        } else if (auto* c = std::get_if<WorkerCancelInfo>(&*m)) {
          std::erase_if(running, [&](const Running& r) { return r.dispatch_id == c->dispatch_id; });
        }
      }
    }
    const int64_t now = NowMicros();
    if (epoch > 0 && now >= next_beat) {
      WorkerLoad load;
      load.running = static_cast<int>(running.size());
      (void)s.Send({Encode(WorkerMessage(HeartbeatInfo{epoch, load}))});
      next_beat = now + 100'000;
    }
    if (now < next_step) continue;
    next_step = now + options_.step_ms * 1000;
    if (running.empty() || epoch == 0) continue;
    StepTokensInfo step;
    step.epoch = epoch;
    for (Running& r : running) {
      TokenEvent e;
      e.dispatch_id = r.dispatch_id;
      e.has_token = true;
      e.token.token = 1;
      e.finished = --r.left <= 0;
      if (e.finished) e.finish_reason = "length";
      step.events.push_back(e);
    }
    std::erase_if(running, [](const Running& r) { return r.left <= 0; });
    step.load.running = static_cast<int>(running.size());
    (void)s.Send({Encode(WorkerMessage(step))});
  }
}

std::vector<int32_t> TaggedPrompt(int tag, int length) {
  std::vector<int32_t> p = {tag / 256, tag % 256};
  while (static_cast<int>(p.size()) < length) p.push_back(7);
  return p;
}

int Tag(const std::vector<int32_t>& prompt) {
  return prompt.size() >= 2 ? prompt[0] * 256 + prompt[1] : -1;
}

std::map<std::string, Outcome> Drive(const std::string& frontend,
                                     const std::vector<Scripted>& script, int timeout_ms,
                                     const SocketOptions& socket_options) {
  std::map<std::string, Outcome> out;
  zmq::context_t context;
  auto socket = Socket::Create(&context, zmq::socket_type::dealer, socket_options);
  if (!socket.ok() || !(*socket)->Connect(frontend).ok()) return out;
  Socket& s = **socket;
  std::vector<Scripted> order = script;
  std::stable_sort(order.begin(), order.end(),
                   [](const Scripted& a, const Scripted& b) { return a.at_ms < b.at_ms; });
  const int64_t start = NowMicros();
  const int64_t give_up = start + int64_t{timeout_ms} * 1000;
  size_t next = 0;
  size_t ended = 0;
  while (ended < order.size() && NowMicros() < give_up) {
    const int64_t now = NowMicros();
    while (next < order.size() && start + order[next].at_ms * 1000 <= now) {
      Outcome& o = out[order[next].request.request_id];
      o.sent_micros = NowMicros();
      (void)s.Send({Encode(ClientMessage(order[next].request))});
      ++next;
    }
    int wait_ms = 5;
    if (next < order.size()) {
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          (start + order[next].at_ms * 1000 - NowMicros()) / 1000, 0, 5));
    }
    auto frames = s.Recv(wait_ms);
    if (!frames.ok() || !frames->has_value() || (*frames)->empty()) continue;
    auto m = DecodeServerMessage((*frames)->back());
    if (!m.ok()) continue;
    Outcome* o = nullptr;
    if (auto* f = std::get_if<GenerateFinalOut>(&*m)) {
      o = &out[f->request_id];
      o->ok = true;
      o->final = *f;
    } else if (auto* e = std::get_if<ErrorInfo>(&*m)) {
      o = &out[e->request_id];
      o->error = *e;
    }
    if (o != nullptr && !o->ended) {
      o->ended = true;
      o->ended_micros = NowMicros();
      ++ended;
    }
  }
  return out;
}

StatsOut QueryStats(const std::string& frontend, const std::string& api_key) {
  zmq::context_t context;
  auto socket = Socket::Create(&context, zmq::socket_type::dealer, SocketOptions());
  if (!socket.ok() || !(*socket)->Connect(frontend).ok()) return StatsOut();
  (void)(*socket)->Send({Encode(ClientMessage(StatsQuery{api_key}))});
  auto frames = (*socket)->Recv(5000);
  if (!frames.ok() || !frames->has_value()) return StatsOut();
  auto m = DecodeServerMessage((**frames)[0]);
  if (!m.ok() || !std::holds_alternative<StatsOut>(*m)) return StatsOut();
  return std::get<StatsOut>(*m);
}

}  // namespace carpool::router::testing
