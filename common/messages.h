// carpool's messages as plain C++ structs: what the router, the workers and the SDK work with.
// common/codec.h turns them into protobuf frames and back; nothing else touches generated types.
#ifndef CARPOOL_COMMON_MESSAGES_H_
#define CARPOOL_COMMON_MESSAGES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/pooling.h"
#include "common/priority.h"
#include "common/sample_result.h"
#include "common/sampling_params.h"
#include "common/tokenizer.h"
#include "common/usage.h"

namespace carpool {

inline constexpr uint32_t kProtocolVersion = 1;

// Machine-readable error reasons (DESIGN.md, error model).
namespace reason {
inline constexpr char kQueueFull[] = "queue_full";
inline constexpr char kTokenBudget[] = "token_budget";
inline constexpr char kTenantQuota[] = "tenant_quota";
inline constexpr char kDeadlineUnmeetable[] = "deadline_unmeetable";
inline constexpr char kDeadlineExceeded[] = "deadline_exceeded";
inline constexpr char kPromptTooLong[] = "prompt_too_long";
inline constexpr char kInvalidArgument[] = "invalid_argument";
inline constexpr char kUnknownModel[] = "unknown_model";
inline constexpr char kWorkerLost[] = "worker_lost";
inline constexpr char kCancelled[] = "cancelled";
inline constexpr char kDraining[] = "draining";
inline constexpr char kUnauthenticated[] = "unauthenticated";
inline constexpr char kInternal[] = "internal";
// RESOURCE_EXHAUSTED: the request reserves more tokens than the cluster could ever admit.
inline constexpr char kTooLarge[] = "too_large";
// UNAVAILABLE: a queued request waited --no-worker-timeout-ms with no worker able to serve it.
inline constexpr char kNoWorkers[] = "no_workers";
// Set by the SDKs, never sent: the connection to the router dropped with the call open.
inline constexpr char kRouterLost[] = "router_lost";
// RESOURCE_EXHAUSTED: the client did not read its answers; the router's backlog for it overflowed
// and its requests were cancelled.
inline constexpr char kClientTooSlow[] = "client_too_slow";
// ALREADY_EXISTS: the request_id is already in flight for this client; the error refers to the
// refused message, never to the live request, which goes on.
inline constexpr char kDuplicateRequestId[] = "duplicate_request_id";
}  // namespace reason

struct ErrorInfo {
  std::string request_id;
  absl::StatusCode code = absl::StatusCode::kInternal;
  std::string reason;
  std::string message;
  int64_t retry_after_ms = 0;
};

// ---- client -> router

// A conversation for the model's chat template (proto ChatInput): the router renders it and
// tokenizes the result without adding special tokens (the template writes them).
struct ChatInput {
  std::string messages_json;              // a JSON array of OpenAI chat messages
  std::string tools_json;                 // a JSON array of OpenAI tools; "": none
  bool add_generation_prompt = true;      // open the assistant's turn
  std::string chat_template_kwargs_json;  // a JSON object of extra template variables; "": none

