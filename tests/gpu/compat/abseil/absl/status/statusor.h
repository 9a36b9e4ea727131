// Stand-in for abseil's absl::StatusOr (GPU-only build without abseil; see status.h).
#ifndef CARPOOL_TESTS_GPU_COMPAT_ABSL_STATUS_STATUSOR_H_
#define CARPOOL_TESTS_GPU_COMPAT_ABSL_STATUS_STATUSOR_H_

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"

namespace absl {

template <typename T>
class StatusOr {
 public:
  StatusOr() : status_(StatusCode::kUnknown, "") {}
  StatusOr(const Status& status) : status_(status) { CheckNotOk(); }        // NOLINT: implicit
  StatusOr(Status&& status) : status_(std::move(status)) { CheckNotOk(); }  // NOLINT
  template <typename U = T, typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                                        !std::is_same_v<std::decay_t<U>, StatusOr>>>
  StatusOr(U&& value) : value_(std::forward<U>(value)) {}  // NOLINT: implicit

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  const T& value() const& { return CheckOk(), *value_; }
  T& value() & { return CheckOk(), *value_; }
  T&& value() && { return CheckOk(), std::move(*value_); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void CheckNotOk() {
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr built from an OK Status");
  }
  void CheckOk() const {
    if (!status_.ok()) {
      std::fprintf(stderr, "StatusOr::value() on error: %s\n", status_.ToString().c_str());
      std::abort();
    }
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace absl

#endif  // CARPOOL_TESTS_GPU_COMPAT_ABSL_STATUS_STATUSOR_H_
