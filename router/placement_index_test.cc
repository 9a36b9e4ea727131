// The placement index (router/placement_index.h) against the linear placement it replaced:
// random fleets under random changes, and at every step each policy's choice through
// GenerateKind::PlaceAmong compared with router::Place over GenerateKind::Place's snapshots;
// the same for embed requests, EmbedKind::PlaceAmong against router::Place over
// EmbedKind::Place's snapshots.
#include "router/placement_index.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_hash.h"
#include "gtest/gtest.h"
#include "router/embed_kind.h"
#include "router/generate_kind.h"
#include "router/placement.h"
#include "router/prefix_index.h"
#include "router/worker_registry.h"

namespace carpool::router {
namespace {

RegisterInfo Info(std::string identity, std::string model, int max_num_seqs,
                  int num_kv_blocks = 0) {
  RegisterInfo info;
  info.worker_id = std::move(identity);
  info.model = std::move(model);
  info.max_num_seqs = max_num_seqs;
  info.num_kv_blocks = num_kv_blocks;
  info.block_size = 16;
  return info;
}

constexpr PlacementPolicy kPolicies[] = {PlacementPolicy::kRoundRobin,
                                         PlacementPolicy::kLeastLoaded,
                                         PlacementPolicy::kPowerOfTwo,
                                         PlacementPolicy::kPrefixAffinity};

// A random fleet of two models, its prefix index, and the prompts its caches hold parts of.
class Fleet {
 public:
  explicit Fleet(uint64_t seed) : rng_(seed) {
    for (int p = 0; p < 6; ++p) {
      std::vector<int32_t> prompt(8 + rng_() % 120);
      // Prompts 0 and 1 share their first 40 tokens (a system prompt); the others differ.
      for (size_t i = 0; i < prompt.size(); ++i) {
        prompt[i] = p < 2 && i < 40 ? static_cast<int32_t>(i) : static_cast<int32_t>(rng_());
      }
      prompts_.push_back(std::move(prompt));
    }
    const int n = 1 + static_cast<int>(rng_() % 64);
    for (int i = 0; i < n; ++i) Register();
    // In half the fleets most workers start with the system prompt cached: prefix_affinity
    // then finds more holders of a first block than it visits, and walks by load instead.
    if (rng_() % 2 == 0) {
      for (const std::string& identity : names_) {
        const WorkerState* w = registry_.Find(identity);
        if (w == nullptr || rng_() % 8 == 0) continue;
        KvEventsInfo e;
        e.stored = PromptBlockHashes(prompts_[0], std::max(1, w->info.block_size), 0);
        e.stored.resize(std::min<size_t>(e.stored.size(), 1 + rng_() % 3));
        prefixes_.Apply(identity, e, std::max(1, w->info.num_kv_blocks));
      }
    }
  }

  WorkerRegistry& registry() { return registry_; }
  PrefixIndex& prefixes() { return prefixes_; }
  std::mt19937_64& rng() { return rng_; }
  const std::vector<std::string>& names() const { return names_; }

  // A worker, new or re-registered (which may move it to the other model).
  void Register(std::string identity = "") {
    if (identity.empty()) {
      identity = absl::StrCat("w", rng_() % 1000);
      names_.push_back(identity);
    }
    RegisterInfo info;
    info.worker_id = identity;
    info.model = rng_() % 4 == 0 ? "b" : "a";
    info.max_num_seqs = 1 + static_cast<int>(rng_() % 4);
    const int blocks[] = {0, 4, 8, 16, 64};
    info.num_kv_blocks = blocks[rng_() % 5];
    const int sizes[] = {16, 16, 16, 16, 8, 0};
    info.block_size = sizes[rng_() % 6];
    std::vector<uint64_t> orphaned;
    registry_.Register(identity, info, 0, &orphaned);
    prefixes_.RemoveWorker(identity);
  }

