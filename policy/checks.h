// Argument checks shared by the policy's entry points that take operator
// input: each names the field and the value it refused. Internal to policy/.
#pragma once

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckptd::policy::internal {

inline bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }
inline bool NonNegativeFinite(double v) { return std::isfinite(v) && v >= 0; }

inline absl::Status CheckPositive(const char* name, double v) {
  if (PositiveFinite(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be positive and finite, got ", v));
}

inline absl::Status CheckNonNegative(const char* name, double v) {
  if (NonNegativeFinite(v)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be non-negative and finite, got ", v));
}

}  // namespace ckptd::policy::internal
