// The schema-less wire reader and ScanClientRequestId over valid, truncated, oversized and
// garbage frames.
#include "common/wire_scan.h"

#include <random>

#include "common/codec.h"
#include "gtest/gtest.h"
#include "proto/carpool.pb.h"

namespace carpool {
namespace {

std::string GenerateFrame(const std::string& id, size_t text_bytes) {
  GenerateInput g;
  g.request_id = id;
  g.has_text = true;
  g.text = std::string(text_bytes, 'a');
  g.sampling.max_tokens = 7;
  return Encode(ClientMessage(g));
}

TEST(WireReaderTest, ReadsEveryWireType) {
  v1::SamplingParams p;
  p.set_temperature(0.5f);  // fixed32
  p.set_top_k(-1);          // 10-byte varint
  p.set_seed(~uint64_t{0});
  p.add_stop_token_ids(3);  // packed: kLen
  const std::string bytes = p.SerializeAsString();
  wire::Reader r(bytes);
  wire::Field f;
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.number, 1u);
  EXPECT_EQ(f.wire_type, wire::kFixed32);
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.number, 2u);
  EXPECT_EQ(f.value, ~uint64_t{0});
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.number, 8u);
  EXPECT_EQ(f.value, ~uint64_t{0});
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.number, 10u);
  EXPECT_EQ(f.wire_type, wire::kLen);
  EXPECT_EQ(f.bytes, std::string(1, '\x03'));
  EXPECT_FALSE(r.Next(&f));
  EXPECT_TRUE(r.ok());
}

TEST(WireReaderTest, RefusesMalformedVarints) {
  uint64_t v = 0;
  size_t pos = 0;
  // Eleven continuation bytes; and a tenth byte carrying bits past 64.
  EXPECT_FALSE(wire::ReadVarint(std::string(11, '\xff'), &pos, &v));
  EXPECT_FALSE(wire::ReadVarint(std::string(9, '\xff') + "\x02", &pos, &v));
  EXPECT_EQ(pos, 0u);
  EXPECT_TRUE(wire::ReadVarint(std::string(9, '\xff') + "\x01", &pos, &v));
  EXPECT_EQ(v, ~uint64_t{0});
  EXPECT_EQ(pos, 10u);
  pos = 0;
  EXPECT_FALSE(wire::ReadVarint("\x80", &pos, &v));  // cut short
}

TEST(WireReaderTest, TruncatedLengthFieldIsReturnedOnceThenStops) {
  const std::string bytes = std::string("\x12\x10", 2) + "abc";  // field 2, 16 bytes, only 3
  wire::Reader r(bytes);
  wire::Field f;
  ASSERT_TRUE(r.Next(&f));
  EXPECT_TRUE(f.truncated);
  EXPECT_EQ(f.bytes, "abc");
  EXPECT_FALSE(r.Next(&f));
  EXPECT_FALSE(r.ok());
}

