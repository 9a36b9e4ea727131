#include "router/testing/sim_fleet.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <iostream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/block_hash.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/messages.h"
#include "common/transport.h"

namespace carpool::router::testing {
namespace {

constexpr int64_t kRegisterRetryMicros = 1'000'000;
constexpr int kMaxFramesPerWake = 64;
constexpr int kMaxPollMillis = 20;
constexpr int kStopLingerMillis = 1000;

int64_t NowMicros() { return Clock::Real()->NowMicros(); }

// SplitMix64's finalizer: a well-mixed 64-bit function of x.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t PromptHash(absl::Span<const int32_t> prompt) {
  return internal::Xxh64(prompt.data(), prompt.size() * sizeof(int32_t));
}

int32_t TokenOf(uint64_t prompt_hash, int position) {
  return 32 + static_cast<int32_t>(Mix(prompt_hash ^ Mix(static_cast<uint64_t>(position))) % 95);
}

struct Running {
  uint64_t dispatch_id = 0;
  uint64_t prompt_hash = 0;
  int next = 0;  // output position of its next token
  int max_tokens = 0;
  int cached_prompt_tokens = 0;
};

}  // namespace

absl::Status SimFleetOptions::Validate() const {
  auto bad = [](const char* field, int64_t value, const char* need) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimFleetOptions.", field, " must be ", need, ", got ", value));
  };
  if (router.empty()) return absl::InvalidArgumentError("SimFleetOptions.router is required");
  if (workers < 1 || workers > 100000) return bad("workers", workers, "in [1, 100000]");
  if (max_num_seqs < 1) return bad("max_num_seqs", max_num_seqs, ">= 1");
  if (num_kv_blocks < 1) return bad("num_kv_blocks", num_kv_blocks, ">= 1");
  if (block_size < 1) return bad("block_size", block_size, ">= 1");
  if (max_model_len < 1) return bad("max_model_len", max_model_len, ">= 1");
  if (step_ms < 0) return bad("step_ms", step_ms, ">= 0");
  if (heartbeat_ms < 1) return bad("heartbeat_ms", heartbeat_ms, ">= 1");
  if (router_lost_ms < 0) return bad("router_lost_ms", router_lost_ms, ">= 0");
  if (cached_blocks < 0 || cached_blocks > num_kv_blocks) {
    return bad("cached_blocks", cached_blocks, "in [0, num_kv_blocks]");
  }
  if (threads < 1 || threads > 64) return bad("threads", threads, "in [1, 64]");
  return absl::OkStatus();
}

int32_t SimToken(absl::Span<const int32_t> prompt, int position) {
  return TokenOf(PromptHash(prompt), position);
}

