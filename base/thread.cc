#include "base/thread.h"

#include "absl/strings/str_cat.h"

namespace ckptd::base {

absl::Status ThreadNotStarted(absl::string_view what, const std::system_error& error) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot start a thread for ", what, ": ", error.code().message(),
      " (the user's processes and threads are at their limit: RLIMIT_NPROC, ulimit -u, or the cgroup's pids.max)"));
}

}  // namespace ckptd::base
