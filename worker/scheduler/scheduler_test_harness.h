// Test-only helpers for the scheduler: a fake model runner over a fake KV pool, a Sequence
// builder, and a harness that steps a scheduler and checks every plan it makes.
#ifndef CARPOOL_WORKER_SCHEDULER_SCHEDULER_TEST_HARNESS_H_
#define CARPOOL_WORKER_SCHEDULER_SCHEDULER_TEST_HARNESS_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/scheduler/scheduler.h"

namespace carpool::worker::scheduler_testing {

constexpr int32_t kEos = 2;
constexpr int32_t kVocab = 1000;

// A model runner without a model. Its fake KV pool holds, for every slot, a hash of the whole
// context up to that position (as real keys and values depend on everything before them):
// computing positions [start, start + n) writes them through the block table, and sampling reads
// the whole context back through it, checks it, and derives the next token from the last slot.
// So tokens depend only on the context, and a wrong block table, a wrongly shared block or a
// missed recompute fails a check or changes the output. With a sliding window (the cache's), a
// step reads, as the kernels do, only the window of each query: positions
// [start - window + 1, end) of a chunk [start, end); entries before it may be released.
class FakeRunner {
 public:
  explicit FakeRunner(const KvCacheManager* kv)
      : kv_(kv),
        window_(kv->sliding_window()),
        slots_(static_cast<size_t>(kv->num_blocks()) * kv->block_size(), 0) {}

  // Emit EOS as the token at sequence position `position` of seq_id.
  void EosAt(int64_t seq_id, int position) { eos_at_[seq_id] = position; }
  // Positions computed so far for seq_id (all steps, including recomputes).
  int64_t computed_tokens(int64_t seq_id) const {
    auto it = computed_.find(seq_id);
    return it == computed_.end() ? 0 : it->second;
  }

  StepOutput Run(const BatchPlan& plan) {
    StepOutput out;
    out.samples.resize(plan.seqs.size());
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const ScheduledSeq& s = plan.seqs[i];
      const std::vector<uint64_t> context = ContextHashes(*s.seq, s.start_position + s.num_tokens);
      Write(s, context);
      CheckReads(s, context);
      if (s.sample) out.samples[i] = Sample(s);
    }
    return out;
  }

 private:
  // context[p] = hash of tokens [0, p].
  static std::vector<uint64_t> ContextHashes(const Sequence& seq, int end) {
    std::vector<uint64_t> context(end);
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (int pos = 0; pos < end; ++pos) {
      h = (h ^ static_cast<uint64_t>(seq.TokenAt(pos))) * 0xBF58476D1CE4E5B9ULL;
      h ^= h >> 31;
      context[pos] = h;
    }
    return context;
  }

  int64_t Slot(const ScheduledSeq& s, int pos) const {
    const int bs = kv_->block_size();
    return static_cast<int64_t>(s.block_table[pos / bs]) * bs + pos % bs;
  }

  void Write(const ScheduledSeq& s, const std::vector<uint64_t>& context) {
    const int end = s.start_position + s.num_tokens;
    ASSERT_GE(static_cast<int>(s.block_table.size()) * kv_->block_size(), end);
    for (int pos = s.start_position; pos < end; ++pos) {
      const int32_t block = s.block_table[pos / kv_->block_size()];
      ASSERT_GE(block, 0) << "seq " << s.seq->seq_id << " writes position " << pos
                          << " through a released entry";
      // Blocks being written are never shared or registered in the prefix cache.
      EXPECT_EQ(kv_->RefCount(block), 1) << "seq " << s.seq->seq_id << " pos " << pos;
      EXPECT_FALSE(kv_->IsCached(block)) << "seq " << s.seq->seq_id << " pos " << pos;
      slots_[Slot(s, pos)] = context[pos];
    }
    computed_[s.seq->seq_id] += s.num_tokens;
  }

  // Reads back what the step's queries attend to, as the attention kernels would.
  void CheckReads(const ScheduledSeq& s, const std::vector<uint64_t>& context) const {
    const int end = s.start_position + s.num_tokens;
    const int first_read = window_ > 0 ? std::max(0, s.start_position - window_ + 1) : 0;
    for (int pos = first_read; pos < end; ++pos) {
      if (s.block_table[pos / kv_->block_size()] < 0) {
        ADD_FAILURE() << "seq " << s.seq->seq_id << ": position " << pos
                      << " is in the window but its block was released";
        break;
      }
      if (slots_[Slot(s, pos)] != context[pos]) {
        ADD_FAILURE() << "seq " << s.seq->seq_id << ": KV slot of position " << pos
                      << " holds another context";
        break;
      }
    }
  }

