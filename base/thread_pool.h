// A fixed-size pool of worker threads running queued tasks in FIFO order.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/thread_priority.h"

namespace ckptd::base {

// Bounded starvation for a pool whose workers run at a low priority: on a
// CPU that the foreground keeps saturated, SCHED_IDLE workers get about 0.3%
// of a core and their work would wait without end. A pool with a guard also
// keeps as many reserve workers at the priority of the thread that made it
// (normal, typically), idle and taking no task, and looks at its workers'
// scheduler counts (base::ReadThreadCpuTimes) every `tick` while the pool
// has work (tasks queued or running).
// When, over a window of at least `after`, the workers got less than `share`
// of the CPU time they were runnable for and waited at least half of that
// window for a CPU, the reserve workers take the tasks instead (the workers
// finish the ones they hold and stand aside), until the pool has had nothing
// to do for `after`. Raising the workers' own priority would need
// CAP_SYS_NICE; the reserve needs no privilege. Where the kernel keeps no
// such counts, the test is that no task finished during the window.
// A window ends when the pool runs out of work.
struct StarvationGuard {
  // Zero: no guard, no reserve.
  absl::Duration after = absl::ZeroDuration();
  double share = 0.1;
  absl::Duration tick = absl::Milliseconds(250);
  // Null: RealClock::Get().
  Clock* clock = nullptr;
  // Null: ReadThreadCpuTimes (tests count time themselves).
  std::function<absl::StatusOr<ThreadCpuTimes>(int tid)> read_times;
  // Called (on a reserve worker, no lock held) each time the reserve is
  // called in, with what was measured, e.g. "the workers got 0.3% of the CPU
  // time they were runnable for over 2s".
  std::function<void(const std::string& why)> on_boost;
};

class ThreadPool {
 public:
  // `threads` <= 0 means one per hardware thread. The workers run at
  // `priority` (base::SetThreadPriority) from before their first task: the
  // constructor sets it once they have started (at the caller's priority,
  // so that a busy machine does not hold the constructor up). A `guard`
  // applies to a pool whose priority is not kNormal.
  // Where the kernel refuses a thread (RLIMIT_NPROC, pids.max) the pool has
  // the workers started before (status() says why no more; with none,
  // Schedule runs each task on the caller's thread): Create refuses such a
  // pool.
  explicit ThreadPool(int threads, ThreadPriority priority = ThreadPriority::kNormal, StarvationGuard guard = {});
  // The pool, or kResourceExhausted (base::StartThread) when not every
  // thread of it could be started.
  static absl::StatusOr<std::unique_ptr<ThreadPool>> Create(int threads,
                                                            ThreadPriority priority = ThreadPriority::kNormal,
                                                            StarvationGuard guard = {});
  // Runs every task already queued, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> task);
  // Why fewer threads than asked for were started (OK: all were).
  const absl::Status& status() const { return not_started_; }
  int size() const { return static_cast<int>(workers_.size()); }
  // What the workers run at (the first shortfall any of them met, if one did).
  const AppliedPriority& priority() const { return priority_; }
  // Reserve workers (StarvationGuard): how many, how often they were called
  // in, and whether they take tasks now.
  int reserve_size() const { return static_cast<int>(reserve_.size()); }
  int64_t boosts() const;
  bool boosted() const;
  // Calls the reserve in now, as starvation would (counted in boosts(); no
  // on_boost): for work that must not wait, e.g. persists at shutdown. The
  // boost ends as one for starvation does. A pool without a reserve: no-op.
  void Boost();
  // While the reserve is called in, a task a worker already runs is not
  // handed over: the workers themselves run at normal priority until the
  // boost ends, where the kernel allows it (RaiseThreadPriority). OK when it
  // did, or no boost asked it yet; else why not (the tasks the workers held
  // then went on at their priority).
  absl::Status workers_raised() const;

 private:
  void WorkerLoop();
  // The first reserve worker also watches for starvation.
  void ReserveLoop(bool watcher);
  // Pops the next task (mu_ held, a task queued).
  std::function<void()> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finished();
  // No task has run since the pool last ran out of work, `guard_.after` ago
  // or longer (a boost then ends).
  bool IdleForWindowLocked(absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Sums the workers' counts; nullopt where they cannot be read.
  std::optional<ThreadCpuTimes> SampleWorkers(const std::vector<int>& tids);
  // The workers to normal priority while boosted, and back to priority_
  // once the boost ended (each a no-op when they already are). Called
  // without mu_.
  void RaiseWorkers() ABSL_LOCKS_EXCLUDED(mu_, raise_mu_);
  void LowerWorkers() ABSL_LOCKS_EXCLUDED(mu_, raise_mu_);

  mutable absl::Mutex mu_;
  std::vector<int> worker_tids_ ABSL_GUARDED_BY(mu_);
  StarvationGuard guard_;
  Clock* clock_;
  // A guard applies: the reserve exists.
  const bool guarded_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  // When the pool last ran out of work (no task queued or running).
  absl::Time idle_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool boosted_ ABSL_GUARDED_BY(mu_) = false;
  int64_t boosts_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> reserve_;
  // Set by the constructor.
  AppliedPriority priority_;
  int normal_nice_ = 0;  // the constructing thread's
  // Orders RaiseWorkers and LowerWorkers (taken before mu_).
  mutable absl::Mutex raise_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool workers_high_ ABSL_GUARDED_BY(raise_mu_) = false;
  absl::Status raise_refused_ ABSL_GUARDED_BY(raise_mu_);
  absl::Status not_started_;
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
