#include "worker/weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "nlohmann/json.hpp"

namespace carpool::worker {
namespace {

using Json = nlohmann::json;

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Bytes per element of every dtype the safetensors format defines; 0 when unknown.
size_t AnyDTypeSize(const std::string& name) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(name);
  return it == kSizes.end() ? 0 : it->second;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status Malformed(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": malformed safetensors header: ", what));
}

// Reads a JSON array of non-negative integers.
bool ReadUnsignedList(const Json& value, std::vector<uint64_t>* out) {
  if (!value.is_array()) return false;
  for (const Json& item : value) {
    if (!item.is_number_unsigned() && !(item.is_number_integer() && item.get<int64_t>() >= 0)) {
      return false;
    }
    out->push_back(item.get<uint64_t>());
  }
  return true;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name,
                                            const Json& value, const uint8_t* data_begin,
                                            uint64_t data_size) {
  const std::string where = absl::StrCat("tensor ", name);
  if (!value.is_object()) return Malformed(path, absl::StrCat(where, " is not an object"));
  auto dtype = value.find("dtype");
  auto shape = value.find("shape");
  auto offsets = value.find("data_offsets");
  if (dtype == value.end() || !dtype->is_string()) {
    return Malformed(path, absl::StrCat(where, " has no string 'dtype'"));
  }
  std::vector<uint64_t> dims, range;
  if (shape == value.end() || !ReadUnsignedList(*shape, &dims)) {
    return Malformed(path, absl::StrCat(where, " has no 'shape' list of non-negative integers"));
  }
  if (offsets == value.end() || !ReadUnsignedList(*offsets, &range) || range.size() != 2 ||
      range[0] > range[1]) {
    return Malformed(path, absl::StrCat(where, " has no valid 'data_offsets' [begin, end]"));
  }
  SafetensorsEntry entry;
  entry.name = name;
  entry.dtype_name = dtype->get<std::string>();
  uint64_t numel = 1;
  for (uint64_t dim : dims) {
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim)) {
      return Malformed(path, absl::StrCat(where, " has an impossibly large shape"));
    }
    numel *= dim;
    entry.shape.push_back(static_cast<int64_t>(dim));
  }
  if (range[1] > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: tensor ", name, " has data_offsets [", range[0], ", ",
                     range[1], "] but the data section holds only ", data_size, " bytes"));
  }
  const size_t element_size = AnyDTypeSize(entry.dtype_name);
  if (element_size != 0 && range[1] - range[0] != numel * element_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor ", name, " has data_offsets [", range[0], ", ", range[1],
                     "] (", range[1] - range[0], " bytes) but shape ", ShapeString(entry.shape),
                     " of ", entry.dtype_name, " needs ", numel * element_size, " bytes"));
  }
  for (DType candidate : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (entry.dtype_name == DTypeName(candidate)) {
      entry.supported = true;
      entry.dtype = candidate;
    }
  }
  entry.data = data_begin + range[0];
  entry.nbytes = range[1] - range[0];
  return entry;
}

}  // namespace

absl::StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat(path, ": ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    return absl::InvalidArgumentError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": mmap failed: ", std::strerror(error)));
    }
    data = static_cast<const uint8_t*>(mapped);
  }
  ::close(fd);  // the mapping keeps the file open
  return std::shared_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000 | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

float BFloat16ToFloat(uint16_t bits) { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude > 0x7f800000) {  // NaN: keep it quiet and keep the top payload bits
    return sign | 0x7e00 | static_cast<uint16_t>((magnitude >> 13) & 0x3ff);
  }
  if (magnitude >= 0x477ff000) return sign | 0x7c00;  // >= 65520 rounds to infinity
  if (magnitude < 0x38800000) {                       // below 2^-14: subnormal half
    // In units of 2^-24 (exact scaling), rounded to nearest even; 1024 is the smallest normal.
    const float units = BitsToFloat(magnitude) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(units));
  }
  const uint32_t rounded = magnitude + 0xfff + ((magnitude >> 13) & 1);
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

void ConvertToFloat(DType dtype, const uint8_t* src, int64_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, sizeof(bits));
        dst[i] = dtype == DType::kF16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
      }
      return;
  }
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::Open(path));
  return Parse(std::move(file));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::shared_ptr<MappedFile> file) {
  const std::string& path = file->path();
  const size_t size = file->size();
  if (size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: ", size, " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | file->data()[i];
  if (header_length > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated header: it declares ",
                                                   header_length, " bytes but the file has ",
                                                   size - 8, " after the length"));
  }
  const std::string_view header_text(reinterpret_cast<const char*>(file->data() + 8),
                                     header_length);
  Json header;
  try {
    header = Json::parse(header_text);
  } catch (const Json::exception& e) {
    return Malformed(path, e.what());
  }
  if (!header.is_object()) return Malformed(path, "not a JSON object");

  SafetensorsFile result;
  const uint8_t* data_begin = file->data() + 8 + header_length;
  const uint64_t data_size = size - 8 - header_length;
  try {
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        if (!value.is_object()) return Malformed(path, "__metadata__ is not an object");
        for (const auto& [key, item] : value.items()) {
          result.metadata_[key] = item.is_string() ? item.get<std::string>() : item.dump();
        }
        continue;
      }
      ASSIGN_OR_RETURN(SafetensorsEntry entry,
                       ParseEntry(path, name, value, data_begin, data_size));
      result.tensors_.emplace(name, std::move(entry));
    }
  } catch (const Json::exception& e) {
    return Malformed(path, e.what());
  }
  result.file_ = std::move(file);
  return result;
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::Status SafetensorsFile::CheckSupported(const SafetensorsEntry& entry) const {
  if (entry.supported) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(path(), ": dtype ", entry.dtype_name,
                                               " of tensor ", entry.name,
                                               " is not supported (F32, F16, BF16)"));
}