  // One random change of one random worker.
  void Mutate() {
    if (names_.empty()) {
      Register();
      return;
    }
    const std::string& identity = names_[rng_() % names_.size()];
    WorkerState* w = registry_.Find(identity);
    if (w == nullptr) {
      Register(identity);
      return;
    }
    switch (rng_() % 12) {
      case 0:
        if (rng_() % 3 == 0) {
          Register(identity);
        } else {
          prefixes_.RemoveWorker(identity);
          registry_.Remove(identity);
        }
        return;
      case 1:
      case 2: {
        // Loads from a few values, so ties are common.
        const int64_t loads[] = {0, 0, 10, 20, 20, 40, 100, 500, 1000};
        w->outstanding_tokens = loads[rng_() % 9];
        break;
      }
      case 3:
      case 4: {
        const uint64_t id = next_request_++;
        w->requests.insert(id);
        if (rng_() % 3 == 0) w->batch_jobs.insert(id);
        break;
      }
      case 5:
        if (!w->requests.empty()) {
          const uint64_t id = *w->requests.begin();
          w->requests.erase(id);
          w->batch_jobs.erase(id);
        }
        break;
      case 6:
        w->draining = rng_() % 4 == 0;
        break;
      case 7:
        w->stalled = rng_() % 4 == 0;
        break;
      default:
        CacheEvents(identity, *w);
        return;  // the placement index reads nothing of the prefix cache
    }
    registry_.Changed(w);
  }

  // A random prompt (one the caches hold parts of, or another) and request.
  GenerateRequest Request() {
    GenerateRequest r;
    if (rng_() % 4 == 0) {
      r.prompt.resize(1 + rng_() % 60);
      for (int32_t& t : r.prompt) t = static_cast<int32_t>(rng_());
    } else {
      r.prompt = prompts_[rng_() % prompts_.size()];
    }
    r.sampling.max_tokens = static_cast<int>(rng_() % 200);
    r.cache_salt = rng_() % 4 == 0 ? 1 : 0;
    r.admission.batch_job = rng_() % 3 == 0;
    return r;
  }

 private:
  // KV events: a prompt's chain stored from its start (to some depth), blocks removed from it,
  // a chain stored from its middle, unrelated hashes, or a reset.
  void CacheEvents(const std::string& identity, const WorkerState& w) {
    const std::vector<int32_t>& prompt = prompts_[rng_() % prompts_.size()];
    const std::vector<uint64_t> chain =
        PromptBlockHashes(prompt, std::max(1, w.info.block_size), rng_() % 4 == 0 ? 1 : 0);
    KvEventsInfo e;
    e.reset = rng_() % 12 == 0;
    const size_t depth = chain.empty() ? 0 : rng_() % (chain.size() + 1);
    const size_t from = rng_() % 5 == 0 ? std::min(depth, size_t{1}) : 0;
    for (size_t d = from; d < depth; ++d) e.stored.push_back(chain[d]);
    if (rng_() % 4 == 0 && !chain.empty()) e.removed.push_back(chain[rng_() % chain.size()]);
    if (rng_() % 3 == 0) e.stored.push_back(rng_());
    prefixes_.Apply(identity, e, std::max(1, w.info.num_kv_blocks));
  }

