#include "base/open_files.h"

#include <sys/resource.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "base/posix_error.h"

namespace ckptd::base {

absl::StatusOr<uint64_t> RaiseOpenFileLimit() {
  struct rlimit lim;
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return PosixError("getrlimit(RLIMIT_NOFILE)", errno);
  if (lim.rlim_cur < lim.rlim_max) {
    const rlim_t was = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      const int err = errno;
      lim.rlim_cur = was;
      // A hard limit above what the kernel allows (fs.nr_open) is refused:
      // the soft limit stays where it was.
      if (err != EPERM && err != EINVAL) return PosixError("setrlimit(RLIMIT_NOFILE)", err);
    }
  }
  return static_cast<uint64_t>(lim.rlim_cur);
}

std::string RaiseOpenFileLimitForServer(absl::string_view locked_out) {
  const absl::StatusOr<uint64_t> limit = RaiseOpenFileLimit();
  if (!limit.ok()) return absl::StrCat("WARNING: ", limit.status().message());
  if (*limit >= kFewOpenFiles) return "";
  return absl::StrCat("WARNING: at most ", *limit, " open files (the hard limit): as many connections, idle ones ",
                      "included, would lock ", locked_out, " out; raise it (systemd: LimitNOFILE=; ulimit -Hn)");
}

}  // namespace ckptd::base
