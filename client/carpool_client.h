// carpool's C++ SDK: generate and chat (blocking or streaming), embed, tokenize / detokenize,
// cancel, stats and batch jobs (files and batches, OpenAI's Batch API) against a carpool router
// over ZeroMQ (docs/protocol.md; usage in docs/client.md).
//
//   auto client = carpool::Client::Connect({.router_endpoint = "tcp://10.0.0.1:5555"});
//   carpool::GenerateInput request;
//   request.has_text = true;
//   request.text = "Hello";
//   absl::StatusOr<carpool::GenerateResult> result = (*client)->Generate(request);
//
// Every call ends within its timeout: a call that gets no final answer in time sends a cancel to
// the router and returns DEADLINE_EXCEEDED. When the connection to the router drops (the router
// died or closed it, or, with zmtp_heartbeat_ms, stopped answering heartbeats), every call open
// on it ends at once with UNAVAILABLE, reason "router_lost" (a tcp:// or ipc:// endpoint; an
// inproc:// connection cannot drop). A server error becomes an absl::Status with the
// server's code and message; its machine-readable reason and retry_after_ms travel as payloads
// (ErrorReason(), RetryAfterMs()).
//
// Thread safety: a Client is thread-safe; any number of threads may call it at once. One I/O
// thread per Client owns the ZeroMQ socket; calls hand it their frames and wait for their own
// answers, so calls never wait for one another.
#ifndef CARPOOL_CLIENT_CARPOOL_CLIENT_H_
#define CARPOOL_CLIENT_CARPOOL_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/messages.h"

namespace zmq {
class context_t;
}  // namespace zmq

namespace carpool {

namespace client_internal {
class Core;
struct Call;
}  // namespace client_internal

struct ClientOptions {
  // The router's frontend endpoint, or several separated by commas: a pair of routers
  // (docs/cluster.md, "Two routers"; router_endpoints). Default: "tcp://127.0.0.1:5555".
  std::string router_endpoint = "tcp://127.0.0.1:5555";
  // The routers to use, in order; when set, router_endpoint is not read. With two or more the
  // client talks to one at a time and fails over: when the connection to it drops (router_lost)
  // or does not come up within connect_timeout_ms, it connects to the next, and every call still
  // open is sent there again, without counting against max_retries: a stream with the tokens
  // it already received as GenerateInput::resume_tokens (it continues after them, no gap and no
  // duplicate), any other call as it was. A call fails over at most once per endpoint. Generate
  // requests without a seed get one drawn here, so a resumed stream is the one the lost router
  // would have produced. Batch calls that change the store are not sent again (as today).
  // Default: empty (router_endpoint).
  std::vector<std::string> router_endpoints;
  // With several routers: a router whose connection is not up this long after the client
  // connected to it is skipped for the next. Default: 1000.
  int64_t connect_timeout_ms = 1000;
  // Timeout of a call whose CallOptions name none, retries and backoff included.
  // Default: 60000.
  int64_t default_timeout_ms = 60000;
  // How many times a request refused with UNAVAILABLE (a draining router, a lost worker, an
  // unreachable router) is sent again. Never once a streamed chunk has reached the caller.
  // Default: 0 (no retries).
  int max_retries = 0;
  // Backoff before retry k (k = 0, 1, ...): uniform in [b/2, b], b = min(initial * 2^k, max),
  // and at least the server's retry_after_ms. Default: 50, 2000.
  int64_t initial_backoff_ms = 50;
  int64_t max_backoff_ms = 2000;
  // Sent with every request whose api_key is empty. Default: empty.
  std::string api_key;
  // CURVE encryption: the router's public key (Z85, 40 characters) turns it on. The client's
  // own key pair is generated per Client when left empty. Default: off.
  std::string curve_server_public_key;
  std::string curve_public_key;
  std::string curve_secret_key;
  // ZMTP heartbeats on the connection: a PING every interval, and a router that sends nothing for
  // 1.5 intervals after one is dropped (its calls end with router_lost) and redialled, so a
  // silent router is noticed within 2.5 intervals. A router that dies with its host alive
  // closes TCP and is noticed at once, heartbeats or not. 0 disables. Default: 1000.
  int zmtp_heartbeat_ms = 1000;
  // Largest message accepted from the router. Default: 16 MiB.
  int64_t max_message_bytes = 16 << 20;
  // The ZeroMQ context to open the socket in; not owned, must outlive the Client. Needed for an
  // inproc:// router_endpoint (e.g. Router::inproc_endpoint(), in Router::zmq_context()).
  // Default: nullptr (the Client has its own context).
  zmq::context_t* zmq_context = nullptr;

