#include "common/wire_scan.h"

namespace carpool::wire {

bool ReadVarint(std::string_view data, size_t* pos, uint64_t* value) {
  uint64_t v = 0;
  size_t p = *pos;
  for (int i = 0; i < 10; ++i) {
    if (p >= data.size()) return false;
    const uint64_t byte = static_cast<unsigned char>(data[p++]);
    // The tenth byte holds bit 63 only.
    if (i == 9 && byte > 1) return false;
    v |= (byte & 0x7f) << (7 * i);
    if ((byte & 0x80) == 0) {
      *value = v;
      *pos = p;
      return true;
    }
  }
  return false;
}

bool Reader::Next(Field* field) {
  if (!ok_ || pos_ >= data_.size()) return false;
  uint64_t tag = 0;
  if (!ReadVarint(data_, &pos_, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) {
    ok_ = false;
    return false;
  }
  *field = Field();
  field->number = static_cast<uint32_t>(tag >> 3);
  field->wire_type = static_cast<int>(tag & 7);
  switch (field->wire_type) {
    case kVarint:
      if (!ReadVarint(data_, &pos_, &field->value)) break;
      return true;
    case kFixed64:
    case kFixed32: {
      const size_t n = field->wire_type == kFixed64 ? 8 : 4;
      if (data_.size() - pos_ < n) break;
      for (size_t i = 0; i < n; ++i) {
        field->value |= uint64_t{static_cast<unsigned char>(data_[pos_ + i])} << (8 * i);
      }
      pos_ += n;
      return true;
    }
    case kLen: {
      uint64_t len = 0;
      if (!ReadVarint(data_, &pos_, &len)) break;
      const size_t left = data_.size() - pos_;
      if (len > left) {
        field->bytes = data_.substr(pos_);
        field->truncated = true;
        pos_ = data_.size();
        ok_ = false;
        return true;
      }
      field->bytes = data_.substr(pos_, static_cast<size_t>(len));
      pos_ += static_cast<size_t>(len);
      return true;
    }
    default:  // groups (3, 4) are not used by carpool; 6 and 7 do not exist
      break;
  }
  ok_ = false;
  return false;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n = 0;
    uint32_t cp = 0;
    uint32_t min = 0;
    if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(n)) return false;
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace carpool::wire
