#include "base/thread.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace ckptd::base {

absl::Status ThreadNotStarted(absl::string_view what, const std::system_error& error) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot start a thread for ", what, ": ", error.code().message(),
      " (the user's processes and threads are at their limit: RLIMIT_NPROC, ulimit -u, or the cgroup's pids.max)"));
}

absl::Status CheckThreadHeadroom(absl::string_view what, int n) {
  absl::Notification release;
  std::vector<std::thread> started;
  absl::Status s;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<std::thread> t = StartThread(what, [&release] { release.WaitForNotification(); });
    if (!t.ok()) {
      s = absl::ResourceExhaustedError(
          absl::StrCat(t.status().message(), " (", i, " of the ", n, " threads it needs to start could run)"));
      break;
    }
    started.push_back(*std::move(t));
  }
  release.Notify();
  for (std::thread& t : started) t.join();
  return s;
}

}  // namespace ckptd::base
