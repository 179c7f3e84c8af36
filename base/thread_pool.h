// A fixed-size pool of worker threads running queued tasks in FIFO order.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_priority.h"

namespace ckptd::base {

class ThreadPool {
 public:
  // `threads` <= 0 means one per hardware thread. The workers run at
  // `priority` (base::SetThreadPriority) from before their first task: the
  // constructor sets it once they have started (at the caller's priority,
  // so that a busy machine does not hold the constructor up).
  explicit ThreadPool(int threads, ThreadPriority priority = ThreadPriority::kNormal);
  // Runs every task already queued, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> task);
  int size() const { return static_cast<int>(workers_.size()); }
  // What the workers run at (the first shortfall any of them met, if one did).
  const AppliedPriority& priority() const { return priority_; }

 private:
  void WorkerLoop();

  absl::Mutex mu_;
  std::vector<int> worker_tids_ ABSL_GUARDED_BY(mu_);
  // Set by the constructor.
  AppliedPriority priority_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// Counts outstanding work items; Wait() blocks until the count is zero.
class WaitGroup {
 public:
  void Add(int n = 1) {
    absl::MutexLock l(&mu_);
    count_ += n;
  }
  void Done() {
    absl::MutexLock l(&mu_);
    --count_;
  }
  void Wait() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](int* c) { return *c == 0; }, &count_));
  }

 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd::base
