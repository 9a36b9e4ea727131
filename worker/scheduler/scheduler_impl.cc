#include "worker/scheduler/scheduler_impl.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "common/status.h"

namespace carpool::worker::internal {
namespace {

TokenSpan TokensOf(const Sequence& seq) { return TokenSpan(seq.prompt_tokens, seq.output_tokens); }

bool Contains(const std::vector<int32_t>& ids, int32_t token) {
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}

}  // namespace

SchedulerImpl::SchedulerImpl(const SchedulerOptions& options, KvCacheManager* kv_cache,
                             std::unique_ptr<AdmissionPolicy> policy)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      kv_(kv_cache),
      policy_(std::move(policy)) {}

void SchedulerImpl::Add(std::unique_ptr<Sequence> seq) {
  const int64_t seq_id = seq->seq_id;
  CARPOOL_CHECK(!seqs_.contains(seq_id));
  seq->status = SeqStatus::kWaiting;
  seq->num_computed_tokens = 0;
  auto entry = std::make_unique<SeqEntry>();
  entry->seq = std::move(seq);
  entry->arrival_index = next_arrival_++;
  entry->enqueue_micros = clock_->NowMicros();
  waiting_.PushBack(entry.get());
  seqs_.emplace(seq_id, std::move(entry));
}

bool SchedulerImpl::Abort(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return false;
  SeqEntry* entry = it->second.get();
  if (entry->seq->status == SeqStatus::kRunning) {
    kv_->Free(seq_id);
    RemoveRunning(entry);
  } else if (entry->seq->status == SeqStatus::kSuspended) {
    kv_->Free(seq_id);
    std::erase(suspended_, entry);
  } else if (!waiting_.Remove(seq_id)) {
    WaitQueue* own = policy_->own_queue();
    CARPOOL_CHECK(own != nullptr && own->Remove(seq_id));
  }
  seqs_.erase(it);
  return true;
}

int SchedulerImpl::num_waiting() const {
  const WaitQueue* own = policy_->own_queue();
  return waiting_.size() + (own != nullptr ? own->size() : 0) + static_cast<int>(suspended_.size());
}

BatchPlan SchedulerImpl::Schedule() {
  Step step;
  step.token_budget = options_.max_num_batched_tokens;
  // A static batch keeps its members to the end: slots change hands in the continuous policy.
  if (policy_->own_queue() == nullptr) {
    SuspendForUrgent();
    ResumeSuspended();
  }
  ScheduleRunning(/*decodes=*/true, step);
  ScheduleRunning(/*decodes=*/false, step);
  // After a preemption the pool is short: admitting now would only thrash.
  if (step.preempted.empty()) {
    WaitQueue* queue = policy_->Select(waiting_, num_running(), clock_->NowMicros());
    if (queue != nullptr) Admit(*queue, step);
  }
  return MakePlan(step);
}

void SchedulerImpl::SuspendForUrgent() {
  int short_of = waiting_.CountMoreUrgentThan(Priority::kBatch) -
                 (options_.max_num_seqs - num_running());
  while (short_of > 0) {
    // The newest batch-class sequence: the one that has done least of its work.
    SeqEntry* victim = nullptr;
    for (SeqEntry* e : running_) {
      if (e->seq->priority != Priority::kBatch) continue;
      if (victim == nullptr || e->arrival_index > victim->arrival_index) victim = e;
    }
    if (victim == nullptr) return;
    RemoveRunning(victim);
    victim->seq->status = SeqStatus::kSuspended;
    suspended_.push_back(victim);
    ++num_suspensions_;
    --short_of;
  }
}

void SchedulerImpl::ResumeSuspended() {
  while (!suspended_.empty() && num_running() < options_.max_num_seqs &&
         waiting_.CountMoreUrgentThan(Priority::kBatch) == 0) {
    // The oldest first: it was admitted before the others and has waited longest.
    auto oldest = std::min_element(
        suspended_.begin(), suspended_.end(),
        [](const SeqEntry* a, const SeqEntry* b) { return a->arrival_index < b->arrival_index; });
    SeqEntry* entry = *oldest;
    suspended_.erase(oldest);
    entry->seq->status = SeqStatus::kRunning;
    running_.push_back(entry);
  }
}

void SchedulerImpl::ScheduleRunning(bool decodes, Step& step) {
  // Preemption edits running_, so walk a snapshot and skip whoever has left it.
  const std::vector<SeqEntry*> snapshot = running_;
  for (SeqEntry* entry : snapshot) {
    const Sequence& seq = *entry->seq;
    if (seq.status != SeqStatus::kRunning) continue;
    const bool in_decode = seq.num_computed_tokens == seq.num_tokens() - 1;
    if (in_decode == decodes) ScheduleOne(entry, step);
  }
}

int SchedulerImpl::ChunkSize(const Sequence& seq, int start, const Step& step) const {
  const int remaining = seq.num_tokens() - start;
  const int n = std::min(remaining, step.token_budget);
  if (n < remaining && !options_.enable_chunked_prefill) return 0;
  return std::max(n, 0);
}

void SchedulerImpl::ScheduleOne(SeqEntry* entry, Step& step) {
  Sequence& seq = *entry->seq;
  const int start = seq.num_computed_tokens;
  const int n = ChunkSize(seq, start, step);
  if (n == 0) return;
  while (!kv_->Allocate(seq.seq_id, start + n, TokensOf(seq), seq.cache_salt)) {
    SeqEntry* victim = PickVictim();
    Preempt(victim, step);
    if (victim == entry) return;
  }
  step.items.push_back({entry, start, n});
  step.token_budget -= n;
}

void SchedulerImpl::Admit(WaitQueue& queue, Step& step) {
  while (!queue.empty() && num_running() < options_.max_num_seqs && step.token_budget > 0) {
    SeqEntry* entry = queue.Front();
    Sequence& seq = *entry->seq;
    const TokenSpan tokens = TokensOf(seq);
    const int cached = kv_->LookupPrefix(tokens, seq.cache_salt);
    const int n = ChunkSize(seq, cached, step);
    // Strict order: nobody overtakes a sequence that does not fit. Suspended sequences less
    // urgent than it give their blocks back first.
    if (n == 0) break;
    bool fits = kv_->Allocate(seq.seq_id, cached + n, tokens, seq.cache_salt);
    while (!fits) {
      SeqEntry* victim = SuspendedVictimFor(seq.priority);
      if (victim == nullptr) break;
      Preempt(victim, step);
      fits = kv_->Allocate(seq.seq_id, cached + n, tokens, seq.cache_salt);
    }
    if (!fits) break;
    queue.PopFront();
    seq.status = SeqStatus::kRunning;
    seq.num_cached_tokens = cached;
    seq.num_computed_tokens = cached;
    running_.push_back(entry);
    step.items.push_back({entry, cached, n});
    step.token_budget -= n;
  }
}

namespace {

// The least urgent, then newest, of `entries`. REQUIRES: not empty.
SeqEntry* LeastUrgentNewest(const std::vector<SeqEntry*>& entries) {
  auto key = [](const SeqEntry* e) {
    return std::make_tuple(static_cast<int>(e->seq->priority), e->arrival_index);
  };
  return *std::max_element(entries.begin(), entries.end(),
                           [&](const SeqEntry* a, const SeqEntry* b) { return key(a) < key(b); });
}

}  // namespace

SeqEntry* SchedulerImpl::PickVictim() const {
  // A suspended sequence is not in this step: freeing its blocks costs the step nothing.
  if (!suspended_.empty()) return LeastUrgentNewest(suspended_);
  CARPOOL_CHECK(!running_.empty());
  return LeastUrgentNewest(running_);
}

SeqEntry* SchedulerImpl::SuspendedVictimFor(Priority p) const {
  if (suspended_.empty()) return nullptr;
  SeqEntry* victim = LeastUrgentNewest(suspended_);
  return victim->seq->priority > p ? victim : nullptr;
}

void SchedulerImpl::Preempt(SeqEntry* victim, Step& step) {
  Sequence& seq = *victim->seq;
  kv_->Free(seq.seq_id);
  if (seq.status == SeqStatus::kSuspended) {
    std::erase(suspended_, victim);
  } else {
    RemoveRunning(victim);
  }
  auto it = std::find_if(step.items.begin(), step.items.end(),
                         [victim](const Item& item) { return item.entry == victim; });
  if (it != step.items.end()) {
    step.token_budget += it->num_tokens;
    step.items.erase(it);
  }
  seq.status = SeqStatus::kWaiting;
  seq.num_computed_tokens = 0;
  seq.num_cached_tokens = 0;
  ++seq.num_preemptions;
  ++num_preemptions_;
  policy_->RequeueTarget(waiting_).PushFront(victim);
  step.preempted.push_back(seq.seq_id);
}

BatchPlan SchedulerImpl::MakePlan(Step& step) const {
  BatchPlan plan;
  plan.seqs.reserve(step.items.size());
  for (const Item& item : step.items) {
    Sequence* seq = item.entry->seq.get();
    ScheduledSeq s;
    s.seq = seq;
    s.start_position = item.start;
    s.num_tokens = item.num_tokens;
    s.sample = item.start + item.num_tokens == seq->num_tokens();
    s.block_table = kv_->BlockTable(seq->seq_id);
    plan.seqs.push_back(s);
    plan.num_batched_tokens += item.num_tokens;
  }
  plan.preempted = std::move(step.preempted);
  return plan;
}

std::vector<SeqUpdate> SchedulerImpl::Update(const BatchPlan& plan, const StepOutput& output) {
  std::vector<SeqUpdate> updates;
  std::vector<int64_t> finished;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    Sequence& seq = *s.seq;
    seq.num_computed_tokens = s.start_position + s.num_tokens;
    kv_->MarkComputed(seq.seq_id, seq.num_computed_tokens, TokensOf(seq));
    if (!s.sample) continue;
    CARPOOL_CHECK(i < output.samples.size());
    const SampleResult& sample = output.samples[i];
    seq.output_tokens.push_back(sample.token);
    seq.output_logprobs.push_back(sample);
    seq.finish_reason = StopReason(seq);

    SeqUpdate update;
    update.seq_id = seq.seq_id;
    update.has_token = true;
    update.sample = sample;
    update.finish_reason = seq.finish_reason;
    update.finished = seq.finish_reason != FinishReason::kNone;
    update.prompt_tokens = static_cast<int>(seq.prompt_tokens.size());
    update.completion_tokens = static_cast<int>(seq.output_tokens.size());
    update.cached_prompt_tokens = std::min(seq.num_cached_tokens, update.prompt_tokens);
    updates.push_back(std::move(update));
    if (seq.finish_reason != FinishReason::kNone) {
      seq.status = SeqStatus::kFinished;
      kv_->Free(seq.seq_id);
      RemoveRunning(seqs_.at(seq.seq_id).get());
      finished.push_back(seq.seq_id);
    }
  }
  for (int64_t seq_id : finished) seqs_.erase(seq_id);
  return updates;
}

FinishReason SchedulerImpl::StopReason(const Sequence& seq) const {
  const int32_t token = seq.output_tokens.back();
  if (Contains(seq.sampling.stop_token_ids, token)) return FinishReason::kStop;
  if (!seq.sampling.ignore_eos && Contains(seq.eos_token_ids, token)) return FinishReason::kStop;
  if (static_cast<int>(seq.output_tokens.size()) >= seq.sampling.max_tokens) {
    return FinishReason::kLength;
  }
  if (seq.num_tokens() >= options_.max_model_len) return FinishReason::kLength;
  return FinishReason::kNone;
}

void SchedulerImpl::RemoveRunning(SeqEntry* entry) {
  running_.erase(std::find(running_.begin(), running_.end(), entry));
}

}  // namespace carpool::worker::internal