  std::mt19937_64 rng_;
  WorkerRegistry registry_;
  PrefixIndex prefixes_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::string> names_;
  uint64_t next_request_ = 1;
};

// Every placement of every policy on `fleet` now, against the linear placement.
void CheckPlacements(Fleet& fleet, std::vector<GenerateKind*> kinds, int* placed,
                     int* walked) {
  for (const char* model_name : {"a", "b", "none"}) {
    const PlacementIndex* model = fleet.registry().Model(model_name);
    if (model == nullptr) continue;
    const std::vector<WorkerState*>& workers = model->workers();
    ASSERT_TRUE(std::is_sorted(workers.begin(), workers.end(),
                               [](const WorkerState* a, const WorkerState* b) {
                                 return a->identity < b->identity;
                               }));
    for (const WorkerState* w : workers) ASSERT_EQ(w->info.model, model_name);
    for (int k = 0; k < 4; ++k) {
      const PlacementPolicy policy = kPolicies[k];
      const GenerateRequest r = fleet.Request();
      PlacementInput in;
      in.cursor = fleet.rng()() % 1000;
      in.random = fleet.rng()();
      const double weights[] = {1.0, 1.0, 0.5, 2.0, 0.0, 0.03};
      in.affinity_load_weight = weights[fleet.rng()() % 6];
      const PlacementView view = kinds[k]->Place(r, workers, fleet.prefixes());
      PlacementInput reference_in = in;
      reference_in.request_tokens = view.request_tokens;
      const std::optional<int> want = Place(policy, view.snapshots, reference_in);
      const Placement got = kinds[k]->PlaceAmong(r, *model, fleet.prefixes(), policy, in);
      ASSERT_FALSE(got.never.has_value());
      const std::string where = absl::StrCat(PlacementPolicyName(policy), " over ",
                                             workers.size(), " workers, batch_job ",
                                             r.admission.batch_job);
      if (!want) {
        ASSERT_EQ(got.worker, nullptr) << where;
        continue;
      }
      ASSERT_NE(got.worker, nullptr) << where;
      ++*placed;
      const int position = model->PositionOf(got.worker->identity);
      ASSERT_GE(position, 0);
      ASSERT_EQ(workers[position], got.worker);
      if (policy != PlacementPolicy::kPowerOfTwo) {
        ASSERT_EQ(got.worker, workers[*want])
            << where << ": got " << got.worker->identity << " (load "
            << got.worker->outstanding_tokens << "), want " << workers[*want]->identity
            << " (load " << workers[*want]->outstanding_tokens << ")";
        ASSERT_EQ(got.cached_prefix_tokens, view.snapshots[*want].cached_prefix_tokens) << where;
        if (policy == PlacementPolicy::kPrefixAffinity) {
          const std::vector<uint64_t> chain = PromptBlockHashes(r.prompt, 16, r.cache_salt);
          if (!chain.empty() && fleet.prefixes().Holders(chain[0]) > 16) ++*walked;
        }
        continue;
      }
      // power_of_two: a candidate, never the one most loaded of several.
      ASSERT_TRUE(IsCandidate(view.snapshots[position], view.request_tokens)) << where;
      int candidates = 0;
      bool another_as_loaded = false;
      for (size_t i = 0; i < workers.size(); ++i) {
        if (!IsCandidate(view.snapshots[i], view.request_tokens)) continue;
        ++candidates;
        if (static_cast<int>(i) != position &&
            view.snapshots[i].outstanding_tokens >= view.snapshots[position].outstanding_tokens) {
          another_as_loaded = true;
        }
      }
      ASSERT_TRUE(candidates == 1 || another_as_loaded) << where;
    }
  }
}

TEST(PlacementIndexTest, ChoosesWhatTheLinearPlacementChoosesUnderRandomChanges) {
  RouterOptions options[4];
  std::vector<std::unique_ptr<GenerateKind>> kinds;
  std::vector<GenerateKind*> by_policy;
  for (int k = 0; k < 4; ++k) {
    options[k].placement = kPolicies[k];
    kinds.push_back(std::make_unique<GenerateKind>(nullptr, options[k]));
    by_policy.push_back(kinds.back().get());
  }
  int placed = 0;
  int walked = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Fleet fleet(seed);
    // Some fleets start without the holders of each hash (as under the other policies), and
    // build them from the workers' sets halfway.
    if (seed % 5 == 0) fleet.prefixes().TrackHolders(false);
    for (int step = 0; step < 400; ++step) {
      if (step == 200) fleet.prefixes().TrackHolders(true);
      fleet.Mutate();
      ASSERT_EQ(fleet.registry().ResyncPlacement(), 0) << "every change was told";
      CheckPlacements(fleet, by_policy, &placed, &walked);
      if (HasFatalFailure()) {
        ADD_FAILURE() << "seed " << seed << ", step " << step;
        return;
      }
    }
  }
  // The comparisons were not all of empty fleets, and both prefix_affinity searches ran.
  EXPECT_GT(placed, 20000);
  EXPECT_GT(walked, 100);
}

TEST(PlacementIndexTest, RoundRobinCyclesOverTheModelsWorkersByIdentity) {
  WorkerRegistry registry;
  for (const char* id : {"c", "a", "d", "b"}) {
    std::vector<uint64_t> orphaned;
    registry.Register(id, Info(id, std::string(id) == "d" ? "other" : "m", 2), 0, &orphaned);
  }
  const PlacementIndex* model = registry.Model("m");
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->workers().size(), 3u);
  std::string order;
  PlacementIndex::Query q;
  for (q.cursor = 0; q.cursor < 6; ++q.cursor) {
    order += model->workers()[*model->RoundRobin(q)]->identity;
  }
  EXPECT_EQ(order, "abcabc");
  // "b" draining: the cursor that pointed at it goes on to "c".
  registry.Find("b")->draining = true;
  registry.Changed(registry.Find("b"));
  q.cursor = 1;
  EXPECT_EQ(model->workers()[*model->RoundRobin(q)]->identity, "c");
  // Full (both slots held) and drained workers are no candidates of any policy.
  for (const char* id : {"a", "c"}) {
    WorkerState* w = registry.Find(id);
    w->requests = {1, 2};
    registry.Changed(w);
  }
  EXPECT_EQ(model->RoundRobin(q), std::nullopt);
  EXPECT_EQ(model->LeastLoaded(q), std::nullopt);
  EXPECT_EQ(model->PowerOfTwo(q), std::nullopt);
  EXPECT_EQ(model->PrefixAffinity(q, {}), std::nullopt);
  // A batch job's slot is free to others (the worker suspends it), not to another batch job.
  registry.Find("a")->batch_jobs = {2};
  registry.Changed(registry.Find("a"));
  EXPECT_EQ(model->workers()[*model->LeastLoaded(q)]->identity, "a");
  q.batch_job = true;
  EXPECT_EQ(model->LeastLoaded(q), std::nullopt);
  // Removing a worker builds the model's index again; the last one's removal drops it.
  registry.Remove("a");
  EXPECT_EQ(registry.Model("m")->workers().size(), 2u);
  registry.Remove("d");
  EXPECT_EQ(registry.Model("other"), nullptr);
}

