#include "router/embed_kind.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace carpool::router {
namespace {

EmbedRequest& Of(Request& r) { return static_cast<EmbedRequest&>(r); }
const EmbedRequest& Of(const Request& r) { return static_cast<const EmbedRequest&>(r); }

constexpr char kNoEmbedWorker[] =
    "no worker of this cluster serves embeddings (embed_queue_size 0)";

// A draining worker still serves embeddings: a request refused by it waits for credit (on
// another worker, or a replacement) like a generate request, instead of "unsupported".
template <typename Workers>
bool AnyCanEmbed(const Workers& workers) {
  return std::any_of(workers.begin(), workers.end(),
                     [](const WorkerState* w) { return w->info.embed_queue_size > 0; });
}

// Why a request of `inputs` inputs can never be placed among workers of which `embedders`
// embed, the largest embed queue `largest_queue`; nullopt: it can be.
std::optional<Refusal> Never(int inputs, int embedders, int largest_queue) {
  if (embedders == 0) {
    return Refusal{absl::StatusCode::kFailedPrecondition, kReasonUnsupported, kNoEmbedWorker, 0};
  }
  if (inputs > largest_queue) {
    return Refusal{
        absl::StatusCode::kInvalidArgument, reason::kInvalidArgument,
        absl::StrCat("inputs has ", inputs, " entries; this cluster's workers embed at most ",
                     largest_queue, " at once (their embed_queue_size): split the request"),
        0};
  }
  return std::nullopt;
}

}  // namespace

std::optional<Arrival> EmbedKind::Receive(ClientMessage& message, const RequestLimits& limits) {
  auto* input = std::get_if<EmbedInput>(&message);
  if (input == nullptr) return std::nullopt;
  auto r = std::make_unique<EmbedRequest>();
  Arrival a = ArrivalOf(this, *input, r.get(), ValidateEmbedShape(*input, limits));
  r->input = std::move(*input);
  a.request = std::move(r);
  return a;
}

std::optional<Refusal> EmbedKind::Admit(Request& r, AdmissionRequest* a) {
  const WorkerRegistry& registry = host_->workers();
  if (!registry.empty() && !registry.any_embedder()) {
    return Refusal{absl::StatusCode::kFailedPrecondition, kReasonUnsupported, kNoEmbedWorker, 0};
  }
  // Admitted like a generate request of the inputs' tokens and max_tokens 0, but it keeps no KV.
  a->kv_resident = false;
  // A batch job's request (ValidateEmbedShape let only the batch runner send one): the batch
  // lane, and the batch class on its worker.
  if (Of(r).input.batch_job) {
    r.priority = Priority::kBatch;
    a->batch_job = true;
  }
  return std::nullopt;
}

bool EmbedKind::BatchJob(const Request& r) const { return Of(r).input.batch_job; }

bool EmbedKind::NeedsTokenizer(const Request& r) const {
  const std::vector<EmbedItem>& inputs = Of(r).input.inputs;
  return std::any_of(inputs.begin(), inputs.end(), [](const EmbedItem& i) { return i.has_text; });
}

PromptTexts EmbedKind::TakeTexts(Request& r) { return router::TakeTexts(&Of(r).input); }

absl::Status EmbedKind::Validate(Request& request, const ModelLimits& model,
                                 const RequestLimits& limits, const EncodedTexts& encoded) {
  EmbedRequest& r = Of(request);
  absl::StatusOr<ValidatedEmbed> v = ValidateEmbed(r.input, encoded, model, limits);
  if (!v.ok()) return v.status();
  r.tokens = std::move(v->inputs);
  r.total_tokens = v->total_tokens;
  r.input.inputs.clear();
  return absl::OkStatus();
}

int64_t EmbedKind::PromptTokens(const Request& request) const {
  const EmbedRequest& r = Of(request);
  if (r.validated) return r.total_tokens;
  int64_t tokens = 0;
  for (const EmbedItem& item : r.input.inputs) {
    tokens += static_cast<int64_t>(item.token_ids.size());
  }
  return tokens;
}

PlacementView EmbedKind::Place(const Request& request, const std::vector<WorkerState*>& workers,
                               const PrefixIndex&) {
  const EmbedRequest& r = Of(request);
  PlacementView view;
  const int inputs = static_cast<int>(r.tokens.size());
  int largest_queue = 0;
  for (const WorkerState* w : workers) {
    largest_queue = std::max(largest_queue, w->info.embed_queue_size);
  }
  view.never = Never(inputs, AnyCanEmbed(workers) ? 1 : 0, largest_queue);
  if (view.never) return view;
  view.request_tokens = r.total_tokens;
  view.snapshots.resize(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    // No KV capacity check: an embed keeps no blocks once its forward pass is done.
    view.snapshots[i] = {workers[i]->HasEmbedCredit(inputs) ? 1 : 0, workers[i]->outstanding_tokens,
                         0, 0};
  }
  return view;
}

