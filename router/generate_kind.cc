#include "router/generate_kind.h"

#include <algorithm>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "common/block_hash.h"

namespace carpool::router {
namespace {

GenerateRequest& Of(Request& r) { return static_cast<GenerateRequest&>(r); }
const GenerateRequest& Of(const Request& r) { return static_cast<const GenerateRequest&>(r); }

// prefix_affinity visits the holders of the prompt's first block when at most this many
// workers hold it; past that, it walks the candidates from the least loaded.
constexpr int kMaxHoldersVisited = 16;

// A prompt's block-hash chain for the workers of one block size.
struct Chain {
  int block_size = 0;
  std::vector<uint64_t> hashes;
};

}  // namespace

GenerateKind::GenerateKind(RequestHost* host, const RouterOptions& options)
    : host_(host), prefix_affinity_(options.placement == PlacementPolicy::kPrefixAffinity) {
  for (int t = 0; t < options.tenants.size(); ++t) {
    cache_salts_.push_back(options.tenants.at(t).cache_salt);
  }
}

std::optional<Arrival> GenerateKind::Receive(ClientMessage& message, const RequestLimits& limits) {
  auto* input = std::get_if<GenerateInput>(&message);
  if (input == nullptr) return std::nullopt;
  auto r = std::make_unique<GenerateRequest>();
  Arrival a = ArrivalOf(this, *input, r.get(), ValidateShape(*input, limits));
  r->stream = input->stream;
  r->sampling = input->sampling;
  r->input = std::move(*input);
  a.request = std::move(r);
  return a;
}

std::optional<Refusal> GenerateKind::Admit(Request& request, AdmissionRequest* a) {
  GenerateRequest& r = Of(request);
  if (r.tenant >= 0) r.cache_salt = cache_salts_[r.tenant];
  if (!r.sampling.has_seed) {
    r.sampling.has_seed = true;
    r.sampling.seed = rng_();
  }
  a->max_tokens = r.sampling.max_tokens;
  // A batch job's request (ValidateShape let only the batch runner send one) runs in the batch
  // lane, and at the batch class on its worker, which preempts it first.
  if (r.input.batch_job) {
    r.priority = Priority::kBatch;
    a->batch_job = true;
  }
  return std::nullopt;
}

bool GenerateKind::BatchJob(const Request& r) const { return Of(r).input.batch_job; }

bool GenerateKind::NeedsTokenizer(const Request& r) const {
  const GenerateInput& in = Of(r).input;
  return in.has_text || in.chat.has_value() || !in.stop.empty();
}

PromptTexts GenerateKind::TakeTexts(Request& r) { return router::TakeTexts(&Of(r).input); }

absl::Status GenerateKind::Validate(Request& request, const ModelLimits& model,
                                    const RequestLimits& limits, const EncodedTexts& encoded) {
  GenerateRequest& r = Of(request);
  absl::StatusOr<ValidatedPrompt> v = ValidateGenerate(r.input, encoded, model, limits);
  if (!v.ok()) return v.status();
  r.prompt = std::move(v->tokens);
  r.tokenizer = model.tokenizer;
  r.skip_special_tokens = r.input.skip_special_tokens;
  if (!r.input.stop.empty()) {
    r.stops.emplace(std::move(r.input.stop), r.input.include_stop_str_in_output);
  }
  r.input = GenerateInput();
  if (!v->resume_tokens.empty()) Resume(r, v->resume_tokens);
  return absl::OkStatus();
}

void GenerateKind::Resume(GenerateRequest& r, const std::vector<int32_t>& tokens) {
  // They stand as tokens this router produced: Dispatch sends them to the worker as output
  // tokens (recomputed as context, as a worker failover does), chunks continue at their count
  // and usage counts them. Their logprobs went with the lost router: none here.
  r.output.reserve(tokens.size());
  for (int32_t id : tokens) {
    SampleResult t;
    t.token = id;
    r.output.push_back(std::move(t));
  }
  if (r.tokenizer == nullptr) return;
  // The decoder and the stop matcher see the received tokens' text, and a stream lets none of
  // it out (the client has it): they hold back what the lost router held back (a character cut
  // short, a possible stop string), so the text continues exactly. A stop string inside them is
  // not acted on: the lost router would have ended the stream there. A non-streamed request's
  // final text is that of every token, these included.
  r.decoder = std::make_unique<text::StreamDecoder>(r.tokenizer.get(), r.skip_special_tokens);
  for (SampleResult& t : r.output) {
    t.text = r.decoder->Add(t.token);
    std::string out = r.stops ? r.stops->Feed(t.text) : t.text;
    if (!r.stream) r.text += out;
  }
}

int64_t GenerateKind::PromptTokens(const Request& request) const {
  const GenerateRequest& r = Of(request);
  if (r.validated) return static_cast<int64_t>(r.prompt.size());
  return static_cast<int64_t>(r.input.token_ids.size());
}

PlacementView GenerateKind::Place(const Request& request, const std::vector<WorkerState*>& workers,
                                  const PrefixIndex& prefixes) {
  const GenerateRequest& r = Of(request);
  PlacementView view;
  view.request_tokens = static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens;
  view.snapshots.resize(workers.size());
  // The prompt's block-hash chain, once per block size among the workers.
  std::vector<uint64_t> chain;
  int chain_block_size = -1;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerState& w = *workers[i];
    const int credit = w.credit(request.admission.batch_job);
    view.snapshots[i] = {credit, w.outstanding_tokens, CapacityTokens(w), 0};
    if (prefix_affinity_ && credit > 0) {
      if (w.info.block_size != chain_block_size) {
        chain_block_size = w.info.block_size;
        chain = PromptBlockHashes(r.prompt, chain_block_size, r.cache_salt);
      }
      view.snapshots[i].cached_prefix_tokens =
          int64_t{prefixes.MatchedBlocks(w.identity, chain)} * w.info.block_size;
    }
  }
  return view;
}

