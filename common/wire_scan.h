// Protobuf's wire format read field by field, without a schema and without trusting the input.
// Part of the codec (common/codec.h): it finds what a refusal must name (a request_id) in frames
// that do not decode: too large, truncated, or invalid past the field that matters.
//
// Thread-compatible; a Reader borrows its input, which must outlive it.
#ifndef CARPOOL_COMMON_WIRE_SCAN_H_
#define CARPOOL_COMMON_WIRE_SCAN_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace carpool::wire {

inline constexpr int kVarint = 0;
inline constexpr int kFixed64 = 1;
inline constexpr int kLen = 2;
inline constexpr int kFixed32 = 5;

struct Field {
  uint32_t number = 0;
  int wire_type = kVarint;
  // kVarint: the raw 64-bit value (an int32 -1 is 2^64 - 1); kFixed32/kFixed64: the bits.
  uint64_t value = 0;
  // kLen: the payload. When `truncated`, only the part of it the input holds.
  std::string_view bytes;
  bool truncated = false;
};

// Reads the fields of one message in order.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  // The next field; false at the end of the input or at a malformed field (bad tag, varint
  // longer than 10 bytes or past 64 bits, a group, a fixed field cut short). A kLen field whose
  // payload runs past the end is returned once with `truncated` set; reading stops after it.
  bool Next(Field* field);
  // False once a malformed or truncated field was met.
  bool ok() const { return ok_; }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Reads a varint at data[*pos], advancing *pos; false (and *pos unchanged) when malformed or
// cut short.
bool ReadVarint(std::string_view data, size_t* pos, uint64_t* value);

// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool IsValidUtf8(std::string_view s);

}  // namespace carpool::wire

#endif  // CARPOOL_COMMON_WIRE_SCAN_H_