TEST(PlacementIndexTest, LeastLoadedSkipsWorkersWithoutRoomAndStopsPastEveryCapacity) {
  WorkerRegistry registry;
  for (int i = 0; i < 64; ++i) {
    // 160 tokens each; the last one 1600.
    const RegisterInfo info = Info(absl::StrCat("w", 100 + i), "m", 8, i == 63 ? 100 : 10);
    std::vector<uint64_t> orphaned;
    registry.Register(info.worker_id, info, 0, &orphaned);
    WorkerState* w = registry.Find(info.worker_id);
    w->outstanding_tokens = 100 + i;
    registry.Changed(w);
  }
  const PlacementIndex* model = registry.Model("m");
  PlacementIndex::Query q;
  q.request_tokens = 60;
  EXPECT_EQ(model->workers()[*model->LeastLoaded(q)]->identity, "w100");
  q.request_tokens = 61;  // 100 + 61 > 160: only the large one has room
  EXPECT_EQ(model->workers()[*model->LeastLoaded(q)]->identity, "w163");
  q.request_tokens = 2000;  // nobody
  EXPECT_EQ(model->LeastLoaded(q), std::nullopt);
  EXPECT_EQ(model->RoundRobin(q), std::nullopt);
  EXPECT_EQ(model->PowerOfTwo(q), std::nullopt);
  // A worker holding nothing takes even a request larger than its capacity.
  WorkerState* idle = registry.Find("w140");
  idle->outstanding_tokens = 0;
  registry.Changed(idle);
  EXPECT_EQ(model->workers()[*model->LeastLoaded(q)]->identity, "w140");
}

TEST(PlacementIndexTest, PowerOfTwoDrawsEveryCandidateButNeverTheMostLoaded) {
  WorkerRegistry registry;
  for (int i = 0; i < 5; ++i) {
    const RegisterInfo info = Info(absl::StrCat("w", i), "m", 4);
    std::vector<uint64_t> orphaned;
    registry.Register(info.worker_id, info, 0, &orphaned);
    WorkerState* w = registry.Find(info.worker_id);
    w->outstanding_tokens = 10 * (i + 1);
    registry.Changed(w);
  }
  const PlacementIndex* model = registry.Model("m");
  std::mt19937_64 rng(3);
  std::map<std::string, int> picks;
  PlacementIndex::Query q;
  for (int i = 0; i < 4000; ++i) {
    q.random = rng();
    ++picks[model->workers()[*model->PowerOfTwo(q)]->identity];
  }
  // Of two distinct uniform draws among 5, the less loaded: worker i wins with probability
  // (4 - i) / 10.
  EXPECT_EQ(picks.count("w4"), 0u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(picks[absl::StrCat("w", i)] / 4000.0, (4 - i) / 10.0, 0.03) << i;
  }
}

