// The CPU priority of background threads: work that must not slow the
// foreground (a trainer on the same cores) runs when a core would otherwise
// be idle. Linux keeps the scheduling policy and the nice value per thread,
// so each call changes one thread only. docs/operations.md, "The agent's CPU
// use", says what each level means for an operator.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckptd::base {

enum class ThreadPriority {
  kNormal,  // left as it is
  kLow,     // nice 19: about 1.5% of a core a nice-0 thread keeps busy
  kIdle,    // SCHED_IDLE (about 0.3% of such a core), else nice 19
};

// "normal", "low", "idle".
absl::string_view ThreadPriorityName(ThreadPriority priority);
// The names above; anything else is kInvalidArgument listing them.
absl::StatusOr<ThreadPriority> ParseThreadPriority(absl::string_view name);

// What a thread got.
struct AppliedPriority {
  ThreadPriority requested = ThreadPriority::kNormal;
  // What the thread runs at now: "SCHED_IDLE", "nice 19" or "unchanged".
  std::string applied = "unchanged";
  // Why `applied` falls short of `requested` (the errno of the refused
  // call, as base::PosixError maps it); OK when it does not.
  absl::Status why_not;

  // "SCHED_IDLE", or e.g. "nice 19 (SCHED_IDLE refused: ...)".
  std::string ToString() const;
};

// Lowers thread `tid` of this process to `priority` (kNormal changes
// nothing; nothing is ever raised). kIdle also keeps the thread's I/O in the
// best-effort class at its lowest level, as nice 19 would: SCHED_IDLE alone
// would put it in the idle I/O class, where a busy disk can hold a
// checkpoint's writes back without bound. Never fails: what could not be
// done is in `why_not`.
AppliedPriority SetThreadPriority(int tid, ThreadPriority priority);

// Raises thread `tid` of this process back to SCHED_OTHER at nice `nice`
// (what the process runs at), for work that must not wait after all. Linux
// allows it to root, to CAP_SYS_NICE, or where RLIMIT_NICE reaches `nice`
// (sched(7)); otherwise kPermissionDenied naming what was refused.
absl::Status RaiseThreadPriority(int tid, int nice);
// The nice value of the calling thread.
int CallingThreadNice();
// The same for the calling thread.
AppliedPriority SetCallingThreadPriority(ThreadPriority priority);
// The calling thread's id (gettid), as SetThreadPriority takes it.
int CurrentThreadId();

// Gives the calling thread the lowest best-effort I/O priority and leaves
// its CPU priority as it is (no privilege needed): a thread that mostly waits
// for the disk and must not be starved of the CPU.
absl::Status SetCallingThreadLowestIoPriority();

// Names the calling thread (its first 15 bytes) as `ps -L`, `top -H`, perf
// and /proc/self/task/TID/comm show it. A new thread inherits its creator's
// name: each of ckptd's threads says what it is. Best effort.
void SetCallingThreadName(absl::string_view name);

// What the scheduler has counted for one thread of this process
// (/proc/self/task/TID/schedstat): time on a CPU, and time runnable but
// waiting for one.
struct ThreadCpuTimes {
  absl::Duration on_cpu;
  absl::Duration waiting;
};
// kUnavailable where the kernel keeps no such counts; kNotFound for a thread
// that is gone.
absl::StatusOr<ThreadCpuTimes> ReadThreadCpuTimes(int tid);

}  // namespace ckptd::base
