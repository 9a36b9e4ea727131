// Status helpers shared by every carpool module.
//
// Errors cross module boundaries as absl::Status / absl::StatusOr<T>; these macros keep the
// happy path readable. No exception crosses a module boundary.
#ifndef CARPOOL_COMMON_STATUS_H_
#define CARPOOL_COMMON_STATUS_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CARPOOL_CONCAT_INNER_(a, b) a##b
#define CARPOOL_CONCAT_(a, b) CARPOOL_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` yields a non-OK absl::Status.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status carpool_status_ = (expr);   \
    if (!carpool_status_.ok()) return carpool_status_; \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on error returns its
// status, otherwise assigns the value to `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  CARPOOL_ASSIGN_OR_RETURN_IMPL_(CARPOOL_CONCAT_(carpool_statusor_, __LINE__), lhs, expr)
#define CARPOOL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();       \
  lhs = std::move(tmp).value()

// CHECK is for programmer errors only, never for input that arrives from outside the process.
#define CARPOOL_CHECK(cond)                                                           \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

#endif  // CARPOOL_COMMON_STATUS_H_
