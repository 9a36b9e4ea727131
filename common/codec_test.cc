// Round trips through the protobuf codec (the embed messages; the text fields and the
// tokenize / detokenize messages of issue 13), and what it refuses.
#include "common/codec.h"

#include <iterator>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "proto/carpool.pb.h"

namespace carpool {
namespace {

TEST(CodecEmbedTest, EmbedInputRoundTrips) {
  EmbedInput in;
  in.request_id = "e1";
  in.inputs.push_back({true, "hello", {}});
  in.inputs.push_back({false, "", {1, 2, 3}});
  in.inputs.push_back({true, std::string("\xff\x00z", 3), {}});
  in.normalize = false;
  in.pooling = Pooling::kLast;
  in.priority = Priority::kBatch;
  in.deadline_ms = 1500;
  in.api_key = "key";
  in.add_bos = false;
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<EmbedInput>(*m));
  const EmbedInput& out = std::get<EmbedInput>(*m);
  EXPECT_EQ(out.request_id, "e1");
  ASSERT_EQ(out.inputs.size(), 3u);
  EXPECT_TRUE(out.inputs[0].has_text);
  EXPECT_EQ(out.inputs[0].text, "hello");
  EXPECT_FALSE(out.inputs[1].has_text);
  EXPECT_EQ(out.inputs[1].token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(out.inputs[2].text, std::string("\xff\x00z", 3));
  EXPECT_FALSE(out.normalize);
  EXPECT_EQ(out.pooling, Pooling::kLast);
  EXPECT_EQ(out.priority, Priority::kBatch);
  EXPECT_EQ(out.deadline_ms, 1500);
  EXPECT_EQ(out.api_key, "key");
  EXPECT_FALSE(out.add_bos);
}

TEST(CodecEmbedTest, EmbedInputDefaultsSurvive) {
  EmbedInput in;
  in.request_id = "e2";
  in.inputs.push_back({false, "", {5}});
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  const EmbedInput& out = std::get<EmbedInput>(*m);
  EXPECT_TRUE(out.normalize);
  EXPECT_EQ(out.pooling, Pooling::kMean);
  EXPECT_EQ(out.priority, Priority::kDefault);
  EXPECT_EQ(out.deadline_ms, 0);
  EXPECT_TRUE(out.add_bos);
}

TEST(CodecEmbedTest, EmbedResultRoundTrips) {
  EmbedResultOut r;
  r.request_id = "e1";
  r.embeddings = {{0.5f, -0.25f, 1e-8f}, {}, {3.0f}};
  r.usage.prompt_tokens = 9;
  r.timings = {1.5, 2.5, 3.5};
  absl::StatusOr<ServerMessage> m = DecodeServerMessage(Encode(ServerMessage(r)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<EmbedResultOut>(*m));
  const EmbedResultOut& out = std::get<EmbedResultOut>(*m);
  EXPECT_EQ(out.request_id, "e1");
  EXPECT_EQ(out.embeddings, r.embeddings);
  EXPECT_EQ(out.usage.prompt_tokens, 9);
  EXPECT_DOUBLE_EQ(out.timings.queue_ms, 1.5);
  EXPECT_DOUBLE_EQ(out.timings.ttft_ms, 2.5);
  EXPECT_DOUBLE_EQ(out.timings.total_ms, 3.5);
}

TEST(CodecEmbedTest, EmbedDispatchRoundTrips) {
  EmbedDispatchInfo d;
  d.dispatch_id = 42;
  d.inputs = {{256, 1, 2}, {7}};
  d.normalize = false;
  d.pooling = Pooling::kLast;
  d.priority = Priority::kInteractive;
  absl::StatusOr<RouterMessage> m = DecodeRouterMessage(Encode(RouterMessage(d)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<EmbedDispatchInfo>(*m));
  const EmbedDispatchInfo& out = std::get<EmbedDispatchInfo>(*m);
  EXPECT_EQ(out.dispatch_id, 42u);
  EXPECT_EQ(out.inputs, d.inputs);
  EXPECT_FALSE(out.normalize);
  EXPECT_EQ(out.pooling, Pooling::kLast);
  EXPECT_EQ(out.priority, Priority::kInteractive);
}

TEST(CodecEmbedTest, EmbedDoneRoundTrips) {
  EmbedDoneInfo e;
  e.epoch = 7;
  e.dispatch_id = 42;
  e.embeddings = {{1, 2}, {3, 4}};
  absl::StatusOr<WorkerMessage> m = DecodeWorkerMessage(Encode(WorkerMessage(e)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<EmbedDoneInfo>(*m));
  const EmbedDoneInfo& out = std::get<EmbedDoneInfo>(*m);
  EXPECT_EQ(out.epoch, 7u);
  EXPECT_EQ(out.dispatch_id, 42u);
  EXPECT_EQ(out.embeddings, e.embeddings);
}

TEST(CodecEmbedTest, RegisterAndLoadCarryEmbedCapacity) {
  RegisterInfo r;
  r.worker_id = "w";
  r.embed_queue_size = 64;
  r.hidden_size = 8;
  absl::StatusOr<WorkerMessage> m = DecodeWorkerMessage(Encode(WorkerMessage(r)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<RegisterInfo>(*m).embed_queue_size, 64);
  EXPECT_EQ(std::get<RegisterInfo>(*m).hidden_size, 8);
  HeartbeatInfo h;
  h.epoch = 3;
  h.load.embed_queued = 5;
  h.load.preemptions = 11;
  m = DecodeWorkerMessage(Encode(WorkerMessage(h)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<HeartbeatInfo>(*m).load.embed_queued, 5);
  EXPECT_EQ(std::get<HeartbeatInfo>(*m).load.preemptions, 11);
}

TEST(CodecEmbedTest, HeartbeatCarriesTheEmbedBatcherOnlyWhenPresent) {
  HeartbeatInfo h;
  h.epoch = 4;
  absl::StatusOr<WorkerMessage> m = DecodeWorkerMessage(Encode(WorkerMessage(h)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(std::get<HeartbeatInfo>(*m).embed_batcher.has_value());

  EmbedBatcherCounters c;
  c.submitted = 10;
  c.refused = 3;
  c.timed_out = 1;
  c.cancelled = 2;
  c.answered = 6;
  c.failed = 1;
  c.batches = 4;
  c.batch_size_counts = {0, 2, 1, 0, 1};
  c.max_batch_size = 4;
  c.queue_wait_count = 7;
  c.queue_wait_sum_micros = 12345;
  h.embed_batcher = c;
  m = DecodeWorkerMessage(Encode(WorkerMessage(h)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::get<HeartbeatInfo>(*m).embed_batcher.has_value());
  EXPECT_EQ(*std::get<HeartbeatInfo>(*m).embed_batcher, c);

  // A batcher that has seen nothing yet is still present (all zeros), not absent.
  h.embed_batcher = EmbedBatcherCounters{};
  m = DecodeWorkerMessage(Encode(WorkerMessage(h)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::get<HeartbeatInfo>(*m).embed_batcher.has_value());
  EXPECT_EQ(*std::get<HeartbeatInfo>(*m).embed_batcher, EmbedBatcherCounters{});
}

TEST(CodecEmbedTest, GarbageIsAnErrorNotACrash) {
  EXPECT_FALSE(DecodeClientMessage("\x2a\x05\x12\x03\xff").ok());
  EXPECT_FALSE(DecodeWorkerMessage("not protobuf \xff\xff").ok());
}

// ---- text: models by name, stop strings, tokenize / detokenize, the tokenizer handover

TEST(CodecTextTest, GenerateInputCarriesModelStopAndTextOptions) {
  GenerateInput in;
  in.request_id = "g1";
  in.has_text = true;
  in.text = "hi";
  in.model = "llama-3";
  in.stop = {"\n\n", "END", "caf\xc3\xa9", ""};  // a proto string: UTF-8 only
  in.include_stop_str_in_output = true;
  in.skip_special_tokens = false;
  in.add_bos = false;
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<GenerateInput>(*m));
  const GenerateInput& out = std::get<GenerateInput>(*m);
  EXPECT_EQ(out.model, "llama-3");
  EXPECT_EQ(out.stop, in.stop);
  EXPECT_TRUE(out.include_stop_str_in_output);
  EXPECT_FALSE(out.skip_special_tokens);
  EXPECT_FALSE(out.add_bos);
}

TEST(CodecTextTest, GenerateInputDefaults) {
  GenerateInput in;
  in.request_id = "g2";
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  const GenerateInput& out = std::get<GenerateInput>(*m);
  EXPECT_EQ(out.model, "");
  EXPECT_TRUE(out.stop.empty());
  EXPECT_FALSE(out.include_stop_str_in_output);
  EXPECT_TRUE(out.skip_special_tokens);
}

TEST(CodecTextTest, UnsetSkipSpecialTokensMeansTrue) {
  // A client that never heard of the field (proto3 optional: absent) gets vLLM's default.
  v1::ClientMessage m;
  m.set_protocol_version(kProtocolVersion);
  m.mutable_generate()->set_request_id("old");
  absl::StatusOr<ClientMessage> out = DecodeClientMessage(m.SerializeAsString());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(std::get<GenerateInput>(*out).skip_special_tokens);
  m.mutable_generate()->set_skip_special_tokens(false);
  out = DecodeClientMessage(m.SerializeAsString());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(std::get<GenerateInput>(*out).skip_special_tokens);
}

TEST(CodecTextTest, GenerateFinalCarriesStopString) {
  GenerateFinalOut f;
  f.request_id = "g1";
  f.text = "abc";
  f.finish_reason = "stop";
  f.stop_string = "END";
  absl::StatusOr<ServerMessage> m = DecodeServerMessage(Encode(ServerMessage(f)));
  ASSERT_TRUE(m.ok()) << m.status();
  const GenerateFinalOut& out = std::get<GenerateFinalOut>(*m);
  EXPECT_EQ(out.stop_string, "END");
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_EQ(out.text, "abc");
  f.stop_string.clear();
  m = DecodeServerMessage(Encode(ServerMessage(f)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<GenerateFinalOut>(*m).stop_string, "");
}

TEST(CodecTextTest, EmbedInputCarriesModel) {
  EmbedInput in;
  in.request_id = "e1";
  in.inputs.push_back({true, "x", {}});
  in.model = "bge";
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<EmbedInput>(*m).model, "bge");
}

TEST(CodecTextTest, TokenizeInputRoundTrips) {
  TokenizeInput in;
  in.request_id = "t1";
  in.model = "m";
  in.text = std::string("caf\xc3\xa9 \x00 \xff", 9);
  in.add_special_tokens = false;
  in.api_key = "key";
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<TokenizeInput>(*m));
  const TokenizeInput& out = std::get<TokenizeInput>(*m);
  EXPECT_EQ(out.request_id, "t1");
  EXPECT_EQ(out.model, "m");
  EXPECT_EQ(out.text, in.text);
  EXPECT_FALSE(out.add_special_tokens);
  EXPECT_EQ(out.api_key, "key");
  in.add_special_tokens = true;
  m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(std::get<TokenizeInput>(*m).add_special_tokens);
}

TEST(CodecTextTest, UnsetAddSpecialTokensMeansTrue) {
  v1::ClientMessage m;
  m.set_protocol_version(kProtocolVersion);
  m.mutable_tokenize()->set_request_id("t");
  absl::StatusOr<ClientMessage> out = DecodeClientMessage(m.SerializeAsString());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(std::get<TokenizeInput>(*out).add_special_tokens);
  EXPECT_TRUE(TokenizeInput{}.add_special_tokens);
}

TEST(CodecTextTest, DetokenizeInputRoundTrips) {
  DetokenizeInput in;
  in.request_id = "d1";
  in.model = "m";
  in.token_ids = {128000, 9906, 0, 2147483647};
  in.skip_special_tokens = true;
  in.api_key = "key";
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<DetokenizeInput>(*m));
  const DetokenizeInput& out = std::get<DetokenizeInput>(*m);
  EXPECT_EQ(out.request_id, "d1");
  EXPECT_EQ(out.model, "m");
  EXPECT_EQ(out.token_ids, in.token_ids);
  EXPECT_TRUE(out.skip_special_tokens);
  EXPECT_EQ(out.api_key, "key");
  // Hugging Face decode keeps special tokens unless told.
  DetokenizeInput plain;
  plain.request_id = "d2";
  m = DecodeClientMessage(Encode(ClientMessage(plain)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(std::get<DetokenizeInput>(*m).skip_special_tokens);
  EXPECT_TRUE(std::get<DetokenizeInput>(*m).token_ids.empty());
}

TEST(CodecTextTest, DetokenizeIdsOutsideInt32AreRefused) {
  // detokenize (field 7) holding request_id "d" and token_ids (field 3) = 2^32 + 5, a varint
  // the parser would silently cut to 5.
  const std::string body = std::string("\x0a\x01" "d" "\x18\x85\x80\x80\x80\x10", 9);
  v1::ClientMessage envelope;
  envelope.set_protocol_version(kProtocolVersion);
  const std::string frame =
      envelope.SerializeAsString() + "\x3a" + static_cast<char>(body.size()) + body;
  absl::StatusOr<ClientMessage> out = DecodeClientMessage(frame);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("detokenize.token_ids[0]"), std::string::npos)
      << out.status();
  EXPECT_EQ(ScanClientRequestId(frame), "d");
}

TEST(CodecTextTest, TokenizeAndDetokenizeResultsRoundTrip) {
  TokenizeResultOut t;
  t.request_id = "t1";
  t.token_ids = {128000, 9906, 1917};
  t.max_model_len = 131072;
  absl::StatusOr<ServerMessage> m = DecodeServerMessage(Encode(ServerMessage(t)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<TokenizeResultOut>(*m));
  EXPECT_EQ(std::get<TokenizeResultOut>(*m).token_ids, t.token_ids);
  EXPECT_EQ(std::get<TokenizeResultOut>(*m).max_model_len, 131072);
  EXPECT_EQ(RequestIdOf(*m), "t1");

  DetokenizeResultOut d;
  d.request_id = "d1";
  d.text = std::string("Hello \xf0\x9f\x98\x80\x00", 11);
  m = DecodeServerMessage(Encode(ServerMessage(d)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<DetokenizeResultOut>(*m));
  EXPECT_EQ(std::get<DetokenizeResultOut>(*m).text, d.text);
  EXPECT_EQ(RequestIdOf(*m), "d1");
}

TEST(CodecTextTest, RegisterCarriesTheTokenizerHandover) {
  RegisterInfo r;
  r.worker_id = "w";
  r.model = "/models/llama";
  r.tokenizer = TokenizerKind::kHuggingFace;
  r.tokenizer_json = std::string("{\"model\":{}}\x00\xff", 14);
  r.tokenizer_config_json = "{\"eos_token\":\"</s>\"}";
  r.eos_token_ids = {128001, 128008, 128009};
  r.bos_token_id = 128000;
  r.max_model_len = 8192;
  absl::StatusOr<WorkerMessage> m = DecodeWorkerMessage(Encode(WorkerMessage(r)));
  ASSERT_TRUE(m.ok()) << m.status();
  const RegisterInfo& out = std::get<RegisterInfo>(*m);
  EXPECT_EQ(out.tokenizer, TokenizerKind::kHuggingFace);
  EXPECT_EQ(out.tokenizer_json, r.tokenizer_json);
  EXPECT_EQ(out.tokenizer_config_json, r.tokenizer_config_json);
  EXPECT_EQ(out.eos_token_ids, r.eos_token_ids);
  EXPECT_EQ(out.bos_token_id, 128000);
  EXPECT_EQ(out.max_model_len, 8192);
  EXPECT_EQ(out.model, "/models/llama");

  // The byte tokenizer hands nothing over.
  RegisterInfo b;
  b.tokenizer = TokenizerKind::kByte;
  m = DecodeWorkerMessage(Encode(WorkerMessage(b)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<RegisterInfo>(*m).tokenizer, TokenizerKind::kByte);
  EXPECT_EQ(std::get<RegisterInfo>(*m).tokenizer_json, "");
  EXPECT_TRUE(std::get<RegisterInfo>(*m).eos_token_ids.empty());
}

TEST(CodecTextTest, TokenizerKindWireNames) {
  EXPECT_STREQ(TokenizerKindName(TokenizerKind::kHuggingFace), "hf");
  EXPECT_EQ(TokenizerKindFromName("hf"), TokenizerKind::kHuggingFace);
  EXPECT_EQ(TokenizerKindFromName("byte"), TokenizerKind::kByte);
  EXPECT_EQ(TokenizerKindFromName(""), TokenizerKind::kNone);
  EXPECT_EQ(TokenizerKindFromName("sentencepiece"), std::nullopt);
  // A Hugging Face tokenizer is built by text/, not by common/.
  EXPECT_EQ(CreateTokenizer(TokenizerKind::kHuggingFace, "/m").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// The router tells clients the text each token completed; it survives the wire.
TEST(CodecTokenTest, TokenTextRoundTrips) {
  GenerateChunkOut c;
  c.request_id = "r";
  c.tokens = {SampleResult{5, -0.5f, {{5, -0.5f}}, " Hi"}, SampleResult{6, -1.0f, {}, ""}};
  c.text = " Hi";
  auto m = DecodeServerMessage(Encode(ServerMessage(c)));
  ASSERT_TRUE(m.ok()) << m.status();
  const auto& out = std::get<GenerateChunkOut>(*m);
  ASSERT_EQ(out.tokens.size(), 2u);
  EXPECT_EQ(out.tokens[0].text, " Hi");
  EXPECT_EQ(out.tokens[1].text, "");
  EXPECT_EQ(out.tokens[0].top_logprobs.size(), 1u);
}

// ---- chat input (issue 14): a conversation for the model's chat template

ChatInput SampleChat() {
  ChatInput c;
  c.messages_json = R"([{"role":"user","content":"caf\u00e9"}])";
  c.tools_json = R"([{"type":"function","function":{"name":"f"}}])";
  c.add_generation_prompt = false;
  c.chat_template_kwargs_json = R"({"enable_thinking":false})";
  return c;
}

TEST(CodecChatTest, GenerateChatRoundTrips) {
  GenerateInput in;
  in.request_id = "c1";
  in.chat = SampleChat();
  in.sampling.max_tokens = 7;
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  const GenerateInput& out = std::get<GenerateInput>(*m);
  ASSERT_TRUE(out.chat.has_value());
  EXPECT_EQ(*out.chat, *in.chat);
  EXPECT_FALSE(out.has_text);
  EXPECT_TRUE(out.token_ids.empty());
  EXPECT_EQ(out.sampling.max_tokens, 7);

  // The chat is in the prompt oneof: a text or token-id prompt carries none.
  in.chat.reset();
  in.has_text = true;
  in.text = "x";
  m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(std::get<GenerateInput>(*m).chat.has_value());
  EXPECT_TRUE(std::get<GenerateInput>(*m).has_text);
}

TEST(CodecChatTest, UnsetAddGenerationPromptMeansTrue) {
  v1::ClientMessage m;
  m.set_protocol_version(kProtocolVersion);
  m.mutable_generate()->set_request_id("c");
  m.mutable_generate()->mutable_chat()->set_messages_json("[]");
  absl::StatusOr<ClientMessage> out = DecodeClientMessage(m.SerializeAsString());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(std::get<GenerateInput>(*out).chat.has_value());
  EXPECT_TRUE(std::get<GenerateInput>(*out).chat->add_generation_prompt);
  EXPECT_EQ(std::get<GenerateInput>(*out).chat->tools_json, "");
  EXPECT_TRUE(ChatInput{}.add_generation_prompt);
}

TEST(CodecChatTest, TokenizeChatRoundTripsAndUnsetSpecialTokensIsFalse) {
  TokenizeInput in;
  in.request_id = "t";
  in.chat = SampleChat();
  in.add_special_tokens = true;
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  const TokenizeInput& out = std::get<TokenizeInput>(*m);
  ASSERT_TRUE(out.chat.has_value());
  EXPECT_EQ(*out.chat, *in.chat);
  EXPECT_TRUE(out.add_special_tokens);  // as asked

  // A client that leaves add_special_tokens unset gets apply_chat_template's false for chat.
  v1::ClientMessage raw;
  raw.set_protocol_version(kProtocolVersion);
  raw.mutable_tokenize()->set_request_id("t");
  raw.mutable_tokenize()->mutable_chat()->set_messages_json("[]");
  absl::StatusOr<ClientMessage> decoded = DecodeClientMessage(raw.SerializeAsString());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(std::get<TokenizeInput>(*decoded).add_special_tokens);
  ASSERT_TRUE(std::get<TokenizeInput>(*decoded).chat.has_value());

  // Plain text keeps no chat.
  TokenizeInput text;
  text.request_id = "t2";
  text.text = "hi";
  m = DecodeClientMessage(Encode(ClientMessage(text)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(std::get<TokenizeInput>(*m).chat.has_value());
}

TEST(CodecChatTest, RegisterCarriesTheChatTemplateFile) {
  RegisterInfo r;
  r.tokenizer = TokenizerKind::kHuggingFace;
  r.chat_template_jinja = "{% for m in messages %}{{ m.content }}{% endfor %}\n";
  absl::StatusOr<WorkerMessage> m = DecodeWorkerMessage(Encode(WorkerMessage(r)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<RegisterInfo>(*m).chat_template_jinja, r.chat_template_jinja);
  r.chat_template_jinja.clear();
  m = DecodeWorkerMessage(Encode(WorkerMessage(r)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<RegisterInfo>(*m).chat_template_jinja, "");
}

// ---- batch jobs (issue 16): the batch lane flag, the Batch API calls, the lane in Stats

TEST(CodecBatchTest, BatchJobFlagTravelsOnGenerateAndEmbed) {
  GenerateInput g;
  g.request_id = "g1";
  g.batch_job = true;
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(g)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(std::get<GenerateInput>(*m).batch_job);
  g.batch_job = false;
  m = DecodeClientMessage(Encode(ClientMessage(g)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(std::get<GenerateInput>(*m).batch_job);

  EmbedInput e;
  e.request_id = "e1";
  e.inputs.push_back({false, "", {1}});
  e.batch_job = true;
  m = DecodeClientMessage(Encode(ClientMessage(e)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(std::get<EmbedInput>(*m).batch_job);
  e.batch_job = false;
  m = DecodeClientMessage(Encode(ClientMessage(e)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(std::get<EmbedInput>(*m).batch_job);
}

TEST(CodecBatchTest, EveryBatchCallFieldRoundTrips) {
  BatchCallInfo in;
  in.request_id = "b1";
  in.api_key = "key";
  in.op = BatchOp::kCreateFile;
  in.id = "file-1";
  in.filename = "in.jsonl";
  in.purpose = "batch";
  in.content = std::string("{\"custom_id\": \"a\"}\n\xff\x00", 22);  // bytes, not UTF-8
  in.input_file_id = "file-2";
  in.endpoint = "/v1/chat/completions";
  in.completion_window = "24h";
  in.metadata_json = "{\"k\": \"v\"}";
  in.after = "batch_9";
  in.limit = 7;
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<BatchCallInfo>(*m));
  EXPECT_EQ(std::get<BatchCallInfo>(*m), in);
}

TEST(CodecBatchTest, EveryOpKeepsItsName) {
  const BatchOp ops[] = {BatchOp::kCreateFile,  BatchOp::kGetFile,     BatchOp::kFileContent,
                         BatchOp::kDeleteFile,  BatchOp::kCreateBatch, BatchOp::kGetBatch,
                         BatchOp::kListBatches, BatchOp::kCancelBatch};
  std::set<std::string> names;
  for (BatchOp op : ops) {
    BatchCallInfo in;
    in.request_id = "b";
    in.op = op;
    absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(in)));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(std::get<BatchCallInfo>(*m).op, op) << BatchOpName(op);
    names.insert(BatchOpName(op));
  }
  EXPECT_EQ(names.size(), std::size(ops));
  EXPECT_EQ(names.count("unspecified"), 0u);
  EXPECT_STREQ(BatchOpName(BatchOp::kUnspecified), "unspecified");
}

TEST(CodecBatchTest, AnOpThatNamesNoneIsRefusedWithItsRequestId) {
  v1::ClientMessage raw;
  raw.set_protocol_version(kProtocolVersion);
  raw.mutable_batch()->set_request_id("b7");
  raw.mutable_batch()->set_op(static_cast<v1::BatchCall::Op>(99));
  const std::string frame = raw.SerializeAsString();
  absl::StatusOr<ClientMessage> out = DecodeClientMessage(frame);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("op"), std::string::npos) << out.status();
  EXPECT_EQ(ScanClientRequestId(frame), "b7");
  // Unset, it decodes (the router refuses it, naming the op).
  raw.mutable_batch()->clear_op();
  out = DecodeClientMessage(raw.SerializeAsString());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::get<BatchCallInfo>(*out).op, BatchOp::kUnspecified);
}

TEST(CodecBatchTest, IsBatchCallFrameReadsTheLastBody) {
  BatchCallInfo b;
  b.request_id = "b1";
  b.op = BatchOp::kCreateFile;
  b.content = std::string(5000, 'x');
  const std::string batch = Encode(ClientMessage(b));
  EXPECT_TRUE(IsBatchCallFrame(batch));
  // Cut short, the frame still names its body.
  EXPECT_TRUE(IsBatchCallFrame(std::string_view(batch).substr(0, 100)));
  GenerateInput g;
  g.request_id = "g1";
  const std::string generate = Encode(ClientMessage(g));
  EXPECT_FALSE(IsBatchCallFrame(generate));
  EXPECT_FALSE(IsBatchCallFrame(Encode(ClientMessage(StatsQuery{}))));
  EXPECT_FALSE(IsBatchCallFrame("garbage \xff\xff"));
  EXPECT_FALSE(IsBatchCallFrame(""));
  // Another member of the oneof after the batch call replaces it, as the parser has it.
  EXPECT_FALSE(IsBatchCallFrame(batch + generate));
  EXPECT_TRUE(IsBatchCallFrame(generate + batch));
}

TEST(CodecBatchTest, BatchReplyRoundTripsWithBytes) {
  BatchReplyInfo r{"b1", "{\"id\": \"file-1\", \"object\": \"file\"}",
                   std::string("line\n\x00\xfe", 7)};
  absl::StatusOr<ServerMessage> m = DecodeServerMessage(Encode(ServerMessage(r)));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(std::holds_alternative<BatchReplyInfo>(*m));
  EXPECT_EQ(std::get<BatchReplyInfo>(*m), r);
  EXPECT_EQ(RequestIdOf(*m), "b1");
}

TEST(CodecBatchTest, StatsCarryTheBatchLane) {
  StatsOut s;
  s.batch_lane_queued = 40;
  s.batch_lane_inflight = 8;
  s.batch_max_queued = 1000;
  s.batch_max_inflight = 16;
  s.batches_by_status = {{"in_progress", 2}, {"completed", 5}};
  s.batch_requests_pending = 12345;
  absl::StatusOr<ServerMessage> m = DecodeServerMessage(Encode(ServerMessage(s)));
  ASSERT_TRUE(m.ok()) << m.status();
  const StatsOut& out = std::get<StatsOut>(*m);
  EXPECT_EQ(out.batch_lane_queued, 40);
  EXPECT_EQ(out.batch_lane_inflight, 8);
  EXPECT_EQ(out.batch_max_queued, 1000);
  EXPECT_EQ(out.batch_max_inflight, 16);
  EXPECT_EQ(out.batches_by_status, s.batches_by_status);
  EXPECT_EQ(out.batch_requests_pending, 12345);
}

}  // namespace
}  // namespace carpool
