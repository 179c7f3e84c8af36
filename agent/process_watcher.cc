#include "agent/process_watcher.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "base/posix_error.h"
#include "base/thread.h"
#include "base/thread_priority.h"

namespace ckptd::agent {

ProcessWatcher::ProcessWatcher() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    not_started_ = base::PosixError("process watcher: epoll_create1/eventfd", errno);
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
    not_started_ = base::PosixError("process watcher: epoll_ctl", errno);
    return;
  }
  absl::StatusOr<std::thread> thread = base::StartThread("the process watcher", [this] { Loop(); });
  if (thread.ok()) {
    thread_ = *std::move(thread);
  } else {
    not_started_ = thread.status();
  }
}

ProcessWatcher::~ProcessWatcher() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    // If the write fails the loop still ends at its next event; nothing else to do.
    (void)!::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  absl::MutexLock l(&mu_);
  for (auto& [fd, cb] : callbacks_) ::close(fd);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

absl::Status ProcessWatcher::Watch(pid_t pid, std::function<void()> on_exit) {
  if (!not_started_.ok()) return not_started_;
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    if (errno == ESRCH) {  // already gone
      on_exit();
      return absl::OkStatus();
    }
    return base::PosixError(absl::StrCat("pidfd_open ", pid), errno);
  }
  absl::MutexLock l(&mu_);
  callbacks_[fd] = std::move(on_exit);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    const int err = errno;
    callbacks_.erase(fd);
    ::close(fd);
    return base::PosixError(absl::StrCat("epoll_ctl for pid ", pid), err);
  }
  return absl::OkStatus();
}

void ProcessWatcher::Loop() {
  base::SetCallingThreadName("ckptd-procwatch");
  while (true) {
    epoll_event events[16];
    const int n = ::epoll_wait(epoll_fd_, events, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // the epoll fd is broken: nothing more can be watched
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) return;
      std::function<void()> cb;
      {
        absl::MutexLock l(&mu_);
        auto it = callbacks_.find(fd);
        if (it == callbacks_.end()) continue;
        cb = std::move(it->second);
        callbacks_.erase(it);
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
      }
      cb();
    }
  }
}

}  // namespace ckptd::agent
