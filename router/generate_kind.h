// Generate requests (GenerateInput): a prompt and sampling parameters in, tokens back (streamed
// as GenerateChunkOut, or all at once) and a GenerateFinalOut with usage and timings. A stream
// whose worker is lost resumes on another from the tokens already sent.
//
// The prompt is token ids, text, or a chat (GenerateInput::chat): TakeTexts hands a chat to the
// tokenizer pool, which renders it with the model's chat template right before it tokenizes the
// result without special tokens (router_text.cc); its errors end the request INVALID_ARGUMENT.
//
// Output text: one text::StreamDecoder per request (its model's tokenizer, skip_special_tokens
// as asked) turns the tokens into text as they come, so a chunk's text is what its tokens
// complete; text that only the end completes (a character cut short, a possible stop string)
// comes with the last chunk, or in the final's text when the worker ended without a token. The
// non-streamed final's text is the decode of all the tokens. The decoder lives in the request,
// so a stream resumed on another worker continues its text exactly. Stop strings
// (router/stop_strings.h) are matched on that text; the first one ends the request at once:
// finish_reason "stop", stop_string set, the worker told to drop the sequence.
//
// Thread-compatible: owned by the router's event loop.
#ifndef CARPOOL_ROUTER_GENERATE_KIND_H_
#define CARPOOL_ROUTER_GENERATE_KIND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "router/request_kind.h"
#include "router/router.h"
#include "router/stop_strings.h"
#include "text/stream_decoder.h"

namespace carpool::router {

struct GenerateRequest final : Request {
  bool stream = false;
  GenerateInput input;               // kept until validated
  std::vector<int32_t> prompt;       // token ids, once validated
  SamplingParams sampling;           // seed resolved at admission
  uint64_t cache_salt = 0;           // its tenant's: prefix caches are not shared across tenants
  int64_t first_token = 0;           // micros; 0: none yet
  std::vector<SampleResult> output;  // every token so far, kept across failovers
  // The output text, once validated (kept across failovers). The tokenizer outlives the decoder.
  std::shared_ptr<const Tokenizer> tokenizer;  // null: the model has none (no text)
  bool skip_special_tokens = true;
  std::unique_ptr<text::StreamDecoder> decoder;
  std::optional<StopStrings> stops;
  std::string text;  // non-streamed: the text so far (the final's)
};

class GenerateKind final : public RequestKind {
 public:
  // `host` is not owned and outlives this.
  GenerateKind(RequestHost* host, const RouterOptions& options);

  const char* name() const override { return "generate"; }
  std::optional<Arrival> Receive(ClientMessage& message, const RequestLimits& limits) override;
  std::optional<Refusal> Admit(Request& r, AdmissionRequest* a) override;
  bool NeedsTokenizer(const Request& r) const override;
  bool BatchJob(const Request& r) const override;
  PromptTexts TakeTexts(Request& r) override;
  absl::Status Validate(Request& r, const ModelLimits& model, const RequestLimits& limits,
                        const EncodedTexts& encoded) override;
  int64_t PromptTokens(const Request& r) const override;
  PlacementView Place(const Request& r, const std::vector<WorkerState*>& workers,
                      const PrefixIndex& prefixes) override;
  // A search of the index (router/placement_index.h) that chooses what Place() would.
  Placement PlaceAmong(const Request& r, const PlacementIndex& model, const PrefixIndex& prefixes,
                       PlacementPolicy policy, PlacementInput in) override;
  RouterMessage Dispatch(Request& r, WorkerState* w, int64_t cached_prefix_tokens) override;
  void OnWorkerEvent(Request& r, WorkerState* w, WorkerEvent event, int64_t now) override;
  bool Detach(const Request& r, WorkerState* w) override;
  int64_t GeneratedTokens(const Request& r) const override;

 private:
  // prefix_affinity by the index: the workers that hold the prompt's first block, or, when
  // many do, a walk from the least loaded.
  Placement PlaceByPrefix(const GenerateRequest& r, const PlacementIndex& model,
                          const PrefixIndex& prefixes, const PlacementIndex::Query& q);
  // A resumed stream (GenerateInput::resume_tokens): `tokens` become its output so far, and its
  // decoder and stop strings have seen their text.
  void Resume(GenerateRequest& r, const std::vector<int32_t>& tokens);
  // The worker's answer for a token (and its relay), and the end of the request when finished.
  void OnToken(GenerateRequest& r, WorkerState* w, const TokenEvent& e, int64_t now);
  // The text `token` completes (and, when `last`, all that is left), after the stop strings.
  std::string TextOf(GenerateRequest& r, const SampleResult* token, bool last);

  RequestHost* host_;
  std::vector<uint64_t> cache_salts_;            // by tenant
  bool prefix_affinity_;                         // placement counts each worker's cached prefix
  std::mt19937_64 rng_{std::random_device{}()};  // seeds for requests that name none
};

}  // namespace carpool::router

#endif  // CARPOOL_ROUTER_GENERATE_KIND_H_