Placement GenerateKind::PlaceAmong(const Request& request, const PlacementIndex& model,
                                   const PrefixIndex& prefixes, PlacementPolicy policy,
                                   PlacementInput in) {
  const GenerateRequest& r = Of(request);
  PlacementIndex::Query q;
  q.batch_job = request.admission.batch_job;
  q.request_tokens = static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens;
  q.cursor = in.cursor;
  q.random = in.random;
  q.affinity_load_weight = in.affinity_load_weight;
  std::optional<int> pick;
  switch (policy) {
    case PlacementPolicy::kRoundRobin:
      pick = model.RoundRobin(q);
      break;
    case PlacementPolicy::kPowerOfTwo:
      pick = model.PowerOfTwo(q);
      break;
    case PlacementPolicy::kPrefixAffinity:
      // The index's search needs weight >= 0 (RouterOptions checks it).
      // And the holders of each hash (the router keeps them under prefix_affinity).
      if (q.affinity_load_weight < 0 || (prefix_affinity_ && !prefixes.tracks_holders())) {
        return RequestKind::PlaceAmong(request, model, prefixes, policy, in);
      }
      if (prefix_affinity_) return PlaceByPrefix(r, model, prefixes, q);
      pick = model.PrefixAffinity(q, {});  // no cached prefixes counted: Place() sees none
      break;
    default:
      pick = model.LeastLoaded(q);
      break;
  }
  Placement p;
  if (pick) p.worker = model.workers()[*pick];
  return p;
}

Placement GenerateKind::PlaceByPrefix(const GenerateRequest& r, const PlacementIndex& model,
                                      const PrefixIndex& prefixes,
                                      const PlacementIndex::Query& q) {
  // The prompt's chain once per block size among the workers (nearly always one).
  absl::InlinedVector<Chain, 1> chains;
  int holders = 0;
  for (int block_size : model.block_sizes()) {
    Chain c{block_size, PromptBlockHashes(r.prompt, block_size, r.cache_salt)};
    if (c.hashes.empty()) continue;
    holders += prefixes.Holders(c.hashes[0]);
    chains.push_back(std::move(c));
  }
  // The cached tokens of the worker at `position`.
  const auto cached_of = [&](int position) -> int64_t {
    const WorkerState& w = *model.workers()[position];
    for (const Chain& c : chains) {
      if (c.block_size == w.info.block_size) {
        return int64_t{prefixes.MatchedBlocks(w.identity, c.hashes)} * c.block_size;
      }
    }
    return 0;
  };
  std::optional<int> pick;
  if (holders <= kMaxHoldersVisited) {
    absl::InlinedVector<PlacementIndex::Cached, kMaxHoldersVisited> cached;
    for (const Chain& c : chains) {
      prefixes.ForEachHolder(c.hashes[0], [&](const std::string& identity) {
        const int position = model.PositionOf(identity);
        if (position < 0 || model.workers()[position]->info.block_size != c.block_size ||
            !model.IsCandidate(position, q)) {
          return;
        }
        cached.push_back(
            {position, int64_t{prefixes.MatchedBlocks(identity, c.hashes)} * c.block_size});
      });
    }
    pick = model.PrefixAffinity(q, cached);
  } else {
    // No worker caches more of a chain than its first block that no worker holds.
    int64_t max_cached = 0;
    for (const Chain& c : chains) {
      size_t depth = 0;
      while (depth < c.hashes.size() && prefixes.Holders(c.hashes[depth]) > 0) ++depth;
      max_cached = std::max(max_cached, static_cast<int64_t>(depth) * c.block_size);
    }
    pick = model.PrefixAffinityByLoad(q, max_cached, cached_of);
  }
  Placement p;
  if (pick) {
    p.worker = model.workers()[*pick];
    p.cached_prefix_tokens = cached_of(*pick);
  }
  return p;
}

