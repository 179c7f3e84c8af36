// The one place where errno becomes an absl::Status.
#pragma once

#include "absl/strings/string_view.h"
#include <string_view>

#include "absl/status/status.h"

namespace ckptd::base {

// Maps `error_number` to a status code chosen for what the caller should do
// next (ENOSPC -> kResourceExhausted, ENOENT -> kNotFound, EIO -> kDataLoss,
// EAGAIN/EINTR -> kUnavailable, ...). The message is "<context>: <strerror>",
// where context names the operation and the path.
absl::Status PosixError(absl::string_view context, int error_number);

}  // namespace ckptd::base
