// How the router serves one kind of request (generate, embed, ...): the core every request the
// router holds shares (Request), and the interface each kind implements (RequestKind), one
// method per stage. Router::Impl (router/router_impl.h) owns the sockets, the event loop, the
// request table, admission, placement and the worker registry; it runs the stages in order for
// every kind alike and a kind calls back into it through RequestHost. A new kind is a new
// RequestKind (its own request struct, its own file) listed in Router::Impl's constructor.
//
// The four ids of a request, one name each in the router's code, comments and logs
// (docs/protocol.md, "The four ids of a request"):
//   request_id   the client's string, unique among that client's requests in flight; the only
//                id a client sees. The router keys (client, request_id) to the router_id.
//   router_id    the router's uint64 for the request's whole life in the router, from admission
//                to its answer, the same across failovers: the key of the request table and of
//                the admission queues.
//   dispatch_id  the router's uint64, new on every dispatch to a worker: it names the request on
//                every router <-> worker message, and news under an older one is stale.
//   seq_id       the worker engine's id of the sequence; the router never sees it.
//
// Thread-compatible: everything here lives on the router's event loop.
#ifndef CARPOOL_ROUTER_REQUEST_KIND_H_
#define CARPOOL_ROUTER_REQUEST_KIND_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/messages.h"
#include "router/admission.h"
#include "router/placement.h"
#include "router/placement_index.h"
#include "router/prefix_index.h"
#include "router/request_validator.h"
#include "router/router_metrics.h"
#include "router/worker_registry.h"

namespace carpool::router {

class RequestKind;

// Where a request is in the router, from its arrival to its end.
enum class Stage {
  // Text whose model's tokenizer is not there yet: no worker has registered (which model it
  // names is not known), or the model's tokenizer is loading. Not admitted yet.
  kWaitingForTokenizer,
  // Its text is being tokenized on the tokenizer pool. Not admitted yet.
  kTokenizing,
  // In the admission controller: queued, or dispatched to a worker.
  kAdmitted,
};

// A request the router holds, from its acceptance to its end. Each kind derives its own struct
// (its input and what it keeps across dispatches) and is the only code that reads those fields.
// At every stage it is in the request table and counts for its client's duplicate request_id
// check; a cancel, its deadline or its client's loss ends it.
struct Request {
  virtual ~Request() = default;

  RequestKind* kind = nullptr;  // its handler; not owned
  uint64_t router_id = 0;
  std::string request_id;
  std::string client;  // the client's name in the router: its socket and routing id
  int tenant = -1;     // index into RouterOptions::tenants; -1: anonymous
  Priority priority = Priority::kDefault;  // the class it runs at (the tenant's cap applied)
  bool validated = false;                  // checked against the model (RequestKind::Validate)
  // The model it names ("": the only one); once resolved, the served model's name.
  std::string model;
  bool model_resolved = false;
  Stage stage = Stage::kAdmitted;
  // What admission is asked: built at arrival, submitted once the prompt's tokens are known.
  AdmissionRequest admission;
  int64_t arrival = 0;                     // micros on the router's clock
  int64_t deadline = 0;                    // micros on the router's clock; 0: none
  int64_t dispatched = 0;                  // its first dispatch; 0: none yet
  // While a worker runs it: the worker's identity and the current dispatch.
  std::string worker;
  uint64_t dispatch_id = 0;
  int64_t outstanding = 0;  // what it adds to its worker's outstanding_tokens
  int migrations = 0;       // times it moved after its worker was lost or stalled
  // Queued while no worker of its model was registered: since when (micros); 0: not so.
  int64_t no_worker_since = 0;
};

// A client's message of some kind, as RequestKind::Receive hands it to the loop.
struct Arrival {
  std::unique_ptr<Request> request;  // kind, request_id and priority (as asked) set
  std::string api_key;
  int64_t deadline_ms = 0;  // 0: none
  absl::Status shape;       // the checks that need no model
};

// How a request sees the workers, for the placement policy (router/placement.h).
struct PlacementView {
  std::vector<WorkerSnapshot> snapshots;  // one per worker, in the order given to Place
  int64_t request_tokens = 0;             // what it adds to a worker's outstanding_tokens
  // Set when no worker of this cluster can ever run it: it ends with this error.
  std::optional<Refusal> never;
};

// Where a request goes now (RequestKind::PlaceAmong).
struct Placement {
  WorkerState* worker = nullptr;      // null: no worker is a candidate now
  int64_t cached_prefix_tokens = 0;   // of its prompt, on `worker` (prefix_affinity)
  std::optional<Refusal> never;       // as PlacementView::never
};

// What a worker said about one dispatched request.
using WorkerEvent = std::variant<TokenEvent, EmbedDoneInfo>;

// The router's loop as a kind sees it. Implemented by Router::Impl; called on the loop only.
class RequestHost {
 public:
  // Sends `message` to `client`. False when the client turned out to be gone: every request of
  // it has then ended (their Request objects are destroyed).
  virtual bool SendToClient(const std::string& client, const ServerMessage& message) = 0;
  // Sends `code`/`why` to the request's client and ends the request.
  virtual void Fail(uint64_t router_id, absl::StatusCode code, const char* why,
                    std::string message) = 0;
  // `r` finished on `w`: takes it off w's books, ends it (it feeds the service rate), then
  // sends `answer` to its client. `r` is destroyed. `cancel_on_worker`: the router ended it
  // before the worker did (a stop string): the worker is told to drop it, so its KV blocks
  // free at once, and its later tokens are stale.
  virtual void Finish(Request& r, WorkerState* w, ServerMessage answer,
                      bool cancel_on_worker) = 0;
  virtual const WorkerRegistry& workers() const = 0;
  virtual RouterMetrics& metrics() = 0;