// A random fleet of two models whose workers embed (queues of a few sizes) or not, under the
// changes that embed placement reads: embed inputs dispatched and answered, loads, draining,
// stalls, registrations (a new queue size, or the other model) and removals.
class EmbedFleet {
 public:
  explicit EmbedFleet(uint64_t seed) : rng_(seed) {
    // Up to ~150 workers of model "a": blocks of 8 to 13, so queries cross several.
    const int n = 1 + static_cast<int>(rng_() % (seed % 3 == 0 ? 200 : 40));
    for (int i = 0; i < n; ++i) Register();
  }

  WorkerRegistry& registry() { return registry_; }
  PrefixIndex& prefixes() { return prefixes_; }
  std::mt19937_64& rng() { return rng_; }

  void Register(std::string identity = "") {
    if (identity.empty()) {
      identity = absl::StrCat("e", rng_() % 1000);
      names_.push_back(identity);
    }
    const std::string model = rng_() % 4 == 0 ? "b" : "a";
    RegisterInfo info = Info(identity, model, 1 + static_cast<int>(rng_() % 4));
    const int queues[] = {0, 0, 1, 2, 4, 8, 8, 64};
    info.embed_queue_size = queues[rng_() % 8];
    std::vector<uint64_t> orphaned;
    registry_.Register(identity, info, 0, &orphaned);
  }

  void Mutate() {
    if (names_.empty()) {
      Register();
      return;
    }
    const std::string& identity = names_[rng_() % names_.size()];
    WorkerState* w = registry_.Find(identity);
    if (w == nullptr) {
      Register(identity);
      return;
    }
    const int queue = w->info.embed_queue_size;
    switch (rng_() % 10) {
      case 0:
        if (rng_() % 3 == 0) {
          Register(identity);
        } else {
          registry_.Remove(identity);
        }
        return;
      case 1:
      case 2: {
        const int64_t loads[] = {0, 0, 10, 20, 20, 40, 100, 500, 1000};
        w->outstanding_tokens = loads[rng_() % 9];
        break;
      }
      case 3:
      case 4:
        // An embed dispatched (only where it fits, as the router dispatches), or a few.
        w->embed_inputs += 1 + static_cast<int>(rng_() % std::max(1, queue));
        w->embed_inputs = std::min(w->embed_inputs, std::max(queue, 0));
        break;
      case 5:
        w->embed_inputs = std::max(0, w->embed_inputs - 1 - static_cast<int>(rng_() % 8));
        break;
      case 6:
        w->draining = rng_() % 4 == 0;
        break;
      case 7:
        w->stalled = rng_() % 4 == 0;
        break;
      default:
        w->requests.insert(next_request_++);  // a generate slot: embed placement reads none
        break;
    }
    registry_.Changed(w);
  }

  // An embed request of a random number of inputs (at times more than any queue holds).
  EmbedRequest Request() {
    EmbedRequest r;
    const int inputs[] = {0, 1, 1, 1, 2, 3, 4, 5, 8, 9, 64, 65};
    r.tokens.resize(inputs[rng_() % 12], std::vector<int32_t>{1, 2});
    r.total_tokens = static_cast<int64_t>(rng_() % 300);
    r.validated = true;
    r.admission.batch_job = rng_() % 3 == 0;
    r.input.batch_job = r.admission.batch_job;
    return r;
  }

 private:
  std::mt19937_64 rng_;
  WorkerRegistry registry_;
  PrefixIndex prefixes_;
  std::vector<std::string> names_;
  uint64_t next_request_ = 1;
};