TEST(WireReaderTest, Utf8) {
  EXPECT_TRUE(wire::IsValidUtf8("r-1 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(wire::IsValidUtf8("\xff"));
  EXPECT_FALSE(wire::IsValidUtf8("\xc0\x80"));          // overlong NUL
  EXPECT_FALSE(wire::IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(wire::IsValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(wire::IsValidUtf8("\xe2\x82"));          // cut short
}

TEST(ScanClientRequestIdTest, FindsTheIdOfEveryBodyThatHasOne) {
  EXPECT_EQ(ScanClientRequestId(GenerateFrame("g-1", 10)), "g-1");
  EXPECT_EQ(ScanClientRequestId(Encode(ClientMessage(CancelInput{"c-1"}))), "c-1");
  EmbedInput e;
  e.request_id = "e-1";
  e.inputs.push_back({false, "", {1, 2}});
  EXPECT_EQ(ScanClientRequestId(Encode(ClientMessage(e))), "e-1");
  TokenizeInput t;
  t.request_id = "t-1";
  t.text = "hello";
  EXPECT_EQ(ScanClientRequestId(Encode(ClientMessage(t))), "t-1");
  DetokenizeInput d;
  d.request_id = "d-1";
  d.token_ids = {1, 2};
  EXPECT_EQ(ScanClientRequestId(Encode(ClientMessage(d))), "d-1");
  EXPECT_EQ(ScanClientRequestId(Encode(ClientMessage(StatsQuery{}))), "");
}

TEST(ScanClientRequestIdTest, OversizedFrame) {
  // Larger than any router limit; the id comes first, the prompt after.
  EXPECT_EQ(ScanClientRequestId(GenerateFrame("big", 3 << 20)), "big");
}

TEST(ScanClientRequestIdTest, EveryTruncationThatKeepsTheIdFindsIt) {
  const std::string frame = GenerateFrame("trunc-id", 200);
  // protocol_version (2 bytes), body tag + length (1 + 2), id tag + length (2) + 8 bytes.
  const size_t id_end = 2 + 3 + 2 + 8;
  for (size_t n = 0; n < frame.size(); ++n) {
    const std::string cut = frame.substr(0, n);
    EXPECT_FALSE(DecodeClientMessage(cut).ok()) << n;
    EXPECT_EQ(ScanClientRequestId(cut), n >= id_end ? "trunc-id" : "") << n;
  }
}

TEST(ScanClientRequestIdTest, InvalidPastTheId) {
  v1::ClientMessage m;
  m.set_protocol_version(kProtocolVersion);
  m.mutable_generate()->set_request_id("partly-valid");
  std::string frame = m.SerializeAsString();
  // The body goes on with a field of wire type 7, which does not exist.
  frame[3] = static_cast<char>(frame[3] + 2);
  frame += std::string("\x0f\x00", 2);
  ASSERT_FALSE(DecodeClientMessage(frame).ok());
  EXPECT_EQ(ScanClientRequestId(frame), "partly-valid");
  // Another protocol version still names its request.
  m.set_protocol_version(99);
  EXPECT_FALSE(DecodeClientMessage(m.SerializeAsString()).ok());
  EXPECT_EQ(ScanClientRequestId(m.SerializeAsString()), "partly-valid");
}

TEST(ScanClientRequestIdTest, FollowsProtobufsMergeRules) {
  v1::ClientMessage a, b, c;
  a.mutable_generate()->set_request_id("first");
  b.mutable_generate()->set_request_id("second");
  c.mutable_cancel()->set_request_id("cancelled");
  // A repeated body merges: the last request_id wins.
  EXPECT_EQ(ScanClientRequestId(a.SerializeAsString() + b.SerializeAsString()), "second");
  // Another oneof member replaces the body.
  EXPECT_EQ(ScanClientRequestId(a.SerializeAsString() + c.SerializeAsString()), "cancelled");
  v1::ClientMessage stats;
  stats.mutable_stats();
  EXPECT_EQ(ScanClientRequestId(a.SerializeAsString() + stats.SerializeAsString()), "");
  // A repeated body without an id keeps the earlier one.
  v1::ClientMessage empty_body;
  empty_body.mutable_generate()->set_stream(true);
  EXPECT_EQ(ScanClientRequestId(a.SerializeAsString() + empty_body.SerializeAsString()), "first");
}

TEST(ScanClientRequestIdTest, InvalidUtf8IdIsNotEchoed) {
  v1::ClientMessage m;
  m.mutable_cancel()->set_request_id("ok");
  std::string frame = m.SerializeAsString();
  frame[frame.size() - 1] = '\xff';
  EXPECT_EQ(ScanClientRequestId(frame), "");
}

TEST(ScanClientRequestIdTest, GarbageNeverCrashes) {
  std::mt19937 rng(7);
  const std::string valid = GenerateFrame("fuzz", 40);
  for (int i = 0; i < 20000; ++i) {
    std::string frame;
    if (i % 2 == 0) {
      frame.resize(rng() % 64);
      for (char& ch : frame) ch = static_cast<char>(rng());
    } else {
      frame = valid;
      for (int k = 0; k < 3; ++k) frame[rng() % frame.size()] = static_cast<char>(rng());
    }
    const std::string id = ScanClientRequestId(frame);
    EXPECT_LE(id.size(), frame.size());
    EXPECT_TRUE(wire::IsValidUtf8(id));
  }
}

}  // namespace
}  // namespace carpool