 protected:
  ~RequestHost() = default;
};

// One kind of request. The loop calls the stages in this order: Receive, Admit (the kind's
// part: AdmissionRequest filled, not yet submitted), TakeTexts when NeedsTokenizer (tokenized
// on the pool, Stage::kTokenizing), Validate (once the tokens are known; a request of token ids at
// arrival once the model is known, else before its first placement), the admission
// controller's Admit with the real prompt tokens, then Place and Dispatch
// each time it is dispatched, OnWorkerEvent for each answer of its worker, and Detach whenever
// it leaves a worker. A lost or stalled worker's requests are detached, re-queued by the loop
// (up to RouterOptions::max_migrations, then UNAVAILABLE worker_lost) and dispatched again:
// Dispatch resumes from what the kind kept (a generate stream: its tokens so far).
class RequestKind {
 public:
  virtual ~RequestKind() = default;

  // The `kind` label of the router's metrics: "generate", "embed".
  virtual const char* name() const = 0;

  // Takes `message` when it is a request of this kind (nullopt: another kind's), and checks
  // what needs no model against the client's `limits` (Arrival::shape).
  virtual std::optional<Arrival> Receive(ClientMessage& message, const RequestLimits& limits) = 0;
  // Admission: sets what `a` needs of this kind (max_tokens, kv_resident) and the request's own
  // state that depends on its tenant (r.tenant is set). A refusal ends it before it is queued.
  virtual std::optional<Refusal> Admit(Request& r, AdmissionRequest* a) = 0;
  // Whether `r` needs its model's tokenizer before it can be validated: text to tokenize, or
  // stop strings to match on the output text.
  virtual bool NeedsTokenizer(const Request& r) const = 0;
  // Whether `r` is a batch job's request (the batch runner's: it waits in the batch lane).
  virtual bool BatchJob(const Request& r) const = 0;
  // The texts to tokenize, moved out of `r` (the tokenizer pool encodes them).
  virtual PromptTexts TakeTexts(Request& r) = 0;
  // Checks `r` against its model; `encoded` holds the tokens of TakeTexts' texts (empty when
  // it had none). An error (its reason: ValidationReason) ends the request.
  virtual absl::Status Validate(Request& r, const ModelLimits& model,
                                const RequestLimits& limits, const EncodedTexts& encoded) = 0;
  // The prompt tokens admission reserves: exact once validated; before (a request of token ids
  // queued before any worker registered), their count.
  virtual int64_t PromptTokens(const Request& r) const = 0;

  // How `r` sees each of `workers` now (credit, load, cached prefix) and its size.
  virtual PlacementView Place(const Request& r, const std::vector<WorkerState*>& workers,
                              const PrefixIndex& prefixes) = 0;
  // The worker of `model` (its placement index) that `policy` chooses for `r` now, given `in`
  // (cursor, random, weight; request_tokens is the kind's): what router::Place chooses over
  // Place()'s view. This default is that, linear in the workers; a kind overrides it with a
  // search of the index (GenerateKind).
  virtual Placement PlaceAmong(const Request& r, const PlacementIndex& model,
                               const PrefixIndex& prefixes, PlacementPolicy policy,
                               PlacementInput in) {
    Placement p;
    PlacementView view = Place(r, model.workers(), prefixes);
    if (view.never) {
      p.never = std::move(view.never);
      return p;
    }
    in.request_tokens = view.request_tokens;
    if (const std::optional<int> pick = router::Place(policy, view.snapshots, in)) {
      p.worker = model.workers()[*pick];
      p.cached_prefix_tokens = view.snapshots[*pick].cached_prefix_tokens;
    }
    return p;
  }
  // Books `r` on `w` (a sequence slot, embed inputs), sets r.outstanding and returns the
  // message that starts it there. r.worker and r.dispatch_id are set; the loop adds
  // r.outstanding to w's outstanding_tokens and sends the message.
  virtual RouterMessage Dispatch(Request& r, WorkerState* w, int64_t cached_prefix_tokens) = 0;

  // An answer of r's worker `w` under r's current dispatch. It may end `r` (RequestHost Finish
  // or Fail).
  virtual void OnWorkerEvent(Request& r, WorkerState* w, WorkerEvent event, int64_t now) = 0;
  // Takes `r` off `w`'s books (what Dispatch booked, not outstanding_tokens: the loop's); false
  // when `w` does not hold it (a re-registration, whose fresh state never counted it).
  virtual bool Detach(const Request& r, WorkerState* w) = 0;
  // Output tokens produced for `r` so far: the tenant's bucket gets back what it reserved
  // beyond them.
  virtual int64_t GeneratedTokens(const Request& r) const = 0;
};

// The Arrival of a client's `input` (GenerateInput, EmbedInput, ...) as request `r` of `kind`:
// what every kind's input carries (request_id, priority, model, api_key, deadline_ms) and
// `shape`.
// The caller moves its own fields into `r`, then `r` into Arrival::request.
template <typename Input>
Arrival ArrivalOf(RequestKind* kind, const Input& input, Request* r, absl::Status shape) {
  r->kind = kind;
  r->request_id = input.request_id;
  r->priority = input.priority;
  r->model = input.model;
  Arrival a;
  a.api_key = input.api_key;
  a.deadline_ms = input.deadline_ms;
  a.shape = std::move(shape);
  return a;
}

// Milliseconds from `from` to `to` (micros); 0 while `to` is unknown (0).
inline double MillisBetween(int64_t from, int64_t to) {
  return to > 0 ? (to - from) / 1000.0 : 0.0;
}

// A worker's KV cache in tokens.
inline int64_t CapacityTokens(const WorkerState& w) { return w.capacity_tokens(); }

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_REQUEST_KIND_H_