// Every policy's embed placement on `fleet` now, against the linear placement: the same worker
// (power_of_two included), or the same refusal.
void CheckEmbedPlacements(EmbedFleet& fleet, EmbedKind& kind, int* placed, int* refused) {
  for (const char* model_name : {"a", "b"}) {
    const PlacementIndex* model = fleet.registry().Model(model_name);
    if (model == nullptr) continue;
    const std::vector<WorkerState*>& workers = model->workers();
    for (const PlacementPolicy policy : kPolicies) {
      const EmbedRequest r = fleet.Request();
      PlacementInput in;
      in.cursor = fleet.rng()() % 1000;
      in.random = fleet.rng()();
      const double weights[] = {1.0, 1.0, 0.5, 0.0, 0.03, -1.0};
      in.affinity_load_weight = weights[fleet.rng()() % 6];
      const PlacementView view = kind.Place(r, workers, fleet.prefixes());
      const Placement got = kind.PlaceAmong(r, *model, fleet.prefixes(), policy, in);
      const std::string where =
          absl::StrCat(PlacementPolicyName(policy), " over ", workers.size(), " workers, ",
                       r.tokens.size(), " inputs, weight ", in.affinity_load_weight);
      if (view.never) {
        ASSERT_TRUE(got.never.has_value()) << where;
        EXPECT_EQ(got.never->code, view.never->code) << where;
        EXPECT_EQ(got.never->message, view.never->message) << where;
        ++*refused;
        continue;
      }
      ASSERT_FALSE(got.never.has_value()) << where << ": " << got.never->message;
      PlacementInput reference_in = in;
      reference_in.request_tokens = view.request_tokens;
      const std::optional<int> want = Place(policy, view.snapshots, reference_in);
      if (!want) {
        ASSERT_EQ(got.worker, nullptr) << where << ": got " << got.worker->identity;
        continue;
      }
      ASSERT_NE(got.worker, nullptr) << where << ": want " << workers[*want]->identity;
      ASSERT_EQ(got.worker, workers[*want])
          << where << ": got " << got.worker->identity << " (load "
          << got.worker->outstanding_tokens << ", embed inputs " << got.worker->embed_inputs
          << "), want " << workers[*want]->identity << " (load "
          << workers[*want]->outstanding_tokens << ", embed inputs "
          << workers[*want]->embed_inputs << ")";
      EXPECT_EQ(got.cached_prefix_tokens, 0);
      ++*placed;
    }
  }
}

TEST(PlacementIndexTest, EmbedChoosesWhatTheLinearPlacementChoosesUnderRandomChanges) {
  EmbedKind kind(nullptr);
  int placed = 0;
  int refused = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    EmbedFleet fleet(seed);
    for (int step = 0; step < 400; ++step) {
      fleet.Mutate();
      ASSERT_EQ(fleet.registry().ResyncPlacement(), 0) << "every change was told";
      for (const char* model_name : {"a", "b"}) {
        const PlacementIndex* model = fleet.registry().Model(model_name);
        if (model == nullptr) continue;
        int members = 0;
        for (const WorkerState* w : model->workers()) members += w->can_embed() ? 1 : 0;
        ASSERT_EQ(model->embed_members(), members);
      }
      CheckEmbedPlacements(fleet, kind, &placed, &refused);
      if (HasFatalFailure()) {
        ADD_FAILURE() << "seed " << seed << ", step " << step;
        return;
      }
    }
  }
  // Most comparisons chose a worker; the refusals (no embedder, too many inputs) ran too.
  EXPECT_GT(placed, 100000);
  EXPECT_GT(refused, 10000);
}

TEST(PlacementIndexTest, EmbedLaneSkipsWorkersWithoutRoomAndResyncSeesEmbedInputs) {
  WorkerRegistry registry;
  for (int i = 0; i < 40; ++i) {
    RegisterInfo info = Info(absl::StrCat("w", 100 + i), "m", 4);
    info.embed_queue_size = i == 7 ? 0 : 8;
    std::vector<uint64_t> orphaned;
    registry.Register(info.worker_id, info, 0, &orphaned);
    WorkerState* w = registry.Find(info.worker_id);
    w->outstanding_tokens = 1000 - 10 * i;  // the last is the least loaded
    w->embed_inputs = i % 8;                // room 8 - i % 8
    registry.Changed(w);
  }
  const PlacementIndex* model = registry.Model("m");
  ASSERT_EQ(model->embedders(), 39);
  EXPECT_EQ(model->largest_embed_queue(), 8);
  EXPECT_EQ(model->embed_members(), 39);
  // Room for 8: those with no inputs held (i % 8 == 0), w132 the least loaded.
  EXPECT_EQ(model->workers()[*model->EmbedLeastLoaded(8)]->identity, "w132");
  EXPECT_EQ(model->workers()[*model->EmbedLeastLoaded(1)]->identity, "w139");
  EXPECT_EQ(model->workers()[*model->EmbedRoundRobin(8, 33)]->identity, "w100");  // wraps
  EXPECT_EQ(model->workers()[*model->EmbedRoundRobin(8, 9)]->identity, "w116");
  EXPECT_EQ(model->workers()[*model->EmbedRoundRobin(7, 9)]->identity, "w109");  // room 7
  EXPECT_EQ(model->EmbedLeastLoaded(9), std::nullopt);
  EXPECT_EQ(model->EmbedRoundRobin(9, 0), std::nullopt);
  EXPECT_EQ(model->EmbedPowerOfTwo(9, 5), std::nullopt);
  // Of the five with room for 8 (w100, w108, ..., w132), draws 3 and 3 + 1 + 0: w124 and w132.
  EXPECT_EQ(model->workers()[*model->EmbedPowerOfTwo(8, 3)]->identity, "w132");
  // embed_inputs changed without Changed: Resync finds it and reads it.
  WorkerState* w = registry.Find("w132");
  w->embed_inputs = 1;
  EXPECT_EQ(registry.ResyncPlacement(), 1);
  EXPECT_EQ(model->workers()[*model->EmbedLeastLoaded(8)]->identity, "w124");
  // Draining: out of the lane, still an embedder (a request waits rather than "unsupported").
  w->draining = true;
  registry.Changed(w);
  EXPECT_EQ(model->embed_members(), 38);
  EXPECT_EQ(model->embedders(), 39);
}