  // INVALID_ARGUMENT naming the first bad field.
  absl::Status Validate() const;
  // The routers in order: router_endpoints, or router_endpoint split at commas (blanks
  // trimmed).
  std::vector<std::string> Endpoints() const;
};

struct CallOptions {
  // Deadline of the whole call, retries included; 0 uses ClientOptions::default_timeout_ms.
  // Default: 0.
  int64_t timeout_ms = 0;
};

struct GenerateResult {
  std::string request_id;
  std::vector<SampleResult> tokens;  // in order, with logprob and top alternatives
  std::string text;                  // decoded by the router; empty without a tokenizer
  std::string finish_reason;         // "length" | "stop"
  std::string stop_string;           // the stop string that ended it (GenerateInput::stop)
  Usage usage;
  Timings timings;  // measured by the router, in ms

  std::vector<int32_t> TokenIds() const;
};

struct EmbedResult {
  std::string request_id;
  std::vector<std::vector<float>> embeddings;  // one per input, in order
  Usage usage;                                 // prompt_tokens: every input's tokens
  Timings timings;                             // measured by the router, in ms
};

// A Tokenize or TokenizeChat call: the model's tokenizer, run by the router (Hugging Face
// encode).
struct TokenizeOptions {
  // The model whose tokenizer to use; "" picks the cluster's only model. Default: "".
  std::string model;
  // Add the special tokens the tokenizer puts around a sequence (BOS for Llama), as Hugging
  // Face's encode does. Unset: true for Tokenize; false for TokenizeChat, as transformers'
  // apply_chat_template (the template writes BOS itself). Default: unset.
  std::optional<bool> add_special_tokens;
  // Default: "" (a unique id; ClientOptions::api_key).
  std::string request_id;
  std::string api_key;
  // Deadline of the call, retries included; 0: ClientOptions::default_timeout_ms. Default: 0.
  int64_t timeout_ms = 0;
};

struct TokenizeResult {
  std::string request_id;
  std::vector<int32_t> token_ids;
  int max_model_len = 0;  // the model's context length
};

// A Detokenize call (Hugging Face decode).
struct DetokenizeOptions {
  // Default: "" (the cluster's only model).
  std::string model;
  // Leave out special tokens (BOS, EOS, ...). Default: false, as Hugging Face's decode.
  bool skip_special_tokens = false;
  // Default: "" (a unique id; ClientOptions::api_key).
  std::string request_id;
  std::string api_key;
  // Default: 0 (ClientOptions::default_timeout_ms).
  int64_t timeout_ms = 0;
};

// ---- batch jobs (docs/batch.md): files and batches as OpenAI's Batch API has them

// Options of one batch call (files and batches).
struct BatchCallOptions {
  // Default: "" (ClientOptions::api_key). With tenants, a batch is its creator's tenant's: other
  // keys get NOT_FOUND for its ids.
  std::string api_key;
  // Default: 0 (ClientOptions::default_timeout_ms). An upload of a large file may need more.
  int64_t timeout_ms = 0;
};

// A stored file (OpenAI's file object).
struct FileInfo {
  std::string id;        // "file-..."
  int64_t bytes = 0;
  int64_t created_at = 0;  // unix seconds
  std::string filename;
  std::string purpose;   // "batch" (uploads), "batch_output" (a batch's output and error files)
};

struct BatchRequestCounts {
  int64_t total = 0;
  int64_t completed = 0;
  int64_t failed = 0;
};

// One entry of a batch's `errors`: a line of its input file that failed validation.
struct BatchError {
  std::string code;     // "invalid_json", "duplicate_custom_id", ...
  std::string message;
  int64_t line = 0;     // 1-based line of the input file; 0 when the error names none
};

// A batch (OpenAI's batch object). Timestamps are unix seconds, 0 while not reached.
struct BatchInfo {
  std::string id;  // "batch_..."
  // validating, failed, in_progress, finalizing, completed, expired, cancelling, cancelled.
  std::string status;
  std::string endpoint;  // "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
  std::string input_file_id;
  std::string output_file_id;  // "" until the batch has written it
  std::string error_file_id;   // "" when no request failed (or not written yet)
  std::string completion_window;
  BatchRequestCounts request_counts;
  std::vector<BatchError> errors;  // validation errors of a failed batch, by line
  std::map<std::string, std::string> metadata;
  int64_t created_at = 0;
  int64_t in_progress_at = 0;
  int64_t expires_at = 0;
  int64_t finalizing_at = 0;
  int64_t completed_at = 0;
  int64_t failed_at = 0;
  int64_t expired_at = 0;
  int64_t cancelling_at = 0;
  int64_t cancelled_at = 0;

