// Starting a thread without an exception: std::thread throws
// std::system_error when the kernel refuses one (EAGAIN under RLIMIT_NPROC
// or a cgroup's pids.max), and a daemon must answer that, not abort.
#pragma once

#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd::base {

// kResourceExhausted: "cannot start a thread for <what>: <errno text> (...)",
// saying which limits refuse threads.
absl::Status ThreadNotStarted(absl::string_view what, const std::system_error& error);

// A thread running `f`, or kResourceExhausted (ThreadNotStarted) naming
// `what` (e.g. "the persister of job j rank 3") when none can be made.
template <typename F>
absl::StatusOr<std::thread> StartThread(absl::string_view what, F&& f) {
  try {
    return std::thread(std::forward<F>(f));
  } catch (const std::system_error& e) {  // the one way std::thread reports it
    return ThreadNotStarted(what, e);
  }
}

// Whether `n` more threads can run at once now: starts them, each waiting
// until all have started, then ends them. kResourceExhausted
// (ThreadNotStarted, naming `what` and how many could start) when the kernel
// refuses one. For a daemon's start, before libraries that abort when their
// first threads are refused (gRPC's server) make theirs: another process of
// the same user may still take the room meanwhile.
absl::Status CheckThreadHeadroom(absl::string_view what, int n);

}  // namespace ckptd::base