RouterMessage GenerateKind::Dispatch(Request& request, WorkerState* w,
                                     int64_t cached_prefix_tokens) {
  GenerateRequest& r = Of(request);
  // Work still to do: the prompt and the tokens already produced (recomputed on a resumed
  // stream) less what the worker's cache holds, plus the tokens left to generate.
  const auto produced = static_cast<int64_t>(r.output.size());
  r.outstanding = std::max<int64_t>(
                      1, static_cast<int64_t>(r.prompt.size()) + produced - cached_prefix_tokens) +
                  (r.sampling.max_tokens - produced);
  w->requests.insert(r.router_id);
  if (request.admission.batch_job) w->batch_jobs.insert(r.router_id);
  DispatchInfo d;
  d.dispatch_id = r.dispatch_id;
  d.prompt_tokens = r.prompt;
  for (const SampleResult& t : r.output) d.output_tokens.push_back(t.token);
  d.sampling = r.sampling;
  d.priority = r.priority;
  d.cache_salt = r.cache_salt;
  return d;
}

void GenerateKind::OnWorkerEvent(Request& request, WorkerState* w, WorkerEvent event, int64_t now) {
  if (const auto* e = std::get_if<TokenEvent>(&event)) {
    OnToken(Of(request), w, *e, now);
    return;
  }
  host_->Fail(request.router_id, absl::StatusCode::kInternal, reason::kInternal,
              "the worker answered a generate request with embeddings");
}

std::string GenerateKind::TextOf(GenerateRequest& r, const SampleResult* token, bool last) {
  if (r.tokenizer == nullptr) return "";
  if (r.decoder == nullptr) {
    r.decoder = std::make_unique<text::StreamDecoder>(r.tokenizer.get(), r.skip_special_tokens);
  }
  std::string text = token != nullptr ? r.decoder->Add(token->token) : std::string();
  if (last) text += r.decoder->Finish();
  if (token != nullptr && !r.output.empty()) r.output.back().text = text;  // before stops
  if (r.stops) {
    text = r.stops->Feed(text);
    if (last) text += r.stops->Flush();
  }
  if (!r.stream) r.text += text;  // the final's text; a stream's went out in its chunks
  return text;
}

void GenerateKind::OnToken(GenerateRequest& r, WorkerState* w, const TokenEvent& e, int64_t now) {
  bool stopped = false;
  std::string rest;  // text the end completed that no chunk carries
  if (e.has_token) {
    if (r.first_token == 0) r.first_token = now;
    r.output.push_back(e.token);
    ++w->tokens_generated;
    const int64_t left = r.sampling.max_tokens - static_cast<int64_t>(r.output.size());
    w->outstanding_tokens += left - r.outstanding;
    r.outstanding = left;
    std::string text = TextOf(r, &e.token, e.finished);
    stopped = r.stops && r.stops->stopped();
    if (r.stream) {
      GenerateChunkOut chunk;
      chunk.request_id = r.request_id;
      chunk.index = static_cast<int>(r.output.size()) - 1;
      chunk.tokens.push_back(r.output.back());
      chunk.text = std::move(text);
      if (!host_->SendToClient(r.client, chunk)) return;  // the client is gone, and `r` with it
    }
  } else if (e.finished) {
    rest = TextOf(r, nullptr, /*last=*/true);
  }
  if (!e.finished && !stopped) return;
  GenerateFinalOut f;
  f.request_id = r.request_id;
  if (!r.stream) {
    f.tokens = r.output;
    f.text = r.text;
  } else {
    f.text = std::move(rest);
  }
  f.finish_reason = stopped ? "stop" : e.finish_reason;
  if (stopped) f.stop_string = r.stops->matched();
  f.usage = {static_cast<int>(r.prompt.size()), static_cast<int>(r.output.size()),
             e.cached_prompt_tokens};
  f.timings = {MillisBetween(r.arrival, r.dispatched), MillisBetween(r.arrival, r.first_token),
               MillisBetween(r.arrival, now)};
  host_->metrics().OnGenerateFinished(f.finish_reason, f.usage, f.timings);
  // A stop string ends the sequence before the worker would: it drops it (its KV blocks free).
  host_->Finish(r, w, std::move(f), /*cancel_on_worker=*/stopped && !e.finished);
}

bool GenerateKind::Detach(const Request& r, WorkerState* w) {
  w->batch_jobs.erase(r.router_id);
  return w->requests.erase(r.router_id) > 0;
}

int64_t GenerateKind::GeneratedTokens(const Request& r) const {
  return static_cast<int64_t>(Of(r).output.size());
}

}  // namespace carpool::router
