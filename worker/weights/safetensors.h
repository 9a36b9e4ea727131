// Reading safetensors files (https://github.com/huggingface/safetensors) through a memory map.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data;
// offsets are relative to the first byte after the header. Everything in the header is checked
// against the file before any tensor is touched.
#ifndef CARPOOL_WORKER_WEIGHTS_SAFETENSORS_H_
#define CARPOOL_WORKER_WEIGHTS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "worker/weights/weights.h"

namespace carpool::worker {

// A whole file mapped read-only. Unmapped when the last shared_ptr goes.
// Thread-safe: immutable after Open.
class MappedFile {
 public:
  // NOT_FOUND when the file does not exist; INVALID_ARGUMENT when it is not a regular file or
  // cannot be read or mapped.
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // nullptr when size() == 0.
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// The dtypes carpool reads (as fp32, or BF16 kept as bf16: LoadOptions).
enum class DType { kF32, kF16, kBF16 };
const char* DTypeName(DType dtype);  // "F32", "F16", "BF16"
size_t DTypeSize(DType dtype);

// IEEE half and bfloat16 <-> float. Exact for every value including subnormals, infinities
// and NaN (NaN stays NaN). The Float-to-16 directions round to nearest even.
float HalfToFloat(uint16_t bits);
float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
uint16_t FloatToBFloat16(float value);

// Converts `count` elements of `dtype` at `src` (any alignment, little-endian) to fp32.
void ConvertToFloat(DType dtype, const uint8_t* src, int64_t count, float* dst);

// One tensor entry of a safetensors header, already checked against the file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as written in the header, e.g. "BF16" or "I8"
  bool supported = false;  // dtype_name is F32, F16 or BF16; then `dtype` is meaningful
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t nbytes = 0;
};

// A parsed safetensors file. Tensors of dtypes other than F32/F16/BF16 are listed (their bytes
// are bounds-checked) but only fail when read, so a checkpoint may carry extra tensors carpool
// does not use.
class SafetensorsFile {
 public:
  // Maps and parses `path`. INVALID_ARGUMENT for a truncated or malformed file, naming the
  // file and, where there is one, the tensor.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  static absl::StatusOr<SafetensorsFile> Parse(std::shared_ptr<MappedFile> file);

  const std::string& path() const { return file_->path(); }
  const std::shared_ptr<MappedFile>& file() const { return file_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const SafetensorsEntry* Find(const std::string& name) const;

  // The tensor as fp32: a View into the mapping for 4-byte-aligned F32 data, otherwise an owned
  // converted copy, converted on `pool`'s threads (null: on the calling thread). With
  // options.keep_bf16 a BF16 tensor is returned as bf16 instead: a ViewBf16 of 2-byte-aligned
  // data, otherwise an owned copy. Views hold file(), so the mapping lives as long as they do.
  // UNIMPLEMENTED for other dtypes.
  absl::StatusOr<Tensor> Read(const SafetensorsEntry& entry, ThreadPool* pool = nullptr,
                              const LoadOptions& options = {}) const;
  // Indices [begin, end) of dimension `dim` (0: rows, 1: columns of a 2-D tensor), as Read
  // types them: a view for a row slice of aligned F32 (or kept BF16) data, otherwise an owned
  // copy of the slice alone. INVALID_ARGUMENT for a dimension or range outside the tensor;
  // UNIMPLEMENTED for other dtypes. Converts on `pool` as Read does.
  absl::StatusOr<Tensor> ReadSlice(const SafetensorsEntry& entry, int dim, int64_t begin,
                                   int64_t end, ThreadPool* pool = nullptr,
                                   const LoadOptions& options = {}) const;

 private:
  SafetensorsFile() = default;

  // UNIMPLEMENTED unless entry's dtype is one carpool reads.
  absl::Status CheckSupported(const SafetensorsEntry& entry) const;
  static bool KeepsBf16(const SafetensorsEntry& entry, const LoadOptions& options);
  // `count` consecutive elements of `entry` from `first` (inside its data), typed as Read says.
  Tensor Contiguous(const SafetensorsEntry& entry, const uint8_t* first, int64_t count,
                    std::vector<int64_t> shape, ThreadPool* pool,
                    const LoadOptions& options) const;

  std::shared_ptr<MappedFile> file_;
  std::map<std::string, SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace carpool::worker

#endif  // CARPOOL_WORKER_WEIGHTS_SAFETENSORS_H_