  bool operator==(const ChatInput&) const = default;
};

struct GenerateInput {
  std::string request_id;
  bool has_text = false;
  std::string text;                  // when has_text
  std::vector<int32_t> token_ids;    // when neither text nor chat
  // Set: the prompt is this conversation, rendered by the model's chat template (has_text is
  // then false, token_ids empty, add_bos unused).
  std::optional<ChatInput> chat = std::nullopt;
  SamplingParams sampling;
  Priority priority = Priority::kDefault;
  int64_t deadline_ms = 0;           // 0: none
  std::string api_key;
  bool stream = false;
  bool add_bos = true;               // text: add the tokenizer's special tokens
  std::string model;                 // "": the served model when the cluster has one
  std::vector<std::string> stop;     // stop strings, matched on the output text
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;   // in the output text
  // A request of a batch job (docs/batch.md): admitted in the batch lane. Only the router's
  // in-process batch runner may set it.
  bool batch_job = false;
  // A resumed stream: the output tokens the client already received (the proto's comment).
  std::vector<int32_t> resume_tokens;
};

// One input of an embed request: text (tokenized by the router) or token ids.
struct EmbedItem {
  bool has_text = false;
  std::string text;
  std::vector<int32_t> token_ids;
};

struct EmbedInput {
  std::string request_id;
  std::vector<EmbedItem> inputs;
  bool normalize = true;
  Pooling pooling = Pooling::kMean;
  Priority priority = Priority::kDefault;
  int64_t deadline_ms = 0;           // 0: none
  std::string api_key;
  bool add_bos = true;
  std::string model;                 // "": the served model when the cluster has one
  bool batch_job = false;            // as GenerateInput::batch_job
};

// Text to token ids with the model's tokenizer (Hugging Face encode).
struct TokenizeInput {
  std::string request_id;
  std::string model;                 // "": the served model when the cluster has one
  std::string text;
  // Whether to add the tokenizer's special tokens. The wire's unset is true for text and false
  // for chat; a chat tokenize sets it false to get the ids a chat generate request gets.
  bool add_special_tokens = true;
  std::string api_key;
  // Set: tokenize this conversation as the model's chat template renders it (text empty).
  std::optional<ChatInput> chat = std::nullopt;
};

// Token ids to text with the model's tokenizer (Hugging Face decode).
struct DetokenizeInput {
  std::string request_id;
  std::string model;
  std::vector<int32_t> token_ids;
  bool skip_special_tokens = false;
  std::string api_key;
};

struct CancelInput {
  std::string request_id;
};

struct StatsQuery {
  std::string api_key;  // needed where the router has tenants
};

// The Batch API's operations (proto BatchCall.Op; docs/batch.md).
enum class BatchOp {
  kUnspecified,
  kCreateFile,   // filename, purpose, content
  kGetFile,      // id
  kFileContent,  // id
  kDeleteFile,   // id
  kCreateBatch,  // input_file_id, endpoint, completion_window, metadata_json
  kGetBatch,     // id
  kListBatches,  // after, limit
  kCancelBatch,  // id
};

// "create_file", "get_batch", ...: for messages and logs.
inline const char* BatchOpName(BatchOp op) {
  switch (op) {
    case BatchOp::kUnspecified:
      break;
    case BatchOp::kCreateFile:
      return "create_file";
    case BatchOp::kGetFile:
      return "get_file";
    case BatchOp::kFileContent:
      return "file_content";
    case BatchOp::kDeleteFile:
      return "delete_file";
    case BatchOp::kCreateBatch:
      return "create_batch";
    case BatchOp::kGetBatch:
      return "get_batch";
    case BatchOp::kListBatches:
      return "list_batches";
    case BatchOp::kCancelBatch:
      return "cancel_batch";
  }
  return "unspecified";
}

// One operation on the router's batch store, as the HTTP gateway's /v1/files and /v1/batches
// serve them. Only the fields of its op are read.
struct BatchCallInfo {
  std::string request_id;
  std::string api_key;
  BatchOp op = BatchOp::kUnspecified;
  std::string id;                 // a file or batch id
  std::string filename;
  std::string purpose;            // "batch"
  std::string content;            // the uploaded file's bytes
  std::string input_file_id;
  std::string endpoint;           // "/v1/chat/completions", ...
  std::string completion_window;  // "24h"
  std::string metadata_json;      // a JSON object; "": none
  std::string after;              // list: the last id of the page before; "": the first page
  int limit = 0;                  // list: 0 = 20

