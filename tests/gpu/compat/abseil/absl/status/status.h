// Stand-in for abseil's absl::Status, used only by the GPU-only build (tests/gpu/CMakeLists.txt)
// on machines without abseil. It covers what kernels/cuda, common/status.h and the sampler use;
// the real abseil is always preferred when CMake finds it.
#ifndef CARPOOL_TESTS_GPU_COMPAT_ABSL_STATUS_STATUS_H_
#define CARPOOL_TESTS_GPU_COMPAT_ABSL_STATUS_STATUS_H_

#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace absl {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

inline const char* StatusCodeName(StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i <= 16 ? kNames[i] : "UNKNOWN";
}

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string_view message)
      : code_(code), message_(code == StatusCode::kOk ? "" : std::string(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  std::string_view message() const { return message_; }
  std::string ToString() const {
    if (ok()) return "OK";
    return std::string(StatusCodeName(code_)) + ": " + message_;
  }
  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }
  friend bool operator!=(const Status& a, const Status& b) { return !(a == b); }
  friend std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status CancelledError(std::string_view m) { return Status(StatusCode::kCancelled, m); }
inline Status UnknownError(std::string_view m) { return Status(StatusCode::kUnknown, m); }
inline Status InvalidArgumentError(std::string_view m) {
  return Status(StatusCode::kInvalidArgument, m);
}
inline Status NotFoundError(std::string_view m) { return Status(StatusCode::kNotFound, m); }
inline Status ResourceExhaustedError(std::string_view m) {
  return Status(StatusCode::kResourceExhausted, m);
}
inline Status FailedPreconditionError(std::string_view m) {
  return Status(StatusCode::kFailedPrecondition, m);
}
inline Status OutOfRangeError(std::string_view m) { return Status(StatusCode::kOutOfRange, m); }
inline Status UnimplementedError(std::string_view m) {
  return Status(StatusCode::kUnimplemented, m);
}
inline Status InternalError(std::string_view m) { return Status(StatusCode::kInternal, m); }
inline Status UnavailableError(std::string_view m) { return Status(StatusCode::kUnavailable, m); }

}  // namespace absl

#endif  // CARPOOL_TESTS_GPU_COMPAT_ABSL_STATUS_STATUS_H_
