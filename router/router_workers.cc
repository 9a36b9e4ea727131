// Router::Impl, worker side: dispatch, registrations, worker answers, failover, the watchdog.
#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "router/router_impl.h"

namespace carpool::router {
namespace {

// TryDispatch passes over at most this many queued requests it finds no worker for, per call.
constexpr size_t kMaxUnplacedPerPass = 16;

// Whether a worker's engine reports sequences or embed inputs it has not finished.
bool ShowsWork(const WorkerLoad& l) {
  return l.running > 0 || l.waiting > 0 || l.embed_queued > 0;
}

}  // namespace

// ---- dispatch

void Router::Impl::TryDispatch() {
  if (registry_.empty()) return;
  // A request no worker can take now is passed over: the ones behind it may go (by the rule of
  // AdmissionController::Next), up to a bound per call.
  absl::flat_hash_set<uint64_t> unplaced;
  // Requests a batch job's request was preempted for in this call: one each.
  absl::flat_hash_set<uint64_t> preempted_for;
  const auto pass_over = [&](uint64_t router_id) {
    unplaced.insert(router_id);
    return unplaced.size() < kMaxUnplacedPerPass;
  };
  for (;;) {
    const std::optional<uint64_t> router_id = admission_->Next(unplaced);
    if (!router_id) {
      // Nothing more goes: the head of the order may wait for budget that batch jobs hold.
      if (PreemptBatchJobForBudget(unplaced, &preempted_for)) continue;
      return;
    }
    Request& r = *requests_.at(*router_id);
    if (!r.validated && !((r.model_resolved || ResolveModel(r)) && Validate(r, {}))) {
      End(*router_id);
      continue;
    }
    // Placement among the workers serving its model (admission is the cluster's, for all).
    const PlacementIndex* model = registry_.Model(r.model);
    if (model == nullptr) {
      // Its model's workers are all gone while others serve: it waits for one of them, as long
      // as a request waits when no worker at all is there (--no-worker-timeout-ms).
      const int64_t now = clock_->NowMicros();
      if (r.no_worker_since == 0) r.no_worker_since = now;
      const int64_t limit = options_.admission.no_worker_timeout_ms * 1000;
      if (limit > 0 && now - r.no_worker_since >= limit) {
        SendError(r.client, r.request_id, absl::StatusCode::kUnavailable, reason::kNoWorkers,
                  absl::StrCat("no worker of model '", r.model, "' could serve the request for ",
                               options_.admission.no_worker_timeout_ms,
                               " ms (--no-worker-timeout-ms)"),
                  kNoWorkersRetryMs);
        End(*router_id);
        continue;
      }
      if (!pass_over(*router_id)) return;
      continue;
    }
    r.no_worker_since = 0;
    PlacementInput in;
    in.cursor = placements_;
    in.random = rng_();
    in.affinity_load_weight = options_.affinity_load_weight;
    Placement placed = r.kind->PlaceAmong(r, *model, prefix_index_, options_.placement, in);
    if (placed.never) {
      Fail(*router_id, placed.never->code, placed.never->reason,
           std::move(placed.never->message));
      continue;
    }
    if (placed.worker == nullptr) {
      // Batch jobs hold the KV room it needs: one of them yields, and Next() gives it again.
      // (Only here does it see every worker of its model.)
      if (!preempted_for.contains(*router_id) && !r.admission.batch_job &&
          r.admission.kv_resident && admission_->counters().batch_inflight > 0) {
        const std::vector<WorkerState*>& workers = model->workers();
        if (PreemptBatchJobForCapacity(r, workers, r.kind->Place(r, workers, prefix_index_))) {
          preempted_for.insert(*router_id);
          continue;
        }
      }
      if (!pass_over(*router_id)) return;
      continue;
    }
    admission_->MarkDispatched(*router_id);
    ++placements_;
    Dispatch(r, placed.worker, placed.cached_prefix_tokens);
  }
}

bool Router::Impl::PreemptBatchJobForCapacity(const Request& r,
                                          const std::vector<WorkerState*>& workers,
                                          const PlacementView& view) {
  // A batch job's request never preempts (the lane only takes room nothing else waits for), and
  // an embed needs no sequence slot or KV room that a generate would give back.
  if (r.admission.batch_job || !r.admission.kv_resident) return false;
  if (admission_->counters().batch_inflight == 0) return false;
  Request* victim = nullptr;
  WorkerState* victim_worker = nullptr;
  for (size_t i = 0; i < workers.size(); ++i) {
    WorkerState* w = workers[i];
    const int64_t capacity = CapacityTokens(*w);
    if (!w->serving() || (capacity > 0 && view.request_tokens > capacity)) continue;
    // Its newest batch job: the least work lost (a resume recomputes its prompt and tokens).
    Request* newest = nullptr;
    for (uint64_t router_id : w->requests) {
      auto it = requests_.find(router_id);
      if (it == requests_.end() || !it->second->admission.batch_job) continue;
      if (newest == nullptr || it->second->dispatch_id > newest->dispatch_id) {
        newest = it->second.get();
      }
    }
    if (newest == nullptr) continue;
    // Only where `r` then becomes a candidate by placement's own rule: a slot free (which the
    // batch job's request does not change for `r`), its tokens within the worker's capacity.
    WorkerSnapshot after = view.snapshots[i];
    after.outstanding_tokens -= newest->outstanding;
    PlacementInput in;
    in.request_tokens = view.request_tokens;
    if (!Place(PlacementPolicy::kLeastLoaded, {after}, in)) continue;
    if (victim == nullptr || newest->dispatch_id > victim->dispatch_id) {
      victim = newest;
      victim_worker = w;
    }
  }
  if (victim == nullptr) return false;
  PreemptBatchJob(*victim, victim_worker);
  return true;
}

bool Router::Impl::PreemptBatchJobForBudget(const absl::flat_hash_set<uint64_t>& unplaced,
                                            absl::flat_hash_set<uint64_t>* preempted_for) {
  if (admission_->counters().batch_inflight == 0) return false;
  const std::optional<std::pair<uint64_t, int64_t>> held = admission_->HeldForBudget(unplaced);
  if (!held || preempted_for->contains(held->first)) return false;
  auto it = requests_.find(held->first);
  if (it == requests_.end()) return false;
  const Request& r = *it->second;
  // The budget is the cluster's, but only its model's workers can run it: their batch jobs'
  // generations (an embed or a generate waits on budget alike).
  struct Running {
    Request* request;
    WorkerState* worker;
    int64_t tokens;
  };
  std::vector<Running> running;
  int64_t held_by_batch = 0;
  const PlacementIndex* model = registry_.Model(r.model);
  if (model == nullptr) return false;
  for (WorkerState* w : model->workers()) {
    if (!w->serving()) continue;
    for (uint64_t router_id : w->requests) {
      auto b = requests_.find(router_id);
      if (b == requests_.end() || !b->second->admission.batch_job) continue;
      const int64_t tokens = admission_->ReservedTokens(router_id);
      running.push_back({b->second.get(), w, tokens});
      held_by_batch += tokens;
    }
  }
  // Preempting all of them would not make room: it waits for what else runs, as before.
  if (held_by_batch < held->second) return false;
  // The newest that makes room alone; else the newest (later dispatches take more).
  const Running* victim = nullptr;
  for (bool alone : {true, false}) {
    for (const Running& b : running) {
      if (alone && b.tokens < held->second) continue;
      if (victim == nullptr || b.request->dispatch_id > victim->request->dispatch_id) victim = &b;
    }
    if (victim != nullptr) break;
  }
  preempted_for->insert(r.router_id);
  PreemptBatchJob(*victim->request, victim->worker);
  return true;
}

void Router::Impl::PreemptBatchJob(Request& r, WorkerState* w) {
  // As a failover moves a request, without counting toward max_migrations: the worker drops it
  // (its KV blocks free; its late tokens are stale), and it waits at the front of the batch lane
  // to resume from its prompt and the tokens it has, so its client sees one answer.
  SendToWorker(w->identity, WorkerCancelInfo{r.dispatch_id});
  DetachFromWorker(r, w);
  by_dispatch_.erase(r.dispatch_id);
  r.worker.clear();
  r.outstanding = 0;
  admission_->Requeue(r.router_id);
  stats_.metrics().OnBatchPreemption();
}

void Router::Impl::Dispatch(Request& r, WorkerState* w, int64_t cached_prefix_tokens) {
  const int64_t now = clock_->NowMicros();
  r.worker = w->identity;
  r.dispatch_id = next_dispatch_id_++;
  by_dispatch_[r.dispatch_id] = r.router_id;
  if (r.dispatched == 0) r.dispatched = now;
  if (!w->busy()) w->last_progress_micros = now;  // the watchdog starts now
  const RouterMessage message = r.kind->Dispatch(r, w, cached_prefix_tokens);
  w->outstanding_tokens += r.outstanding;
  registry_.Changed(w);
  if (r.migrations > 0) ++w->migrations_in;
  SendToWorker(w->identity, message);
}

bool Router::Impl::DetachFromWorker(Request& r, WorkerState* w) {
  // Only from a registration that holds it: a request orphaned by a re-registration still names
  // the identity, whose fresh state never counted it.
  if (!r.kind->Detach(r, w)) return false;
  w->outstanding_tokens -= r.outstanding;
  registry_.Changed(w);
  return true;
}

void Router::Impl::Finish(Request& r, WorkerState* w, ServerMessage answer,
                          bool cancel_on_worker) {
  ++w->requests_served;
  DetachFromWorker(r, w);
  if (cancel_on_worker) SendToWorker(r.worker, WorkerCancelInfo{r.dispatch_id});
  r.worker.clear();  // finished on the worker: End() must not cancel it there
  const std::string client = r.client;
  End(r.router_id, /*completed=*/true);
  SendToClient(client, answer);
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
    // A stalled worker holds nothing (its requests moved away), so it can show no progress. Its
    // engine is alive once its load goes from the work it showed to none: the engine processed
    // the cancels of the moved requests (a hung engine publishes no new load; one that hung
    // before it ever showed the work never goes from work to none, and stays stalled).
    const bool drained = w->stalled && !w->busy() && ShowsWork(w->load) && !ShowsWork(h->load);
    w->load = h->load;
    if (drained) Unstall(w, "is alive and idle again (its load shows nothing running or waiting)");
    if (h->embed_batcher.has_value()) {
      stats_.metrics().UpdateEmbedBatcher(w->info.worker_id, *h->embed_batcher);
    }
  } else if (auto* s = std::get_if<StepTokensInfo>(&m)) {
    NoteProgress(w, now, /*step=*/true);
    w->load = s->load;
    stats_.metrics().OnStep(static_cast<int>(s->events.size()), w->info.max_num_seqs);
    for (TokenEvent& e : s->events) OnRequestEvent(w, std::move(e), now);
    registry_.Changed(w);  // each token took from its request's outstanding tokens
  } else if (auto* e = std::get_if<EmbedDoneInfo>(&m)) {
    NoteProgress(w, now, /*step=*/true);
    OnRequestEvent(w, std::move(*e), now);
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
  // Which workers hold a hash: only prefix_affinity asks (and it doubles the index's memory).
  prefix_index_.TrackHolders(options_.placement == PlacementPolicy::kPrefixAffinity);
  if (std::optional<TokenizerLoad> load = models_.Register(info)) {
    StartTokenizerLoad(std::move(*load));
  }
  std::cerr << "carpool-router: worker " << info.worker_id << " registered (epoch " << epoch
            << ", model " << info.model << ", " << info.max_num_seqs << " seqs)\n";
  SendToWorker(identity, RegisterAckInfo{epoch});
  UpdateCapacity();
  for (uint64_t router_id : orphaned) Failover(router_id);
  ResumeWaiting();
}

Request* Router::Impl::Lookup(const WorkerState* w, uint64_t dispatch_id) {
  auto d = by_dispatch_.find(dispatch_id);
  if (d == by_dispatch_.end()) return nullptr;
  auto it = requests_.find(d->second);
  if (it == requests_.end() || it->second->worker != w->identity ||
      it->second->dispatch_id != dispatch_id) {
    return nullptr;
  }
  return it->second.get();
}

void Router::Impl::OnRequestEvent(WorkerState* w, WorkerEvent event, int64_t now) {
  const uint64_t dispatch_id = std::visit([](const auto& e) { return e.dispatch_id; }, event);
  Request* r = Lookup(w, dispatch_id);
  if (r == nullptr) return;  // cancelled, migrated or stale
  r->kind->OnWorkerEvent(*r, w, std::move(event), now);
}

void Router::Impl::OnFailed(WorkerState* w, const RequestFailedInfo& f) {
  Request* r = Lookup(w, f.dispatch_id);
  if (r == nullptr) return;
  const uint64_t router_id = r->router_id;
  DetachFromWorker(*r, w);
  r->worker.clear();
  r->outstanding = 0;
  if (f.error.reason == reason::kDraining) {
    w->draining = true;
    registry_.Changed(w);
    by_dispatch_.erase(r->dispatch_id);
    admission_->Requeue(router_id);
    return;
  }
  Fail(router_id, f.error.code, f.error.reason.c_str(), f.error.message);
}

void Router::Impl::Failover(uint64_t router_id) {
  auto it = requests_.find(router_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  by_dispatch_.erase(r.dispatch_id);
  r.worker.clear();
  r.outstanding = 0;
  if (r.migrations >= options_.max_migrations) {
    Fail(router_id, absl::StatusCode::kUnavailable, reason::kWorkerLost,
         absl::StrCat("its worker was lost ", r.migrations + 1, " times"));
    return;
  }
  ++r.migrations;
  stats_.OnMigration();
  admission_->Requeue(router_id);
}

void Router::Impl::RemoveWorker(const std::string& identity, const char* why) {
  std::cerr << "carpool-router: worker " << identity << " " << why << "\n";
  prefix_index_.RemoveWorker(identity);
  const std::vector<uint64_t> held = registry_.Remove(identity);
  UpdateCapacity();
  for (uint64_t router_id : held) Failover(router_id);
}

void Router::Impl::CheckWorkers(int64_t now) {
  for (const std::string& identity :
       registry_.Silent(now, options_.heartbeat_timeout_ms * 1000)) {
    RemoveWorker(identity, "missed its heartbeats: dead");
  }
  CheckStalls(now);
  // Every change of what placement reads calls registry_.Changed; this finds any that did not.
  if (const int stale = registry_.ResyncPlacement(); stale > 0) {
    std::cerr << "carpool-router: bug: the placement index missed a change of " << stale
              << " worker(s); read again\n";
  }
  UpdateCapacity();  // a worker may have started draining
  FailQueuedThatCannotRun();
  stats_.UpdateGauges(Sources());
}

void Router::Impl::NoteProgress(WorkerState* w, int64_t now, bool step) {
  if (step && w->busy() && w->last_progress_micros > 0) {
    // The time one step (or embed batch) took; the average follows slower steps at once.
    const double took = static_cast<double>(now - w->last_progress_micros);
    w->step_micros = std::max(took, 0.8 * w->step_micros + 0.2 * took);
  }
  w->last_progress_micros = now;
  if (w->stalled) Unstall(w, "makes progress again");
}

void Router::Impl::Unstall(WorkerState* w, const char* why) {
  w->stalled = false;
  registry_.Changed(w);
  std::cerr << "carpool-router: worker " << w->info.worker_id << " " << why << ": recovered\n";
  UpdateCapacity();
}

void Router::Impl::CheckStalls(int64_t now) {
  if (options_.stall_timeout_ms <= 0) return;
  const auto limit_of = [&](const WorkerState& w) {
    return std::max<int64_t>(options_.stall_timeout_ms * 1000,
                             static_cast<int64_t>(kStallSteps * w.step_micros));
  };
  // A first look in no set order; the rare stalled ones are then handled in identity order.
  bool any = false;
  registry_.ForEach([&](const WorkerState& w) {
    any = any || (!w.stalled && w.busy() && now - w.last_progress_micros > limit_of(w));
  });
  if (!any) return;
  for (WorkerState* w : registry_.Mutable()) {
    if (w->stalled || !w->busy()) continue;
    const int64_t limit = limit_of(*w);
    const int64_t quiet = now - w->last_progress_micros;
    if (quiet <= limit) continue;
    std::cerr << "carpool-router: worker " << w->info.worker_id << " holds "
              << w->requests.size() + w->embeds.size() << " request(s) and showed no progress for "
              << quiet / 1000 << " ms (limit " << limit / 1000
              << " ms): stalled, moving its requests\n";
    w->stalled = true;
    registry_.Changed(w);
    std::vector<uint64_t> held(w->requests.begin(), w->requests.end());
    held.insert(held.end(), w->embeds.begin(), w->embeds.end());
    std::sort(held.begin(), held.end());
    for (uint64_t router_id : held) {
      // An earlier failover may have ended it (its client was gone: DropClient ends them all).
      auto it = requests_.find(router_id);
      if (it == requests_.end()) continue;
      Request& r = *it->second;
      // Should it wake up, it frees their blocks and its late tokens are stale.
      SendToWorker(w->identity, WorkerCancelInfo{r.dispatch_id});
      DetachFromWorker(r, w);
      Failover(router_id);
    }
  }
}

void Router::Impl::FailQueuedThatCannotRun() {
  for (const auto& [router_id, refusal] : admission_->Oversized()) {
    auto it = requests_.find(router_id);
    if (it == requests_.end()) continue;
    const Request& r = *it->second;
    Refuse(r.client, r.request_id, r.tenant, refusal);
    End(router_id);
  }
  for (uint64_t router_id : admission_->Stranded()) {
    auto it = requests_.find(router_id);
    if (it == requests_.end()) continue;
    const Request& r = *it->second;
    SendError(r.client, r.request_id, absl::StatusCode::kUnavailable, reason::kNoWorkers,
              absl::StrCat("no worker could serve the request for ",
                           options_.admission.no_worker_timeout_ms,
                           " ms (--no-worker-timeout-ms)"),
              kNoWorkersRetryMs);
    End(router_id);
  }
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
  registry_.ForEach([&](const WorkerState& w) {
    const int64_t capacity = CapacityTokens(w);
    ceiling += capacity;
    largest = std::max(largest, capacity);
    if (w.stalled) return;
    tokens += capacity;
    any = any || !w.draining;
  });
  admission_->SetCapacityTokens(tokens);
  admission_->SetCeilingTokens(ceiling);
  admission_->SetLargestWorkerTokens(largest);
  admission_->SetWorkersAvailable(any);
}

}  // namespace carpool::router
