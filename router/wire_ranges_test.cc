// Every numeric field of every client message (proto/carpool.proto: ClientMessage and what it
// holds; cancel and stats carry none) with 0, -1, 2^31, 2^32 + 1, 2^63 and 2^64 as varints, and
// the floats also with NaN and +-inf, written on the wire by hand so that nothing narrows them
// first. Each value is accepted, or refused once, by the codec or by the request validator, with
// INVALID_ARGUMENT naming the field.
#include <cmath>
#include <cstring>
#include <limits>

#include "common/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/carpool.pb.h"
#include "router/request_validator.h"

namespace carpool::router {
namespace {

using ::testing::HasSubstr;

// ---- hand-written wire bytes

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
// 2^64 does not fit a varint: ten bytes whose last carries bit 64.
const std::string kVarint2To64 = std::string(9, '\x80') + "\x02";

std::string Tag(int field, int wire_type) { return Varint(uint64_t(field) << 3 | wire_type); }
std::string VarintField(int field, const std::string& varint) { return Tag(field, 0) + varint; }
std::string LenField(int field, const std::string& payload) {
  return Tag(field, 2) + Varint(payload.size()) + payload;
}
std::string FloatField(int field, float f) {
  char bytes[4];
  std::memcpy(bytes, &f, 4);
  return Tag(field, 5) + std::string(bytes, 4);
}

// ---- the values

enum class Outcome { kOk, kCodec, kValidator };
constexpr Outcome O = Outcome::kOk, C = Outcome::kCodec, V = Outcome::kValidator;

struct IntValue {
  const char* label;
  std::string varint;
};
const std::vector<IntValue>& IntValues() {
  static const auto* v = new std::vector<IntValue>{
      {"0", Varint(0)},
      {"-1", Varint(~uint64_t{0})},
      {"2^31", Varint(uint64_t{1} << 31)},
      {"2^32+1", Varint((uint64_t{1} << 32) + 1)},
      {"2^63", Varint(uint64_t{1} << 63)},
      {"2^64", kVarint2To64},
  };
  return *v;
}
const std::vector<std::pair<const char*, float>>& FloatValues() {
  static const auto* v = new std::vector<std::pair<const char*, float>>{
      {"0", 0.0f},
      {"-1", -1.0f},
      {"2^31", 2147483648.0f},
      {"2^32+1", 4294967297.0f},
      {"2^63", 9223372036854775808.0f},
      {"NaN", std::numeric_limits<float>::quiet_NaN()},
      {"+inf", std::numeric_limits<float>::infinity()},
      {"-inf", -std::numeric_limits<float>::infinity()},
  };
  return *v;
}

// ---- the messages around the field

// A valid generate request's body bytes: token ids {1, 2}, max_tokens 1.
std::string GenerateBody() {
  v1::GenerateRequest g;
  g.set_request_id("t");
  g.mutable_token_ids()->add_ids(1);
  g.mutable_token_ids()->add_ids(2);
  g.mutable_sampling()->set_max_tokens(1);
  return g.SerializeAsString();
}
std::string EmbedBody() {
  v1::EmbedRequest e;
  e.set_request_id("e");
  e.add_inputs()->mutable_token_ids()->add_ids(1);
  return e.SerializeAsString();
}
std::string Envelope(int body_field, const std::string& body) {
  return VarintField(1, Varint(kProtocolVersion)) + LenField(body_field, body);
}

// Where a field lives: wraps its own bytes into a whole ClientMessage. Protobuf merges a
// repeated submessage into the one before, and the last scalar wins, so appending overrides.
using Wrap = std::function<std::string(const std::string& field_bytes)>;
Wrap InGenerate() {
  return [](const std::string& f) { return Envelope(2, GenerateBody() + f); };
}
Wrap InSampling() {
  return [](const std::string& f) { return Envelope(2, GenerateBody() + LenField(4, f)); };
}
Wrap InTokenIds() {  // generate.token_ids: one more id
  return [](const std::string& f) { return Envelope(2, GenerateBody() + LenField(3, f)); };
}
Wrap InEmbed() {
  return [](const std::string& f) { return Envelope(5, EmbedBody() + f); };
}
Wrap InEmbedInputIds() {  // embed.inputs[1].token_ids
  return [](const std::string& f) {
    return Envelope(5, EmbedBody() + LenField(2, LenField(2, f)));
  };
}
Wrap InEnvelope() {  // after the body: the last protocol_version wins
  return [](const std::string& f) { return Envelope(2, GenerateBody()) + f; };
}

struct IntField {
  const char* name;  // what the error must name
  Wrap wrap;
  int number;
  bool packed;
  std::vector<Outcome> expect;  // per IntValues()
};
struct FloatFieldCase {
  const char* name;
  int number;
  std::vector<Outcome> expect;  // per FloatValues()
};

// ---- running one case

ModelLimits Model() {
  ModelLimits m;
  m.known = true;
  m.vocab_size = 300;
  m.max_model_len = 4096;
  m.tokenizer = std::make_shared<ByteTokenizer>();
  m.bos_token_id = 256;
  return m;
}

// Decodes `frame` and validates what decoded; the outcome and the error that decided it.
std::pair<Outcome, absl::Status> DecodeAndValidate(const std::string& frame) {
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(frame);
  if (!m.ok()) return {Outcome::kCodec, m.status()};
  const RequestLimits limits;
  absl::Status s;
  if (const auto* g = std::get_if<GenerateInput>(&*m)) {
    s = ValidateGenerate(*g, Model(), limits).status();
  } else if (const auto* e = std::get_if<EmbedInput>(&*m)) {
    s = ValidateEmbed(*e, Model(), limits).status();
  } else {
    s = absl::InternalError("decoded to another message type");
  }
  return {s.ok() ? Outcome::kOk : Outcome::kValidator, s};
}

const char* Name(Outcome o) {
  return o == Outcome::kOk ? "accepted" : o == Outcome::kCodec ? "codec" : "validator";
}

void Expect(const std::string& what, const std::string& frame, Outcome want,
            const char* field_name) {
  auto [got, status] = DecodeAndValidate(frame);
  EXPECT_EQ(Name(got), std::string(Name(want))) << what << ": " << status;
  if (got != Outcome::kOk) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(field_name)) << what;
  }
}

