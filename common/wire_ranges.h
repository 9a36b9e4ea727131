// Range checks on the integers of a protobuf frame, against the schema. Part of the codec
// (common/codec.h), which runs them on every client frame before converting it.
//
// Protobuf's parser keeps the low 32 bits of a varint given to an int32, uint32 or enum field
// without a word (a deadline of 2^32 + 100 ms becomes 100 ms), and proto3 enums accept any
// number. These checks read the wire bytes, so they see the value that was sent.
#ifndef CARPOOL_COMMON_WIRE_RANGES_H_
#define CARPOOL_COMMON_WIRE_RANGES_H_

#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"

namespace carpool::wire {

// OK when every int32, uint32 and enum value in `frame` (a serialized `type`, nested messages
// and packed repeated fields included) fits its field, and every enum value names one of the
// enum's values. Otherwise INVALID_ARGUMENT naming the field by its path
// ("'generate.sampling.max_tokens' is 2147483648, ...") and its bound. Floats, 64-bit integers,
// strings and unknown fields are the receiver's to check. REQUIRES: `frame` parses as `type`.
absl::Status CheckRanges(std::string_view frame, const google::protobuf::Descriptor* type);

}  // namespace carpool::wire

#endif  // CARPOOL_COMMON_WIRE_RANGES_H_
