// Router::Impl, worker side: dispatch, registrations, token relay, failover, stats.
#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/tokenizer.h"
#include "router/router_impl.h"

namespace carpool::router {
namespace {

double Millis(int64_t from, int64_t to) { return to > 0 ? (to - from) / 1000.0 : 0.0; }

int64_t CapacityTokens(const WorkerState& w) {
  return int64_t{w.info.num_kv_blocks} * std::max(0, w.info.block_size);
}

// TryDispatch passes over at most this many queued requests it finds no worker for, per call.
constexpr size_t kMaxUnplacedPerPass = 16;

}  // namespace

// ---- dispatch

void Router::Impl::TryDispatch() {
  if (registry_.empty()) return;
  std::vector<WorkerState*> workers;
  std::vector<WorkerSnapshot> snapshots;
  const bool affinity = options_.placement == PlacementPolicy::kPrefixAffinity;
  // A request no worker can take now is passed over: the ones behind it may go (by the rule of
  // AdmissionController::Next), up to a bound per call.
  absl::flat_hash_set<uint64_t> unplaced;
  const auto pass_over = [&](uint64_t id) {
    unplaced.insert(id);
    return unplaced.size() < kMaxUnplacedPerPass;
  };
  while (std::optional<uint64_t> id = admission_->Next(unplaced)) {
    Request& r = requests_.at(*id);
    if (!r.validated && !Validate(&r)) {
      End(*id);
      continue;
    }
    if (r.embed) {
      if (!TryDispatchEmbed(&r) && !pass_over(*id)) return;
      workers.clear();  // embed credit and load changed: fresh snapshots for the next one
      continue;
    }
    if (workers.empty()) {
      workers = registry_.Mutable();
      snapshots.resize(workers.size());
    }
    std::vector<uint64_t> chain;
    int chain_block_size = -1;
    for (size_t i = 0; i < workers.size(); ++i) {
      const WorkerState& w = *workers[i];
      snapshots[i] = {w.credit(), w.outstanding_tokens, CapacityTokens(w), 0};
      if (affinity && w.credit() > 0) {
        if (w.info.block_size != chain_block_size) {
          chain_block_size = w.info.block_size;
          chain = PromptBlockHashes(r.prompt, chain_block_size, r.cache_salt);
        }
        snapshots[i].cached_prefix_tokens =
            int64_t{prefix_index_.MatchedBlocks(w.identity, chain)} * w.info.block_size;
      }
    }
    PlacementInput in;
    in.request_tokens = static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens;
    in.cursor = placements_;
    in.random = rng_();
    in.affinity_load_weight = options_.affinity_load_weight;
    std::optional<int> pick = Place(options_.placement, snapshots, in);
    if (!pick) {
      if (!pass_over(*id)) return;
      continue;
    }
    admission_->MarkDispatched(*id);
    ++placements_;
    Dispatch(&r, workers[*pick], snapshots[*pick].cached_prefix_tokens);
  }
}

void Router::Impl::Dispatch(Request* r, WorkerState* w, int64_t cached_tokens) {
  r->worker = w->identity;
  r->dispatch_id = next_dispatch_id_++;
  dispatch_to_request_[r->dispatch_id] = r->id;
  if (r->dispatched == 0) r->dispatched = clock_->NowMicros();
  if (!w->busy()) w->last_progress_micros = clock_->NowMicros();  // the watchdog starts now
  // Work still to do: the prompt and the tokens already produced (recomputed on a resumed
  // stream) less what the worker's cache holds, plus the tokens left to generate.
  r->outstanding = std::max<int64_t>(
                       1, static_cast<int64_t>(r->prompt.size() + r->output.size()) -
                              cached_tokens) +
                   (r->sampling.max_tokens - static_cast<int64_t>(r->output.size()));
  w->requests.insert(r->id);
  w->outstanding_tokens += r->outstanding;
  if (r->migrations > 0) ++w->migrations_in;
  DispatchInfo d;
  d.dispatch_id = r->dispatch_id;
  d.prompt_tokens = r->prompt;
  for (const SampleResult& t : r->output) d.output_tokens.push_back(t.token);
  d.sampling = r->sampling;
  d.priority = r->priority;
  d.cache_salt = r->cache_salt;
  SendToWorker(w->identity, d);
}

bool Router::Impl::AnyWorkerCanEmbed() const {
  // A draining worker still serves embeddings: a request refused by it waits for credit (on
  // another worker, or a replacement) like a generate request, instead of "unsupported".
  for (const WorkerState* w : registry_.All()) {
    if (w->info.embed_queue_size > 0) return true;
  }
  return false;
}

bool Router::Impl::TryDispatchEmbed(Request* r) {
  if (!AnyWorkerCanEmbed()) {
    Fail(r->id, absl::StatusCode::kFailedPrecondition, kReasonUnsupported,
         "no worker of this cluster serves embeddings (embed_queue_size 0)");
    return true;
  }
  const int inputs = static_cast<int>(r->embed_tokens.size());
  std::vector<WorkerState*> workers = registry_.Mutable();
  int largest_queue = 0;
  for (const WorkerState* w : workers) {
    largest_queue = std::max(largest_queue, w->info.embed_queue_size);
  }
  if (inputs > largest_queue) {
    Fail(r->id, absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
         absl::StrCat("inputs has ", inputs, " entries; this cluster's workers embed at most ",
                      largest_queue, " at once (their embed_queue_size): split the request"));
    return true;
  }
  std::vector<WorkerSnapshot> snapshots(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    // No KV capacity check: an embed keeps no blocks once its forward pass is done.
    snapshots[i] = {workers[i]->HasEmbedCredit(inputs) ? 1 : 0,
                    workers[i]->outstanding_tokens, 0, 0};
  }
  PlacementInput in;
  in.request_tokens = r->embed_total_tokens;
  in.cursor = placements_;
  in.random = rng_();
  in.affinity_load_weight = options_.affinity_load_weight;
  std::optional<int> pick = Place(options_.placement, snapshots, in);
  if (!pick) return false;
  admission_->MarkDispatched(r->id);
  ++placements_;
  DispatchEmbed(r, workers[*pick]);
  return true;
}

void Router::Impl::DispatchEmbed(Request* r, WorkerState* w) {
  r->worker = w->identity;
  r->dispatch_id = next_dispatch_id_++;
  dispatch_to_request_[r->dispatch_id] = r->id;
  if (r->dispatched == 0) r->dispatched = clock_->NowMicros();
  if (!w->busy()) w->last_progress_micros = clock_->NowMicros();  // the watchdog starts now
  r->outstanding = r->embed_total_tokens;
  w->embeds.insert(r->id);
  w->embed_inputs += static_cast<int>(r->embed_tokens.size());
  w->outstanding_tokens += r->outstanding;
  if (r->migrations > 0) ++w->migrations_in;
  EmbedDispatchInfo d;
  d.dispatch_id = r->dispatch_id;
  d.inputs = r->embed_tokens;
  d.normalize = r->embed_input.normalize;
  d.pooling = r->embed_input.pooling;
  d.priority = r->priority;
  SendToWorker(w->identity, d);
}

void Router::Impl::DetachFromWorker(Request* r, WorkerState* w) {
  // Only from a registration that holds it: a request orphaned by a re-registration still names
  // the identity, whose fresh state never counted it.
  const bool held = w->requests.erase(r->id) > 0;
  if (w->embeds.erase(r->id) > 0) {
    w->embed_inputs -= static_cast<int>(r->embed_tokens.size());
  } else if (!held) {
    return;
  }
  w->outstanding_tokens -= r->outstanding;
}

// ---- workers

void Router::Impl::OnWorkerMessage(const std::string& identity, WorkerMessage m) {
  const int64_t now = clock_->NowMicros();
  if (auto* reg = std::get_if<RegisterInfo>(&m)) {
    OnRegister(identity, *reg, now);
    return;
  }
  uint64_t epoch = 0;
  std::visit(
      [&](const auto& v) {
        if constexpr (!std::is_same_v<std::decay_t<decltype(v)>, RegisterInfo>) epoch = v.epoch;
      },
      m);
  WorkerState* w = registry_.Find(identity, epoch);
  if (w == nullptr) {
    // Unknown (e.g. after a router restart, or declared dead): ask it to register again. A
    // known worker's message from an older epoch is stale and dropped.
    if (registry_.Find(identity) == nullptr) SendToWorker(identity, RegisterAckInfo{0});
    return;
  }
  w->last_seen_micros = now;
  if (auto* h = std::get_if<HeartbeatInfo>(&m)) {
    // A change of KV use between two steps is a long prefill advancing chunk by chunk.
    if (h->load.kv_used_blocks != w->load.kv_used_blocks) NoteProgress(w, now, /*step=*/false);
    w->load = h->load;
    if (h->embed_batcher.has_value()) {
      metrics_.UpdateEmbedBatcher(w->info.worker_id, *h->embed_batcher);
    }
  } else if (auto* s = std::get_if<StepTokensInfo>(&m)) {
    NoteProgress(w, now, /*step=*/true);
    w->load = s->load;
    metrics_.OnStep(static_cast<int>(s->events.size()), w->info.max_num_seqs);
    for (TokenEvent& e : s->events) OnTokenEvent(w, std::move(e), now);
  } else if (auto* e = std::get_if<EmbedDoneInfo>(&m)) {
    NoteProgress(w, now, /*step=*/true);
    OnEmbedDone(w, std::move(*e), now);
  } else if (auto* f = std::get_if<RequestFailedInfo>(&m)) {
    NoteProgress(w, now, /*step=*/false);
    OnFailed(w, *f);
  } else if (auto* k = std::get_if<KvEventsInfo>(&m)) {
    prefix_index_.Apply(identity, *k, std::max(1, w->info.num_kv_blocks));
  } else if (std::holds_alternative<DeregisterInfo>(m)) {
    RemoveWorker(identity, "deregistered");
  }
}

void Router::Impl::OnRegister(const std::string& identity, const RegisterInfo& info,
                              int64_t now) {
  std::vector<uint64_t> orphaned;
  const uint64_t epoch = registry_.Register(identity, info, now, &orphaned);
  prefix_index_.RemoveWorker(identity);
  if (!limits_.known || info.max_model_len < limits_.max_model_len) {
    limits_.known = true;
    limits_.vocab_size = info.vocab_size;
    limits_.max_model_len = info.max_model_len;
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        CreateTokenizer(info.tokenizer, info.model);
    limits_.tokenizer = tokenizer.ok() ? std::move(*tokenizer) : nullptr;
    limits_.bos_token_id = info.bos_token_id;
  }
  std::cerr << "carpool-router: worker " << info.worker_id << " registered (epoch " << epoch
            << ", model " << info.model << ", " << info.max_num_seqs << " seqs)\n";
  SendToWorker(identity, RegisterAckInfo{epoch});
  UpdateCapacity();
  for (uint64_t id : orphaned) Failover(id);
}

Request* Router::Impl::Lookup(const WorkerState* w, uint64_t dispatch_id) {
  auto d = dispatch_to_request_.find(dispatch_id);
  if (d == dispatch_to_request_.end()) return nullptr;
  auto it = requests_.find(d->second);
  if (it == requests_.end() || it->second.worker != w->identity ||
      it->second.dispatch_id != dispatch_id) {
    return nullptr;
  }
  return &it->second;
}

void Router::Impl::OnTokenEvent(WorkerState* w, TokenEvent e, int64_t now) {
  Request* r = Lookup(w, e.dispatch_id);
  if (r == nullptr) return;  // cancelled, migrated or stale
  if (e.has_token) {
    if (r->first_token == 0) r->first_token = now;
    r->output.push_back(e.token);
    ++w->tokens_generated;
    const int64_t left = r->sampling.max_tokens - static_cast<int64_t>(r->output.size());
    w->outstanding_tokens += left - r->outstanding;
    r->outstanding = left;
    if (r->stream) {
      GenerateChunkOut chunk;
      chunk.request_id = r->client_request_id;
      chunk.index = static_cast<int>(r->output.size()) - 1;
      chunk.tokens.push_back(e.token);
      chunk.text = DecodeText({e.token.token});
      SendToClient(r->client, chunk);
      // The client may be gone (SendToClient ended its requests).
      r = Lookup(w, e.dispatch_id);
      if (r == nullptr) return;
    }
  }
  if (!e.finished) return;
  r->cached_prompt_tokens = e.cached_prompt_tokens;
  GenerateFinalOut f;
  f.request_id = r->client_request_id;
  std::vector<int32_t> ids;
  for (const SampleResult& t : r->output) ids.push_back(t.token);
  if (!r->stream) {
    f.tokens = r->output;
    f.text = DecodeText(ids);
  }
  f.finish_reason = e.finish_reason;
  f.usage = {static_cast<int>(r->prompt.size()), static_cast<int>(r->output.size()),
             r->cached_prompt_tokens};
  f.timings = {Millis(r->arrival, r->dispatched), Millis(r->arrival, r->first_token),
               Millis(r->arrival, now)};
  metrics_.OnGenerateFinished(f.finish_reason, f.usage, f.timings);
  ++w->requests_served;
  const uint64_t id = r->id;
  const std::string client = r->client;
  w->requests.erase(id);
  w->outstanding_tokens -= r->outstanding;
  r->worker.clear();  // finished on the worker: End() must not cancel it there
  End(id, /*completed=*/true);
  SendToClient(client, f);
}

void Router::Impl::OnEmbedDone(WorkerState* w, EmbedDoneInfo done, int64_t now) {
  Request* r = Lookup(w, done.dispatch_id);
  if (r == nullptr) return;  // cancelled, migrated or stale
  const uint64_t id = r->id;
  if (done.embeddings.size() != r->embed_tokens.size()) {
    Fail(id, absl::StatusCode::kInternal, reason::kInternal,
         absl::StrCat("the worker returned ", done.embeddings.size(), " embeddings for ",
                      r->embed_tokens.size(), " inputs"));
    return;
  }
  // Every vector is as wide as the worker's registered hidden_size (any width, but not empty,
  // for a worker that registered none): an empty or short one is the worker's bug.
  for (size_t i = 0; i < done.embeddings.size(); ++i) {
    const size_t width = done.embeddings[i].size();
    const int want = w->info.hidden_size;
    if (want > 0 ? width != static_cast<size_t>(want) : width == 0) {
      Fail(id, absl::StatusCode::kInternal, reason::kInternal,
           absl::StrCat("the worker returned an embedding of ", width, " floats for input ", i,
                        "; it registered hidden_size ", want));
      return;
    }
  }
  EmbedResultOut out;
  out.request_id = r->client_request_id;
  out.embeddings = std::move(done.embeddings);
  out.usage.prompt_tokens = static_cast<int>(r->embed_total_tokens);
  // No tokens stream back: the "first token" is the answer.
  out.timings = {Millis(r->arrival, r->dispatched), Millis(r->arrival, now),
                 Millis(r->arrival, now)};
  metrics_.OnEmbedFinished(out.usage, out.timings, static_cast<int>(out.embeddings.size()));
  ++w->requests_served;
  const std::string client = r->client;
  DetachFromWorker(r, w);
  r->worker.clear();  // finished on the worker: End() must not cancel it there
  End(id, /*completed=*/true);
  SendToClient(client, out);
}

void Router::Impl::OnFailed(WorkerState* w, const RequestFailedInfo& f) {
  Request* r = Lookup(w, f.dispatch_id);
  if (r == nullptr) return;
  const uint64_t id = r->id;
  DetachFromWorker(r, w);
  r->worker.clear();
  r->outstanding = 0;
  if (f.error.reason == reason::kDraining) {
    w->draining = true;
    dispatch_to_request_.erase(r->dispatch_id);
    admission_->Requeue(id);
    return;
  }
  Fail(id, f.error.code, f.error.reason.c_str(), f.error.message);
}

void Router::Impl::Failover(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  dispatch_to_request_.erase(r.dispatch_id);
  r.worker.clear();
  r.outstanding = 0;
  if (r.migrations >= options_.max_migrations) {
    Fail(id, absl::StatusCode::kUnavailable, reason::kWorkerLost,
         absl::StrCat("its worker was lost ", r.migrations + 1, " times"));
    return;
  }
  ++r.migrations;
  ++migrations_total_;
  metrics_.OnMigration();
  admission_->Requeue(id);
}

void Router::Impl::RemoveWorker(const std::string& identity, const char* why) {
  std::cerr << "carpool-router: worker " << identity << " " << why << "\n";
  prefix_index_.RemoveWorker(identity);
  const std::vector<uint64_t> held = registry_.Remove(identity);
  UpdateCapacity();
  for (uint64_t id : held) Failover(id);
}

void Router::Impl::CheckWorkers(int64_t now) {
  for (const std::string& identity :
       registry_.Silent(now, options_.heartbeat_timeout_ms * 1000)) {
    RemoveWorker(identity, "missed its heartbeats: dead");
  }
  CheckStalls(now);
  UpdateCapacity();  // a worker may have started draining
  FailQueuedThatCannotRun();
  UpdateMetrics();
}

void Router::Impl::NoteProgress(WorkerState* w, int64_t now, bool step) {
  if (step && w->busy() && w->last_progress_micros > 0) {
    // The time one step (or embed batch) took; the average follows slower steps at once.
    const double took = static_cast<double>(now - w->last_progress_micros);
    w->step_micros = std::max(took, 0.8 * w->step_micros + 0.2 * took);
  }
  w->last_progress_micros = now;
  if (w->stalled) {
    w->stalled = false;
    std::cerr << "carpool-router: worker " << w->info.worker_id << " makes progress again\n";
    UpdateCapacity();
  }
}

void Router::Impl::CheckStalls(int64_t now) {
  if (options_.stall_timeout_ms <= 0) return;
  for (WorkerState* w : registry_.Mutable()) {
    if (w->stalled || !w->busy()) continue;
    const int64_t limit = std::max<int64_t>(options_.stall_timeout_ms * 1000,
                                            static_cast<int64_t>(kStallSteps * w->step_micros));
    const int64_t quiet = now - w->last_progress_micros;
    if (quiet <= limit) continue;
    std::cerr << "carpool-router: worker " << w->info.worker_id << " holds "
              << w->requests.size() + w->embeds.size() << " request(s) and showed no progress for "
              << quiet / 1000 << " ms (limit " << limit / 1000
              << " ms): stalled, moving its requests\n";
    w->stalled = true;
    std::vector<uint64_t> held(w->requests.begin(), w->requests.end());
    held.insert(held.end(), w->embeds.begin(), w->embeds.end());
    std::sort(held.begin(), held.end());
    for (uint64_t id : held) {
      // An earlier failover may have ended it (its client was gone: DropClient ends them all).
      auto it = requests_.find(id);
      if (it == requests_.end()) continue;
      Request& r = it->second;
      // Should it wake up, it frees their blocks and its late tokens are stale.
      SendToWorker(w->identity, WorkerCancelInfo{r.dispatch_id});
      DetachFromWorker(&r, w);
      Failover(id);
    }
  }
}

void Router::Impl::FailQueuedThatCannotRun() {
  for (const auto& [id, refusal] : admission_->Oversized()) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Refuse(it->second.client, it->second.client_request_id, it->second.tenant, refusal);
    End(id);
  }
  for (uint64_t id : admission_->Stranded()) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    SendError(it->second.client, it->second.client_request_id, absl::StatusCode::kUnavailable,
              reason::kNoWorkers,
              absl::StrCat("no worker could serve the request for ",
                           options_.admission.no_worker_timeout_ms,
                           " ms (--no-worker-timeout-ms)"),
              kNoWorkersRetryMs);
    End(id);
  }
}