TEST(WireRangesTest, EveryIntegerFieldOfEveryClientMessage) {
  // 2^64 is no varint: the frame is refused whatever the field.
  const std::vector<IntField> fields = {
      {"protocol", InEnvelope(), 1, false, {C, C, C, C, C, C}},
      {"deadline_ms", InGenerate(), 6, false, {O, C, O, C, C, C}},
      {"priority", InGenerate(), 5, false, {O, C, C, C, C, C}},
      {"stream", InGenerate(), 8, false, {O, O, O, O, O, C}},  // bool: any non-zero is true
      {"add_bos", InGenerate(), 9, false, {O, O, O, O, O, C}},
      {"token", InTokenIds(), 1, true, {O, V, C, C, C, C}},
      {"token", InTokenIds(), 1, false, {O, V, C, C, C, C}},  // unpacked
      {"top_k", InSampling(), 2, false, {O, O, C, C, C, C}},
      {"seed", InSampling(), 8, false, {O, O, O, O, O, C}},  // uint64: all fit
      {"max_tokens", InSampling(), 9, false, {V, V, C, C, C, C}},
      {"stop_token_ids", InSampling(), 10, true, {O, V, C, C, C, C}},
      {"ignore_eos", InSampling(), 11, false, {O, O, O, O, O, C}},
      {"logprobs", InSampling(), 12, false, {O, V, C, C, C, C}},
      {"deadline_ms", InEmbed(), 6, false, {O, C, O, C, C, C}},
      {"priority", InEmbed(), 5, false, {O, C, C, C, C, C}},
      {"pooling", InEmbed(), 4, false, {O, C, C, C, C, C}},
      {"normalize", InEmbed(), 3, false, {O, O, O, O, O, C}},
      {"add_bos", InEmbed(), 8, false, {O, O, O, O, O, C}},
      {"token", InEmbedInputIds(), 1, true, {O, V, C, C, C, C}},
  };
  for (const IntField& f : fields) {
    ASSERT_EQ(f.expect.size(), IntValues().size()) << f.name;
    for (size_t i = 0; i < IntValues().size(); ++i) {
      const IntValue& v = IntValues()[i];
      // 2^64 cannot be written as a varint; the frame must still be refused, naming anything.
      const char* name = v.label == std::string("2^64") ? "" : f.name;
      const std::string bytes =
          f.packed ? LenField(f.number, v.varint) : VarintField(f.number, v.varint);
      Expect(absl::StrCat(f.name, " (field ", f.number, ") = ", v.label), f.wrap(bytes),
             f.expect[i], name);
    }
  }
}

