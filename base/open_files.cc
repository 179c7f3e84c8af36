#include "base/open_files.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/posix_error.h"

namespace ckptd::base {

absl::StatusOr<uint64_t> RaiseOpenFileLimit() {
  struct rlimit lim;
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return PosixError("getrlimit(RLIMIT_NOFILE)", errno);
  if (lim.rlim_cur >= lim.rlim_max) return static_cast<uint64_t>(lim.rlim_cur);
  struct rlimit raised = {lim.rlim_max, lim.rlim_max};
  if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return static_cast<uint64_t>(raised.rlim_cur);
  if (errno != EPERM) return PosixError("setrlimit(RLIMIT_NOFILE)", errno);
  // A hard limit above what the kernel allows a process (fs.nr_open) cannot
  // be reached: both go to that (lowering the hard limit needs no privilege).
  uint64_t nr_open = 0;
  std::ifstream in("/proc/sys/fs/nr_open");
  if (!(in >> nr_open) || nr_open <= lim.rlim_cur) {
    return absl::FailedPreconditionError(absl::StrCat("cannot raise the open-file limit from ", lim.rlim_cur,
                                                      " to its hard limit ", lim.rlim_max));
  }
  raised.rlim_cur = raised.rlim_max = std::min<rlim_t>(lim.rlim_max, nr_open);
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) return PosixError("setrlimit(RLIMIT_NOFILE)", errno);
  return static_cast<uint64_t>(raised.rlim_cur);
}

std::string RaiseOpenFileLimitForServer(absl::string_view locked_out) {
  const absl::StatusOr<uint64_t> limit = RaiseOpenFileLimit();
  if (!limit.ok()) return std::string(limit.status().message());
  if (*limit >= kFewOpenFiles) return "";
  return absl::StrCat("at most ", *limit, " open files: as many connections, idle ones included, would ",
                      "lock ", locked_out, " out; raise the hard limit (systemd: LimitNOFILE=; ulimit -Hn)");
}

}  // namespace ckptd::base
