// Embed requests (EmbedInput): up to max_embed_inputs texts or token-id lists in, one vector per
// input back (EmbedResultOut). They take no sequence slot and keep no KV on the worker: they are
// placed on embed credit (the worker's embed_queue_size, in inputs) and answered at once.
//
// Thread-compatible: owned by the router's event loop.
#ifndef CARPOOL_ROUTER_EMBED_KIND_H_
#define CARPOOL_ROUTER_EMBED_KIND_H_

#include <cstdint>
#include <vector>

#include "router/request_kind.h"

namespace carpool::router {

// The reason of FAILED_PRECONDITION for an embed request no worker of the cluster can serve.
inline constexpr char kReasonUnsupported[] = "unsupported";

struct EmbedRequest final : Request {
  EmbedInput input;                          // its inputs cleared once validated
  std::vector<std::vector<int32_t>> tokens;  // each input's tokens, once validated
  int64_t total_tokens = 0;
};

class EmbedKind final : public RequestKind {
 public:
  // `host` is not owned and outlives this.
  explicit EmbedKind(RequestHost* host) : host_(host) {}

  const char* name() const override { return "embed"; }
  std::optional<Arrival> Receive(ClientMessage& message, const RequestLimits& limits) override;
  // Refuses FAILED_PRECONDITION unsupported when workers are registered and none embeds.
  std::optional<Refusal> Admit(Request& r, AdmissionRequest* a) override;
  bool NeedsTokenizer(const Request& r) const override;
  bool BatchJob(const Request& r) const override;
  PromptTexts TakeTexts(Request& r) override;
  absl::Status Validate(Request& r, const ModelLimits& model, const RequestLimits& limits,
                        const EncodedTexts& encoded) override;
  int64_t PromptTokens(const Request& r) const override;
  // Never placeable: no worker embeds (unsupported), or more inputs than any worker's embed
  // queue holds (invalid_argument).
  PlacementView Place(const Request& r, const std::vector<WorkerState*>& workers,
                      const PrefixIndex& prefixes) override;
  // What router::Place chooses over Place()'s view, by the model's embed lane
  // (PlacementIndex::Embed*) instead of a snapshot of every worker: O(sqrt(N) log N). On embeds
  // prefix_affinity is least_loaded (nothing is cached); a negative or non-finite weight takes
  // the linear way.
  Placement PlaceAmong(const Request& r, const PlacementIndex& model, const PrefixIndex& prefixes,
                       PlacementPolicy policy, PlacementInput in) override;
  RouterMessage Dispatch(Request& r, WorkerState* w, int64_t cached_prefix_tokens) override;
  // Checks the answer (one vector per input, each of the worker's hidden_size) and relays it;
  // a malformed one ends the request INTERNAL.
  void OnWorkerEvent(Request& r, WorkerState* w, WorkerEvent event, int64_t now) override;
  bool Detach(const Request& r, WorkerState* w) override;
  int64_t GeneratedTokens(const Request&) const override { return 0; }

 private:
  void OnDone(EmbedRequest& r, WorkerState* w, EmbedDoneInfo done, int64_t now);

  RequestHost* host_;
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_EMBED_KIND_H_
