#include "base/thread_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/posix_error.h"

namespace ckptd::base {
namespace {

constexpr int kLowestNice = 19;

// <linux/ioprio.h> is missing from older kernel headers: its ABI values.
constexpr int kIoprioWhoProcess = 1;
constexpr int kIoprioClassShift = 13;
constexpr int kIoprioClassBestEffort = 2;
constexpr int kIoprioLowestLevel = 7;

// 0 or errno.
int SetIoPriorityLowestBestEffort(int tid) {
  const int ioprio = (kIoprioClassBestEffort << kIoprioClassShift) | kIoprioLowestLevel;
  return ::syscall(SYS_ioprio_set, kIoprioWhoProcess, tid, ioprio) == 0 ? 0 : errno;
}

// 0 or errno.
int SetNice(int tid, int nice) { return ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) == 0 ? 0 : errno; }

}  // namespace

int CurrentThreadId() { return static_cast<int>(::syscall(SYS_gettid)); }

absl::string_view ThreadPriorityName(ThreadPriority priority) {
  switch (priority) {
    case ThreadPriority::kNormal:
      return "normal";
    case ThreadPriority::kLow:
      return "low";
    case ThreadPriority::kIdle:
      return "idle";
  }
  return "unknown";
}

absl::StatusOr<ThreadPriority> ParseThreadPriority(absl::string_view name) {
  for (ThreadPriority p : {ThreadPriority::kIdle, ThreadPriority::kLow, ThreadPriority::kNormal}) {
    if (name == ThreadPriorityName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("must be idle, low or normal, got \"", name, "\""));
}

std::string AppliedPriority::ToString() const {
  if (why_not.ok()) return applied;
  return absl::StrCat(applied, " (", why_not.message(), ")");
}

absl::Status SetCallingThreadLowestIoPriority() {
  if (const int err = SetIoPriorityLowestBestEffort(CurrentThreadId()); err != 0) {
    return PosixError("ioprio_set best-effort 7", err);
  }
  return absl::OkStatus();
}

absl::StatusOr<ThreadCpuTimes> ReadThreadCpuTimes(int tid) {
  const std::string path = absl::StrCat("/proc/self/task/", tid, "/schedstat");
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such thread"));
    return absl::UnavailableError(PosixError(path, err).message());
  }
  char line[128] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  // "<ns on a CPU> <ns waiting on a run queue> <time slices>"
  std::vector<absl::string_view> fields = absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty());
  uint64_t on_cpu = 0;
  uint64_t waiting = 0;
  if (!read || fields.size() < 2 || !absl::SimpleAtoi(fields[0], &on_cpu) || !absl::SimpleAtoi(fields[1], &waiting)) {
    return absl::UnavailableError(absl::StrCat(path, ": not the scheduler's counts: \"", line, "\""));
  }
  return ThreadCpuTimes{absl::Nanoseconds(on_cpu), absl::Nanoseconds(waiting)};
}

void SetCallingThreadName(absl::string_view name) {
  // The kernel keeps 16 bytes with the terminating zero.
  const std::string shown(name.substr(0, 15));
  (void)::pthread_setname_np(::pthread_self(), shown.c_str());
}

AppliedPriority SetCallingThreadPriority(ThreadPriority priority) {
  return SetThreadPriority(CurrentThreadId(), priority);
}

AppliedPriority SetThreadPriority(int tid, ThreadPriority priority) {
  AppliedPriority out;
  out.requested = priority;
  if (priority == ThreadPriority::kNormal) return out;
  if (priority == ThreadPriority::kIdle) {
    sched_param param{};
    param.sched_priority = 0;
    // A thread id: that thread only.
    if (::sched_setscheduler(tid, SCHED_IDLE, &param) == 0) {
      out.applied = "SCHED_IDLE";
      if (const int err = SetIoPriorityLowestBestEffort(tid); err != 0) {
        // The CPU priority is what counts; the disk may give these writes
        // the idle class. Said, not fatal.
        out.why_not = PosixError("ioprio_set best-effort 7", err);
      }
      return out;
    }
    out.why_not = PosixError("SCHED_IDLE refused", errno);
  }
  if (const int err = SetNice(tid, kLowestNice); err != 0) {
    absl::Status nice = PosixError("setpriority nice 19", err);
    out.why_not =
        out.why_not.ok() ? nice : absl::Status(nice.code(), absl::StrCat(out.why_not.message(), "; ", nice.message()));
    return out;
  }
  out.applied = "nice 19";
  return out;
}

absl::Status RaiseThreadPriority(int tid, int nice) {
  sched_param param{};
  param.sched_priority = 0;
  if (::sched_setscheduler(tid, SCHED_OTHER, &param) != 0) {
    return PosixError("SCHED_OTHER refused (root, CAP_SYS_NICE or RLIMIT_NICE allows it)", errno);
  }
  if (const int err = SetNice(tid, nice); err != 0) {
    return PosixError(absl::StrCat("setpriority nice ", nice, " refused (root, CAP_SYS_NICE or RLIMIT_NICE allows it)"),
                      err);
  }
  // Back in the best-effort I/O class at the default level.
  constexpr int kIoprioDefaultLevel = 4;
  (void)::syscall(SYS_ioprio_set, kIoprioWhoProcess, tid,
                  (kIoprioClassBestEffort << kIoprioClassShift) | kIoprioDefaultLevel);
  return absl::OkStatus();
}

int CallingThreadNice() {
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(CurrentThreadId()));
  return errno == 0 ? nice : 0;
}

}  // namespace ckptd::base
