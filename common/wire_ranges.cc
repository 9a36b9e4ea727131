#include "common/wire_ranges.h"

#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/wire_scan.h"

namespace carpool::wire {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

// Nesting deeper than carpool's messages go is left to the parser's own limit.
constexpr int kMaxDepth = 16;

bool IsNarrowVarint(const FieldDescriptor* f) {
  return f->type() == FieldDescriptor::TYPE_INT32 || f->type() == FieldDescriptor::TYPE_UINT32 ||
         f->type() == FieldDescriptor::TYPE_ENUM;
}

std::string EnumValues(const EnumDescriptor* e) {
  std::string out;
  for (int i = 0; i < e->value_count(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", e->value(i)->number(), " (", e->value(i)->name(),
                    ")");
  }
  return out;
}

absl::Status Malformed(const std::string& name) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not well-formed protobuf (a varint past 64 bits?)"));
}

absl::Status CheckValue(const FieldDescriptor* f, uint64_t raw, const std::string& name) {
  if (f->type() == FieldDescriptor::TYPE_UINT32) {
    if (raw <= std::numeric_limits<uint32_t>::max()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is ", raw,
                                                   ", above its largest value ",
                                                   std::numeric_limits<uint32_t>::max()));
  }
  // int32 and enums: the varint is the value sign-extended to 64 bits.
  const int64_t v = static_cast<int64_t>(raw);
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", name, "' is ", v, ", outside its range [", std::numeric_limits<int32_t>::min(),
        ", ", std::numeric_limits<int32_t>::max(), "]"));
  }
  if (f->type() == FieldDescriptor::TYPE_ENUM &&
      f->enum_type()->FindValueByNumber(static_cast<int>(v)) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is ", v, ", not a ",
                                                   f->enum_type()->name(), ": one of ",
                                                   EnumValues(f->enum_type())));
  }
  return absl::OkStatus();
}

// Whether `raw` fits a field of type `type` (`e`: its enum, for TYPE_ENUM), as CheckValue
// decides it, without building a message. The type is read once per field by the caller
// (FieldDescriptor::type() is not free).
bool ValueFits(FieldDescriptor::Type type, const EnumDescriptor* e, uint64_t raw) {
  if (type == FieldDescriptor::TYPE_UINT32) return raw <= std::numeric_limits<uint32_t>::max();
  const int64_t v = static_cast<int64_t>(raw);
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    return false;
  }
  return type != FieldDescriptor::TYPE_ENUM || e->FindValueByNumber(static_cast<int>(v)) != nullptr;
}

// CheckMessage's walk without names: true when CheckMessage would return OK. Every message is
// walked this way first; only a frame that fails is walked again to name the field (a name per
// field and per element of a packed list costs more than the rest of decoding a prompt).
bool Fits(std::string_view bytes, const Descriptor* type, int depth) {
  if (depth > kMaxDepth) return true;
  Reader reader(bytes);
  Field field;
  while (reader.Next(&field)) {
    const FieldDescriptor* f = type->FindFieldByNumber(static_cast<int>(field.number));
    if (f == nullptr) continue;
    const FieldDescriptor::Type t = f->type();
    if (t == FieldDescriptor::TYPE_MESSAGE) {
      if (field.wire_type == kLen && !Fits(field.bytes, f->message_type(), depth + 1)) {
        return false;
      }
    } else if (!IsNarrowVarint(f)) {
      continue;
    } else {
      const EnumDescriptor* e = t == FieldDescriptor::TYPE_ENUM ? f->enum_type() : nullptr;
      if (field.wire_type == kVarint) {
        if (!ValueFits(t, e, field.value)) return false;
      } else if (field.wire_type == kLen && f->is_repeated()) {  // packed
        size_t pos = 0;
        uint64_t v = 0;
        while (pos < field.bytes.size()) {
          if (!ReadVarint(field.bytes, &pos, &v) || !ValueFits(t, e, v)) return false;
        }
      }
    }
  }
  return reader.ok();
}

// `seen`: elements of each repeated field so far, by path (shared across the occurrences of a
// submessage that the parser merges into one).
absl::Status CheckMessage(std::string_view bytes, const Descriptor* type, const std::string& path,
                          int depth, std::map<std::string, int>* seen) {
  if (depth > kMaxDepth) return absl::OkStatus();
  const auto element = [&](const FieldDescriptor* f, const std::string& name) {
    return f->is_repeated() ? absl::StrCat(name, "[", (*seen)[name]++, "]") : name;
  };
  Reader reader(bytes);
  Field field;
  while (reader.Next(&field)) {
    const FieldDescriptor* f = type->FindFieldByNumber(static_cast<int>(field.number));
    if (f == nullptr) continue;  // unknown: ignored, as by the parser
    const std::string name = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (field.wire_type != kLen) continue;
      absl::Status s =
          CheckMessage(field.bytes, f->message_type(), element(f, name), depth + 1, seen);
      if (!s.ok()) return s;
    } else if (!IsNarrowVarint(f)) {
      continue;
    } else if (field.wire_type == kVarint) {
      absl::Status s = CheckValue(f, field.value, element(f, name));
      if (!s.ok()) return s;
    } else if (field.wire_type == kLen && f->is_repeated()) {  // packed
      size_t pos = 0;
      uint64_t v = 0;
      while (pos < field.bytes.size()) {
        if (!ReadVarint(field.bytes, &pos, &v)) return Malformed(name);
        absl::Status s = CheckValue(f, v, element(f, name));
        if (!s.ok()) return s;
      }
    }
  }
  // What the parser took but this reader does not (a varint past 64 bits): not a value to trust.
  if (!reader.ok()) return Malformed(path.empty() ? type->name() : path);
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRanges(std::string_view frame, const Descriptor* type) {
  if (Fits(frame, type, 0)) return absl::OkStatus();
  std::map<std::string, int> seen;
  return CheckMessage(frame, type, "", 0, &seen);
}

}  // namespace carpool::wire
