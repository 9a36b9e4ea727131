// Round trips of the embed messages through the protobuf codec, and what it refuses.
#include "common/codec.h"

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace carpool
