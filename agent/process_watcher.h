// Notices at once when a watched process exits (pidfd + epoll on one thread).
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ckptd::agent {

class ProcessWatcher {
 public:
  ProcessWatcher();
  // Stops watching; callbacks not yet run are dropped.
  ~ProcessWatcher();
  ProcessWatcher(const ProcessWatcher&) = delete;
  ProcessWatcher& operator=(const ProcessWatcher&) = delete;

  // Runs `on_exit` on the watcher thread once `pid` has exited (at once if it
  // already has). Why the watcher could not start, if it could not (its
  // thread: kResourceExhausted).
  absl::Status Watch(pid_t pid, std::function<void()> on_exit);

 private:
  void Loop();

  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that stops Loop
  absl::Mutex mu_;
  std::map<int, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);  // by pidfd
  absl::Status not_started_;  // set by the constructor only
  std::thread thread_;
};

}  // namespace ckptd::agent
