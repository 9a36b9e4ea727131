// Protobuf frames <-> carpool's message structs. The only code that touches generated types.
//
// Decode* never trusts its input: a frame that is not the expected message, carries another
// protocol version, or names no known message type gives INVALID_ARGUMENT with a message that
// says which. DecodeClientMessage also refuses an integer that does not fit its field (a uint32
// deadline_ms of 2^32 + 100 is not read as 100) or an enum value that names none
// (common/wire_ranges.h). Semantic validation (sampling ranges, lengths, floats) is the
// receiver's job: router/request_validator.h. Encode clamps an int64 millisecond count to a
// uint32 field's range instead of wrapping it.
#ifndef CARPOOL_COMMON_CODEC_H_
#define CARPOOL_COMMON_CODEC_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/messages.h"

namespace carpool {

std::string Encode(const ClientMessage& message);
std::string Encode(const ServerMessage& message);
std::string Encode(const WorkerMessage& message);
std::string Encode(const RouterMessage& message);

absl::StatusOr<ClientMessage> DecodeClientMessage(std::string_view frame);
// The request_id a ClientMessage frame names, read without decoding the rest (common/wire_scan.h),
// so that a refusal of a frame that does not decode (too large, truncated, invalid past its
// request_id, another protocol version) still names the request it refuses. Protobuf's rules
// apply: the last generate/cancel/embed/tokenize/detokenize body wins, and in it the last
// request_id. "" when the frame names none (a stats request, garbage) or the id is not valid
// UTF-8.
std::string ScanClientRequestId(std::string_view frame);
// Whether a ClientMessage frame's body is a BatchCall, read without decoding it (as
// ScanClientRequestId: the last body wins), so that a frame too large for other messages can be
// held to the batch call's limit instead (an upload of up to --batch-max-file-bytes).
bool IsBatchCallFrame(std::string_view frame);
absl::StatusOr<ServerMessage> DecodeServerMessage(std::string_view frame);
absl::StatusOr<WorkerMessage> DecodeWorkerMessage(std::string_view frame);
absl::StatusOr<RouterMessage> DecodeRouterMessage(std::string_view frame);

// The Priority a proto Priority value names (also in config files: router/tenants.h); kDefault
// for PRIORITY_DEFAULT and any value that names none.
Priority PriorityFromWire(int value);

// The absl::StatusCode whose name is `name` ("RESOURCE_EXHAUSTED"); kUnknown if none.
absl::StatusCode StatusCodeFromName(std::string_view name);

}  // namespace carpool

#endif  // CARPOOL_COMMON_CODEC_H_