  bool operator==(const BatchCallInfo&) const = default;
};

using ClientMessage = std::variant<GenerateInput, CancelInput, StatsQuery, EmbedInput,
                                   TokenizeInput, DetokenizeInput, BatchCallInfo>;

// ---- router -> client

struct GenerateChunkOut {
  std::string request_id;
  int index = 0;                     // output position of tokens[0]
  std::vector<SampleResult> tokens;
  std::string text;
};

struct GenerateFinalOut {
  std::string request_id;
  std::vector<SampleResult> tokens;  // non-streaming only
  std::string text;
  std::string finish_reason;
  Usage usage;
  Timings timings;
  std::string stop_string;           // the stop string that ended it ("" otherwise)
};

struct WorkerStatsOut {
  std::string worker_id;
  bool healthy = false;
  uint64_t epoch = 0;
  int running = 0;
  int num_kv_blocks = 0;
  int kv_used_blocks = 0;
  int64_t outstanding_tokens = 0;
  int max_num_seqs = 0;
  std::string model;
  int64_t requests_served = 0;
  int waiting = 0;
  bool draining = false;
  int64_t heartbeat_age_ms = 0;
  int cached_prefix_blocks = 0;
  int64_t migrations_in = 0;
  int64_t tokens_generated = 0;
  int64_t preemptions = 0;
  int64_t suspensions = 0;
  // Initialized so the positional aggregates of older fields need not name them.
  std::string weight_dtype{};
  std::string kv_cache_dtype{};
};

struct TenantStatsOut {
  std::string name;
  int active = 0;
  int64_t rejected = 0;
};

struct StatsOut {
  std::vector<WorkerStatsOut> workers;
  int queued = 0;
  int inflight = 0;
  int64_t requests_total = 0;
  int64_t requests_rejected = 0;
  std::map<std::string, int64_t> rejections_by_reason;
  // Admission (see proto Stats).
  int queued_interactive = 0;
  int queued_default = 0;
  int queued_batch = 0;
  int64_t queued_tokens = 0;
  int64_t inflight_tokens = 0;
  int64_t max_queued_tokens = 0;
  int64_t max_inflight_tokens = 0;
  int64_t migrations = 0;
  bool draining = false;
  std::string placement;
  std::vector<TenantStatsOut> tenants;
  double service_tokens_per_s = 0;
  // The batch lane (docs/batch.md): its requests queued and dispatched, and its limits.
  int batch_lane_queued = 0;
  int batch_lane_inflight = 0;
  int batch_max_queued = 0;
  int batch_max_inflight = 0;
  // Batch jobs by status name ("in_progress", ...) and their requests not answered yet; empty
  // and 0 on a router without a batch store.
  std::map<std::string, int64_t> batches_by_status;
  int64_t batch_requests_pending = 0;
};

struct EmbedResultOut {
  std::string request_id;
  std::vector<std::vector<float>> embeddings;  // one per input, in order
  Usage usage;                                 // prompt_tokens only
  Timings timings;
};

struct TokenizeResultOut {
  std::string request_id;
  std::vector<int32_t> token_ids;
  int max_model_len = 0;             // the model's context length
};

struct DetokenizeResultOut {
  std::string request_id;
  std::string text;
};

// The answer to a BatchCallInfo: OpenAI's JSON object for it (a file, a batch, a list of
// batches, a deleted file), and for kFileContent the file's bytes.
struct BatchReplyInfo {
  std::string request_id;
  std::string json;
  std::string content;

  bool operator==(const BatchReplyInfo&) const = default;
};

using ServerMessage = std::variant<GenerateChunkOut, GenerateFinalOut, ErrorInfo, StatsOut,
                                   EmbedResultOut, TokenizeResultOut, DetokenizeResultOut,
                                   BatchReplyInfo>;

// The client request a message answers; "" for stats.
inline const std::string& RequestIdOf(const ServerMessage& m) {
  static const std::string kNone;
  if (auto* c = std::get_if<GenerateChunkOut>(&m)) return c->request_id;
  if (auto* f = std::get_if<GenerateFinalOut>(&m)) return f->request_id;
  if (auto* e = std::get_if<ErrorInfo>(&m)) return e->request_id;
  if (auto* r = std::get_if<EmbedResultOut>(&m)) return r->request_id;
  if (auto* t = std::get_if<TokenizeResultOut>(&m)) return t->request_id;
  if (auto* d = std::get_if<DetokenizeResultOut>(&m)) return d->request_id;
  if (auto* b = std::get_if<BatchReplyInfo>(&m)) return b->request_id;
  return kNone;
}

// ---- worker -> router

struct RegisterInfo {
  std::string worker_id;
  std::string model;
  int max_num_seqs = 0;
  int num_kv_blocks = 0;
  int block_size = 0;
  int max_model_len = 0;
  int vocab_size = 0;
  TokenizerKind tokenizer = TokenizerKind::kNone;
  int bos_token_id = -1;
  int max_num_batched_tokens = 0;
  int embed_queue_size = 0;          // 0: cannot embed
  int hidden_size = 0;
  // The tokenizer handover, when tokenizer is kHuggingFace: the folder's tokenizer.json and
  // tokenizer_config.json ("" when it has none) as bytes.
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::vector<int32_t> eos_token_ids;  // what ends generation
  std::string chat_template_jinja;     // the folder's chat_template.jinja ("": none)
  // Its weights' and KV cache's storage: "fp32", "bf16", "fp16", "int8" ("": no model).
  std::string weight_dtype{};
  std::string kv_cache_dtype{};
};

struct WorkerLoad {
  int running = 0;
  int waiting = 0;
  int kv_used_blocks = 0;
  int kv_free_blocks = 0;
  int64_t preemptions = 0;           // cumulative
  int embed_queued = 0;
  int64_t suspensions = 0;           // cumulative: batch-class sequences suspended, KV kept
};

// A worker's embedding batcher, cumulative since the worker started; counts are of inputs.
struct EmbedBatcherCounters {
  int64_t submitted = 0;  // accepted into the queue
  int64_t refused = 0;    // turned away because the queue was full
  int64_t timed_out = 0;  // dropped at their deadline before they ran
  int64_t cancelled = 0;
  int64_t answered = 0;
  int64_t failed = 0;   // got an error from the model
  int64_t batches = 0;  // including the retries of split batches
  std::vector<int64_t> batch_size_counts;  // [s]: batches of s inputs
  int max_batch_size = 0;
  int64_t queue_wait_count = 0;       // inputs that reached a batch
  int64_t queue_wait_sum_micros = 0;  // their total time from queue to first batch