TEST(WireRangesTest, EveryFloatFieldOfEveryClientMessage) {
  const std::vector<FloatFieldCase> fields = {
      {"temperature", 1, {O, V, O, O, O, V, V, V}},
      {"top_p", 3, {V, V, V, V, V, V, V, V}},
      {"min_p", 4, {O, V, V, V, V, V, V, V}},
      {"repetition_penalty", 5, {V, V, O, O, O, V, V, V}},
      {"presence_penalty", 6, {O, O, V, V, V, V, V, V}},
      {"frequency_penalty", 7, {O, O, V, V, V, V, V, V}},
  };
  for (const FloatFieldCase& f : fields) {
    ASSERT_EQ(f.expect.size(), FloatValues().size()) << f.name;
    for (size_t i = 0; i < FloatValues().size(); ++i) {
      const auto& [label, value] = FloatValues()[i];
      Expect(absl::StrCat(f.name, " = ", label), InSampling()(FloatField(f.number, value)),
             f.expect[i], f.name);
    }
  }
}

TEST(WireRangesTest, ErrorsNameThePathAndTheBound) {
  const std::string deadline = InGenerate()(VarintField(6, Varint((uint64_t{1} << 32) + 100)));
  absl::Status s = DecodeClientMessage(deadline).status();
  EXPECT_THAT(s.message(), HasSubstr("'generate.deadline_ms' is 4294967396"));
  EXPECT_THAT(s.message(), HasSubstr("4294967295"));
  s = DecodeClientMessage(InSampling()(VarintField(9, Varint(uint64_t{1} << 31)))).status();
  EXPECT_THAT(s.message(), HasSubstr("'generate.sampling.max_tokens' is 2147483648"));
  EXPECT_THAT(s.message(), HasSubstr("2147483647"));
  s = DecodeClientMessage(InTokenIds()(LenField(1, Varint(1) + Varint(uint64_t{1} << 40))))
          .status();
  EXPECT_THAT(s.message(), HasSubstr("'generate.token_ids.ids[3]'"));  // after 1, 2 and 1
  s = DecodeClientMessage(InEmbed()(VarintField(4, Varint(7)))).status();
  EXPECT_THAT(s.message(), HasSubstr("'embed.pooling' is 7, not a Pooling"));
  EXPECT_THAT(s.message(), HasSubstr("POOLING_LAST"));
  // The validator names the real bound of max_tokens.
  auto [outcome, status] = DecodeAndValidate(InSampling()(VarintField(9, Varint(0))));
  EXPECT_EQ(outcome, Outcome::kValidator);
  EXPECT_THAT(status.message(), HasSubstr("max_tokens is 0; it must be in [1, 1048576]"));
}

TEST(WireRangesTest, ValuesInRangeArriveExactly) {
  absl::StatusOr<ClientMessage> m =
      DecodeClientMessage(InGenerate()(VarintField(6, Varint(uint64_t{1} << 31))));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<GenerateInput>(*m).deadline_ms, int64_t{1} << 31);
  m = DecodeClientMessage(InGenerate()(VarintField(6, Varint(4294967295u))));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<GenerateInput>(*m).deadline_ms, 4294967295);
}

TEST(WireRangesTest, EncodeClampsMillisecondsInsteadOfWrapping) {
  GenerateInput g;
  g.request_id = "r";
  g.token_ids = {1};
  g.deadline_ms = (int64_t{1} << 32) + 100;
  absl::StatusOr<ClientMessage> m = DecodeClientMessage(Encode(ClientMessage(g)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<GenerateInput>(*m).deadline_ms, 4294967295);
  g.deadline_ms = -5;
  m = DecodeClientMessage(Encode(ClientMessage(g)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::get<GenerateInput>(*m).deadline_ms, 0);
  ErrorInfo e{"r", absl::StatusCode::kUnavailable, "x", "y", int64_t{1} << 33};
  absl::StatusOr<ServerMessage> back = DecodeServerMessage(Encode(ServerMessage(e)));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::get<ErrorInfo>(*back).retry_after_ms, 4294967295);
}

}  // namespace
}  // namespace carpool::router
