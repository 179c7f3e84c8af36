#include "base/thread_pool.h"

#include <algorithm>
#include <utility>

namespace ckptd::base {

ThreadPool::ThreadPool(int threads, ThreadPriority priority) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  std::vector<int> tids;
  {
    absl::MutexLock l(&mu_);
    auto all_started = [this, threads]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(worker_tids_.size()) == threads;
    };
    mu_.Await(absl::Condition(&all_started));
    tids = worker_tids_;
  }
  // No task can have been scheduled yet: every one runs at `priority`.
  priority_ = SetThreadPriority(tids.front(), priority);
  for (size_t i = 1; i < tids.size(); ++i) {
    AppliedPriority applied = SetThreadPriority(tids[i], priority);
    if (priority_.why_not.ok() && !applied.why_not.ok()) priority_ = std::move(applied);
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock l(&mu_);
  tasks_.push_back(std::move(task));
}

void ThreadPool::WorkerLoop() {
  {
    absl::MutexLock l(&mu_);
    worker_tids_.push_back(CurrentThreadId());
  }
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace ckptd::base
