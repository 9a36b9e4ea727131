#include "worker/model/step_plan.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace carpool::worker {
namespace {

constexpr uint32_t kMagic = 0xca49'5e02;  // "carpool step", version 2 (plans have a kind)
// Header: magic, kind, payload length (u64), then up to kInlineBytes of payload.
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kFixedBytes = 16;
constexpr size_t kInlineBytes = kHeaderBytes - kFixedBytes;

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T* value) {
    if (bytes_.size() < sizeof(T)) return false;
    std::memcpy(value, bytes_.data(), sizeof(T));
    bytes_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetInts(size_t n, std::vector<int32_t>* out) {
    if (n > bytes_.size() / sizeof(int32_t)) return false;
    out->resize(n);
    if (n > 0) std::memcpy(out->data(), bytes_.data(), n * sizeof(int32_t));
    bytes_.remove_prefix(n * sizeof(int32_t));
    return true;
  }
  bool done() const { return bytes_.empty(); }

 private:
  absl::string_view bytes_;
};

}  // namespace

// Layout: u8 kind, u32 seqs, u32 tokens; per seq: i64 id, i32 start, i32 num, u8 sample,
// u32 blocks, i32 x blocks; then i32 x tokens. Host byte order: the group shares one
// architecture.
std::string EncodeStepPlan(const StepPlan& plan) {
  std::string out;
  Put(&out, static_cast<uint8_t>(plan.kind));
  Put(&out, static_cast<uint32_t>(plan.seqs.size()));
  Put(&out, static_cast<uint32_t>(plan.token_ids.size()));
  for (const StepPlan::Seq& s : plan.seqs) {
    Put(&out, s.seq_id);
    Put(&out, s.start_position);
    Put(&out, s.num_tokens);
    Put(&out, static_cast<uint8_t>(s.sample ? 1 : 0));
    Put(&out, static_cast<uint32_t>(s.block_table.size()));
    out.append(reinterpret_cast<const char*>(s.block_table.data()),
               s.block_table.size() * sizeof(int32_t));
  }
  out.append(reinterpret_cast<const char*>(plan.token_ids.data()),
             plan.token_ids.size() * sizeof(int32_t));
  return out;
}

absl::StatusOr<StepPlan> DecodeStepPlan(absl::string_view bytes) {
  Reader in(bytes);
  uint8_t kind = 0;
  uint32_t num_seqs = 0, num_tokens = 0;
  if (!in.Get(&kind) || !in.Get(&num_seqs) || !in.Get(&num_tokens)) {
    return absl::InvalidArgumentError("step plan: truncated header");
  }
  if (kind != static_cast<uint8_t>(StepPlan::Kind::kGenerate) &&
      kind != static_cast<uint8_t>(StepPlan::Kind::kEmbed)) {
    return absl::InvalidArgumentError(absl::StrCat("step plan: unknown kind ", kind));
  }
  StepPlan plan;
  plan.kind = static_cast<StepPlan::Kind>(kind);
  const bool embed = plan.kind == StepPlan::Kind::kEmbed;
  int64_t tokens = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    StepPlan::Seq s;
    uint8_t sample = 0;
    uint32_t blocks = 0;
    if (!in.Get(&s.seq_id) || !in.Get(&s.start_position) || !in.Get(&s.num_tokens) ||
        !in.Get(&sample) || !in.Get(&blocks) || !in.GetInts(blocks, &s.block_table)) {
      return absl::InvalidArgumentError(absl::StrCat("step plan: sequence ", i, " is truncated"));
    }
    if (s.start_position < 0 || s.num_tokens < 1) {
      return absl::InvalidArgumentError(absl::StrCat("step plan: sequence ", i,
                                                     " has an invalid position range"));
    }
    if (embed && (s.start_position != 0 || !s.block_table.empty() || sample != 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step plan: embed sequence ", i,
                       " must start at position 0 with no block table and nothing sampled"));
    }
    s.sample = sample != 0;
    tokens += s.num_tokens;
    plan.seqs.push_back(std::move(s));
  }
  if (tokens != num_tokens || !in.GetInts(num_tokens, &plan.token_ids) || !in.done()) {
    return absl::InvalidArgumentError("step plan: token count does not match the sequences");
  }
  return plan;
}

absl::Status SendStepMessage(cluster::Communicator* comm, const StepMessage& message) {
  std::string header(kHeaderBytes, '\0');
  const uint32_t kind = static_cast<uint32_t>(message.kind);
  const uint64_t length = message.payload.size();
  std::memcpy(header.data(), &kMagic, 4);
  std::memcpy(header.data() + 4, &kind, 4);
  std::memcpy(header.data() + 8, &length, 8);
  const bool fits = length <= kInlineBytes;
  if (fits) std::memcpy(header.data() + kFixedBytes, message.payload.data(), length);
  RETURN_IF_ERROR(comm->Broadcast(header.data(), kHeaderBytes, 0, comm->timeout()));
  if (fits) return absl::OkStatus();
  std::string payload = message.payload;
  return comm->Broadcast(payload.data(), static_cast<int64_t>(payload.size()), 0, comm->timeout());
}

absl::StatusOr<StepMessage> ReceiveStepMessage(cluster::Communicator* comm) {
  std::string header(kHeaderBytes, '\0');
  RETURN_IF_ERROR(comm->Broadcast(header.data(), kHeaderBytes, 0, absl::InfiniteDuration()));
  uint32_t magic = 0, kind = 0;
  uint64_t length = 0;
  std::memcpy(&magic, header.data(), 4);
  std::memcpy(&kind, header.data() + 4, 4);
  std::memcpy(&length, header.data() + 8, 8);
  if (magic != kMagic || (kind != static_cast<uint32_t>(StepKind::kStep) &&
                          kind != static_cast<uint32_t>(StepKind::kShutdown))) {
    return absl::InvalidArgumentError("step channel: not a step message (a different version?)");
  }
  if (length > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("step channel: payload of ", length, " bytes"));
  }
  StepMessage message;
  message.kind = static_cast<StepKind>(kind);
  if (length <= kInlineBytes) {
    message.payload.assign(header.data() + kFixedBytes, length);
    return message;
  }
  message.payload.resize(length);
  RETURN_IF_ERROR(
      comm->Broadcast(message.payload.data(), static_cast<int64_t>(length), 0, comm->timeout()));
  return message;
}

}  // namespace carpool::worker