absl::StatusOr<Tensor> SafetensorsFile::Read(const SafetensorsEntry& entry, ThreadPool* pool,
                                             const LoadOptions& options) const {
  RETURN_IF_ERROR(CheckSupported(entry));
  const int64_t count = static_cast<int64_t>(entry.nbytes / DTypeSize(entry.dtype));
  return Contiguous(entry, entry.data, count, entry.shape, pool, options);
}

absl::StatusOr<Tensor> SafetensorsFile::ReadSlice(const SafetensorsEntry& entry, int dim,
                                                  int64_t begin, int64_t end, ThreadPool* pool,
                                                  const LoadOptions& options) const {
  RETURN_IF_ERROR(CheckSupported(entry));
  const int rank = static_cast<int>(entry.shape.size());
  if (rank < 1 || rank > 2 || dim < 0 || dim >= rank || begin < 0 || begin > end ||
      end > entry.shape[dim]) {
    return absl::InvalidArgumentError(absl::StrCat(
        path(), ": cannot take [", begin, ", ", end, ") of dimension ", dim, " of tensor ",
        entry.name, " with shape ", ShapeString(entry.shape)));
  }
  const int64_t rows = entry.shape[0];
  const int64_t cols = rank == 2 ? entry.shape[1] : 1;
  std::vector<int64_t> shape = entry.shape;
  shape[dim] = end - begin;
  const size_t element = DTypeSize(entry.dtype);
  if (dim == 0) {
    const uint8_t* first = entry.data + static_cast<size_t>(begin * cols) * element;
    return Contiguous(entry, first, (end - begin) * cols, std::move(shape), pool, options);
  }
  // Columns: one run per row.
  const int64_t width = end - begin;
  const auto row_run = [&](int64_t r) {
    return entry.data + static_cast<size_t>(r * cols + begin) * element;
  };
  if (KeepsBf16(entry, options)) {
    auto values = std::make_unique_for_overwrite<uint16_t[]>(rows * width);
    uint16_t* out = values.get();
    ParallelFor(pool, rows, [&](int64_t first_row, int64_t last_row) {
      for (int64_t r = first_row; r < last_row; ++r) {
        std::memcpy(out + r * width, row_run(r), static_cast<size_t>(width) * element);
      }
    });
    return Tensor::OwnedBf16(std::move(values), std::move(shape));
  }
  auto values = std::make_unique_for_overwrite<float[]>(rows * width);
  float* out = values.get();
  ParallelFor(pool, rows, [&](int64_t first_row, int64_t last_row) {
    for (int64_t r = first_row; r < last_row; ++r) {
      ConvertToFloat(entry.dtype, row_run(r), width, out + r * width);
    }
  });
  return Tensor::Owned(std::move(values), std::move(shape));
}

bool SafetensorsFile::KeepsBf16(const SafetensorsEntry& entry, const LoadOptions& options) {
  return options.keep_bf16 && entry.dtype == DType::kBF16;
}

Tensor SafetensorsFile::Contiguous(const SafetensorsEntry& entry, const uint8_t* first,
                                   int64_t count, std::vector<int64_t> shape, ThreadPool* pool,
                                   const LoadOptions& options) const {
  const uintptr_t address = reinterpret_cast<uintptr_t>(first);
  if (KeepsBf16(entry, options)) {
    if (address % alignof(uint16_t) == 0) {
      return Tensor::ViewBf16(reinterpret_cast<const uint16_t*>(first), std::move(shape), file_);
    }
    auto values = std::make_unique_for_overwrite<uint16_t[]>(count);
    std::memcpy(values.get(), first, static_cast<size_t>(count) * sizeof(uint16_t));
    return Tensor::OwnedBf16(std::move(values), std::move(shape));
  }
  if (entry.dtype == DType::kF32 && address % alignof(float) == 0) {
    return Tensor::View(reinterpret_cast<const float*>(first), std::move(shape), file_);
  }
  const size_t element = DTypeSize(entry.dtype);
  auto values = std::make_unique_for_overwrite<float[]>(count);
  float* out = values.get();
  constexpr int64_t kChunk = 1 << 16;
  ParallelFor(pool, (count + kChunk - 1) / kChunk, [&](int64_t chunk_begin, int64_t chunk_end) {
    const int64_t from = chunk_begin * kChunk;
    const int64_t to = std::min(count, chunk_end * kChunk);
    ConvertToFloat(entry.dtype, first + from * element, to - from, out + from);
  });
  return Tensor::Owned(std::move(values), std::move(shape));
}

}  // namespace carpool::worker