  // failed, completed, expired or cancelled: nothing changes any more.
  bool finished() const;
};

struct BatchList {
  std::vector<BatchInfo> data;  // newest first
  bool has_more = false;        // more after data.back(): ListBatches(data.back().id)
};

// A SubmitBatch or SubmitBatchFile call.
struct SubmitBatchOptions {
  // The endpoint every line names in its url. SubmitBatchFile: "" takes the first line's url.
  // Default: "".
  std::string endpoint;
  // How long the batch may run before it ends expired: "24h", or carpool's "Ns", "Nm", "Nh" up to
  // 24h. Default: "24h".
  std::string completion_window = "24h";
  // Up to 16 string values, kept with the batch. Default: none.
  std::map<std::string, std::string> metadata;
  // SubmitBatchFile: the uploaded file's name. Default: "batch.jsonl".
  std::string filename = "batch.jsonl";
  BatchCallOptions call;
};

// What a finished batch wrote: its output file (one line per answered request,
// {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}) and its error
// file (the lines whose request failed), in input order; "" when the batch has none.
struct BatchResultFiles {
  std::string output_jsonl;
  std::string error_jsonl;
};

// Payload keys of a server error's details on an absl::Status.
inline constexpr char kReasonPayloadUrl[] = "carpool.reason";
inline constexpr char kRetryAfterPayloadUrl[] = "carpool.retry_after_ms";

// The status for a server Error: its code and message, with reason and retry_after_ms payloads.
absl::Status StatusFromError(const ErrorInfo& error);
// The machine-readable reason ("queue_full", ...) of a status from this SDK; "" when none.
std::string ErrorReason(const absl::Status& status);
// The server's retry_after_ms of a status from this SDK; 0 when none.
int64_t RetryAfterMs(const absl::Status& status);

// One streaming request, read chunk by chunk. Next() and result() belong to one thread at a time;
// Cancel() may be called from any thread. May outlive its Client (calls then end CANCELLED).
class Stream {
 public:
  ~Stream();  // cancels the request if it has not ended
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Waits at most wait_ms (-1: until the call's deadline) for what comes next:
  //   a chunk;
  //   nullopt: the final arrived and result() is complete;
  //   an error, which ends the stream: the server's Error (ErrorReason tells why), CANCELLED
  //   after Cancel(), DEADLINE_EXCEEDED when the call's deadline passed (the router is told to
  //   cancel);
  //   DEADLINE_EXCEEDED with done() still false: only wait_ms passed; call Next again.
  // After the end, Next returns the same end again.
  absl::StatusOr<std::optional<GenerateChunkOut>> Next(int64_t wait_ms = -1);
  // Ends the request: the router is told, and Next returns CANCELLED once the chunks already
  // received are read. No effect after the end.
  void Cancel();

  bool done() const { return done_; }
  const std::string& request_id() const { return result_.request_id; }
  // What has arrived so far; complete once Next returned nullopt.
  const GenerateResult& result() const { return result_; }

 private:
  friend class Client;
  Stream(std::shared_ptr<client_internal::Core> core, std::shared_ptr<client_internal::Call> call,
         std::string frame, absl::Time deadline, int64_t timeout_ms);
  // Handles an UNAVAILABLE error by waiting and sending again; false when it should end instead.
  bool Retry(const ErrorInfo& error);
  // Handles router_lost with routers to fail over to: sends the request to the current one
  // (the I/O thread has switched), resuming after the tokens received; false when it should
  // end instead (no other router, failovers used up, past the deadline).
  bool FailOver(const ErrorInfo& error);
  absl::Status Finish(absl::Status status);

  std::shared_ptr<client_internal::Core> core_;
  std::shared_ptr<client_internal::Call> call_;
  std::string frame_;  // the encoded request, for retries
  // The request itself (routers to fail over to only): a resumed stream re-sends it with the
  // tokens received so far as resume_tokens.
  std::optional<GenerateInput> input_;
  int failovers_ = 0;  // times sent to another router after router_lost
  absl::Time deadline_;
  int64_t timeout_ms_ = 0;
  int retries_ = 0;
  bool received_chunk_ = false;
  bool done_ = false;
  absl::Status end_status_;
  GenerateResult result_;
};

class Client {
 public:
  // Starts the I/O thread and connects. Does not wait for the router: calls to a router that
  // never answers end with DEADLINE_EXCEEDED.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // Ends every call in flight with CANCELLED and tells the router to cancel them (waiting at most
  // ~200 ms for those messages to leave). REQUIRES: no other thread is inside a method.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends `request` (non-streaming on the wire) and waits for its final. An empty request_id is
  // replaced by a unique one; an empty api_key by ClientOptions::api_key. ALREADY_EXISTS when
  // another call of this Client uses the same request_id.
  absl::StatusOr<GenerateResult> Generate(GenerateInput request, const CallOptions& call = {});