  SampleResult Sample(const ScheduledSeq& s) {
    const int end = s.start_position + s.num_tokens;
    SampleResult result;
    result.token = 3 + static_cast<int32_t>(slots_[Slot(s, end - 1)] % (kVocab - 3));
    auto eos = eos_at_.find(s.seq->seq_id);
    if (eos != eos_at_.end() && eos->second == end) result.token = kEos;
    result.logprob = -0.01f * static_cast<float>(end);
    return result;
  }

  const KvCacheManager* kv_;
  const int window_;
  std::vector<uint64_t> slots_;
  absl::flat_hash_map<int64_t, int> eos_at_;
  absl::flat_hash_map<int64_t, int64_t> computed_;
};

// Builds a Sequence: SeqBuilder(7).Prompt(20).MaxTokens(4).Build().
class SeqBuilder {
 public:
  explicit SeqBuilder(int64_t seq_id) : seq_(std::make_unique<Sequence>()) {
    seq_->seq_id = seq_id;
    seq_->eos_token_ids = {kEos};
    seq_->sampling.max_tokens = 8;
  }
  // `n` prompt tokens derived from `variant` (equal variants give equal prompts).
  SeqBuilder& Prompt(int n, int variant = -1) {
    const int64_t v = variant >= 0 ? variant : seq_->seq_id;
    seq_->prompt_tokens.resize(n);
    for (int i = 0; i < n; ++i) seq_->prompt_tokens[i] = 3 + (v * 131 + i * 17) % (kVocab - 3);
    return *this;
  }
  SeqBuilder& Tokens(std::vector<int32_t> tokens) {
    seq_->prompt_tokens = std::move(tokens);
    return *this;
  }
  SeqBuilder& MaxTokens(int n) {
    seq_->sampling.max_tokens = n;
    return *this;
  }
  SeqBuilder& WithPriority(Priority p) {
    seq_->priority = p;
    return *this;
  }
  SeqBuilder& Salt(uint64_t salt) {
    seq_->cache_salt = salt;
    return *this;
  }
  SeqBuilder& StopTokens(std::vector<int32_t> ids) {
    seq_->sampling.stop_token_ids = std::move(ids);
    return *this;
  }
  SeqBuilder& IgnoreEos() {
    seq_->sampling.ignore_eos = true;
    return *this;
  }
  std::unique_ptr<Sequence> Build() { return std::move(seq_); }

 private:
  std::unique_ptr<Sequence> seq_;
};

// A plan entry, copied so it outlives the step.
struct Item {
  int64_t seq_id;
  int start;
  int num_tokens;
  bool sample;
  friend bool operator==(const Item&, const Item&) = default;
};
inline std::ostream& operator<<(std::ostream& os, const Item& i) {
  return os << "{seq " << i.seq_id << " @" << i.start << " +" << i.num_tokens
            << (i.sample ? " sample}" : "}");
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  int cached_prompt_tokens = 0;
  int64_t finish_step = -1;
};

struct Config {
  SchedulerOptions sched;
  KvCacheOptions kv;
  Config() {
    sched.max_num_batched_tokens = 64;
    sched.max_num_seqs = 8;
    sched.max_model_len = 256;
    kv.num_blocks = 256;
    kv.block_size = 4;
  }
};

// Owns a KV cache, a scheduler and a fake runner; steps them and checks every plan.
class Harness {
 public:
  explicit Harness(Config config, Clock* clock = nullptr) : options_(config.sched) {
    options_.clock = clock;
    kv_ = *KvCacheManager::Create(config.kv);
    auto scheduler = CreateScheduler(options_, kv_.get());
    EXPECT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = *std::move(scheduler);
    runner_ = std::make_unique<FakeRunner>(kv_.get());
  }

  void Add(std::unique_ptr<Sequence> seq) {
    arrival_step_[seq->seq_id] = step_;
    results_[seq->seq_id];
    scheduler_->Add(std::move(seq));
  }

  // One engine iteration. Returns the plan's entries; preempted ids go to last_preempted().
  std::vector<Item> Step() {
    BatchPlan plan = scheduler_->Schedule();
    // The step's peak: Update only releases and frees.
    peak_used_blocks_ = std::max(peak_used_blocks_, kv_->num_used_blocks());
    std::vector<Item> items = Check(plan);
    last_preempted_ = plan.preempted;
    for (int64_t id : plan.preempted) decoding_.erase(id);
    const StepOutput out = runner_->Run(plan);
    for (const SeqUpdate& u : scheduler_->Update(plan, out)) Record(u);
    ++step_;
    return items;
  }