Placement EmbedKind::PlaceAmong(const Request& request, const PlacementIndex& model,
                                const PrefixIndex& prefixes, PlacementPolicy policy,
                                PlacementInput in) {
  const int inputs = static_cast<int>(Of(request).tokens.size());
  Placement p;
  p.never = Never(inputs, model.embedders(), model.largest_embed_queue());
  if (p.never) return p;
  std::optional<int> pick;
  switch (policy) {
    case PlacementPolicy::kRoundRobin:
      pick = model.EmbedRoundRobin(inputs, in.cursor);
      break;
    case PlacementPolicy::kPowerOfTwo:
      pick = model.EmbedPowerOfTwo(inputs, in.random);
      break;
    case PlacementPolicy::kPrefixAffinity:
      // Every score is -weight * load: for a weight >= 0 the least loaded wins (ties: fewer
      // outstanding tokens, then the lowest position), as under least_loaded.
      if (!(std::isfinite(in.affinity_load_weight) && in.affinity_load_weight >= 0)) {
        return RequestKind::PlaceAmong(request, model, prefixes, policy, in);
      }
      pick = model.EmbedLeastLoaded(inputs);
      break;
    default:
      pick = model.EmbedLeastLoaded(inputs);
      break;
  }
  if (pick) p.worker = model.workers()[*pick];
  return p;
}

RouterMessage EmbedKind::Dispatch(Request& request, WorkerState* w, int64_t) {
  EmbedRequest& r = Of(request);
  r.outstanding = r.total_tokens;
  w->embeds.insert(r.router_id);
  w->embed_inputs += static_cast<int>(r.tokens.size());
  EmbedDispatchInfo d;
  d.dispatch_id = r.dispatch_id;
  d.inputs = r.tokens;
  d.normalize = r.input.normalize;
  d.pooling = r.input.pooling;
  d.priority = r.priority;
  return d;
}

void EmbedKind::OnWorkerEvent(Request& request, WorkerState* w, WorkerEvent event, int64_t now) {
  if (auto* done = std::get_if<EmbedDoneInfo>(&event)) {
    OnDone(Of(request), w, std::move(*done), now);
    return;
  }
  host_->Fail(request.router_id, absl::StatusCode::kInternal, reason::kInternal,
              "the worker answered an embed request with tokens");
}

void EmbedKind::OnDone(EmbedRequest& r, WorkerState* w, EmbedDoneInfo done, int64_t now) {
  if (done.embeddings.size() != r.tokens.size()) {
    host_->Fail(r.router_id, absl::StatusCode::kInternal, reason::kInternal,
                absl::StrCat("the worker returned ", done.embeddings.size(), " embeddings for ",
                             r.tokens.size(), " inputs"));
    return;
  }
  // Every vector is as wide as the worker's registered hidden_size (any width, but not empty,
  // for a worker that registered none): an empty or short one is the worker's bug.
  const int want = w->info.hidden_size;
  for (size_t i = 0; i < done.embeddings.size(); ++i) {
    const size_t width = done.embeddings[i].size();
    if (want > 0 ? width != static_cast<size_t>(want) : width == 0) {
      host_->Fail(r.router_id, absl::StatusCode::kInternal, reason::kInternal,
                  absl::StrCat("the worker returned an embedding of ", width, " floats for input ",
                               i, "; it registered hidden_size ", want));
      return;
    }
  }
  EmbedResultOut out;
  out.request_id = r.request_id;
  out.embeddings = std::move(done.embeddings);
  out.usage.prompt_tokens = static_cast<int>(r.total_tokens);
  // No tokens stream back: the "first token" is the answer.
  out.timings = {MillisBetween(r.arrival, r.dispatched), MillisBetween(r.arrival, now),
                 MillisBetween(r.arrival, now)};
  host_->metrics().OnEmbedFinished(out.usage, out.timings, static_cast<int>(out.embeddings.size()));
  host_->Finish(r, w, std::move(out), /*cancel_on_worker=*/false);
}

bool EmbedKind::Detach(const Request& request, WorkerState* w) {
  const EmbedRequest& r = Of(request);
  if (w->embeds.erase(r.router_id) == 0) return false;
  w->embed_inputs -= static_cast<int>(r.tokens.size());
  return true;
}

}  // namespace carpool::router