  bool operator==(const EmbedBatcherCounters&) const = default;
};

struct HeartbeatInfo {
  // Not an aggregate, so that `HeartbeatInfo{epoch, load}` stays warning-free (-Wextra).
  HeartbeatInfo() = default;
  HeartbeatInfo(uint64_t epoch, WorkerLoad load,
                std::optional<EmbedBatcherCounters> embed_batcher = std::nullopt)
      : epoch(epoch), load(load), embed_batcher(std::move(embed_batcher)) {}

  uint64_t epoch = 0;
  WorkerLoad load;
  std::optional<EmbedBatcherCounters> embed_batcher;  // absent when the worker cannot embed
};

struct TokenEvent {
  uint64_t dispatch_id = 0;
  bool has_token = false;
  SampleResult token;
  bool finished = false;
  std::string finish_reason;
  int cached_prompt_tokens = 0;
};

struct StepTokensInfo {
  uint64_t epoch = 0;
  std::vector<TokenEvent> events;
  WorkerLoad load;
};

struct RequestFailedInfo {
  uint64_t epoch = 0;
  uint64_t dispatch_id = 0;
  ErrorInfo error;
};

struct DeregisterInfo {
  uint64_t epoch = 0;
};

// Prefix-cache blocks the worker now holds (`stored`) or no longer holds (`removed`), by block
// hash; `reset` drops everything reported before.
struct KvEventsInfo {
  uint64_t epoch = 0;
  bool reset = false;
  std::vector<uint64_t> stored;
  std::vector<uint64_t> removed;
};

struct EmbedDoneInfo {
  uint64_t epoch = 0;
  uint64_t dispatch_id = 0;
  std::vector<std::vector<float>> embeddings;
};

using WorkerMessage = std::variant<RegisterInfo, HeartbeatInfo, StepTokensInfo, RequestFailedInfo,
                                   DeregisterInfo, KvEventsInfo, EmbedDoneInfo>;

// ---- router -> worker

struct RegisterAckInfo {
  uint64_t epoch = 0;
};

struct DispatchInfo {
  uint64_t dispatch_id = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> output_tokens;  // already generated elsewhere; continue after them
  SamplingParams sampling;
  Priority priority = Priority::kDefault;
  uint64_t cache_salt = 0;
};

struct EmbedDispatchInfo {
  uint64_t dispatch_id = 0;
  std::vector<std::vector<int32_t>> inputs;
  bool normalize = true;
  Pooling pooling = Pooling::kMean;
  Priority priority = Priority::kDefault;
};

struct WorkerCancelInfo {
  uint64_t dispatch_id = 0;
};

struct DrainInfo {};

using RouterMessage =
    std::variant<RegisterAckInfo, DispatchInfo, WorkerCancelInfo, DrainInfo, EmbedDispatchInfo>;

}  // namespace carpool

#endif  // CARPOOL_COMMON_MESSAGES_H_