  // Steps until nothing is left; false if that takes more than max_steps.
  bool RunToCompletion(int max_steps = 10'000) {
    for (int i = 0; i < max_steps && scheduler_->has_unfinished(); ++i) Step();
    return !scheduler_->has_unfinished();
  }

  void ExpectAllBlocksFree() const {
    EXPECT_EQ(kv_->num_used_blocks(), 0);
    EXPECT_EQ(kv_->num_free_blocks(), kv_->num_blocks());
    EXPECT_EQ(kv_->num_seqs(), 0);
  }

  Scheduler& scheduler() { return *scheduler_; }
  KvCacheManager& kv() { return *kv_; }
  FakeRunner& runner() { return *runner_; }
  const std::map<int64_t, Result>& results() const { return results_; }
  const Result& result(int64_t id) const { return results_.at(id); }
  const std::vector<int64_t>& last_preempted() const { return last_preempted_; }
  int64_t steps() const { return step_; }
  // Most blocks in use at once, over all steps so far.
  int peak_used_blocks() const { return peak_used_blocks_; }
  int64_t max_latency_steps() const {
    int64_t worst = 0;
    for (const auto& [id, r] : results_) {
      worst = std::max(worst, r.finish_step - arrival_step_.at(id));
    }
    return worst;
  }

 private:
  // Budgets, ordering and consistency of one plan.
  std::vector<Item> Check(const BatchPlan& plan) {
    std::vector<Item> items;
    std::set<int64_t> seen;
    int sum = 0;
    bool past_decodes = false;
    for (const ScheduledSeq& s : plan.seqs) {
      const Sequence& seq = *s.seq;
      items.push_back({seq.seq_id, s.start_position, s.num_tokens, s.sample});
      EXPECT_TRUE(seen.insert(seq.seq_id).second) << "seq " << seq.seq_id << " twice";
      EXPECT_GT(s.num_tokens, 0);
      EXPECT_EQ(s.start_position, seq.num_computed_tokens);
      EXPECT_LE(s.start_position + s.num_tokens, seq.num_tokens());
      EXPECT_EQ(s.sample, s.start_position + s.num_tokens == seq.num_tokens());
      EXPECT_EQ(seq.status, SeqStatus::kRunning);
      const bool decode = decoding_.contains(seq.seq_id);
      EXPECT_TRUE(!decode || s.num_tokens == 1) << "decode of seq " << seq.seq_id;
      EXPECT_FALSE(decode && past_decodes) << "decode of seq " << seq.seq_id << " after a prefill";
      past_decodes |= !decode;
      sum += s.num_tokens;
    }
    EXPECT_EQ(plan.num_batched_tokens, sum);
    EXPECT_LE(plan.num_batched_tokens, options_.max_num_batched_tokens);
    EXPECT_LE(static_cast<int>(plan.seqs.size()), options_.max_num_seqs);
    EXPECT_LE(scheduler_->num_running(), options_.max_num_seqs);
    return items;
  }

  void Record(const SeqUpdate& u) {
    Result& r = results_[u.seq_id];
    EXPECT_FALSE(r.finished) << "update after finish for seq " << u.seq_id;
    if (u.has_token) {
      r.tokens.push_back(u.sample.token);
      r.logprobs.push_back(u.sample.logprob);
      decoding_.insert(u.seq_id);
      EXPECT_EQ(u.completion_tokens, static_cast<int>(r.tokens.size()));
    }
    if (u.finished) {
      r.finished = true;
      r.reason = u.finish_reason;
      r.cached_prompt_tokens = u.cached_prompt_tokens;
      r.finish_step = step_;
      decoding_.erase(u.seq_id);
    }
  }

  SchedulerOptions options_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<FakeRunner> runner_;
  std::map<int64_t, Result> results_;
  std::map<int64_t, int64_t> arrival_step_;
  std::set<int64_t> decoding_;  // got a token, not finished or preempted since: must decode
  std::vector<int64_t> last_preempted_;
  int64_t step_ = 0;
  int peak_used_blocks_ = 0;
};

}  // namespace carpool::worker::scheduler_testing

#endif  // CARPOOL_WORKER_SCHEDULER_SCHEDULER_TEST_HARNESS_H_