std::vector<int32_t> SimTokens(absl::Span<const int32_t> prompt, int n) {
  const uint64_t h = PromptHash(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(TokenOf(h, i));
  return out;
}

// One simulated worker: its socket, registration, requests and prefix cache.
struct SimFleet::Worker {
  int index = 0;
  std::unique_ptr<Socket> socket;
  RegisterInfo info;
  uint64_t epoch = 0;
  bool register_pending = false;
  int64_t register_sent = 0;
  int64_t next_beat = 0;
  int64_t next_step = 0;
  bool draining = false;
  bool deregistered = false;
  std::vector<Running> running;

  // The prefix cache: the random blocks it started with that are still held, [prefill_evicted,
  // cached_blocks) by index (never touched by a prompt, so the oldest, evicted first), and the
  // prompt blocks, least recently used first: `order` holds (hash, stamp) pairs, of which only
  // the one whose stamp `stamp_of` holds is live.
  int prefill_evicted = 0;
  absl::flat_hash_map<uint64_t, uint64_t> stamp_of;
  std::deque<std::pair<uint64_t, uint64_t>> order;
  uint64_t next_stamp = 1;
  // Changes not reported yet; a hash stored and evicted again before the report is in neither.
  std::vector<uint64_t> stored;
  absl::flat_hash_set<uint64_t> stored_set;
  std::vector<uint64_t> removed;
};

struct SimFleet::Shard {
  // Declared before the sockets (in `workers`), so it is destroyed after them.
  zmq::context_t context;
  std::vector<Worker> workers;
  std::thread thread;
};

namespace {

// The hash of the i-th random block worker `w` started with.
uint64_t PrefillHash(uint64_t seed, int worker, int i) {
  return Mix(Mix(seed ^ (static_cast<uint64_t>(worker) << 32)) + static_cast<uint64_t>(i)) | 1;
}

}  // namespace

SimFleet::SimFleet(const SimFleetOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<SimFleet>> SimFleet::Start(const SimFleetOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<SimFleet> fleet(new SimFleet(options));
  const int threads = std::min(options.threads, options.workers);
  for (int t = 0; t < threads; ++t) fleet->shards_.push_back(std::make_unique<Shard>());
  for (int t = 0; t < threads; ++t) {
    Shard& shard = *fleet->shards_[t];
    const int mine = (options.workers - t + threads - 1) / threads;
    shard.context.set(zmq::ctxopt::max_sockets, mine + 16);
    shard.workers.resize(mine);
    for (int k = 0; k < mine; ++k) {
      Worker& w = shard.workers[k];
      w.index = t + k * threads;
      SocketOptions so;
      so.routing_id = fleet->WorkerId(w.index);
      so.reconnect_ivl_ms = 100;
      so.reconnect_ivl_max_ms = 2000;
      // The worker's own connection watch (worker_server.cc): the router answers these PINGs.
      if (options.router_lost_ms > 0) {
        so.zmtp_heartbeat_ms = std::max(1, options.router_lost_ms / 3);
        so.zmtp_heartbeat_timeout_ms = options.router_lost_ms;
      }
      auto socket = Socket::Create(&shard.context, zmq::socket_type::dealer, so);
      if (!socket.ok()) return socket.status();
      w.socket = std::move(*socket);
      if (absl::Status s = w.socket->Connect(options.router); !s.ok()) return s;
      RegisterInfo& reg = w.info;
      reg.worker_id = so.routing_id;
      reg.model = options.model;
      reg.max_num_seqs = options.max_num_seqs;
      reg.num_kv_blocks = options.num_kv_blocks;
      reg.block_size = options.block_size;
      reg.max_model_len = options.max_model_len;
      reg.vocab_size = 300;
      reg.tokenizer = TokenizerKind::kByte;
      reg.bos_token_id = 256;
    }
  }
  fleet->per_worker_ = std::make_unique<std::atomic<int64_t>[]>(options.workers);
  for (auto& shard : fleet->shards_) {
    Shard* s = shard.get();
    s->thread = std::thread([f = fleet.get(), s] { f->Serve(s); });
  }
  return fleet;
}

SimFleet::~SimFleet() { Stop(/*deregister=*/true); }

void SimFleet::Stop(bool deregister) {
  std::call_once(stopped_, [&] {
    deregister_on_stop_.store(deregister);
    stop_.store(true);
    for (auto& shard : shards_) {
      if (shard->thread.joinable()) shard->thread.join();
    }
    // The contexts wait (up to the linger) for the deregistrations to go out.
    shards_.clear();
  });
}

bool SimFleet::WaitRegistered(int timeout_ms) const {
  const int64_t give_up = NowMicros() + int64_t{timeout_ms} * 1000;
  while (registered_.load() < options_.workers) {
    if (NowMicros() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::string SimFleet::WorkerId(int i) const { return absl::StrCat(options_.id_prefix, "-", i); }

SimFleetCounters SimFleet::counters() const {
  SimFleetCounters c;
  c.registered = registered_.load();
  c.deregistered = deregistered_.load();
  c.registrations = registrations_.load();
  c.dispatches = dispatches_.load();
  c.cancels = cancels_.load();
  c.refused = refused_.load();
  c.tokens = tokens_.load();
  c.finished = finished_.load();
  c.heartbeats = heartbeats_.load();
  c.kv_events = kv_events_.load();
  for (int i = 0; i < options_.workers; ++i) c.dispatches_per_worker.push_back(per_worker_[i]);
  return c;
}

std::vector<SimDispatch> SimFleet::dispatches() const {
  std::lock_guard<std::mutex> lock(record_mu_);
  return record_;
}

// ---- one shard's thread

void SimFleet::Send(Worker& w, const WorkerMessage& m) {
  // A full queue or a connection not up yet: dropped, as a worker's I/O thread would; the
  // registration is retried and heartbeats are periodic.
  (void)w.socket->Send({Encode(m)});
}

int SimFleet::Held(const Worker& w) const {
  return options_.cached_blocks - w.prefill_evicted + static_cast<int>(w.stamp_of.size());
}

void SimFleet::EvictOne(Worker& w) {
  uint64_t h = 0;
  if (w.prefill_evicted < options_.cached_blocks) {
    h = PrefillHash(options_.seed, w.index, w.prefill_evicted++);
  } else {
    for (;;) {
      const auto [hash, stamp] = w.order.front();
      w.order.pop_front();
      auto it = w.stamp_of.find(hash);
      if (it == w.stamp_of.end() || it->second != stamp) continue;  // touched since
      w.stamp_of.erase(it);
      h = hash;
      break;
    }
  }
  if (w.stored_set.erase(h) == 0) w.removed.push_back(h);
}

void SimFleet::StoreBlock(Worker& w, uint64_t h) {
  auto it = w.stamp_of.find(h);
  if (it != w.stamp_of.end()) {
    it->second = w.next_stamp;
    w.order.emplace_back(h, w.next_stamp++);
  } else {
    while (Held(w) >= options_.num_kv_blocks) EvictOne(w);
    w.stamp_of.emplace(h, w.next_stamp);
    w.order.emplace_back(h, w.next_stamp++);
    if (w.stored_set.insert(h).second) w.stored.push_back(h);
  }
  // Touches leave dead entries behind: rebuild the order once they outnumber the live ones.
  if (w.order.size() > 2 * w.stamp_of.size() + 1024) {
    std::vector<std::pair<uint64_t, uint64_t>> live;
    for (const auto& [hash, stamp] : w.stamp_of) live.emplace_back(stamp, hash);
    std::sort(live.begin(), live.end());
    w.order.clear();
    for (const auto& [stamp, hash] : live) w.order.emplace_back(hash, stamp);
  }
}

void SimFleet::SendKvChanges(Worker& w) {
  if (w.epoch == 0) return;
  KvEventsInfo k;
  k.epoch = w.epoch;
  for (uint64_t h : w.stored) {
    if (w.stored_set.contains(h)) k.stored.push_back(h);
  }
  k.removed = std::move(w.removed);
  w.stored.clear();
  w.stored_set.clear();
  w.removed.clear();
  if (k.stored.empty() && k.removed.empty()) return;
  Send(w, k);
  ++kv_events_;
}

void SimFleet::SendKvSnapshot(Worker& w) {
  KvEventsInfo k;
  k.epoch = w.epoch;
  k.reset = true;
  k.stored.reserve(Held(w));
  for (int i = w.prefill_evicted; i < options_.cached_blocks; ++i) {
    k.stored.push_back(PrefillHash(options_.seed, w.index, i));
  }
  for (const auto& [hash, stamp] : w.order) {
    auto it = w.stamp_of.find(hash);
    if (it != w.stamp_of.end() && it->second == stamp) k.stored.push_back(hash);
  }
  w.stored.clear();
  w.stored_set.clear();
  w.removed.clear();
  Send(w, k);
  ++kv_events_;
}

void SimFleet::SendRegister(Worker& w, int64_t now) {
  Send(w, w.info);
  w.register_pending = true;
  w.register_sent = now;
}

void SimFleet::SetEpoch(Worker& w, uint64_t epoch) {
  if ((w.epoch == 0) != (epoch == 0)) registered_ += epoch == 0 ? -1 : 1;
  w.epoch = epoch;
}

void SimFleet::OnFrame(Worker& w, const std::string& frame, int64_t now) {
  absl::StatusOr<RouterMessage> m = DecodeRouterMessage(frame);
  if (!m.ok()) {
    std::cerr << "sim-fleet: " << WorkerId(w.index) << ": bad frame: " << m.status().message()
              << "\n";
    return;
  }
  if (w.deregistered) return;
  if (const auto* ack = std::get_if<RegisterAckInfo>(&*m)) {
    if (ack->epoch == 0) {
      // The router does not know this registration: register again (once per pending one).
      if (w.epoch == 0 && w.register_pending) return;
      SetEpoch(w, 0);
      w.running.clear();
      SendRegister(w, now);
      return;
    }
    if (ack->epoch == w.epoch) return;
    // A new registration: the router gave up whatever the old one held.
    SetEpoch(w, ack->epoch);
    ++registrations_;
    w.register_pending = false;
    w.running.clear();
    w.next_beat = now + int64_t{options_.heartbeat_ms} * 1000;
    SendKvSnapshot(w);
  } else if (const auto* d = std::get_if<DispatchInfo>(&*m)) {
    if (w.epoch == 0) return;
    if (w.draining) {
      RequestFailedInfo f;
      f.epoch = w.epoch;
      f.dispatch_id = d->dispatch_id;
      f.error.code = absl::StatusCode::kUnavailable;
      f.error.reason = reason::kDraining;
      f.error.message = "worker is draining";
      Send(w, f);
      ++refused_;
      return;
    }
    OnDispatch(w, *d, now);
  } else if (const auto* c = std::get_if<WorkerCancelInfo>(&*m)) {
    cancels_ += static_cast<int64_t>(std::erase_if(
        w.running, [&](const Running& r) { return r.dispatch_id == c->dispatch_id; }));
  } else if (std::holds_alternative<DrainInfo>(*m)) {
    w.draining = true;
  }
}

void SimFleet::OnDispatch(Worker& w, const DispatchInfo& d, int64_t now) {
  const std::vector<uint64_t> chain =
      PromptBlockHashes(d.prompt_tokens, options_.block_size, d.cache_salt);
  int matched = 0;
  while (matched < static_cast<int>(chain.size()) && w.stamp_of.contains(chain[matched])) {
    ++matched;
  }
  for (uint64_t h : chain) StoreBlock(w, h);
  if (w.running.empty()) w.next_step = now + int64_t{options_.step_ms} * 1000;
  w.running.push_back({d.dispatch_id, PromptHash(d.prompt_tokens),
                       static_cast<int>(d.output_tokens.size()), d.sampling.max_tokens,
                       matched * options_.block_size});
  ++dispatches_;
  ++per_worker_[w.index];
  if (options_.record_dispatches) {
    std::lock_guard<std::mutex> lock(record_mu_);
    record_.push_back({w.index, d.dispatch_id, d.prompt_tokens,
                       static_cast<int>(d.output_tokens.size())});
  }
}

void SimFleet::Step(Worker& w, int64_t now) {
  // As a worker does: the step's KV changes before its tokens.
  SendKvChanges(w);
  StepTokensInfo step;
  step.epoch = w.epoch;
  for (Running& r : w.running) {
    TokenEvent e;
    e.dispatch_id = r.dispatch_id;
    e.has_token = true;
    e.token.token = TokenOf(r.prompt_hash, r.next);
    ++r.next;
    e.finished = r.next >= r.max_tokens;
    if (e.finished) {
      e.finish_reason = "length";
      e.cached_prompt_tokens = r.cached_prompt_tokens;
    }
    step.events.push_back(std::move(e));
  }
  tokens_ += static_cast<int64_t>(step.events.size());
  finished_ += static_cast<int64_t>(
      std::erase_if(w.running, [](const Running& r) { return r.next >= r.max_tokens; }));
  step.load = Load(w);
  Send(w, step);
  w.next_step = now + int64_t{options_.step_ms} * 1000;
}

WorkerLoad SimFleet::Load(const Worker& w) const {
  WorkerLoad load;
  load.running = static_cast<int>(w.running.size());
  load.kv_used_blocks = Held(w);
  load.kv_free_blocks = options_.num_kv_blocks - load.kv_used_blocks;
  return load;
}

int64_t SimFleet::Tick(Worker& w, int64_t now) {
  if (w.deregistered) return INT64_MAX;
  if (w.epoch == 0) {
    if (!w.register_pending || now - w.register_sent >= kRegisterRetryMicros) {
      SendRegister(w, now);
    }
    return w.register_sent + kRegisterRetryMicros;
  }
  if (!w.running.empty() && now >= w.next_step) Step(w, now);
  if (w.draining && w.running.empty()) {
    SendKvChanges(w);
    Send(w, DeregisterInfo{w.epoch});
    SetEpoch(w, 0);
    w.deregistered = true;
    ++deregistered_;
    return INT64_MAX;
  }
  if (now >= w.next_beat) {
    Send(w, HeartbeatInfo{w.epoch, Load(w)});
    ++heartbeats_;
    w.next_beat = now + int64_t{options_.heartbeat_ms} * 1000;
  }
  return w.running.empty() ? w.next_beat : std::min(w.next_beat, w.next_step);
}

void SimFleet::Serve(Shard* shard) {
  std::vector<PollItem> items;
  for (Worker& w : shard->workers) items.push_back({w.socket.get()});
  // Spread the first heartbeats over one interval, so they do not arrive in bursts.
  const int64_t start = NowMicros();
  const auto n = static_cast<int64_t>(options_.workers);
  for (Worker& w : shard->workers) {
    w.next_beat = start + int64_t{options_.heartbeat_ms} * 1000 * w.index / n;
  }
  int64_t next_wake = start;
  while (!stop_.load(std::memory_order_relaxed)) {
    const int64_t wait = std::clamp<int64_t>((next_wake - NowMicros() + 999) / 1000, 0,
                                             kMaxPollMillis);
    absl::StatusOr<PollResult> readable = Poll(items, static_cast<int>(wait));
    if (!readable.ok()) {
      std::cerr << "sim-fleet: poll: " << readable.status().message() << "\n";
      break;
    }
    int64_t now = NowMicros();
    for (size_t i = 0; i < items.size(); ++i) {
      if (!(*readable)[i]) continue;
      Worker& w = shard->workers[i];
      for (int k = 0; k < kMaxFramesPerWake; ++k) {
        absl::StatusOr<std::optional<Frames>> frames = w.socket->Recv(0);
        if (!frames.ok() || !frames->has_value()) break;
        if ((*frames)->size() == 1) OnFrame(w, (**frames)[0], now);
      }
    }
    now = NowMicros();
    next_wake = now + int64_t{kMaxPollMillis} * 1000;
    for (Worker& w : shard->workers) next_wake = std::min(next_wake, Tick(w, now));
  }
  for (Worker& w : shard->workers) {
    if (deregister_on_stop_.load() && w.epoch > 0) {
      Send(w, DeregisterInfo{w.epoch});
      (void)w.socket->SetLinger(kStopLingerMillis);
    }
    if (w.epoch > 0) SetEpoch(w, 0);
  }
}

}  // namespace carpool::router::testing