void Router::Impl::UpdateMetrics() {
  const int64_t now = clock_->NowMicros();
  std::vector<WorkerMetricsSnapshot> workers;
  for (const WorkerState* w : registry_.All()) {
    const int64_t age_ms = (now - w->last_seen_micros) / 1000;
    workers.push_back({w->info.worker_id, w->serving() && age_ms * 2 <= options_.heartbeat_timeout_ms,
                       static_cast<int>(w->requests.size()), w->load.waiting,
                       w->load.kv_used_blocks, w->info.num_kv_blocks, w->load.preemptions});
  }
  const AdmissionCounters& c = admission_->counters();
  int queued = 0;
  for (int q : c.queued) queued += q;
  metrics_.UpdateCluster(queued, c.inflight, workers);
}

void Router::Impl::UpdateCapacity() {
  // A stalled worker runs nothing: its KV is no part of what the cluster can admit. A draining
  // one still finishes what it holds (and serves embeds), so its capacity counts.
  // What could ever run counts the stalled ones too: too_large must not end a request that
  // fits once a stalled worker recovers.
  int64_t tokens = 0;
  int64_t ceiling = 0;
  int64_t largest = 0;
  bool any = false;
  for (const WorkerState* w : registry_.All()) {
    ceiling += CapacityTokens(*w);
    largest = std::max(largest, CapacityTokens(*w));
    if (w->stalled) continue;
    tokens += CapacityTokens(*w);
    any = any || !w->draining;
  }
  admission_->SetCapacityTokens(tokens);
  admission_->SetCeilingTokens(ceiling);
  admission_->SetLargestWorkerTokens(largest);
  admission_->SetWorkersAvailable(any);
}

