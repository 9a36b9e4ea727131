#include "common/codec.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/wire_ranges.h"
#include "common/wire_scan.h"
#include "proto/carpool.pb.h"

namespace carpool {
namespace {

namespace pb = ::carpool::v1;

// ---- shared pieces

// Milliseconds for a uint32 field: clamped to [0, 2^32 - 1] (about 49.7 days), never wrapped.
uint32_t WireMillis(int64_t ms) {
  return static_cast<uint32_t>(
      std::clamp<int64_t>(ms, 0, std::numeric_limits<uint32_t>::max()));
}

// Each Priority and its proto value; both directions read this one table.
constexpr std::pair<Priority, pb::Priority> kPriorities[] = {
    {Priority::kInteractive, pb::PRIORITY_INTERACTIVE},
    {Priority::kDefault, pb::PRIORITY_DEFAULT},
    {Priority::kBatch, pb::PRIORITY_BATCH},
};

pb::Priority ToProto(Priority p) {
  for (const auto& [priority, wire] : kPriorities) {
    if (priority == p) return wire;
  }
  return pb::PRIORITY_DEFAULT;
}

Priority FromProto(pb::Priority p) { return PriorityFromWire(p); }

void ToProto(const SamplingParams& s, pb::SamplingParams* p) {
  p->set_temperature(s.temperature);
  p->set_top_k(s.top_k);
  p->set_top_p(s.top_p);
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_presence_penalty(s.presence_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  if (s.has_seed) p->set_seed(s.seed);
  p->set_max_tokens(s.max_tokens);
  for (int32_t id : s.stop_token_ids) p->add_stop_token_ids(id);
  p->set_ignore_eos(s.ignore_eos);
  p->set_logprobs(s.logprobs);
}

SamplingParams FromProto(const pb::SamplingParams& p) {
  SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) s.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) s.frequency_penalty = p.frequency_penalty();
  if (p.has_seed()) {
    s.has_seed = true;
    s.seed = p.seed();
  }
  if (p.has_max_tokens()) s.max_tokens = p.max_tokens();
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.logprobs = p.logprobs();
  return s;
}

void ToProto(const SampleResult& t, pb::Token* p) {
  p->set_id(t.token);
  p->set_logprob(t.logprob);
  p->set_text(t.text);
  for (const TokenLogprob& top : t.top_logprobs) {
    pb::TokenLogprob* e = p->add_top_logprobs();
    e->set_token(top.token);
    e->set_logprob(top.logprob);
  }
}

SampleResult FromProto(const pb::Token& p) {
  SampleResult t;
  t.token = p.id();
  t.logprob = p.logprob();
  t.text = p.text();
  for (const pb::TokenLogprob& e : p.top_logprobs()) {
    t.top_logprobs.push_back({e.token(), e.logprob()});
  }
  return t;
}

void ToProto(const ErrorInfo& e, pb::Error* p) {
  p->set_request_id(e.request_id);
  p->set_code(absl::StatusCodeToString(e.code));
  p->set_reason(e.reason);
  p->set_message(e.message);
  p->set_retry_after_ms(WireMillis(e.retry_after_ms));
}

ErrorInfo FromProto(const pb::Error& p) {
  return ErrorInfo{p.request_id(), StatusCodeFromName(p.code()), p.reason(), p.message(),
                   p.retry_after_ms()};
}

void ToProto(const WorkerLoad& l, pb::WorkerLoad* p) {
  p->set_running(l.running);
  p->set_waiting(l.waiting);
  p->set_kv_used_blocks(l.kv_used_blocks);
  p->set_kv_free_blocks(l.kv_free_blocks);
  p->set_preemptions(l.preemptions);
  p->set_embed_queued(l.embed_queued);
  p->set_suspensions(l.suspensions);
}

WorkerLoad FromProto(const pb::WorkerLoad& p) {
  return WorkerLoad{p.running(),        p.waiting(),     p.kv_used_blocks(),
                    p.kv_free_blocks(), p.preemptions(), p.embed_queued(),
                    p.suspensions()};
}

void ToProto(const EmbedBatcherCounters& c, pb::EmbedBatcherStats* p) {
  p->set_submitted(c.submitted);
  p->set_refused(c.refused);
  p->set_timed_out(c.timed_out);
  p->set_cancelled(c.cancelled);
  p->set_answered(c.answered);
  p->set_failed(c.failed);
  p->set_batches(c.batches);
  p->mutable_batch_size_counts()->Assign(c.batch_size_counts.begin(), c.batch_size_counts.end());
  p->set_max_batch_size(c.max_batch_size);
  p->set_queue_wait_count(c.queue_wait_count);
  p->set_queue_wait_sum_micros(c.queue_wait_sum_micros);
}

EmbedBatcherCounters FromProto(const pb::EmbedBatcherStats& p) {
  EmbedBatcherCounters c;
  c.submitted = p.submitted();
  c.refused = p.refused();
  c.timed_out = p.timed_out();
  c.cancelled = p.cancelled();
  c.answered = p.answered();
  c.failed = p.failed();
  c.batches = p.batches();
  c.batch_size_counts.assign(p.batch_size_counts().begin(), p.batch_size_counts().end());
  c.max_batch_size = p.max_batch_size();
  c.queue_wait_count = p.queue_wait_count();
  c.queue_wait_sum_micros = p.queue_wait_sum_micros();
  return c;
}

pb::Pooling ToProto(Pooling p) {
  return p == Pooling::kLast ? pb::POOLING_LAST : pb::POOLING_MEAN;
}

Pooling FromProto(pb::Pooling p) { return p == pb::POOLING_LAST ? Pooling::kLast : Pooling::kMean; }

// Each BatchOp and its proto value; both directions read this one table.
constexpr std::pair<BatchOp, pb::BatchCall::Op> kBatchOps[] = {
    {BatchOp::kCreateFile, pb::BatchCall::CREATE_FILE},
    {BatchOp::kGetFile, pb::BatchCall::GET_FILE},
    {BatchOp::kFileContent, pb::BatchCall::FILE_CONTENT},
    {BatchOp::kDeleteFile, pb::BatchCall::DELETE_FILE},
    {BatchOp::kCreateBatch, pb::BatchCall::CREATE_BATCH},
    {BatchOp::kGetBatch, pb::BatchCall::GET_BATCH},
    {BatchOp::kListBatches, pb::BatchCall::LIST_BATCHES},
    {BatchOp::kCancelBatch, pb::BatchCall::CANCEL_BATCH},
};

pb::BatchCall::Op ToProto(BatchOp op) {
  for (const auto& [ours, wire] : kBatchOps) {
    if (ours == op) return wire;
  }
  return pb::BatchCall::OP_UNSPECIFIED;
}

BatchOp FromProto(pb::BatchCall::Op op) {
  for (const auto& [ours, wire] : kBatchOps) {
    if (wire == op) return ours;
  }
  return BatchOp::kUnspecified;
}

void ToProto(const std::vector<std::vector<float>>& embeddings,
             google::protobuf::RepeatedPtrField<pb::Embedding>* p) {
  for (const std::vector<float>& e : embeddings) {
    p->Add()->mutable_values()->Add(e.begin(), e.end());
  }
}

std::vector<std::vector<float>> FromProto(
    const google::protobuf::RepeatedPtrField<pb::Embedding>& p) {
  std::vector<std::vector<float>> out;
  out.reserve(p.size());
  for (const pb::Embedding& e : p) out.emplace_back(e.values().begin(), e.values().end());
  return out;
}

std::string Serialize(const google::protobuf::Message& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

// Parses `frame` as T and checks the protocol version; with `check_ranges`, first that every
// integer fits its field (wire::CheckRanges), before the parser's truncation is relied on.
template <typename T>
absl::Status ParseEnvelope(std::string_view frame, T* envelope, bool check_ranges = false) {
  if (!envelope->ParseFromArray(frame.data(), static_cast<int>(frame.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame is not a carpool.v1.", T::descriptor()->name()));
  }
  if (check_ranges) {
    if (absl::Status s = wire::CheckRanges(frame, T::descriptor()); !s.ok()) return s;
  }
  if (envelope->protocol_version() != kProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat("protocol version ",
                                                   envelope->protocol_version(),
                                                   " is not supported (expected ",
                                                   kProtocolVersion, ")"));
  }
  return absl::OkStatus();
}

void ToProto(const ChatInput& c, pb::ChatInput* p) {
  p->set_messages_json(c.messages_json);
  p->set_tools_json(c.tools_json);
  p->set_add_generation_prompt(c.add_generation_prompt);
  p->set_chat_template_kwargs_json(c.chat_template_kwargs_json);
}

ChatInput FromProto(const pb::ChatInput& p) {
  ChatInput c;
  c.messages_json = p.messages_json();
  c.tools_json = p.tools_json();
  c.add_generation_prompt = !p.has_add_generation_prompt() || p.add_generation_prompt();
  c.chat_template_kwargs_json = p.chat_template_kwargs_json();
  return c;
}

absl::Status UnknownType(const char* envelope) {
  return absl::InvalidArgumentError(absl::StrCat("unknown ", envelope, " message type"));
}

// ---- client <-> router

struct ClientEncoder {
  pb::ClientMessage* m;
  void operator()(const GenerateInput& g) const {
    pb::GenerateRequest* p = m->mutable_generate();
    p->set_request_id(g.request_id);
    if (g.chat.has_value()) {
      ToProto(*g.chat, p->mutable_chat());
    } else if (g.has_text) {
      p->set_text(g.text);
    } else {
      auto* ids = p->mutable_token_ids();
      for (int32_t id : g.token_ids) ids->add_ids(id);
    }
    ToProto(g.sampling, p->mutable_sampling());
    p->set_priority(ToProto(g.priority));
    p->set_deadline_ms(WireMillis(g.deadline_ms));
    p->set_api_key(g.api_key);
    p->set_stream(g.stream);
    p->set_add_bos(g.add_bos);
    p->set_model(g.model);
    for (const std::string& stop : g.stop) p->add_stop(stop);
    p->set_include_stop_str_in_output(g.include_stop_str_in_output);
    p->set_skip_special_tokens(g.skip_special_tokens);
    p->set_batch_job(g.batch_job);
    for (int32_t id : g.resume_tokens) p->add_resume_tokens(id);
  }
  void operator()(const CancelInput& c) const { m->mutable_cancel()->set_request_id(c.request_id); }
  void operator()(const StatsQuery& q) const { m->mutable_stats()->set_api_key(q.api_key); }
  void operator()(const EmbedInput& e) const {
    pb::EmbedRequest* p = m->mutable_embed();
    p->set_request_id(e.request_id);
    for (const EmbedItem& item : e.inputs) {
      pb::EmbedInput* q = p->add_inputs();
      if (item.has_text) {
        q->set_text(item.text);
      } else {
        auto* ids = q->mutable_token_ids();
        ids->mutable_ids()->Add(item.token_ids.begin(), item.token_ids.end());
      }
    }
    p->set_normalize(e.normalize);
    p->set_pooling(ToProto(e.pooling));
    p->set_priority(ToProto(e.priority));
    p->set_deadline_ms(WireMillis(e.deadline_ms));
    p->set_api_key(e.api_key);
    p->set_add_bos(e.add_bos);
    p->set_model(e.model);
    p->set_batch_job(e.batch_job);
  }
  void operator()(const TokenizeInput& t) const {
    pb::TokenizeRequest* p = m->mutable_tokenize();
    p->set_request_id(t.request_id);
    p->set_model(t.model);
    p->set_text(t.text);
    p->set_add_special_tokens(t.add_special_tokens);
    p->set_api_key(t.api_key);
    if (t.chat.has_value()) ToProto(*t.chat, p->mutable_chat());
  }
  void operator()(const DetokenizeInput& d) const {
    pb::DetokenizeRequest* p = m->mutable_detokenize();
    p->set_request_id(d.request_id);
    p->set_model(d.model);
    p->mutable_token_ids()->Add(d.token_ids.begin(), d.token_ids.end());
    p->set_skip_special_tokens(d.skip_special_tokens);
    p->set_api_key(d.api_key);
  }
  void operator()(const BatchCallInfo& b) const {
    pb::BatchCall* p = m->mutable_batch();
    p->set_request_id(b.request_id);
    p->set_api_key(b.api_key);
    p->set_op(ToProto(b.op));
    p->set_id(b.id);
    p->set_filename(b.filename);
    p->set_purpose(b.purpose);
    p->set_content(b.content);
    p->set_input_file_id(b.input_file_id);
    p->set_endpoint(b.endpoint);
    p->set_completion_window(b.completion_window);
    p->set_metadata_json(b.metadata_json);
    p->set_after(b.after);
    p->set_limit(b.limit);
  }
};

struct ServerEncoder {
  pb::ServerMessage* m;
  void operator()(const GenerateChunkOut& c) const {
    pb::GenerateChunk* p = m->mutable_chunk();
    p->set_request_id(c.request_id);
    p->set_index(c.index);
    for (const SampleResult& t : c.tokens) ToProto(t, p->add_tokens());
    p->set_text(c.text);
  }
  void operator()(const GenerateFinalOut& f) const {
    pb::GenerateFinal* p = m->mutable_final();
    p->set_request_id(f.request_id);
    for (const SampleResult& t : f.tokens) ToProto(t, p->add_tokens());
    p->set_text(f.text);
    p->set_finish_reason(f.finish_reason);
    p->mutable_usage()->set_prompt_tokens(f.usage.prompt_tokens);
    p->mutable_usage()->set_completion_tokens(f.usage.completion_tokens);
    p->mutable_usage()->set_cached_prompt_tokens(f.usage.cached_prompt_tokens);
    p->mutable_timings()->set_queue_ms(f.timings.queue_ms);
    p->mutable_timings()->set_ttft_ms(f.timings.ttft_ms);
    p->mutable_timings()->set_total_ms(f.timings.total_ms);
    p->set_stop_string(f.stop_string);
  }
  void operator()(const ErrorInfo& e) const { ToProto(e, m->mutable_error()); }
  void operator()(const StatsOut& s) const {
    pb::Stats* p = m->mutable_stats();
    for (const WorkerStatsOut& w : s.workers) {
      pb::WorkerStats* q = p->add_workers();
      q->set_worker_id(w.worker_id);
      q->set_healthy(w.healthy);
      q->set_epoch(w.epoch);
      q->set_running(w.running);
      q->set_num_kv_blocks(w.num_kv_blocks);
      q->set_kv_used_blocks(w.kv_used_blocks);
      q->set_outstanding_tokens(w.outstanding_tokens);
      q->set_max_num_seqs(w.max_num_seqs);
      q->set_model(w.model);
      q->set_requests_served(w.requests_served);
      q->set_waiting(w.waiting);
      q->set_draining(w.draining);
      q->set_heartbeat_age_ms(w.heartbeat_age_ms);
      q->set_cached_prefix_blocks(w.cached_prefix_blocks);
      q->set_migrations_in(w.migrations_in);
      q->set_tokens_generated(w.tokens_generated);
      q->set_preemptions(w.preemptions);
      q->set_suspensions(w.suspensions);
      q->set_weight_dtype(w.weight_dtype);
      q->set_kv_cache_dtype(w.kv_cache_dtype);
    }
    p->set_queued(s.queued);
    p->set_inflight(s.inflight);
    p->set_requests_total(s.requests_total);
    p->set_requests_rejected(s.requests_rejected);
    for (const auto& [r, n] : s.rejections_by_reason) (*p->mutable_rejections_by_reason())[r] = n;
    p->set_queued_interactive(s.queued_interactive);
    p->set_queued_default(s.queued_default);
    p->set_queued_batch(s.queued_batch);
    p->set_queued_tokens(s.queued_tokens);
    p->set_inflight_tokens(s.inflight_tokens);
    p->set_max_queued_tokens(s.max_queued_tokens);
    p->set_max_inflight_tokens(s.max_inflight_tokens);
    p->set_migrations(s.migrations);
    p->set_draining(s.draining);
    p->set_placement(s.placement);
    for (const TenantStatsOut& t : s.tenants) {
      pb::TenantStats* q = p->add_tenants();
      q->set_name(t.name);
      q->set_active(t.active);
      q->set_rejected(t.rejected);
    }
    p->set_service_tokens_per_s(s.service_tokens_per_s);
    p->set_batch_lane_queued(s.batch_lane_queued);
    p->set_batch_lane_inflight(s.batch_lane_inflight);
    p->set_batch_max_queued(s.batch_max_queued);
    p->set_batch_max_inflight(s.batch_max_inflight);
    for (const auto& [status, n] : s.batches_by_status) {
      (*p->mutable_batches_by_status())[status] = n;
    }
    p->set_batch_requests_pending(s.batch_requests_pending);
  }
  void operator()(const EmbedResultOut& e) const {
    pb::EmbedResult* p = m->mutable_embed_result();
    p->set_request_id(e.request_id);
    ToProto(e.embeddings, p->mutable_embeddings());
    p->mutable_usage()->set_prompt_tokens(e.usage.prompt_tokens);
    p->mutable_usage()->set_completion_tokens(e.usage.completion_tokens);
    p->mutable_usage()->set_cached_prompt_tokens(e.usage.cached_prompt_tokens);
    p->mutable_timings()->set_queue_ms(e.timings.queue_ms);
    p->mutable_timings()->set_ttft_ms(e.timings.ttft_ms);
    p->mutable_timings()->set_total_ms(e.timings.total_ms);
  }
  void operator()(const TokenizeResultOut& t) const {
    pb::TokenizeResult* p = m->mutable_tokenize_result();
    p->set_request_id(t.request_id);
    p->mutable_token_ids()->Add(t.token_ids.begin(), t.token_ids.end());
    p->set_max_model_len(t.max_model_len);
  }
  void operator()(const DetokenizeResultOut& d) const {
    pb::DetokenizeResult* p = m->mutable_detokenize_result();
    p->set_request_id(d.request_id);
    p->set_text(d.text);
  }
  void operator()(const BatchReplyInfo& b) const {
    pb::BatchReply* p = m->mutable_batch_reply();
    p->set_request_id(b.request_id);
    p->set_json(b.json);
    p->set_content(b.content);
  }
};

// ---- worker <-> router

struct WorkerEncoder {
  pb::WorkerMessage* m;
  void operator()(const RegisterInfo& r) const {
    pb::Register* p = m->mutable_register_();
    p->set_worker_id(r.worker_id);
    p->set_model(r.model);
    p->set_max_num_seqs(r.max_num_seqs);
    p->set_num_kv_blocks(r.num_kv_blocks);
    p->set_block_size(r.block_size);
    p->set_max_model_len(r.max_model_len);
    p->set_vocab_size(r.vocab_size);
    p->set_tokenizer(TokenizerKindName(r.tokenizer));
    p->set_bos_token_id(r.bos_token_id);
    p->set_max_num_batched_tokens(r.max_num_batched_tokens);
    p->set_embed_queue_size(r.embed_queue_size);
    p->set_hidden_size(r.hidden_size);
    p->set_tokenizer_json(r.tokenizer_json);
    p->set_tokenizer_config_json(r.tokenizer_config_json);
    p->mutable_eos_token_ids()->Add(r.eos_token_ids.begin(), r.eos_token_ids.end());
    p->set_chat_template_jinja(r.chat_template_jinja);
    p->set_weight_dtype(r.weight_dtype);
    p->set_kv_cache_dtype(r.kv_cache_dtype);
  }
  void operator()(const HeartbeatInfo& h) const {
    m->mutable_heartbeat()->set_epoch(h.epoch);
    ToProto(h.load, m->mutable_heartbeat()->mutable_load());
    if (h.embed_batcher.has_value()) {
      ToProto(*h.embed_batcher, m->mutable_heartbeat()->mutable_embed_batcher());
    }
  }
  void operator()(const StepTokensInfo& s) const {
    pb::StepTokens* p = m->mutable_step();
    p->set_epoch(s.epoch);
    ToProto(s.load, p->mutable_load());
    for (const TokenEvent& e : s.events) {
      pb::TokenEvent* q = p->add_events();
      q->set_dispatch_id(e.dispatch_id);
      if (e.has_token) ToProto(e.token, q->mutable_token());
      q->set_finished(e.finished);
      q->set_finish_reason(e.finish_reason);
      q->set_cached_prompt_tokens(e.cached_prompt_tokens);
    }
  }
  void operator()(const RequestFailedInfo& f) const {
    m->mutable_failed()->set_epoch(f.epoch);
    m->mutable_failed()->set_dispatch_id(f.dispatch_id);
    ToProto(f.error, m->mutable_failed()->mutable_error());
  }
  void operator()(const DeregisterInfo& d) const { m->mutable_deregister()->set_epoch(d.epoch); }
  void operator()(const KvEventsInfo& k) const {
    pb::KvEvents* p = m->mutable_kv_events();
    p->set_epoch(k.epoch);
    p->set_reset(k.reset);
    p->mutable_stored()->Add(k.stored.begin(), k.stored.end());
    p->mutable_removed()->Add(k.removed.begin(), k.removed.end());
  }
  void operator()(const EmbedDoneInfo& e) const {
    pb::EmbedDone* p = m->mutable_embedded();
    p->set_epoch(e.epoch);
    p->set_dispatch_id(e.dispatch_id);
    ToProto(e.embeddings, p->mutable_embeddings());
  }
};

struct RouterEncoder {
  pb::RouterMessage* m;
  void operator()(const RegisterAckInfo& a) const { m->mutable_registered()->set_epoch(a.epoch); }
  void operator()(const DispatchInfo& d) const {
    pb::Dispatch* p = m->mutable_dispatch();
    p->set_dispatch_id(d.dispatch_id);
    for (int32_t t : d.prompt_tokens) p->add_prompt_tokens(t);
    for (int32_t t : d.output_tokens) p->add_output_tokens(t);
    ToProto(d.sampling, p->mutable_sampling());
    p->set_priority(ToProto(d.priority));
    p->set_cache_salt(d.cache_salt);
  }
  void operator()(const WorkerCancelInfo& c) const {
    m->mutable_cancel()->set_dispatch_id(c.dispatch_id);
  }
  void operator()(const DrainInfo&) const { m->mutable_drain(); }
  void operator()(const EmbedDispatchInfo& e) const {
    pb::EmbedDispatch* p = m->mutable_embed();
    p->set_dispatch_id(e.dispatch_id);
    for (const std::vector<int32_t>& input : e.inputs) {
      p->add_inputs()->mutable_ids()->Add(input.begin(), input.end());
    }
    p->set_normalize(e.normalize);
    p->set_pooling(ToProto(e.pooling));
    p->set_priority(ToProto(e.priority));
  }
};

}  // namespace

std::string Encode(const ClientMessage& message) {
  pb::ClientMessage m;
  m.set_protocol_version(kProtocolVersion);
  std::visit(ClientEncoder{&m}, message);
  return Serialize(m);
}

std::string Encode(const ServerMessage& message) {
  pb::ServerMessage m;
  m.set_protocol_version(kProtocolVersion);
  std::visit(ServerEncoder{&m}, message);
  return Serialize(m);
}

std::string Encode(const WorkerMessage& message) {
  pb::WorkerMessage m;
  m.set_protocol_version(kProtocolVersion);
  std::visit(WorkerEncoder{&m}, message);
  return Serialize(m);
}

std::string Encode(const RouterMessage& message) {
  pb::RouterMessage m;
  m.set_protocol_version(kProtocolVersion);
  std::visit(RouterEncoder{&m}, message);
  return Serialize(m);
}

absl::StatusOr<ClientMessage> DecodeClientMessage(std::string_view frame) {
  pb::ClientMessage m;
  if (absl::Status s = ParseEnvelope(frame, &m, /*check_ranges=*/true); !s.ok()) return s;
  switch (m.body_case()) {
    case pb::ClientMessage::kGenerate: {
      const pb::GenerateRequest& p = m.generate();
      GenerateInput g;
      g.request_id = p.request_id();
      g.has_text = p.prompt_case() == pb::GenerateRequest::kText;
      g.text = p.text();
      g.token_ids.assign(p.token_ids().ids().begin(), p.token_ids().ids().end());
      if (p.prompt_case() == pb::GenerateRequest::kChat) g.chat = FromProto(p.chat());
      g.sampling = FromProto(p.sampling());
      g.priority = FromProto(p.priority());
      g.deadline_ms = p.deadline_ms();
      g.api_key = p.api_key();
      g.stream = p.stream();
      g.add_bos = p.add_bos();
      g.model = p.model();
      g.stop.assign(p.stop().begin(), p.stop().end());
      g.include_stop_str_in_output = p.include_stop_str_in_output();
      g.skip_special_tokens = !p.has_skip_special_tokens() || p.skip_special_tokens();
      g.batch_job = p.batch_job();
      g.resume_tokens.assign(p.resume_tokens().begin(), p.resume_tokens().end());
      return ClientMessage(std::move(g));
    }
    case pb::ClientMessage::kCancel:
      return ClientMessage(CancelInput{m.cancel().request_id()});
    case pb::ClientMessage::kStats:
      return ClientMessage(StatsQuery{m.stats().api_key()});
    case pb::ClientMessage::kEmbed: {
      const pb::EmbedRequest& p = m.embed();
      EmbedInput e;
      e.request_id = p.request_id();
      for (const pb::EmbedInput& q : p.inputs()) {
        EmbedItem item;
        item.has_text = q.input_case() == pb::EmbedInput::kText;
        item.text = q.text();
        item.token_ids.assign(q.token_ids().ids().begin(), q.token_ids().ids().end());
        e.inputs.push_back(std::move(item));
      }
      e.normalize = p.normalize();
      e.pooling = FromProto(p.pooling());
      e.priority = FromProto(p.priority());
      e.deadline_ms = p.deadline_ms();
      e.api_key = p.api_key();
      e.add_bos = p.add_bos();
      e.model = p.model();
      e.batch_job = p.batch_job();
      return ClientMessage(std::move(e));
    }
    case pb::ClientMessage::kTokenize: {
      const pb::TokenizeRequest& p = m.tokenize();
      TokenizeInput t;
      t.request_id = p.request_id();
      t.model = p.model();
      t.text = p.text();
      if (p.has_chat()) t.chat = FromProto(p.chat());
      // Unset: Hugging Face encode's true for text; apply_chat_template's false for chat (the
      // template writes the special tokens).
      t.add_special_tokens =
          p.has_add_special_tokens() ? p.add_special_tokens() : !t.chat.has_value();
      t.api_key = p.api_key();
      return ClientMessage(std::move(t));
    }
    case pb::ClientMessage::kDetokenize: {
      const pb::DetokenizeRequest& p = m.detokenize();
      DetokenizeInput d;
      d.request_id = p.request_id();
      d.model = p.model();
      d.token_ids.assign(p.token_ids().begin(), p.token_ids().end());
      d.skip_special_tokens = p.skip_special_tokens();
      d.api_key = p.api_key();
      return ClientMessage(std::move(d));
    }
    case pb::ClientMessage::kBatch: {
      // Moved out: an upload's content may be 200 MB.
      pb::BatchCall& p = *m.mutable_batch();
      BatchCallInfo b;
      b.request_id = std::move(*p.mutable_request_id());
      b.api_key = std::move(*p.mutable_api_key());
      b.op = FromProto(p.op());
      b.id = std::move(*p.mutable_id());
      b.filename = std::move(*p.mutable_filename());
      b.purpose = std::move(*p.mutable_purpose());
      b.content = std::move(*p.mutable_content());
      b.input_file_id = std::move(*p.mutable_input_file_id());
      b.endpoint = std::move(*p.mutable_endpoint());
      b.completion_window = std::move(*p.mutable_completion_window());
      b.metadata_json = std::move(*p.mutable_metadata_json());
      b.after = std::move(*p.mutable_after());
      b.limit = p.limit();
      return ClientMessage(std::move(b));
    }
    default:
      return UnknownType("client");
  }
}

std::string ScanClientRequestId(std::string_view frame) {
  // Every body that names a request keeps its request_id as field 1.
  static_assert(pb::GenerateRequest::kRequestIdFieldNumber == 1);
  static_assert(pb::Cancel::kRequestIdFieldNumber == 1);
  static_assert(pb::EmbedRequest::kRequestIdFieldNumber == 1);
  static_assert(pb::TokenizeRequest::kRequestIdFieldNumber == 1);
  static_assert(pb::DetokenizeRequest::kRequestIdFieldNumber == 1);
  static_assert(pb::BatchCall::kRequestIdFieldNumber == 1);
  const auto names_request = [](uint32_t number) {
    return number == pb::ClientMessage::kGenerateFieldNumber ||
           number == pb::ClientMessage::kCancelFieldNumber ||
           number == pb::ClientMessage::kEmbedFieldNumber ||
           number == pb::ClientMessage::kTokenizeFieldNumber ||
           number == pb::ClientMessage::kDetokenizeFieldNumber ||
           number == pb::ClientMessage::kBatchFieldNumber;
  };
  uint32_t body = 0;
  std::string_view id;
  wire::Reader envelope(frame);
  wire::Field f;
  while (envelope.Next(&f)) {
    const bool is_body =
        names_request(f.number) || f.number == pb::ClientMessage::kStatsFieldNumber;
    if (f.wire_type != wire::kLen || !is_body) continue;  // unknown fields change nothing
    if (f.number != body) id = {};  // another member of the oneof replaces the body
    body = f.number;
    if (!names_request(f.number)) continue;
    // A repeated body merges into the one before: its request_id, if any, wins.
    wire::Reader message(f.bytes);
    wire::Field g;
    while (message.Next(&g)) {
      if (g.number == 1 && g.wire_type == wire::kLen && !g.truncated) id = g.bytes;
    }
  }
  if (!names_request(body) || !wire::IsValidUtf8(id)) return "";
  return std::string(id);
}

bool IsBatchCallFrame(std::string_view frame) {
  const google::protobuf::OneofDescriptor* body = pb::ClientMessage::descriptor()->oneof_decl(0);
  uint32_t last = 0;
  wire::Reader envelope(frame);
  wire::Field f;
  while (envelope.Next(&f)) {
    const google::protobuf::FieldDescriptor* field =
        pb::ClientMessage::descriptor()->FindFieldByNumber(static_cast<int>(f.number));
    if (f.wire_type == wire::kLen && field != nullptr && field->containing_oneof() == body) {
      last = f.number;
    }
  }
  return last == pb::ClientMessage::kBatchFieldNumber;
}

absl::StatusOr<ServerMessage> DecodeServerMessage(std::string_view frame) {
  pb::ServerMessage m;
  if (absl::Status s = ParseEnvelope(frame, &m); !s.ok()) return s;
  switch (m.body_case()) {
    case pb::ServerMessage::kChunk: {
      GenerateChunkOut c;
      c.request_id = m.chunk().request_id();
      c.index = static_cast<int>(m.chunk().index());
      for (const pb::Token& t : m.chunk().tokens()) c.tokens.push_back(FromProto(t));
      c.text = m.chunk().text();
      return ServerMessage(std::move(c));
    }
    case pb::ServerMessage::kFinal: {
      const pb::GenerateFinal& p = m.final();
      GenerateFinalOut f;
      f.request_id = p.request_id();
      for (const pb::Token& t : p.tokens()) f.tokens.push_back(FromProto(t));
      f.text = p.text();
      f.finish_reason = p.finish_reason();
      f.usage = {p.usage().prompt_tokens(), p.usage().completion_tokens(),
                 p.usage().cached_prompt_tokens()};
      f.timings = {p.timings().queue_ms(), p.timings().ttft_ms(), p.timings().total_ms()};
      f.stop_string = p.stop_string();
      return ServerMessage(std::move(f));
    }
    case pb::ServerMessage::kError:
      return ServerMessage(FromProto(m.error()));
    case pb::ServerMessage::kStats: {
      StatsOut s;
      const pb::Stats& p = m.stats();
      for (const pb::WorkerStats& w : p.workers()) {
        WorkerStatsOut o;
        o.worker_id = w.worker_id();
        o.healthy = w.healthy();
        o.epoch = w.epoch();
        o.running = w.running();
        o.num_kv_blocks = w.num_kv_blocks();
        o.kv_used_blocks = w.kv_used_blocks();
        o.outstanding_tokens = w.outstanding_tokens();
        o.max_num_seqs = w.max_num_seqs();
        o.model = w.model();
        o.requests_served = w.requests_served();
        o.waiting = w.waiting();
        o.draining = w.draining();
        o.heartbeat_age_ms = w.heartbeat_age_ms();
        o.cached_prefix_blocks = w.cached_prefix_blocks();
        o.migrations_in = w.migrations_in();
        o.tokens_generated = w.tokens_generated();
        o.preemptions = w.preemptions();
        o.suspensions = w.suspensions();
        o.weight_dtype = w.weight_dtype();
        o.kv_cache_dtype = w.kv_cache_dtype();
        s.workers.push_back(std::move(o));
      }
      s.queued = p.queued();
      s.inflight = p.inflight();
      s.requests_total = p.requests_total();
      s.requests_rejected = p.requests_rejected();
      for (const auto& [r, n] : p.rejections_by_reason()) s.rejections_by_reason[r] = n;
      s.queued_interactive = p.queued_interactive();
      s.queued_default = p.queued_default();
      s.queued_batch = p.queued_batch();
      s.queued_tokens = p.queued_tokens();
      s.inflight_tokens = p.inflight_tokens();
      s.max_queued_tokens = p.max_queued_tokens();
      s.max_inflight_tokens = p.max_inflight_tokens();
      s.migrations = p.migrations();
      s.draining = p.draining();
      s.placement = p.placement();
      for (const pb::TenantStats& t : p.tenants()) {
        s.tenants.push_back({t.name(), t.active(), t.rejected()});
      }
      s.service_tokens_per_s = p.service_tokens_per_s();
      s.batch_lane_queued = p.batch_lane_queued();
      s.batch_lane_inflight = p.batch_lane_inflight();
      s.batch_max_queued = p.batch_max_queued();
      s.batch_max_inflight = p.batch_max_inflight();
      for (const auto& [status, n] : p.batches_by_status()) s.batches_by_status[status] = n;
      s.batch_requests_pending = p.batch_requests_pending();
      return ServerMessage(std::move(s));
    }
    case pb::ServerMessage::kEmbedResult: {
      const pb::EmbedResult& p = m.embed_result();
      EmbedResultOut e;
      e.request_id = p.request_id();
      e.embeddings = FromProto(p.embeddings());
      e.usage = {p.usage().prompt_tokens(), p.usage().completion_tokens(),
                 p.usage().cached_prompt_tokens()};
      e.timings = {p.timings().queue_ms(), p.timings().ttft_ms(), p.timings().total_ms()};
      return ServerMessage(std::move(e));
    }
    case pb::ServerMessage::kTokenizeResult: {
      const pb::TokenizeResult& p = m.tokenize_result();
      TokenizeResultOut t;
      t.request_id = p.request_id();
      t.token_ids.assign(p.token_ids().begin(), p.token_ids().end());
      t.max_model_len = p.max_model_len();
      return ServerMessage(std::move(t));
    }
    case pb::ServerMessage::kDetokenizeResult:
      return ServerMessage(DetokenizeResultOut{m.detokenize_result().request_id(),
                                               m.detokenize_result().text()});
    case pb::ServerMessage::kBatchReply: {
      pb::BatchReply& p = *m.mutable_batch_reply();  // moved out: a file's content may be large
      return ServerMessage(BatchReplyInfo{std::move(*p.mutable_request_id()),
                                          std::move(*p.mutable_json()),
                                          std::move(*p.mutable_content())});
    }
    default:
      return UnknownType("server");
  }
}

absl::StatusOr<WorkerMessage> DecodeWorkerMessage(std::string_view frame) {
  pb::WorkerMessage m;
  if (absl::Status s = ParseEnvelope(frame, &m); !s.ok()) return s;
  switch (m.body_case()) {
    case pb::WorkerMessage::kRegister: {
      const pb::Register& p = m.register_();
      RegisterInfo r;
      r.worker_id = p.worker_id();
      r.model = p.model();
      r.max_num_seqs = p.max_num_seqs();
      r.num_kv_blocks = p.num_kv_blocks();
      r.block_size = p.block_size();
      r.max_model_len = p.max_model_len();
      r.vocab_size = p.vocab_size();
      r.tokenizer = TokenizerKindFromName(p.tokenizer()).value_or(TokenizerKind::kNone);
      r.bos_token_id = p.bos_token_id();
      r.max_num_batched_tokens = p.max_num_batched_tokens();
      r.embed_queue_size = p.embed_queue_size();
      r.hidden_size = p.hidden_size();
      r.tokenizer_json = p.tokenizer_json();
      r.tokenizer_config_json = p.tokenizer_config_json();
      r.eos_token_ids.assign(p.eos_token_ids().begin(), p.eos_token_ids().end());
      r.chat_template_jinja = p.chat_template_jinja();
      r.weight_dtype = p.weight_dtype();
      r.kv_cache_dtype = p.kv_cache_dtype();
      return WorkerMessage(std::move(r));
    }
    case pb::WorkerMessage::kHeartbeat: {
      HeartbeatInfo h(m.heartbeat().epoch(), FromProto(m.heartbeat().load()));
      if (m.heartbeat().has_embed_batcher()) {
        h.embed_batcher = FromProto(m.heartbeat().embed_batcher());
      }
      return WorkerMessage(std::move(h));
    }
    case pb::WorkerMessage::kStep: {
      StepTokensInfo s;
      s.epoch = m.step().epoch();
      s.load = FromProto(m.step().load());
      for (const pb::TokenEvent& e : m.step().events()) {
        TokenEvent t;
        t.dispatch_id = e.dispatch_id();
        t.has_token = e.has_token();
        if (e.has_token()) t.token = FromProto(e.token());
        t.finished = e.finished();
        t.finish_reason = e.finish_reason();
        t.cached_prompt_tokens = e.cached_prompt_tokens();
        s.events.push_back(std::move(t));
      }
      return WorkerMessage(std::move(s));
    }
    case pb::WorkerMessage::kFailed:
      return WorkerMessage(RequestFailedInfo{m.failed().epoch(), m.failed().dispatch_id(),
                                             FromProto(m.failed().error())});
    case pb::WorkerMessage::kDeregister:
      return WorkerMessage(DeregisterInfo{m.deregister().epoch()});
    case pb::WorkerMessage::kKvEvents: {
      const pb::KvEvents& p = m.kv_events();
      KvEventsInfo k;
      k.epoch = p.epoch();
      k.reset = p.reset();
      k.stored.assign(p.stored().begin(), p.stored().end());
      k.removed.assign(p.removed().begin(), p.removed().end());
      return WorkerMessage(std::move(k));
    }
    case pb::WorkerMessage::kEmbedded: {
      const pb::EmbedDone& p = m.embedded();
      return WorkerMessage(EmbedDoneInfo{p.epoch(), p.dispatch_id(), FromProto(p.embeddings())});
    }
    default:
      return UnknownType("worker");
  }
}

absl::StatusOr<RouterMessage> DecodeRouterMessage(std::string_view frame) {
  pb::RouterMessage m;
  if (absl::Status s = ParseEnvelope(frame, &m); !s.ok()) return s;
  switch (m.body_case()) {
    case pb::RouterMessage::kRegistered:
      return RouterMessage(RegisterAckInfo{m.registered().epoch()});
    case pb::RouterMessage::kDispatch: {
      const pb::Dispatch& p = m.dispatch();
      DispatchInfo d;
      d.dispatch_id = p.dispatch_id();
      d.prompt_tokens.assign(p.prompt_tokens().begin(), p.prompt_tokens().end());
      d.output_tokens.assign(p.output_tokens().begin(), p.output_tokens().end());
      d.sampling = FromProto(p.sampling());
      d.priority = FromProto(p.priority());
      d.cache_salt = p.cache_salt();
      return RouterMessage(std::move(d));
    }
    case pb::RouterMessage::kCancel:
      return RouterMessage(WorkerCancelInfo{m.cancel().dispatch_id()});
    case pb::RouterMessage::kDrain:
      return RouterMessage(DrainInfo{});
    case pb::RouterMessage::kEmbed: {
      const pb::EmbedDispatch& p = m.embed();
      EmbedDispatchInfo e;
      e.dispatch_id = p.dispatch_id();
      for (const pb::TokenIds& ids : p.inputs()) e.inputs.emplace_back(ids.ids().begin(), ids.ids().end());
      e.normalize = p.normalize();
      e.pooling = FromProto(p.pooling());
      e.priority = FromProto(p.priority());
      return RouterMessage(std::move(e));
    }
    default:
      return UnknownType("router");
  }
}

Priority PriorityFromWire(int value) {
  for (const auto& [priority, wire] : kPriorities) {
    if (wire == value) return priority;
  }
  return Priority::kDefault;
}

absl::StatusCode StatusCodeFromName(std::string_view name) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::StatusCodeToString(code) == name) return code;
  }
  return absl::StatusCode::kUnknown;
}

}  // namespace carpool
