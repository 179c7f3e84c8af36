// Small helpers for absl::Status propagation. The Abseil in Debian 12 predates
// its own RETURN_IF_ERROR macros.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CKPTD_STATUS_CONCAT_INNER_(a, b) a##b
#define CKPTD_STATUS_CONCAT_(a, b) CKPTD_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not ok.
#define CKPTD_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::absl::Status ckptd_status_ = (expr);           \
    if (!ckptd_status_.ok()) return ckptd_status_;   \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its status.
#define CKPTD_ASSIGN_OR_RETURN(lhs, expr) \
  CKPTD_ASSIGN_OR_RETURN_IMPL_(CKPTD_STATUS_CONCAT_(ckptd_statusor_, __LINE__), lhs, expr)

#define CKPTD_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                 \
  if (!var.ok()) return std::move(var).status();     \
  lhs = std::move(var).value()