std::string Router::Impl::DecodeText(const std::vector<int32_t>& ids) const {
  return limits_.tokenizer != nullptr ? limits_.tokenizer->Decode(ids) : std::string();
}

StatsOut Router::Impl::BuildStats() const {
  const int64_t now = clock_->NowMicros();
  StatsOut s;
  for (const WorkerState* w : registry_.All()) {
    WorkerStatsOut o;
    o.worker_id = w->info.worker_id;
    o.heartbeat_age_ms = (now - w->last_seen_micros) / 1000;
    o.healthy = w->serving() && o.heartbeat_age_ms * 2 <= options_.heartbeat_timeout_ms;
    o.epoch = w->epoch;
    o.running = static_cast<int>(w->requests.size());
    o.num_kv_blocks = w->info.num_kv_blocks;
    o.kv_used_blocks = w->load.kv_used_blocks;
    o.outstanding_tokens = w->outstanding_tokens;
    o.max_num_seqs = w->info.max_num_seqs;
    o.model = w->info.model;
    o.requests_served = w->requests_served;
    o.waiting = w->load.waiting;
    o.draining = w->draining;
    o.cached_prefix_blocks = prefix_index_.Size(w->identity);
    o.migrations_in = w->migrations_in;
    o.tokens_generated = w->tokens_generated;
    s.workers.push_back(std::move(o));
  }
  const AdmissionCounters& c = admission_->counters();
  s.queued_interactive = c.queued[static_cast<int>(Priority::kInteractive)];
  s.queued_default = c.queued[static_cast<int>(Priority::kDefault)];
  s.queued_batch = c.queued[static_cast<int>(Priority::kBatch)];
  s.queued = s.queued_interactive + s.queued_default + s.queued_batch;
  s.inflight = c.inflight;
  s.queued_tokens = c.queued_tokens;
  s.inflight_tokens = c.inflight_tokens;
  s.max_queued_tokens = options_.admission.max_queued_tokens;
  s.max_inflight_tokens = admission_->max_inflight_tokens();
  s.requests_total = requests_total_;
  for (const auto& [why, n] : rejections_) {
    s.rejections_by_reason[why] = n;
    s.requests_rejected += n;
  }
  s.migrations = migrations_total_;
  s.draining = draining_;
  s.placement = PlacementPolicyName(options_.placement);
  for (int t = 0; t < options_.tenants.size(); ++t) {
    s.tenants.push_back(
        {options_.tenants.at(t).name, admission_->TenantActive(t), tenant_rejections_[t]});
  }
  s.service_tokens_per_s = admission_->ServiceRate();
  return s;
}

}  // namespace carpool::router