TEST(PrefixIndexTest, HoldersFollowEveryWorkersSet) {
  std::mt19937_64 rng(11);
  PrefixIndex index;
  const std::vector<std::string> workers = {"a", "b", "c", "d", "e"};
  std::vector<uint64_t> hashes(40);
  for (uint64_t& h : hashes) h = rng();
  std::map<std::string, std::set<uint64_t>> want;
  for (int step = 0; step < 3000; ++step) {
    const std::string& w = workers[rng() % workers.size()];
    if (rng() % 25 == 0) {
      index.RemoveWorker(w);
      want.erase(w);
    } else {
      KvEventsInfo e;
      e.reset = rng() % 20 == 0;
      if (e.reset) want[w].clear();
      for (int i = 0; i < 3; ++i) e.removed.push_back(hashes[rng() % hashes.size()]);
      for (uint64_t h : e.removed) want[w].erase(h);
      for (int i = 0; i < 4; ++i) e.stored.push_back(hashes[rng() % hashes.size()]);
      const int64_t cap = 12;
      for (uint64_t h : e.stored) {
        if (static_cast<int64_t>(want[w].size()) >= cap) break;
        want[w].insert(h);
      }
      index.Apply(w, e, cap);
    }
    if (step % 500 == 499) {
      // Off frees the holders; on builds them again from the workers' sets.
      index.TrackHolders(false);
      ASSERT_FALSE(index.tracks_holders());
      index.TrackHolders(true);
    }
    for (uint64_t h : hashes) {
      std::set<std::string> holders;
      index.ForEachHolder(h, [&](const std::string& holder) {
        EXPECT_TRUE(holders.insert(holder).second) << "once each";
      });
      std::set<std::string> expected;
      for (const auto& [name, held] : want) {
        if (held.contains(h)) expected.insert(name);
      }
      ASSERT_EQ(holders, expected) << "step " << step;
      ASSERT_EQ(index.Holders(h), static_cast<int>(expected.size()));
    }
    for (const std::string& w : workers) {
      ASSERT_EQ(index.Size(w), want.contains(w) ? static_cast<int>(want[w].size()) : 0);
    }
  }
  EXPECT_GT(index.MemoryBytes(), 0);
}

// any_embedder, kept by Register and Remove, says what a scan of every worker says, through
// registrations, re-registrations that change embed_queue_size, and removals in random order.
TEST(WorkerRegistryTest, AnyEmbedderFollowsAScanOfEveryWorker) {
  WorkerRegistry registry;
  std::mt19937 rng(17);
  for (int round = 0; round < 2000; ++round) {
    const std::string id = absl::StrCat("w", rng() % 8);
    if (rng() % 3 == 0) {
      registry.Remove(id);
    } else {
      RegisterInfo info = Info(id, rng() % 2 ? "m" : "other", 4);
      info.embed_queue_size = rng() % 4 == 0 ? 64 : 0;
      std::vector<uint64_t> orphaned;
      registry.Register(id, info, 0, &orphaned);
    }
    const std::vector<const WorkerState*> all = registry.All();
    const bool scan = std::any_of(all.begin(), all.end(), [](const WorkerState* w) {
      return w->info.embed_queue_size > 0;
    });
    ASSERT_EQ(registry.any_embedder(), scan) << "round " << round;
  }
}

}  // namespace
}  // namespace carpool::router