  // Streams `request`, calling on_chunk for each chunk, in order, on the calling thread (never on
  // the I/O thread: a slow callback delays only this call). The result holds every token.
  absl::StatusOr<GenerateResult> GenerateStream(
      GenerateInput request, const std::function<void(const GenerateChunkOut&)>& on_chunk,
      const CallOptions& call = {});

  // Starts a streaming request and returns it to be read with Stream::Next.
  absl::StatusOr<std::unique_ptr<Stream>> StartStream(GenerateInput request,
                                                      const CallOptions& call = {});

  // Chat, ChatStream, StartChatStream: Generate, GenerateStream and StartStream with the
  // conversation `chat` as the prompt (ChatInput, common/messages.h: the messages as a JSON
  // array of OpenAI chat messages, tools as a JSON array or "" for none, add_generation_prompt,
  // chat_template_kwargs as a JSON object or "" for none). The router renders it with the model's
  // chat template (or its --chat-template) and tokenizes the text without adding special tokens
  // again, as transformers' apply_chat_template does; `request` carries everything else
  // (sampling, model, stop, ids, ...) and must have no prompt of its own (has_text false,
  // token_ids empty, chat unset): INVALID_ARGUMENT otherwise, before sending. The router answers
  // INVALID_ARGUMENT for a conversation it refuses (not JSON, an unknown role, a content part
  // that is not text, a template that raises: its message, a template over its limits, a model
  // with no chat template).
  absl::StatusOr<GenerateResult> Chat(ChatInput chat, GenerateInput request = {},
                                      const CallOptions& call = {});
  absl::StatusOr<GenerateResult> ChatStream(
      ChatInput chat, GenerateInput request,
      const std::function<void(const GenerateChunkOut&)>& on_chunk, const CallOptions& call = {});
  absl::StatusOr<std::unique_ptr<Stream>> StartChatStream(ChatInput chat,
                                                          GenerateInput request = {},
                                                          const CallOptions& call = {});

  // Embeddings of request.inputs (text or token ids), one per input, in order. Same ids,
  // api_key defaults, retries and deadline as Generate.
  absl::StatusOr<EmbedResult> Embed(EmbedInput request, const CallOptions& call = {});

  // The token ids of `text` with the model's tokenizer, tokenized by the router; retries and
  // deadline as Generate. INVALID_ARGUMENT for text that is not UTF-8, NOT_FOUND
  // (unknown_model) for a model the cluster does not serve, UNIMPLEMENTED-style errors from a
  // router whose model has no tokenizer (token ids only).
  absl::StatusOr<TokenizeResult> Tokenize(std::string text, const TokenizeOptions& options = {});

  // The token ids of the conversation `chat` as the model's chat template renders it: the
  // prompt ids Chat with the same ChatInput gets (options.add_special_tokens unset: false).
  // Errors as Tokenize and Chat.
  absl::StatusOr<TokenizeResult> TokenizeChat(ChatInput chat, const TokenizeOptions& options = {});

