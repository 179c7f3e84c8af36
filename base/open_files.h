// The number of files a process may hold open: every connection a server
// keeps is one.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd::base {

// Below this many open files a server warns: that many connections, idle
// ones included, would lock everyone else out.
inline constexpr uint64_t kFewOpenFiles = 65536;

// Raises this process's soft limit on open files (RLIMIT_NOFILE) to its hard
// limit (or to fs.nr_open, the kernel's bound, when the hard limit is above
// it); the usual soft limit, 1024, is a thousand idle connections. Returns
// the soft limit now in force.
absl::StatusOr<uint64_t> RaiseOpenFileLimit();

// For a server at start: RaiseOpenFileLimit, and a warning to log (as a
// warning: the text does not say so) when it failed or the limit stays
// below kFewOpenFiles ("" when all is well).
// `locked_out` says who idle connections would lock out ("agents").
std::string RaiseOpenFileLimitForServer(absl::string_view locked_out);

}  // namespace ckptd::base
