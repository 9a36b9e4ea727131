// libFuzzer target: any byte string as a frame from a client or a worker. Decoding never
// crashes or leaks; what decodes is re-encoded and decodes again to the same kind of message;
// a decoded generate request goes through the router's validator against a byte-tokenizer model;
// the request-id scanner (what a refusal of an undecodable frame names) never crashes, returns
// valid UTF-8 only, and agrees with the decoder on canonical encodings.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/codec.h"
#include "common/wire_scan.h"
#include "router/request_validator.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  using namespace carpool;

  const std::string scanned = ScanClientRequestId(frame);
  Check(wire::IsValidUtf8(scanned));
  if (absl::StatusOr<ClientMessage> m = DecodeClientMessage(frame); m.ok()) {
    absl::StatusOr<ClientMessage> again = DecodeClientMessage(Encode(*m));
    Check(again.ok() && again->index() == m->index());
    // On the canonical encoding (each field once) the scanner finds what the decoder found.
    if (const auto* g = std::get_if<GenerateInput>(&*m);
        g != nullptr && g->request_id.size() <= 128 && wire::IsValidUtf8(g->request_id)) {
      Check(ScanClientRequestId(Encode(*m)) == g->request_id);
    }
    if (const auto* g = std::get_if<GenerateInput>(&*m)) {
      router::RequestLimits limits;
      limits.max_prompt_bytes = 4096;
      router::ModelLimits model;
      model.known = true;
      model.vocab_size = 258;
      model.max_model_len = 2048;
      model.tokenizer = std::make_shared<ByteTokenizer>();
      model.bos_token_id = 256;
      if (router::ValidateShape(*g, limits).ok()) {
        absl::StatusOr<router::ValidatedPrompt> v = router::ValidateGenerate(*g, model, limits);
        if (v.ok()) {
          Check(!v->tokens.empty());
          Check(static_cast<int64_t>(v->tokens.size()) + g->sampling.max_tokens <=
                model.max_model_len);
          for (int32_t t : v->tokens) Check(t >= 0 && t < model.vocab_size);
        } else {
          (void)router::ValidationReason(v.status());
        }
      }
    }
  }
  if (absl::StatusOr<WorkerMessage> m = DecodeWorkerMessage(frame); m.ok()) {
    absl::StatusOr<WorkerMessage> again = DecodeWorkerMessage(Encode(*m));
    Check(again.ok() && again->index() == m->index());
  }
  if (absl::StatusOr<ServerMessage> m = DecodeServerMessage(frame); m.ok()) {
    absl::StatusOr<ServerMessage> again = DecodeServerMessage(Encode(*m));
    Check(again.ok() && again->index() == m->index());
  }
  if (absl::StatusOr<RouterMessage> m = DecodeRouterMessage(frame); m.ok()) {
    absl::StatusOr<RouterMessage> again = DecodeRouterMessage(Encode(*m));
    Check(again.ok() && again->index() == m->index());
  }
  return 0;
}