  // The text of `token_ids` with the model's tokenizer. INVALID_ARGUMENT for an id outside the
  // vocabulary.
  absl::StatusOr<std::string> Detokenize(std::vector<int32_t> token_ids,
                                         const DetokenizeOptions& options = {});

  // Cancels a call of this Client in flight: it returns CANCELLED and the router frees its
  // resources. NOT_FOUND when no call with that id is in flight.
  absl::Status Cancel(const std::string& request_id);

  // The router's view of the cluster. timeout_ms 0: ClientOptions::default_timeout_ms.
  absl::StatusOr<StatsOut> Stats(int64_t timeout_ms = 0);

  // ---- batch jobs (docs/batch.md). Errors are the router's: NOT_FOUND (reason not_found) for an
  // id this key's tenant does not own, INVALID_ARGUMENT for a bad endpoint, window or metadata,
  // OUT_OF_RANGE for a file above the router's --batch-max-file-bytes, FAILED_PRECONDITION for a
  // router without a batch store or a cancel of a finished batch. A call that may have changed
  // the store (an upload, a submit, a cancel, a delete) is not sent again after the connection
  // dropped (router_lost), whatever max_retries says.

  // Uploads `content` (JSONL, one request a line: {"custom_id", "method": "POST", "url",
  // "body"}) as a batch input file.
  absl::StatusOr<FileInfo> UploadFile(std::string filename, std::string content,
                                      const BatchCallOptions& options = {});
  absl::StatusOr<FileInfo> GetFile(const std::string& file_id,
                                   const BatchCallOptions& options = {});
  // The file's bytes. RESOURCE_EXHAUSTED, before asking for them, when the file is larger than
  // ClientOptions::max_message_bytes lets through.
  absl::StatusOr<std::string> FileContent(const std::string& file_id,
                                          const BatchCallOptions& options = {});
  absl::Status DeleteFile(const std::string& file_id, const BatchCallOptions& options = {});

  // Starts a batch of the uploaded file `input_file_id` (options.endpoint required). The batch
  // starts in validating: the whole file is checked before any request runs, and a bad line
  // fails the batch with every error listed (BatchInfo::errors).
  absl::StatusOr<BatchInfo> SubmitBatch(const std::string& input_file_id,
                                        const SubmitBatchOptions& options);
  // UploadFile then SubmitBatch; an empty options.endpoint is the first line's url
  // (INVALID_ARGUMENT, before sending, when that line is not JSON with a string url).
  absl::StatusOr<BatchInfo> SubmitBatchFile(std::string jsonl, const SubmitBatchOptions& options);
  absl::StatusOr<BatchInfo> GetBatch(const std::string& batch_id,
                                     const BatchCallOptions& options = {});
  // This tenant's batches, newest first: `limit` (1..100; 0: 20) after the batch `after` ("":
  // from the newest).
  absl::StatusOr<BatchList> ListBatches(const std::string& after = "", int limit = 0,
                                        const BatchCallOptions& options = {});
  // validating or in_progress: cancelling, then cancelled once the requests in flight ended,
  // with what finished kept. Cancelling or cancelled: unchanged. FAILED_PRECONDITION when it
  // already ended otherwise.
  absl::StatusOr<BatchInfo> CancelBatch(const std::string& batch_id,
                                        const BatchCallOptions& options = {});
  // Polls the batch every poll_ms until it is finished() or options.timeout_ms passes (0: no
  // limit; DEADLINE_EXCEEDED then), calling on_poll (when set) with each state it read.
  absl::StatusOr<BatchInfo> WaitBatch(const std::string& batch_id, int64_t poll_ms = 1000,
                                      const std::function<void(const BatchInfo&)>& on_poll = {},
                                      const BatchCallOptions& options = {});
  // The output and error files of a finished batch (completed, expired or cancelled: what
  // finished; failed validation: none). FAILED_PRECONDITION while it still runs.
  absl::StatusOr<BatchResultFiles> BatchResults(const std::string& batch_id,
                                                const BatchCallOptions& options = {});

  const ClientOptions& options() const;

 private:
  explicit Client(std::shared_ptr<client_internal::Core> core);
  absl::StatusOr<std::unique_ptr<Stream>> Start(GenerateInput request, const CallOptions& call);

  std::shared_ptr<client_internal::Core> core_;
};

}  // namespace carpool

#endif  // CARPOOL_CLIENT_CARPOOL_CLIENT_H_
